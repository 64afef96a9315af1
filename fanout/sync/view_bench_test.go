package sync

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/filter"
	"github.com/walcast/walcast/journal"
)

// recordOrdersCatalog gives public.orders (id int4 key, pad text) a catalog
// entry, as walcast run writes one, so subscriptions may filter it.
func recordOrdersCatalog(tb testing.TB, e *syncEnv) {
	tb.Helper()
	entry := journal.CatalogEntry{Table: journal.Table{Schema: "public", Name: "orders"}, Published: true, RelID: 1, ReplicaIdentity: "d",
		Columns: []journal.CatalogColumn{{Name: "id", TypeOID: 23, Key: true, PrimaryKey: true}, {Name: "pad", TypeOID: 25}}, TableShape: "bench"}
	if _, _, err := e.j.RecordCatalog(context.Background(), e.gen, entry); err != nil {
		tb.Fatal(err)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFilteredFanout: the node's CPU per change per subscription, for
// subs sockets on one table, unfiltered and filtered (socket i follows
// id = i mod 100, so each change matches 1 in 100 sockets and the 100
// filters are distinct), with the frames each sends. The sockets' client
// ends are in a child process; the node's CPU is this process's.
func BenchmarkFilteredFanout(b *testing.B) {
	for _, subs := range []int{1, 100, 10000} {
		for _, mode := range []string{"drain", "filter"} {
			b.Run(fmt.Sprintf("subs=%d/%s", subs, mode), func(b *testing.B) {
				e := benchEnv(b, subs)
				recordOrdersCatalog(b, e)
				bc := startBenchClients(b, e, subs, mode)
				e.topicLive(orders, subs)
				// b.N changes of their own (a republished one is ignored),
				// ids cycling through 0..99.
				var es []journal.Entry
				for i := 0; i < b.N; i += 1000 {
					rows := make([]row, min(1000, b.N-i))
					for k := range rows {
						rows[k] = row{entity: orders, op: decoder.OpInsert, id: (i + k) % 100, pad: 200}
					}
					es = append(es, e.appendRows(rows...)...)
				}
				sent0 := e.node.stats.framesSent.Load()
				handled0 := e.node.stats.liveHandled.Load()
				b.ResetTimer()
				cpu0 := cpuTime()
				for i := range b.N {
					e.publish(es[i])
				}
				for e.node.stats.liveHandled.Load()-handled0 < int64(b.N) || e.node.stats.queuedBytes.Load() > 0 {
					time.Sleep(time.Millisecond)
				}
				cpu := cpuTime() - cpu0
				b.StopTimer()
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/float64(subs), "cpu-ns/change/sub")
				b.ReportMetric(float64(e.node.stats.framesSent.Load()-sent0)/float64(b.N), "frames/change")
				bc.stop()
			})
		}
	}
}

// BenchmarkViewMemory: what the membership mechanism keeps, per
// subscription (the compiled view and an empty row set) and per row key a
// row set holds.
func BenchmarkViewMemory(b *testing.B) {
	entry := journal.CatalogEntry{Table: journal.Table{Schema: "public", Name: "orders"}, Published: true,
		Columns: []journal.CatalogColumn{{Name: "id", TypeOID: 23, Key: true}, {Name: "status", TypeOID: 25}, {Name: "amount", TypeOID: 1700}}}
	req := viewRequest{filter: json.RawMessage(`{"and":[{"col":"status","op":"in","values":["paid","new"]},{"col":"amount","op":">","value":100}]}`),
		columns: []string{"status"}, hasCols: true}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	const subs, keys = 10000, 100000
	for range b.N {
		h0 := heap()
		views := make([]*view, subs)
		sets := make([]*rowSet, subs)
		for i := range views {
			v, err := compileView(entry, true, req, filter.Limits{})
			if err != nil {
				b.Fatal(err)
			}
			views[i], sets[i] = v, newRowSet(0, nil)
		}
		h1 := heap()
		r := newRowSet(0, nil)
		for k := range keys {
			r.add(fmt.Sprintf(`{"id":%d}`, 1000000+k))
		}
		h2 := heap()
		b.ReportMetric(float64(h1-h0)/subs, "bytes/sub")
		b.ReportMetric(float64(h2-h1)/keys, "bytes/key")
		runtime.KeepAlive(views)
		runtime.KeepAlive(sets)
		runtime.KeepAlive(r)
	}
}
