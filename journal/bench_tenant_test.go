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
// entity under REPLICA IDENTITY DEFAULT, as the decoder gives them (the new
// row's tenant known, the old row's not sent), over 20,000 journaled rows
// of 50 tenants: the path that looks up each key's previous tenant to find
// rows that changed tenant. Every tenth update moves its row to another
// tenant. With keys=cached the rows were journaled by the same process,
// which remembers their tenants (keycache.go); with keys=journal it does not,
// and every key is looked up in the journal. Reported: updates/s and
// entries written per update.
func BenchmarkAppendTenantedUpdate(b *testing.B) {
	const rows, tenants = 20000, 50
	for _, cfg := range []struct {
		n      int
		cached bool
	}{{1, true}, {100, true}, {1000, true}, {1, false}, {100, false}, {1000, false}} {
		n := cfg.n
		keys := "journal"
		if cfg.cached {
			keys = "cached"
		}
		b.Run(fmt.Sprintf("keys=%s/batch=%d", keys, n), func(b *testing.B) {
			j, gen, _ := newJournal(b)
			if !cfg.cached {
				j.keys.max = 0
			}
			ctx := context.Background()
			tenantOf := make([]int, rows)
			var lsn decoder.LSN
			for lo := 0; lo < rows; lo += 1000 {
				var cs []chg
				for id := lo; id < lo+1000; id++ {
					tenantOf[id] = id % tenants
					c := ins("public.docs", id)
					c.tenant, c.state, c.pad = fmt.Sprint("t", tenantOf[id]), decoder.TenantKnown, 128
					cs = append(cs, c)
				}
				lsn += 10000
				if _, err := j.Append(ctx, gen, []*decoder.Transaction{mkTx(uint32(lsn), lsn, testEpoch, cs...)}); err != nil {
					b.Fatal(err)
				}
			}
			// Statistics, as autovacuum keeps them on a journal in use (a
			// table filled in a second has none yet, and the planner's
			// default guess makes every key lookup a bitmap scan).
			conn, err := j.pool.acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			_, err = conn.Exec(ctx, "ANALYZE "+j.sql.entries)
			j.pool.release(conn)
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			var took time.Duration
			updates, entries := 0, 0
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				var txs []*decoder.Transaction
				for k := 0; k < n; {
					var cs []chg
					for x := 0; x < 10 && k < n; x++ {
						id := rng.IntN(rows)
						if rng.IntN(10) == 0 {
							tenantOf[id] = (tenantOf[id] + 1) % tenants
						}
						c := ins("public.docs", id)
						c.op, c.tenant, c.state, c.pad = decoder.OpUpdate, fmt.Sprint("t", tenantOf[id]), decoder.TenantKnown, 128
						c.oldState, c.tenanted = decoder.TenantUnresolved, true
						cs = append(cs, c)
						k++
					}
					lsn += 1000
					txs = append(txs, mkTx(uint32(lsn), lsn, testEpoch, cs...))
				}
				runtime.GC()
				b.StartTimer()
				start := time.Now()
				res, err := j.Append(ctx, gen, txs)
				took += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				updates += n
				entries += res.Entries
			}
			b.StopTimer()
			b.ReportMetric(float64(updates)/took.Seconds(), "updates/s")
			b.ReportMetric(float64(entries)/float64(updates), "entries/update")
		})
	}
}
