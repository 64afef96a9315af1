package replication

import (
	"bytes"
	"encoding/binary"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
)

// BenchmarkMemoryPipeline measures the peak resident memory (VmHWM) of the
// replication pipeline — decoder, queue, and a writer that reads every
// change as the journal's COPY source does — against Config.MemoryBudget,
// with the shares and defaults stream uses (decoderBudget, QueueMaxBytes).
// The writer stands in for the journal at a fixed 200 MB/s, slower than
// decoding, so the queue runs full. Workloads:
//
//   - streamed10M: one transaction of 10,000,000 small inserts, streamed
//     as Postgres streams it (stream blocks of 250k changes), spilled,
//     then read back whole;
//   - rows100k×50KB: 100,000 ordinary transactions of one 50 KB row;
//   - mixed: a streamed transaction of 5,000,000 rows with 50,000
//     ordinary 50 KB transactions committing between its stream blocks,
//     so the decoder and the queue are full at once.
//
// Not a timed assertion; run it alone and read peak-RSS-MiB against
// budget-MiB:
//
//	go test ./replication -run '^$' -bench Memory -benchtime 1x
//
// WALCAST_BENCH_BUDGET_MIB runs one budget instead of 64 and 256 MiB.
func BenchmarkMemoryPipeline(b *testing.B) {
	budgets := []int64{64, 256}
	if v, err := strconv.Atoi(os.Getenv("WALCAST_BENCH_BUDGET_MIB")); err == nil && v > 0 {
		budgets = []int64{int64(v)}
	}
	for _, mib := range budgets {
		cfg := Config{MemoryBudget: mib << 20}
		cfg.setDefaults()
		name := "budget=" + strconv.FormatInt(mib, 10) + "MiB/"
		b.Run(name+"streamed10M", func(b *testing.B) { pipelineMemory(b, cfg, streamedWorkload(10_000_000, 0, 0)) })
		b.Run(name+"rows100k×50KB", func(b *testing.B) { pipelineMemory(b, cfg, rowsWorkload(100_000, 50_000)) })
		b.Run(name+"mixed", func(b *testing.B) { pipelineMemory(b, cfg, streamedWorkload(5_000_000, 50_000, 50_000)) })
	}
}

// memWorkload emits pgoutput payloads and returns the transactions committed.
type memWorkload func(emit func(lsn decoder.LSN, msg []byte)) int

