package sync

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// The benchmarks put the sockets' client ends in a child process (this test
// binary re-executed in client mode), so the node's process holds only its
// own ends: 10,000 sockets fit the file limit and the node's memory is
// measured alone.

const benchClientEnv = "WALCAST_SYNC_BENCH_CLIENT"

func init() {
	if spec := os.Getenv(benchClientEnv); spec != "" {
		os.Exit(benchClient(spec))
	}
}

// benchClient: spec is "url|token|sockets|mode". It dials the sockets,
// subscribes each to public.orders, prints "ready", then in mode "count"
// prints "all <k>" each time every socket has received k changes; in mode
// "latency" it records now-commitTime of every delivery and prints the
// percentiles when stdin closes; in mode "drain" it only reads, and in mode
// "filter" socket i subscribes with the filter id = i mod 100 and reads.
func benchClient(spec string) int {
	p := strings.Split(spec, "|")
	url, tok, mode := p[0], p[1], p[3]
	n, _ := strconv.Atoi(p[2])
	conns := make([]*websocket.Conn, n)
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			d := websocket.Dialer{ReadBufferSize: 4096, WriteBufferSize: 512}
			var c *websocket.Conn
			var err error
			for range 50 {
				c, _, err = d.Dial(url+"?access_token="+tok, nil)
				if err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				failed.Add(1)
				return
			}
			sub := `{"t":"sub","topic":"public.orders"}`
			if mode == "filter" {
				sub = fmt.Sprintf(`{"t":"sub","topic":"public.orders","filter":{"col":"id","op":"=","value":%d}}`, i%100)
			}
			_ = c.WriteMessage(websocket.TextMessage, []byte(sub))
			if _, _, err := c.ReadMessage(); err != nil {
				failed.Add(1)
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		fmt.Printf("failed %d\n", failed.Load())
		return 1
	}
	fmt.Println("ready")
	var total atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	out := bufio.NewWriter(os.Stdout)
	var outMu sync.Mutex
	for idx, c := range conns {
		go func() {
			buf := make([]byte, 8192)
			var mine []time.Duration
			for {
				_, r, err := c.NextReader()
				if err != nil {
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
					return
				}
				switch {
				case mode != "latency", idx%20 != 0:
					for {
						if _, err := r.Read(buf); err != nil {
							break
						}
					}
					if mode != "count" {
						break
					}
					if v := total.Add(1); v%int64(n) == 0 {
						outMu.Lock()
						fmt.Fprintf(out, "all %d\n", v/int64(n))
						out.Flush()
						outMu.Unlock()
					}
				default:
					// Every socket drains; one in 20 also measures (finding
					// commitTime without a JSON parse), so the client
					// process keeps up.
					b, _ := io.ReadAll(r)
					if i := bytes.Index(b, []byte(`"commitTime":"`)); i >= 0 {
						rest := b[i+14:]
						if j := bytes.IndexByte(rest, '"'); j > 0 {
							if ct, err := time.Parse(time.RFC3339Nano, string(rest[:j])); err == nil {
								mine = append(mine, time.Since(ct))
							}
						}
					}
					if len(mine)%64 == 0 && len(mine) > 0 {
						mu.Lock()
						lat = append(lat, mine...)
						mu.Unlock()
						mine = mine[:0]
					}
				}
			}
		}()
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
	time.Sleep(200 * time.Millisecond)
	if mode == "latency" {
		mu.Lock()
		slices.Sort(lat)
		if len(lat) > 0 {
			fmt.Printf("latency n=%d p50=%d p99=%d max=%d\n", len(lat), lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1])
		}
		mu.Unlock()
	}
	return 0
}

type benchClients struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func startBenchClients(b *testing.B, e *syncEnv, n int, mode string) *benchClients {
	b.Helper()
	return startBenchClientsAt(b, e.wsURL(""), token(b, []string{orders}, "", time.Hour), n, mode)
}

// startBenchClientsAt starts the client process on url (ws://…) with tok.
func startBenchClientsAt(b *testing.B, url, tok string, n int, mode string) *benchClients {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), benchClientEnv+"="+url+"|"+tok+"|"+strconv.Itoa(n)+"|"+mode)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	bc := &benchClients{cmd: cmd, stdin: stdin, lines: make(chan string, 1<<16)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			bc.lines <- sc.Text()
		}
		close(bc.lines)
	}()
	b.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	if l := <-bc.lines; l != "ready" {
		b.Fatalf("bench clients: %q", l)
	}
	return bc
}

func (bc *benchClients) stop() string {
	bc.stdin.Close()
	var last string
	for l := range bc.lines {
		last = l
	}
	_ = bc.cmd.Wait()
	return last
}

func benchEnv(b *testing.B, n int) *syncEnv {
	return newSyncEnv(b, func(c *Config) {
		c.MaxConnections = n + 10
		c.MaxBufferedBytes = 1 << 20
		c.IdleTimeout = time.Hour
	})
}

