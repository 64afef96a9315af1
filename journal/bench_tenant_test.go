package journal

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
)

// BenchmarkAppendTenantedUpdate appends batches of n updates of a tenanted
// entity over 20,000 journaled rows of 50 tenants, every tenth moving its
// row to another tenant, three ways, each on its own journal, in rotating
// order within every iteration so that a loaded machine slows all three
// alike:
//
//   - unchecked: the updates carry no old-row state, so the journal looks
//     nothing up and moves nothing — what every update cost before rows
//     could move (the baseline);
//   - cached: as the decoder gives them under REPLICA IDENTITY DEFAULT (the
//     new row's tenant known, the old row's not sent), the rows journaled by
//     the same process, which remembers their tenants (keycache.go);
//   - journal: the same with the cache off: every key looked up in the
//     batch's one query.
//
// Reported: updates/s of each, and each one's time over the baseline's.
func BenchmarkAppendTenantedUpdate(b *testing.B) {
	const rows, tenants = 20000, 50
	modes := []string{"unchecked", "cached", "journal"}
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			ctx := context.Background()
			type state struct {
				j        *Journal
				gen      int64
				lsn      decoder.LSN
				tenantOf []int
				rng      *rand.Rand
				took     time.Duration
				entries  int
			}
			var st []*state
			for _, mode := range modes {
				j, gen, _ := newJournal(b)
				if mode != "cached" {
					j.keys.max = 0
				}
				s := &state{j: j, gen: gen, tenantOf: make([]int, rows), rng: rand.New(rand.NewPCG(1, 2))}
				for lo := 0; lo < rows; lo += 1000 {
					var cs []chg
					for id := lo; id < lo+1000; id++ {
						s.tenantOf[id] = id % tenants
						c := ins("public.docs", id)
						c.tenant, c.state, c.pad = fmt.Sprint("t", s.tenantOf[id]), decoder.TenantKnown, 128
						c.tenanted = mode != "unchecked"
						cs = append(cs, c)
					}
					s.lsn += 10000
					if _, err := j.Append(ctx, gen, []*decoder.Transaction{mkTx(uint32(s.lsn), s.lsn, testEpoch, cs...)}); err != nil {
						b.Fatal(err)
					}
				}
				// Statistics, as autovacuum keeps them on a journal in use
				// (a table filled in a second has none yet, and the
				// planner's default guess makes each key lookup a bitmap
				// scan).
				conn, err := j.pool.acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				_, err = conn.Exec(ctx, "ANALYZE "+j.sql.entries)
				j.pool.release(conn)
				if err != nil {
					b.Fatal(err)
				}
				st = append(st, s)
			}
			batch := func(s *state, mode string) []*decoder.Transaction {
				var txs []*decoder.Transaction
				for k := 0; k < n; {
					var cs []chg
					for x := 0; x < 10 && k < n; x++ {
						id := s.rng.IntN(rows)
						if s.rng.IntN(10) == 0 {
							s.tenantOf[id] = (s.tenantOf[id] + 1) % tenants
						}
						c := ins("public.docs", id)
						c.op, c.tenant, c.state, c.pad = decoder.OpUpdate, fmt.Sprint("t", s.tenantOf[id]), decoder.TenantKnown, 128
						if mode != "unchecked" {
							c.oldState, c.tenanted = decoder.TenantUnresolved, true
						}
						cs = append(cs, c)
						k++
					}
					s.lsn += 1000
					txs = append(txs, mkTx(uint32(s.lsn), s.lsn, testEpoch, cs...))
				}
				return txs
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				txs := make([][]*decoder.Transaction, len(modes))
				for m, mode := range modes {
					txs[m] = batch(st[m], mode)
				}
				runtime.GC()
				b.StartTimer()
				for r := range modes {
					m := (i + r) % len(modes)
					s := st[m]
					start := time.Now()
					res, err := s.j.Append(ctx, s.gen, txs[m])
					s.took += time.Since(start)
					if err != nil {
						b.Fatal(err)
					}
					s.entries += res.Entries
				}
			}
			b.StopTimer()
			for m, mode := range modes {
				b.ReportMetric(float64(b.N*n)/st[m].took.Seconds(), mode+"-updates/s")
				if m > 0 {
					b.ReportMetric(st[m].took.Seconds()/st[0].took.Seconds(), mode+"/unchecked")
				}
			}
			b.ReportMetric(float64(st[1].entries)/float64(b.N*n), "entries/update")
		})
	}
}
