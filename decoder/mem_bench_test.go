package decoder

import (
	"bytes"
	"encoding/binary"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"
	"time"
)

// procStatusKiB reads a "Vm…" line of /proc/self/status, in KiB (0 when
// there is none, as off Linux).
func procStatusKiB(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte(field+":")); ok {
			n, _ := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
			return n
		}
	}
	return 0
}

// resetPeakRSS collects garbage, returns freed memory to the OS and resets
// VmHWM to the current RSS (Linux: 5 > /proc/self/clear_refs), so that one
// benchmark's peak is not another's. It reports whether the reset worked.
func resetPeakRSS() bool {
	runtime.GC()
	debug.FreeOSMemory()
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// BenchmarkMemoryStreamed10M measures the peak resident memory (VmHWM) of
// one 10,000,000-row transaction streamed through the decoder as Postgres
// streams a transaction past logical_decoding_work_mem (stream start, 250k
// inserts, stream stop, …, stream commit), then iterated as the journal
// does (each body encoded into a 64 KiB COPY chunk), under a 64 MiB and a
// 256 MiB budget. Not a timed assertion: run it alone and read the metrics.
//
//	go test ./decoder -run '^$' -bench Memory -benchtime 1x
//
// WALCAST_BENCH_ROWS overrides the row count. The spill file, about 1.3 GB
// for 10M rows, goes to a temporary directory.
func BenchmarkMemoryStreamed10M(b *testing.B) {
	rows := 10_000_000
	if v, err := strconv.Atoi(os.Getenv("WALCAST_BENCH_ROWS")); err == nil && v > 0 {
		rows = v
	}
	for _, budget := range []int64{64 << 20, 256 << 20} {
		b.Run("budget="+strconv.FormatInt(budget>>20, 10)+"MiB", func(b *testing.B) {
			for n := 0; n < b.N; n++ {
				streamedMemory(b, rows, budget)
			}
		})
	}
}

func streamedMemory(b *testing.B, rows int, budget int64) {
	const xid, chunk = 7, 250_000
	dir := b.TempDir()
	if !resetPeakRSS() {
		b.Skip("cannot reset VmHWM (/proc/self/clear_refs): not Linux?")
	}
	base := procStatusKiB("VmRSS")
	start := time.Now()
	d := New(Config{MemoryBudget: budget, SpillDir: dir})
	defer d.Close()
	rel := relationMsg(true, xid, 1, "public", "events", 'd', col{"id", 20, true}, col{"kind", 25, false}, col{"n", 23, false})
	ins := make([]byte, 0, 64)
	decode := func(lsn LSN, m []byte) {
		if err := d.Decode(lsn, m); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < rows; i++ {
		lsn := LSN(0x1000 + 0x40*uint64(i))
		if i%chunk == 0 {
			if i > 0 {
				decode(lsn, streamStopMsg())
			}
			decode(lsn, streamStartMsg(xid, i == 0))
			if i == 0 {
				decode(lsn, rel)
			}
		}
		// I xid rel 'N' 3 columns: id, kind, n.
		id := strconv.AppendInt(nil, int64(i+1), 10)
		ins = append(ins[:0], 'I')
		ins = binary.BigEndian.AppendUint32(ins, xid)
		ins = binary.BigEndian.AppendUint32(ins, 1)
		ins = append(ins, 'N', 0, 3)
		ins = append(ins, 't')
		ins = binary.BigEndian.AppendUint32(ins, uint32(len(id)))
		ins = append(ins, id...)
		ins = append(ins, 't', 0, 0, 0, 5)
		ins = append(ins, "click"...)
		ins = append(ins, 't', 0, 0, 0, 1, byte('0'+i%10))
		decode(lsn, ins)
	}
	end := LSN(0x1000 + 0x40*uint64(rows))
	decode(end, streamStopMsg())
	decode(end, streamCommitMsg(xid, end, end+0x10))
	decoded := time.Since(start)
	txs := d.Committed(nil)
	if len(txs) != 1 || txs[0].Len() != rows {
		b.Fatalf("%d transactions", len(txs))
	}
	tx := txs[0]
	// Read it back as the journal's COPY source does: each body appended to
	// a chunk that is sent and reused at 64 KiB.
	chunkBuf := make([]byte, 0, 64<<10+4<<10)
	got := 0
	var sum int
	for it := tx.Changes(); it.Next(); {
		c := it.Change()
		chunkBuf = append(chunkBuf, c.Body...)
		if len(chunkBuf) >= 64<<10 {
			sum += int(chunkBuf[len(chunkBuf)-2])
			chunkBuf = chunkBuf[:0]
		}
		got++
	}
	if got != rows {
		b.Fatalf("read %d of %d rows", got, rows)
	}
	if err := tx.Close(); err != nil {
		b.Fatal(err)
	}
	peak := procStatusKiB("VmHWM")
	st := d.Stats()
	b.ReportMetric(float64(peak)/1024, "peak-RSS-MiB")
	b.ReportMetric(float64(base)/1024, "start-RSS-MiB")
	b.ReportMetric(float64(budget>>20), "budget-MiB")
	b.ReportMetric(float64(peak)/1024-float64(budget>>20), "over-budget-MiB")
	b.ReportMetric(float64(st.BufferedHigh)/(1<<20), "buffered-high-MiB")
	b.ReportMetric(float64(rows)/decoded.Seconds(), "rows/s")
	b.ReportMetric(float64(st.Spilled), "spilled")
	runtime.KeepAlive(sum)
}
