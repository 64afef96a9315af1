package journal

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
)

// BenchmarkAppendBreakdown splits the cost of appending a batch of 1 or
// 1,000 envelopes over the same pre-encoded COPY data, interleaved so that machine
// noise hits every step alike:
//
//	bare:     COPY into an unindexed table (the baseline)
//	pkey:     COPY into a table with the entries table's indexes
//	txn:      BEGIN; COPY; COMMIT in one query string
//	lock:     BEGIN; lock the meta row; COPY; COMMIT
//	meta:     lock; COPY; a one-row update like the meta row's; COMMIT
//	seqs:     meta + updating 10 entity sequences
//	notify:   seqs + NOTIFY
//	journal:  Append itself (+ encoding the rows and envelopes)
//
// The order of the steps rotates every iteration.
//
// Each is reported in envelopes/s and as a fraction of bare.
func BenchmarkAppendBreakdown(b *testing.B) {
	// batch=1 is the steady low-latency case (an append per transaction),
	// batch=1000 a busy one.
	for _, n := range []int{1, 1000} {
		b.Run("batch="+strconv.Itoa(n), func(b *testing.B) { appendBreakdown(b, n) })
	}
}

func appendBreakdown(b *testing.B, n int) {
	j, gen, _ := newJournal(b)
	ctx := context.Background()
	conn, err := j.pool.acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer j.pool.release(conn)
	for _, s := range []string{
		"CREATE TABLE bare (LIKE " + j.sql.chunks + ")",
		"CREATE TABLE pkey (LIKE " + j.sql.chunks + " INCLUDING ALL)",
		"CREATE TABLE txn (LIKE " + j.sql.chunks + " INCLUDING ALL)",
		"CREATE TABLE lck (LIKE " + j.sql.chunks + " INCLUDING ALL)",
		"CREATE TABLE meta2 (LIKE " + j.sql.chunks + " INCLUDING ALL)",
		"CREATE TABLE seqs (LIKE " + j.sql.chunks + " INCLUDING ALL)",
		"CREATE TABLE notif (LIKE " + j.sql.chunks + " INCLUDING ALL)",
		"CREATE TABLE eseqs (LIKE " + j.sql.entitySeqs + " INCLUDING ALL)",
		"INSERT INTO eseqs SELECT 'public.bench_' || i, 0, false FROM generate_series(0, 9) i",
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
	cols := " (" + strings.Join(chunkColumns, ", ") + ") FROM STDIN (FORMAT binary)"
	lock := "SELECT 1 FROM " + j.sql.meta + " FOR UPDATE; "
	eseqs := func(next int64) string {
		var v []string
		for e := 0; e < 10; e++ {
			v = append(v, "("+textLit("public.bench_"+strconv.Itoa(e))+","+strconv.FormatInt(next/10+int64(e), 10)+",false)")
		}
		return "UPDATE eseqs AS s SET last_seq = v.seq, tenanted = s.tenanted OR v.tenanted FROM (VALUES " +
			strings.Join(v, ",") + ") AS v(entity, seq, tenanted) WHERE s.entity = v.entity"
	}
	steps := []struct {
		name string
		sql  func(next int64) string
	}{
		{"bare", func(int64) string { return "COPY bare" + cols }},
		{"pkey", func(int64) string { return "COPY pkey" + cols }},
		{"txn", func(int64) string { return "BEGIN; COPY txn" + cols + "; COMMIT" }},
		{"lock", func(int64) string { return "BEGIN; " + lock + "COPY lck" + cols + "; COMMIT" }},
		// The meta row itself must not be disturbed; the published row has
		// the same shape (a one-row HOT update).
		{"meta", func(next int64) string {
			return "BEGIN; " + lock + "COPY meta2" + cols + "; UPDATE " + j.sql.published + " SET seq = " +
				strconv.FormatInt(next, 10) + "; COMMIT"
		}},
		// + the entity sequence update of a 10-entity batch.
		{"seqs", func(next int64) string {
			return "BEGIN; " + lock + "COPY seqs" + cols + "; UPDATE " + j.sql.published + " SET seq = " +
				strconv.FormatInt(next, 10) + "; " + eseqs(next) + "; COMMIT"
		}},
		// + NOTIFY.
		{"notify", func(next int64) string {
			return "BEGIN; " + lock + "COPY notif" + cols + "; UPDATE " + j.sql.published + " SET seq = " +
				strconv.FormatInt(next, 10) + "; " + eseqs(next) + "; SELECT pg_notify('walcast_bench', '" + strconv.FormatInt(next, 10) + "'); COMMIT"
		}},
	}
	times := make([]time.Duration, len(steps)+1)
	var lsn decoder.LSN
	seq := int64(1)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		txs := benchBatch(n, &lsn)
		data := copyData(txs, seq)
		runtime.GC()
		b.StartTimer()
		for r := 0; r <= len(steps); r++ {
			k := (i + r) % (len(steps) + 1)
			start := time.Now()
			if k == len(steps) {
				if _, err := j.Append(ctx, gen, txs); err != nil {
					b.Fatal(err)
				}
			} else if _, err := conn.PgConn().CopyFrom(ctx, bytes.NewReader(data), steps[k].sql(seq)); err != nil {
				b.Fatal(err)
			}
			times[k] += time.Since(start)
		}
		seq += int64(n)
	}
	b.StopTimer()
	env := float64(b.N * n)
	names := []string{"bare", "pkey", "txn", "lock", "meta", "seqs", "notify", "journal"}
	for k, name := range names {
		b.ReportMetric(env/times[k].Seconds(), name+"-env/s")
		if k > 0 {
			b.ReportMetric(times[0].Seconds()/times[k].Seconds(), name+"/bare")
		}
	}
}