func pipelineMemory(b *testing.B, cfg Config, w memWorkload) {
	for n := 0; n < b.N; n++ {
		runtime.GC()
		debug.FreeOSMemory()
		if os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) != nil {
			b.Skip("cannot reset VmHWM (/proc/self/clear_refs): not Linux?")
		}
		base := procKiB("VmRSS")
		dec := decoder.New(decoder.Config{MemoryBudget: cfg.decoderBudget(), SpillDir: b.TempDir()})
		q := newBoundedQueue(cfg.QueueMaxChanges, cfg.QueueMaxBytes)
		done := make(chan int64)
		var peakQueue int64
		go func() {
			// The journal writer: batches as stream's writer takes them, each
			// change encoded into a 64 KiB COPY chunk, at 200 MB/s.
			var total int64
			chunk := make([]byte, 0, 64<<10+64<<10)
			for {
				batch, ok := q.take(cfg.BatchMaxTxns, cfg.BatchMaxChanges, 0)
				if !ok {
					done <- total
					return
				}
				start := time.Now()
				var bytes int64
				for _, it := range batch {
					if it.tx == nil {
						continue
					}
					for c := it.tx.Changes(); c.Next(); {
						body := c.Change().Body
						bytes += int64(len(body))
						for len(body) > 0 {
							k := min(len(body), 64<<10-len(chunk))
							chunk, body = append(chunk, body[:k]...), body[k:]
							if len(chunk) >= 64<<10 {
								chunk = chunk[:0]
							}
						}
					}
				}
				if d := time.Duration(bytes*5) - time.Since(start); d > 0 { // 5 ns/byte: 200 MB/s
					time.Sleep(d)
				}
				for _, it := range batch {
					it.release()
				}
				total += int64(len(batch))
				q.done(len(batch))
			}
		}()
		var txs []*decoder.Transaction
		start := time.Now()
		want := w(func(lsn decoder.LSN, msg []byte) {
			for q.full() { // the receive loop's back-pressure
				select {
				case <-q.room():
				case <-time.After(5 * time.Millisecond):
				}
			}
			if err := dec.Decode(lsn, msg); err != nil {
				b.Fatal(err)
			}
			if txs = dec.Committed(txs[:0]); len(txs) > 0 {
				q.push(txs)
				clear(txs)
				peakQueue = max(peakQueue, q.queuedBytes())
			}
		})
		for !q.idle() {
			time.Sleep(time.Millisecond)
		}
		q.close()
		if got := <-done; got != int64(want) {
			b.Fatalf("journaled %d of %d transactions", got, want)
		}
		took := time.Since(start)
		st := dec.Stats()
		if err := dec.Close(); err != nil {
			b.Fatal(err)
		}
		peak := float64(procKiB("VmHWM")) / 1024
		budget := float64(cfg.MemoryBudget >> 20)
		b.ReportMetric(peak, "peak-RSS-MiB")
		b.ReportMetric(float64(base)/1024, "start-RSS-MiB")
		b.ReportMetric(budget, "budget-MiB")
		b.ReportMetric(peak-budget, "over-budget-MiB")
		b.ReportMetric(float64(peakQueue)/(1<<20), "queue-high-MiB")
		b.ReportMetric(float64(st.BufferedHigh)/(1<<20), "decoder-high-MiB")
		b.ReportMetric(float64(st.Spilled), "spilled")
		b.ReportMetric(took.Seconds(), "s")
	}
}

// rowsWorkload: n ordinary transactions of one row with a text of size bytes.
func rowsWorkload(n, size int) memWorkload {
	return func(emit func(decoder.LSN, []byte)) int {
		pad := strings.Repeat("w", size)
		lsn := decoder.LSN(0x1000)
		emit(lsn, pgRelation(false, 0))
		for i := 0; i < n; i++ {
			lsn += 0x100
			emit(lsn, pgBegin(uint32(1000+i), lsn+0x80))
			emit(lsn+0x10, pgInsert(false, 0, int64(i+1), pad))
			emit(lsn+0x80, pgCommit(lsn+0x80, lsn+0x90))
		}
		return n
	}
}

// streamedWorkload: one streamed transaction of rows small inserts in
// blocks of 250k changes; between blocks, ordinary transactions of one row
// of size bytes, others in all.
func streamedWorkload(rows, others, size int) memWorkload {
	const xid, block = 7, 250_000
	return func(emit func(decoder.LSN, []byte)) int {
		pad := strings.Repeat("w", size)
		gaps := (rows + block - 1) / block
		lsn := decoder.LSN(0x1000)
		emit(lsn, pgRelation(false, 0))
		done := 0
		ins := make([]byte, 0, 64)
		for i := 0; i < rows; i++ {
			lsn += 0x40
			if i%block == 0 {
				if i > 0 {
					emit(lsn, []byte{'E'})
					for k := done; k < others*(i/block)/gaps; k++ {
						lsn += 0x100
						emit(lsn, pgBegin(uint32(100000+k), lsn+0x80))
						emit(lsn+0x10, pgInsert(false, 0, int64(k+1), pad))
						emit(lsn+0x80, pgCommit(lsn+0x80, lsn+0x90))
						done++
					}
				}
				emit(lsn, pgStreamStart(xid, i == 0))
				if i == 0 {
					emit(lsn, pgRelation(true, xid))
				}
			}
			ins = appendSmallInsert(ins[:0], xid, int64(i+1))
			emit(lsn, ins)
		}
		emit(lsn, []byte{'E'})
		for k := done; k < others; k++ {
			lsn += 0x100
			emit(lsn, pgBegin(uint32(100000+k), lsn+0x80))
			emit(lsn+0x10, pgInsert(false, 0, int64(k+1), pad))
			emit(lsn+0x80, pgCommit(lsn+0x80, lsn+0x90))
		}
		lsn += 0x100
		c := []byte{'c'}
		c = binary.BigEndian.AppendUint32(c, xid)
		c = append(c, 0)
		c = binary.BigEndian.AppendUint64(c, uint64(lsn))
		c = binary.BigEndian.AppendUint64(c, uint64(lsn+0x10))
		c = binary.BigEndian.AppendUint64(c, 0)
		emit(lsn, c)
		return others + 1
	}
}

