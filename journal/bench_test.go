package journal

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
)

// benchBatch builds a batch of n changes (~300-byte envelopes once
// sequenced) over 10 entities, 10 changes per source transaction, starting
// after *lsn.
func benchBatch(n int, lsn *decoder.LSN) []*decoder.Transaction {
	var txs []*decoder.Transaction
	for i := 0; i < n; {
		var cs []chg
		for k := 0; k < 10 && i < n; k++ {
			c := ins(fmt.Sprintf("public.bench_%d", i%10), i)
			c.pad = 128
			cs = append(cs, c)
			i++
		}
		*lsn += 1000
		txs = append(txs, mkTx(uint32(*lsn), *lsn, testEpoch, cs...))
	}
	return txs
}

// copyData encodes a batch as the COPY data the journal would send, for
// the bare COPY baseline.
func copyData(txs []*decoder.Transaction, firstSeq int64) []byte {
	src := &copySource{txs: txs, next: firstSeq, base: map[string]entityState{}, dirty: map[string]entityState{}}
	data, err := io.ReadAll(src)
	if err != nil {
		panic(err)
	}
	return data
}

// BenchmarkAppend appends batches of 1, 100, 1,000 and 10,000 ~300-byte
// envelopes. Each iteration also COPYs the same rows — the very bytes the
// journal sends, encoded beforehand, so the baseline does no Go work at all
// — into an unindexed copy of the entries table (the baseline), and into one
// with the entries table's indexes (to separate the indexes' cost from the
// rest: envelope building, meta row, entity seqs, notify, one extra round
// trip). Reported: envelopes/s of each and the ratio of the
// journal's throughput to the bare COPY's.
func BenchmarkAppend(b *testing.B) {
	for _, n := range []int{1, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			j, gen, _ := newJournal(b)
			ctx := context.Background()
			conn, err := j.pool.acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer j.pool.release(conn)
			for _, s := range []string{
				"CREATE TABLE bare (LIKE " + j.sql.chunks + ")",
				"CREATE TABLE indexed (LIKE " + j.sql.chunks + " INCLUDING ALL)",
			} {
				if _, err := conn.Exec(ctx, s); err != nil {
					b.Fatal(err)
				}
			}
			cols := " (" + strings.Join(chunkColumns, ", ") + ") FROM STDIN (FORMAT binary)"
			bareCopy, indexedCopy := "COPY bare"+cols, "COPY indexed"+cols
			var lsn decoder.LSN
			var seq int64 = 1
			var tJournal, tBare, tIndexed time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				txs := benchBatch(n, &lsn)
				data := copyData(txs, seq)
				runtime.GC() // the batch's garbage is not the journal's cost
				b.StartTimer()

				// Rotate the order so that no step always runs first after
				// the batch is built.
				for r := 0; r < 3; r++ {
					start := time.Now()
					switch (i + r) % 3 {
					case 0:
						res, err := j.Append(ctx, gen, txs)
						if err != nil || res.Entries != n {
							b.Fatalf("%+v %v", res, err)
						}
						tJournal += time.Since(start)
					case 1:
						if _, err := conn.PgConn().CopyFrom(ctx, bytes.NewReader(data), bareCopy); err != nil {
							b.Fatal(err)
						}
						tBare += time.Since(start)
					case 2:
						if _, err := conn.PgConn().CopyFrom(ctx, bytes.NewReader(data), indexedCopy); err != nil {
							b.Fatal(err)
						}
						tIndexed += time.Since(start)
					}
				}
				seq += int64(n)
			}
			b.StopTimer()
			env := float64(b.N * n)
			b.ReportMetric(env/tJournal.Seconds(), "journal-env/s")
			b.ReportMetric(env/tBare.Seconds(), "bare-copy-env/s")
			b.ReportMetric(env/tIndexed.Seconds(), "indexed-copy-env/s")
			b.ReportMetric(tBare.Seconds()/tJournal.Seconds(), "journal/bare")
		})
	}
}

