package sync

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/replication"
)

// The snapshot benchmarks run the whole pipeline (replicator, publisher,
// node) on the harness's PostgreSQL, so they are E2E benchmarks: `make
// bench` skips them (-skip E2E). Run them with
//
//	go test ./fanout/sync -run '^$' -bench E2EState -benchtime 1x

const stateBenchRows = 1_000_000

// readSnapshot reads a socket until its snapshot-end without decoding a
// frame (a client that only counts), and returns the row frames and bytes.
func readSnapshot(c *websocket.Conn) (rows, bytesRead int64, err error) {
	head := make([]byte, 32)
	for {
		_, r, err := c.NextReader()
		if err != nil {
			return rows, bytesRead, err
		}
		n, _ := io.ReadFull(r, head)
		m, _ := io.Copy(io.Discard, r)
		bytesRead += int64(n) + m
		switch {
		case bytes.HasPrefix(head[:n], []byte(`{"t":"row"`)):
			rows++
		case bytes.HasPrefix(head[:n], []byte(`{"t":"snapshot-end"`)):
			return rows, bytesRead, nil
		case bytes.HasPrefix(head[:n], []byte(`{"t":"error"`)):
			return rows, bytesRead, fmt.Errorf("error frame during the snapshot")
		}
	}
}

// countingWriter counts COPY's output.
type countingWriter struct{ n, lines int64 }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	w.lines += int64(bytes.Count(p, []byte{'\n'}))
	return len(p), nil
}

// BenchmarkE2EStateOneSocket: rows per second a 1M-row snapshot delivers to
// one socket (read as fast as the client can), next to COPY (SELECT …) TO
// STDOUT of the same rows from the same database in the same run.
func BenchmarkE2EStateOneSocket(b *testing.B) {
	env := newStateEnvWith(b, func(_ *replication.Config, c *Config) {
		c.Logger, c.IdleTimeout = nil, time.Hour
		// WALCAST_BENCH_PAGE_ROWS sets --snapshot-page-rows, to compare.
		c.State.PageRows, _ = strconv.Atoi(os.Getenv("WALCAST_BENCH_PAGE_ROWS"))
	},
		fmt.Sprintf(`INSERT INTO docs SELECT g, NULL, md5(g::text) FROM generate_series(1, %d) g`, stateBenchRows),
		`VACUUM ANALYZE docs`)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.src)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	tok := stateToken(b, "", true)
	b.ResetTimer()
	for range b.N {
		// COPY of what the snapshot reads (an unscoped token: the rows
		// with no tenant), text format.
		w := &countingWriter{}
		start := time.Now()
		if _, err := conn.PgConn().CopyTo(ctx, w, `COPY (SELECT id, tenant, val FROM ONLY public.docs WHERE tenant IS NULL) TO STDOUT`); err != nil {
			b.Fatal(err)
		}
		copyTime := time.Since(start)

		ws := env.mustDial(tok)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start = time.Now()
		ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
		rows, n, err := readSnapshot(ws.c)
		if err != nil {
			b.Fatal(err)
		}
		snapTime := time.Since(start)
		runtime.ReadMemStats(&after)
		ws.c.Close()
		if rows != w.lines {
			b.Fatalf("snapshot sent %d rows, COPY %d", rows, w.lines)
		}
		b.ReportMetric(float64(rows)/snapTime.Seconds(), "rows/s")
		b.ReportMetric(float64(w.lines)/copyTime.Seconds(), "copy-rows/s")
		b.ReportMetric(snapTime.Seconds()/copyTime.Seconds(), "x-copy-time")
		b.ReportMetric(float64(n)/snapTime.Seconds()/(1<<20), "socket-MiB/s")
		// Allocated by the whole process (node and the counting client)
		// per row: the row path's garbage, which GC then pays for.
		b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(rows), "alloc-B/row")
		b.Logf("snapshot: %d rows, %d MiB in %v; COPY: %d rows, %d MiB in %v", rows, n>>20, snapTime.Round(time.Millisecond),
			w.lines, w.n>>20, copyTime.Round(time.Millisecond))
	}
}

// rssBytes is the process's resident set (VmRSS), 0 where /proc is absent.
func rssBytes() uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkE2EState100Concurrent: 100 sockets of 100 tenants each take a
// snapshot of their tenant's 10,000 rows of a 1M-row table at once
// (--max-concurrent-snapshots 100); the node's peak Go heap and RSS while
// they run. The clients are in the same process but only count bytes.
func BenchmarkE2EState100Concurrent(b *testing.B) {
	const clients = 100
	env := newStateEnvWith(b, func(_ *replication.Config, c *Config) {
		c.Logger, c.IdleTimeout = nil, time.Hour
		c.State.MaxConcurrent = clients
	},
		fmt.Sprintf(`INSERT INTO docs SELECT g, 't' || (g %% %d), md5(g::text) FROM generate_series(1, %d) g`, clients, stateBenchRows),
		`CREATE INDEX ON docs (tenant)`, `VACUUM ANALYZE docs`)
	toks := make([]string, clients)
	for i := range toks {
		toks[i] = stateToken(b, "t"+strconv.Itoa(i), true)
	}
	b.ResetTimer()
	for range b.N {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		baseHeap, baseRSS := ms.HeapInuse, rssBytes()
		var peakHeap, peakRSS, peakRunning atomic.Uint64
		stop := make(chan struct{})
		var sampler sync.WaitGroup
		sampler.Add(1)
		go func() {
			defer sampler.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peakHeap.Load() {
					peakHeap.Store(ms.HeapInuse)
				}
				if r := rssBytes(); r > peakRSS.Load() {
					peakRSS.Store(r)
				}
				if r := uint64(env.node.Stats().SnapshotsRunning); r > peakRunning.Load() {
					peakRunning.Store(r)
				}
			}
		}()
		conns := make([]*wsConn, clients)
		for i := range conns {
			conns[i] = env.mustDial(toks[i])
		}
		var total atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for _, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
				rows, _, err := readSnapshot(c.c)
				if err != nil {
					b.Error(err)
				}
				total.Add(rows)
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		close(stop)
		sampler.Wait()
		for _, c := range conns {
			c.c.Close()
		}
		b.ReportMetric(float64(total.Load())/elapsed.Seconds(), "rows/s")
		b.ReportMetric(float64(peakHeap.Load()-min(peakHeap.Load(), baseHeap))/(1<<20), "peak-heap-growth-MiB")
		b.ReportMetric(float64(peakRSS.Load()-min(peakRSS.Load(), baseRSS))/(1<<20), "peak-RSS-growth-MiB")
		b.Logf("%d snapshots (%d at once at most), %d rows in %v; heap in use %d → peak %d MiB, RSS %d → peak %d MiB",
			clients, peakRunning.Load(), total.Load(), elapsed.Round(time.Millisecond), baseHeap>>20, peakHeap.Load()>>20, baseRSS>>20, peakRSS.Load()>>20)
	}
}