// Hand-built pgoutput payloads (protocol 2) of relation 1, public.t
// (id int8 key, v text).
func pgRelation(stream bool, xid uint32) []byte {
	m := []byte{'R'}
	if stream {
		m = binary.BigEndian.AppendUint32(m, xid)
	}
	m = binary.BigEndian.AppendUint32(m, 1)
	m = append(m, "public\x00t\x00d"...)
	m = binary.BigEndian.AppendUint16(m, 2)
	m = append(m, 1)
	m = append(m, "id\x00"...)
	m = binary.BigEndian.AppendUint32(m, 20)
	m = binary.BigEndian.AppendUint32(m, 0xffffffff)
	m = append(m, 0)
	m = append(m, "v\x00"...)
	m = binary.BigEndian.AppendUint32(m, 25)
	return binary.BigEndian.AppendUint32(m, 0xffffffff)
}

func pgBegin(xid uint32, final decoder.LSN) []byte {
	m := binary.BigEndian.AppendUint64([]byte{'B'}, uint64(final))
	m = binary.BigEndian.AppendUint64(m, 0)
	return binary.BigEndian.AppendUint32(m, xid)
}

func pgCommit(commit, end decoder.LSN) []byte {
	m := binary.BigEndian.AppendUint64([]byte{'C', 0}, uint64(commit))
	m = binary.BigEndian.AppendUint64(m, uint64(end))
	return binary.BigEndian.AppendUint64(m, 0)
}

func pgStreamStart(xid uint32, first bool) []byte {
	m := binary.BigEndian.AppendUint32([]byte{'S'}, xid)
	if first {
		return append(m, 1)
	}
	return append(m, 0)
}

func pgInsert(stream bool, xid uint32, id int64, v string) []byte {
	m := []byte{'I'}
	if stream {
		m = binary.BigEndian.AppendUint32(m, xid)
	}
	m = binary.BigEndian.AppendUint32(m, 1)
	m = append(m, 'N', 0, 2, 't')
	idText := strconv.AppendInt(nil, id, 10)
	m = binary.BigEndian.AppendUint32(m, uint32(len(idText)))
	m = append(m, idText...)
	m = append(m, 't')
	m = binary.BigEndian.AppendUint32(m, uint32(len(v)))
	return append(m, v...)
}

// appendSmallInsert appends a streamed insert of (id, 'click').
func appendSmallInsert(m []byte, xid uint32, id int64) []byte {
	m = append(m, 'I')
	m = binary.BigEndian.AppendUint32(m, xid)
	m = binary.BigEndian.AppendUint32(m, 1)
	m = append(m, 'N', 0, 2, 't')
	idText := strconv.AppendInt(nil, id, 10)
	m = binary.BigEndian.AppendUint32(m, uint32(len(idText)))
	m = append(m, idText...)
	m = append(m, 't', 0, 0, 0, 5)
	return append(m, "click"...)
}

// procKiB reads a "Vm…" line of /proc/self/status, in KiB (0 off Linux).
func procKiB(field string) int64 {
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