// BenchmarkRead reads a 20,000-entry journal by cursor, 1,000 per page:
// unfiltered, one entity of ten, and tenant-scoped.
func BenchmarkRead(b *testing.B) {
	j, gen, _ := newJournal(b)
	ctx := context.Background()
	var lsn decoder.LSN
	for k := 0; k < 20; k++ {
		if _, err := j.Append(ctx, gen, benchBatch(1000, &lsn)); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		q    Query
	}{
		{"all", Query{AllTenants: true}},
		{"one-entity", Query{Entities: []string{"public.bench_3"}, AllTenants: true}},
		{"tenant", Query{Tenant: "acme"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			got := 0
			for i := 0; i < b.N; i++ {
				q := c.q
				q.FromOldest, q.Limit = true, 1000
				for {
					res, err := j.Changes(ctx, q)
					if err != nil || res.ResyncRequired {
						b.Fatalf("%v %+v", err, res)
					}
					got += len(res.Changes)
					if !res.More {
						break
					}
					q.Cursor, q.FromOldest = res.Cursor, false
				}
			}
			b.ReportMetric(float64(got)/b.Elapsed().Seconds(), "env/s")
		})
	}
}

// BenchmarkReadAfter is the publisher's read: a 20,000-entry journal read
// with ReadAfterBytes in batches of 1,000 (from the journal, not the recent
// log), beside a bare COPY of the same rows' columns out of the entries
// chunks — the most a read of them could do. Reported: entries/s of each and
// their ratio.
func BenchmarkReadAfter(b *testing.B) {
	j, gen, url := newJournal(b)
	ctx := context.Background()
	var lsn decoder.LSN
	const total = 20000
	for k := 0; k < total/1000; k++ {
		if _, err := j.Append(ctx, gen, benchBatch(1000, &lsn)); err != nil {
			b.Fatal(err)
		}
	}
	reader := openAt(b, url) // never appends: every read goes to the journal
	conn, err := j.pool.acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer j.pool.release(conn)
	var readT, copyT time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		for pos := int64(0); pos < total; {
			lg, err := reader.ReadAfterBytes(ctx, pos, 1000, 0)
			if err != nil || len(lg.Entries) == 0 {
				b.Fatalf("read after %d: %v (%d entries)", pos, err, len(lg.Entries))
			}
			pos = lg.Entries[len(lg.Entries)-1].Seq
		}
		readT += time.Since(start)
		start = time.Now()
		for pos := int64(0); pos < total; pos += 1000 {
			sql := "COPY (SELECT seq, entity, entity_seq, tenant, tenant_unknown, op, lsn, commit_lsn, commit_time, envelope FROM " +
				j.entriesIn(strconv.FormatInt(pos, 10), strconv.FormatInt(pos+1000, 10), readColumns...) + " e ORDER BY seq) TO STDOUT (FORMAT binary)"
			if _, err := conn.PgConn().CopyTo(ctx, io.Discard, sql); err != nil {
				b.Fatal(err)
			}
		}
		copyT += time.Since(start)
	}
	n := float64(b.N * total)
	b.ReportMetric(n/readT.Seconds(), "read-env/s")
	b.ReportMetric(n/copyT.Seconds(), "copy-env/s")
	b.ReportMetric(copyT.Seconds()/readT.Seconds(), "read/copy")
}

// BenchmarkAppendWAL reports the WAL one append writes on the journal's
// server, per change and per append, for appends of 1, 10, 100 and 1,000
// changes (~300-byte envelopes): the steady state of a quiet source, where
// every source transaction is an append of its own, up to a busy one.
func BenchmarkAppendWAL(b *testing.B) {
	for _, n := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			j, gen, url := newJournal(b)
			ctx := context.Background()
			var lsn decoder.LSN
			// Past the first appends' full-page images of the meta rows.
			for k := 0; k < 20; k++ {
				if _, err := j.Append(ctx, gen, benchBatch(n, &lsn)); err != nil {
					b.Fatal(err)
				}
			}
			walLSN := func() int64 {
				var v int64
				pgtest.MustQueryRow(b, url, "SELECT pg_current_wal_lsn() - '0/0'", nil, &v)
				return v
			}
			b.ResetTimer()
			w0 := walLSN()
			for i := 0; i < b.N; i++ {
				if _, err := j.Append(ctx, gen, benchBatch(n, &lsn)); err != nil {
					b.Fatal(err)
				}
			}
			wal := float64(walLSN() - w0)
			b.ReportMetric(wal/float64(b.N*n), "WAL-B/change")
			b.ReportMetric(wal/float64(b.N), "WAL-B/append")
		})
	}
}