// BenchmarkSyncFanout10k: one 2 KB change delivered to 10,000 sockets on
// one node, per op: from the NATS publish until every socket has read it.
// encodes/op shows the frame is encoded once, whatever the socket count.
func BenchmarkSyncFanout10k(b *testing.B) {
	const n = 10000
	e := benchEnv(b, n)
	bc := startBenchClients(b, e, n, "count")
	e.topicLive(orders, n)
	rows := make([]row, b.N)
	for i := range rows {
		rows[i] = row{entity: orders, op: decoder.OpInsert, id: i, pad: 1900}
	}
	var es []journal.Entry
	for i := 0; i < len(rows); i += 1000 {
		es = append(es, e.appendRows(rows[i:min(i+1000, len(rows))]...)...)
	}
	if len(es[0].Envelope) < 2000 {
		b.Fatalf("envelope is %d bytes", len(es[0].Envelope))
	}
	before := e.node.stats.framesEncoded.Load()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		e.publish(es[i])
		if l := <-bc.lines; l != "all "+strconv.Itoa(i+1) {
			b.Fatalf("clients: %q", l)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(e.node.stats.framesEncoded.Load()-before)/float64(b.N), "encodes/op")
	bc.stop()
}

// BenchmarkLoopbackFloor10k is the floor under BenchmarkSyncFanout10k on
// this machine: the same client process with its 10,000 sockets, each sent
// a 2 KB WebSocket frame per op by a bare loop of writes in this process
// (no node, no NATS). ns/op runs from the first write until every client
// has read the frame; write-loop-ms is the loop alone.
func BenchmarkLoopbackFloor10k(b *testing.B) {
	const n = 10000
	conns := make(chan net.Conn, n)
	up := websocket.Upgrader{ReadBufferSize: 128, WriteBufferSize: 256}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		if _, _, err := c.ReadMessage(); err != nil { // the client's sub
			c.Close()
			return
		}
		_, _ = c.NetConn().Write(controlFrame("subscribed", orders, "c").wire)
		conns <- c.NetConn()
	}))
	defer srv.Close()
	bc := startBenchClientsAt(b, "ws"+strings.TrimPrefix(srv.URL, "http"), "-", n, "count")
	all := make([]net.Conn, n)
	for i := range all {
		all[i] = <-conns
	}
	f := changeFrame(orders, "c", bytes.Repeat([]byte("x"), 2000), true)
	var loop time.Duration
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		for _, c := range all {
			if _, err := c.Write(f.wire); err != nil {
				b.Fatal(err)
			}
		}
		loop += time.Since(start)
		if l := <-bc.lines; l != "all "+strconv.Itoa(i+1) {
			b.Fatalf("clients: %q", l)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(loop.Microseconds())/1000/float64(b.N), "write-loop-ms")
	bc.stop()
	for _, c := range all {
		c.Close()
	}
}

func rss() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// BenchmarkSyncIdleMemory10k: the node's RSS growth per idle, subscribed
// socket with 10,000 sockets open (target ≤ 6 KB). Go heap and
// goroutine stack per socket are reported beside it: stack-bytes/socket
// above 2 KB means readers' stacks grew (socket.run says why they must not).
func BenchmarkSyncIdleMemory10k(b *testing.B) {
	const n = 10000
	for range b.N {
		func() {
			e := benchEnv(b, n)
			runtime.GC()
			debug.FreeOSMemory()
			var ms0 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			r0 := rss()
			bc := startBenchClients(b, e, n, "count")
			e.topicLive(orders, n)
			runtime.GC()
			debug.FreeOSMemory()
			var ms1 runtime.MemStats
			runtime.ReadMemStats(&ms1)
			r1 := rss()
			b.ReportMetric(float64(r1-r0)/n, "rss-bytes/socket")
			b.ReportMetric(float64(int64(ms1.HeapInuse)-int64(ms0.HeapInuse))/n, "heap-bytes/socket")
			b.ReportMetric(float64(int64(ms1.StackInuse)-int64(ms0.StackInuse))/n, "stack-bytes/socket")
			if f := os.Getenv("WALCAST_SYNC_BENCH_HEAPPROFILE"); f != "" {
				out, _ := os.Create(f)
				_ = pprof.WriteHeapProfile(out)
				out.Close()
			}
			bc.stop()
		}()
	}
}

// BenchmarkSyncLatency1k: journal append → socket latency with 1,000
// sockets at 1,000 transactions per second for 5 s. The envelope's
// commitTime is stamped just before the append, so the latency covers the
// journal append, the publish and the fan-out (not replication).
func BenchmarkSyncLatency1k(b *testing.B) {
	const n, rate = 1000, 1000
	for range b.N {
		e := benchEnv(b, n)
		bc := startBenchClients(b, e, n, "latency")
		e.topicLive(orders, n)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		// Batches every 10 ms, as the replicator's group commit would.
		tick := time.NewTicker(10 * time.Millisecond)
		id := 0
		for ctx.Err() == nil {
			<-tick.C
			rows := make([]row, rate/100)
			for k := range rows {
				rows[k] = row{entity: orders, op: decoder.OpInsert, id: id, pad: 200}
				id++
			}
			e.publish(e.appendRowsAt(time.Now(), rows...)...)
		}
		tick.Stop()
		cancel()
		b.ReportMetric(float64(id)/5, "tx/s")
		time.Sleep(time.Second)
		res := bc.stop()
		var cnt, p50, p99, mx int64
		if _, err := fmt.Sscanf(res, "latency n=%d p50=%d p99=%d max=%d", &cnt, &p50, &p99, &mx); err != nil {
			b.Fatalf("clients: %q", res)
		}
		b.ReportMetric(float64(p50)/1e6, "p50-ms")
		b.ReportMetric(float64(p99)/1e6, "p99-ms")
		b.ReportMetric(float64(mx)/1e6, "max-ms")
		b.ReportMetric(float64(cnt), "deliveries")
	}
}
