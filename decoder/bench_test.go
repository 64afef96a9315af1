package decoder

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

var benchCols = []col{
	{"id", 20, true}, {"name", 25, false}, {"email", 1043, false}, {"age", 23, false},
	{"balance", 1700, false}, {"active", 16, false}, {"created_at", 1184, false},
	{"tags", 1009, false}, {"data", 3802, false}, {"score", 701, false},
}

func benchRow(id int) []any {
	return []any{strconv.Itoa(id), "Ada Lovelace", "ada@example.com", "36", "1234.50", "t",
		"2026-11-29 23:21:24.123456+00", `{analyst,"first programmer"}`, `{"plan": "pro", "seats": 5}`, "0.75"}
}

// benchLoop decodes b.N copies of change inside transactions of 1000
// changes, committing, taking and closing them as the replication loop would.
func benchLoop(b *testing.B, relation, change []byte) {
	d := New(Config{SpillDir: b.TempDir()})
	defer d.Close()
	begin, commit := beginMsg(1, 2), commitMsg(2, 3)
	if err := d.Decode(1, relation); err != nil {
		b.Fatal(err)
	}
	var txs []*Transaction
	b.SetBytes(int64(len(change)))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if i%1000 == 0 {
			if err := d.Decode(LSN(i), begin); err != nil {
				b.Fatal(err)
			}
		}
		if err := d.Decode(LSN(i), change); err != nil {
			b.Fatal(err)
		}
		if i%1000 == 999 || i == b.N-1 {
			if err := d.Decode(LSN(i), commit); err != nil {
				b.Fatal(err)
			}
			txs = d.Committed(txs[:0])
			for _, tx := range txs {
				tx.Close()
			}
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "changes/s")
}

// BenchmarkDecodeInsert10Col: decode and envelope-encode a 10-column insert
// (int8, text, varchar, int4, numeric, bool, timestamptz, text[], jsonb,
// float8).
func BenchmarkDecodeInsert10Col(b *testing.B) {
	benchLoop(b, relationMsg(false, 0, 1, "public", "accounts", 'd', benchCols...), insertMsg(false, 0, 1, benchRow(42)...))
}

// BenchmarkDecodeUpdate1KB: an update of a row of about 1 KB (the 10
// columns above plus 1 KB of text) with the old key.
func BenchmarkDecodeUpdate1KB(b *testing.B) {
	cols := append(append([]col(nil), benchCols...), col{"notes", 25, false})
	row := append(benchRow(42), strings.Repeat("lorem ipsum ", 80))
	old := make([]any, len(row))
	old[0] = "41"
	benchLoop(b, relationMsg(false, 0, 1, "public", "accounts", 'd', cols...), updateMsg(false, 0, 1, 'K', old, row...))
}

// BenchmarkStreamed100k: one streamed transaction of 100,000 10-column
// inserts in chunks of 500, under a 4 MiB budget so it spills, then read
// back in full at commit. Reports rows/s and the peak Go heap seen.
func BenchmarkStreamed100k(b *testing.B) {
	const rows = 100_000
	rel := relationMsg(true, 7, 1, "public", "accounts", 'd', benchCols...)
	ins := insertMsg(true, 7, 1, benchRow(42)...)
	b.ReportAllocs()
	var peak uint64
	var ms runtime.MemStats
	sample := func() {
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapAlloc)
	}
	start := time.Now()
	for n := 0; n < b.N; n++ {
		d := New(Config{MemoryBudget: 4 << 20, SpillDir: b.TempDir()})
		for i := 0; i < rows; i++ {
			if i%500 == 0 {
				if i > 0 {
					d.Decode(LSN(i), streamStopMsg())
				}
				if err := d.Decode(LSN(i), streamStartMsg(7, i == 0)); err != nil {
					b.Fatal(err)
				}
				if i == 0 {
					d.Decode(0, rel)
				}
			}
			if err := d.Decode(LSN(i), ins); err != nil {
				b.Fatal(err)
			}
			if i%10000 == 0 {
				sample()
			}
		}
		d.Decode(rows, streamStopMsg())
		if err := d.Decode(rows, streamCommitMsg(7, rows, rows+1)); err != nil {
			b.Fatal(err)
		}
		tx := d.Committed(nil)[0]
		got := 0
		for it := tx.Changes(); it.Next(); {
			got++
			if got%10000 == 0 {
				sample()
			}
		}
		if got != rows || d.Stats().Spilled != 1 {
			b.Fatalf("%d rows, spilled %d", got, d.Stats().Spilled)
		}
		tx.Close()
		d.Close()
	}
	b.ReportMetric(float64(rows*b.N)/time.Since(start).Seconds(), "rows/s")
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
}
