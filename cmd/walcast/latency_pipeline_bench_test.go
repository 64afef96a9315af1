package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"math/bits"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/internal/pgtest"
)

// BenchmarkE2EPipelineLatency measures the whole pipeline under a steady
// load: pgbench commits single-row transactions at a fixed rate into a
// durable private PostgreSQL (fsync and synchronous_commit on), the real
// `walcast run` process (embedded NATS) journals and publishes them, the
// real `walcast sync` process delivers every change to N WebSocket clients
// that all follow the table. For each rate it prints the achieved tx/s,
// commit→NATS and commit→socket latency (p50, p99, max; the socket figures
// over every client), and the CPU each process used. Run it alone
// (`make bench-latency`):
//
//	go test ./cmd/walcast -run '^$' -bench E2EPipelineLatency -benchtime 1x -timeout 30m
//
// Environment: WALCAST_BENCH_RATES (tx/s, comma separated, run in order
// against one pipeline; default "1000,2500"), WALCAST_BENCH_SOCKETS
// (default 200), WALCAST_BENCH_SECONDS (per rate, default 20; the first
// WALCAST_BENCH_WARMUP seconds, default 3, are load but not measured),
// WALCAST_BENCH_PGBENCH_CLIENTS (default 16), WALCAST_BENCH_RUN_ARGS (extra
// `walcast run` flags, space separated), WALCAST_BENCH_LOGS (a directory
// the two processes' logs are written to at the end), WALCAST_BENCH_PROFILE
// (a directory that gets a CPU profile of `walcast run` and of `walcast
// sync` over each measured window, run-<n>.prof and sync-<n>.prof for the
// n-th rate; only with the test binary), WALCAST_BENCH_TRACE (a
// file that gets a line per change received from NATS: seq, commit LSN,
// commitTime and receive time in Unix µs), WALCAST_BENCH_BIN (a walcast
// binary to run as `run` and `sync` instead of this test binary: for
// before/after comparisons of two builds on the same machine).
//
// Latency is the receive time minus the envelope's commitTime: PostgreSQL's
// commit timestamp (microseconds, taken by the committing backend just
// before its commit record is flushed), read on the same machine and clock,
// so it includes the source's own WAL flush. Clients live in this process
// and parse only what they need (seq and commitTime) from each frame.
func BenchmarkE2EPipelineLatency(b *testing.B) {
	rates := []int{1000, 2500}
	if v := os.Getenv("WALCAST_BENCH_RATES"); v != "" {
		rates = nil
		for _, f := range strings.Split(v, ",") {
			r, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || r <= 0 {
				b.Fatalf("WALCAST_BENCH_RATES %q: want positive integers", v)
			}
			rates = append(rates, r)
		}
	}
	sockets := envInt(b, "WALCAST_BENCH_SOCKETS", 200)
	secs := envInt(b, "WALCAST_BENCH_SECONDS", 20)
	warm := envInt(b, "WALCAST_BENCH_WARMUP", 3)
	pgClients := envInt(b, "WALCAST_BENCH_PGBENCH_CLIENTS", 16)
	if warm >= secs {
		b.Fatalf("WALCAST_BENCH_WARMUP (%d) must be below WALCAST_BENCH_SECONDS (%d)", warm, secs)
	}
	for i := 0; i < b.N; i++ {
		pl := startPipeline(b, sockets)
		for _, rate := range rates {
			r := pl.measure(b, rate, time.Duration(secs)*time.Second, time.Duration(warm)*time.Second, pgClients)
			// Printed, not logged: the testing package cuts a
			// benchmark's log after a few lines.
			fmt.Println(r)
			b.ReportMetric(r.achieved, fmt.Sprintf("tx/s@%d", rate))
			b.ReportMetric(ms(r.nats.quantile(0.99)), fmt.Sprintf("nats_p99_ms@%d", rate))
			b.ReportMetric(ms(r.socket.quantile(0.99)), fmt.Sprintf("socket_p99_ms@%d", rate))
		}
	}
}

// In a child started by startWalcast with WALCAST_BENCH_PROFILE set,
// SIGUSR1 starts a CPU profile (<dir>/<command>-<n>.prof, n counting from
// 1) and SIGUSR2 stops it: the benchmark profiles each measured window of
// the real processes.
func init() {
	dir := os.Getenv("WALCAST_BENCH_PROFILE")
	if os.Getenv("WALCAST_TEST_EXEC") != "1" || dir == "" || len(os.Args) < 2 {
		return
	}
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		var f *os.File
		n := 0
		for sig := range ch {
			switch {
			case sig == syscall.SIGUSR1 && f == nil:
				n++
				var err error
				if f, err = os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.prof", os.Args[1], n))); err == nil {
					if pprof.StartCPUProfile(f) != nil {
						f.Close()
						f = nil
					}
				}
			case sig == syscall.SIGUSR2 && f != nil:
				pprof.StopCPUProfile()
				f.Close()
				f = nil
			}
		}
	}()
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s %q: want a positive integer", name, v)
	}
	return n
}

func ms(us int64) float64 { return float64(us) / 1000 }

// pipeline is the system under test and its clients.
type pipeline struct {
	cluster  *pgtest.Cluster
	url      string
	run      *proc
	sync     *proc
	nats     *latencySink
	clients  []*wsClient
	pgbench  string
	scratch  string
	postgres int // postmaster pid
}

func startPipeline(b *testing.B, sockets int) *pipeline {
	c := pgtest.Start(b, pgtest.Options{Settings: map[string]string{
		"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on",
		"shared_buffers": "256MB", "max_wal_size": "4GB", "checkpoint_timeout": "30min",
	}})
	pl := &pipeline{cluster: c, url: c.NewDatabase(b), pgbench: filepath.Join(c.BinDir(), "pgbench"), scratch: b.TempDir()}
	execSQL(b, pl.url, `CREATE TABLE items (id bigserial PRIMARY KEY, val text NOT NULL)`, `CREATE PUBLICATION pub FOR TABLE items`)
	pidFile, err := os.ReadFile(filepath.Join(c.DataDir(), "postmaster.pid"))
	if err != nil {
		b.Fatal(err)
	}
	pl.postgres, _ = strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])

	bin := os.Getenv("WALCAST_BENCH_BIN")
	runArgs := []string{"run", "--database-url", pl.url, "--publication", "pub", "--http-listen", "127.0.0.1:0",
		"--embedded-nats-listen", "127.0.0.1:0", "--log-format", "json", "--skip-preflight"}
	pl.run = startBenchProc(b, bin, append(runArgs, strings.Fields(os.Getenv("WALCAST_BENCH_RUN_ARGS"))...)...)
	natsRe := regexp.MustCompile(`"url":"(nats://[^"]+)"`)
	var natsURL string
	benchWait(b, "walcast run active", 60*time.Second, func() bool {
		if m := natsRe.FindStringSubmatch(pl.run.log()); m != nil {
			natsURL = m[1]
		}
		return natsURL != "" && strings.HasPrefix(pl.run.readyz(), "active")
	}, pl.run)
	pl.sync = startBenchProc(b, bin, "sync", "--nats-url", natsURL, "--journal-url", pl.url, "--listen", "127.0.0.1:0",
		"--http-listen", "127.0.0.1:0", "--jwt-secret", syncJWTSecret, "--cursor-secret", string(cursorSecret), "--log-format", "json",
		"--max-connections-per-ip", "0", "--accept-rate-per-ip", "0", "--accept-rate", "0")
	if dir := os.Getenv("WALCAST_BENCH_LOGS"); dir != "" {
		b.Cleanup(func() {
			_ = os.WriteFile(filepath.Join(dir, "run.log"), []byte(pl.run.log()), 0o644)
			_ = os.WriteFile(filepath.Join(dir, "sync.log"), []byte(pl.sync.log()), 0o644)
		})
	}
	listenRe := regexp.MustCompile(`"listen":"(ws://[^"]+)"`)
	var wsURL string
	benchWait(b, "walcast sync ready", 60*time.Second, func() bool {
		if m := listenRe.FindStringSubmatch(pl.sync.log()); m != nil {
			wsURL = m[1]
		}
		return wsURL != "" && strings.HasPrefix(pl.sync.readyz(), "ready")
	}, pl.sync)

	// One change first, so the node knows the entity (a "*" grant needs
	// it) and every part of the path is warm.
	execSQL(b, pl.url, `INSERT INTO items (val) VALUES ('first')`)
	pl.nats = newLatencySink()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	var trace *bufio.Writer
	if f := os.Getenv("WALCAST_BENCH_TRACE"); f != "" {
		tf, err := os.Create(f)
		if err != nil {
			b.Fatal(err)
		}
		trace = bufio.NewWriter(tf)
		b.Cleanup(func() { _ = trace.Flush(); _ = tf.Close() })
	}
	sub, err := nc.Subscribe("walcast.change.>", func(m *nats.Msg) {
		now := time.Now().UnixMicro()
		pl.nats.observe(m.Data, now)
		if trace != nil {
			// seq, commit LSN, commitTime and receive time (Unix µs).
			seq, _ := jsonInt(m.Data, `"seq":`)
			ct, _ := commitMicros(m.Data)
			fmt.Fprintf(trace, "%d %s %d %d\n", seq, m.Header.Get(bus.HeaderCommitLSN), ct, now)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}

	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": "bench", "topics": []string{"public.items"}, "exp": time.Now().Add(24 * time.Hour).Unix()}).SignedString([]byte(syncJWTSecret))
	if err != nil {
		b.Fatal(err)
	}
	d := websocket.Dialer{ReadBufferSize: 64 << 10, WriteBufferSize: 1 << 10, HandshakeTimeout: 30 * time.Second}
	hdr := http.Header{"Authorization": {"Bearer " + tok}}
	for i := 0; i < sockets; i++ {
		conn, resp, err := d.Dial(wsURL, hdr)
		if err != nil {
			if resp != nil {
				b.Fatalf("socket %d: %v (HTTP %s)", i, err, resp.Status)
			}
			b.Fatalf("socket %d: %v", i, err)
		}
		cl := &wsClient{conn: conn, sink: newLatencySink(), subscribed: make(chan struct{}), done: make(chan struct{})}
		pl.clients = append(pl.clients, cl)
		go cl.read()
		if err := conn.WriteMessage(websocket.TextMessage, []byte(`{"t":"sub","topic":"public.items"}`)); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		for _, cl := range pl.clients {
			_ = cl.conn.Close()
			<-cl.done
		}
	})
	for i, cl := range pl.clients {
		select {
		case <-cl.subscribed:
		case <-time.After(60 * time.Second):
			b.Fatalf("socket %d not subscribed after 60s:\n%s", i, pl.sync.log())
		}
	}
	// A second change (seq 2) reaches every receiver before any run
	// counts: what came before is not counted.
	execSQL(b, pl.url, `INSERT INTO items (val) VALUES ('ready')`)
	deadline := time.Now().Add(60 * time.Second)
	for _, s := range append([]*latencySink{pl.nats}, sinksOf(pl.clients)...) {
		for s.last() < 2 {
			if time.Now().After(deadline) {
				b.Fatalf("the second change did not reach every receiver within 60s:\n%s", pl.sync.log())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return pl
}

func sinksOf(cls []*wsClient) []*latencySink {
	s := make([]*latencySink, len(cls))
	for i, c := range cls {
		s[i] = c.sink
	}
	return s
}

// startBenchProc starts bin (the test binary when empty) as walcast args.
func startBenchProc(b *testing.B, bin string, args ...string) *proc {
	if bin == "" {
		return startWalcast(b, args...)
	}
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	pr, pw := io.Pipe()
	p.cmd.Stderr, p.cmd.Stdout = pw, p
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			p.Write(append(append([]byte(nil), line...), '\n'))
			var rec struct {
				HTTP string `json:"http"`
			}
			if json.Unmarshal(line, &rec) == nil && rec.HTTP != "" {
				p.mu.Lock()
				p.http = rec.HTTP
				p.mu.Unlock()
			}
		}
	}()
	go func() {
		_ = p.cmd.Wait()
		pw.Close()
		close(p.done)
	}()
	b.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

func benchWait(b *testing.B, what string, timeout time.Duration, cond func() bool, p *proc) {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) || p.exited() {
			b.Fatalf("waiting for %s:\n%s", what, p.log())
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// latencyResult is one rate's outcome.
type latencyResult struct {
	rate, sockets int
	committed     int64   // rows committed by pgbench
	achieved      float64 // pgbench's tps
	nats, socket  *latHist
	cpu           map[string]float64  // % of one core, by process
	syncWrites    float64             // write system calls of walcast sync in window
	window        time.Duration       // of the CPU and write samples
	odd           string              // anything unexpected seen by the clients
	stages        map[string]promHist // walcast run's stage histograms over the window
}

func (r latencyResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d tx/s asked, %.0f tx/s achieved (%d rows), %d sockets\n", r.rate, r.achieved, r.committed, r.sockets)
	fmt.Fprintf(&b, "  commit→NATS   p50 %6.1f ms  p99 %6.1f ms  max %6.1f ms  (%d samples)\n",
		ms(r.nats.quantile(0.5)), ms(r.nats.quantile(0.99)), ms(r.nats.max), r.nats.n)
	fmt.Fprintf(&b, "  commit→socket p50 %6.1f ms  p99 %6.1f ms  max %6.1f ms  (%d samples)\n",
		ms(r.socket.quantile(0.5)), ms(r.socket.quantile(0.99)), ms(r.socket.max), r.socket.n)
	fmt.Fprintf(&b, "  CPU %% of one core: postgres %.0f, walcast run %.0f, walcast sync %.0f, pgbench %.0f, this process (clients) %.0f",
		r.cpu["postgres"], r.cpu["run"], r.cpu["sync"], r.cpu["pgbench"], r.cpu["bench"])
	if frames := r.achieved * float64(r.sockets) * r.window.Seconds(); frames > 0 {
		fmt.Fprintf(&b, "\n  walcast sync: %.2f write system calls per frame delivered", r.syncWrites/frames)
	}
	if len(r.stages) > 0 {
		// One sample per journal batch (of its oldest new transaction):
		// an estimate of where a change's time before NATS goes.
		b.WriteString("\n  walcast run, per journal batch (p50/p99 ms):")
		for _, st := range runStages {
			if h, ok := r.stages[st.metric]; ok && h.n > 0 {
				fmt.Fprintf(&b, " %s %.1f/%.1f", st.name, 1000*h.quantile(0.5), 1000*h.quantile(0.99))
			}
		}
		if h, ok := r.stages["walcast_journal_batch_size"]; ok && h.n > 0 {
			fmt.Fprintf(&b, "; batch size p50 %.0f p99 %.0f changes", h.quantile(0.5), h.quantile(0.99))
		}
	}
	if r.odd != "" {
		fmt.Fprintf(&b, "\n  UNEXPECTED: %s", r.odd)
	}
	return b.String()
}

// measure drives rate tx/s for dur with pgbench and collects the latencies
// of the changes committed after warm.
func (pl *pipeline) measure(b *testing.B, rate int, dur, warm time.Duration, pgClients int) latencyResult {
	ctx := context.Background()
	var before int64
	pgtest.MustQueryRow(b, pl.url, `SELECT count(*) FROM items`, nil, &before)
	// Everything before this run has been delivered (checked by the previous
	// run, or the first row): reset the sinks.
	pl.nats.reset()
	for _, cl := range pl.clients {
		cl.sink.reset()
	}
	script := filepath.Join(pl.scratch, "insert.sql")
	if err := os.WriteFile(script, []byte("INSERT INTO items (val) VALUES ('v');\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, pl.pgbench, "-n", "-f", script, "-R", strconv.Itoa(rate), "-T", strconv.Itoa(int(dur.Seconds())),
		"-c", strconv.Itoa(pgClients), "-j", "2", pl.url)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	from := start.Add(warm)
	fromUs := from.UnixMicro()
	pl.nats.from.Store(fromUs)
	for _, cl := range pl.clients {
		cl.sink.from.Store(fromUs)
	}
	time.Sleep(time.Until(from))
	profiling := os.Getenv("WALCAST_BENCH_PROFILE") != ""
	if profiling {
		_ = pl.run.cmd.Process.Signal(syscall.SIGUSR1)
		_ = pl.sync.cmd.Process.Signal(syscall.SIGUSR1)
	}
	cpu0 := pl.cpuTicks()
	stages0 := pl.run.stageHists()
	t0 := time.Now()
	cpuEnd := make(chan map[string]int64, 1)
	var stages1 map[string]promHist // with cpuEnd's sample
	var t1 time.Time                // when cpuEnd's sample was taken
	go func() {
		// Sample before pgbench ends: its backends' ticks go once they
		// exit (until the postmaster reaps them).
		time.Sleep(time.Until(start.Add(dur - time.Second)))
		t1 = time.Now()
		stages1 = pl.run.stageHists()
		cpuEnd <- pl.cpuTicks()
	}()
	if err := cmd.Wait(); err != nil {
		b.Fatalf("pgbench: %v\n%s", err, out.String())
	}
	cpu1 := <-cpuEnd
	if profiling {
		_ = pl.run.cmd.Process.Signal(syscall.SIGUSR2)
		_ = pl.sync.cmd.Process.Signal(syscall.SIGUSR2)
	}
	wall := t1.Sub(t0)
	r := latencyResult{rate: rate, sockets: len(pl.clients), cpu: map[string]float64{}}
	for k, v := range cpu1 {
		r.cpu[k] = max(0, float64(v-cpu0[k])/clockTicks/wall.Seconds()*100)
	}
	r.syncWrites = float64(cpu1["sync-writes"] - cpu0["sync-writes"])
	r.stages = map[string]promHist{}
	for k, h := range stages1 {
		r.stages[k] = h.minus(stages0[k])
	}
	r.window = wall
	// pgbench over its whole run (it may have exited before the sample).
	r.cpu["pgbench"] = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds() / time.Since(start).Seconds() * 100
	if m := regexp.MustCompile(`tps = ([0-9.]+)`).FindStringSubmatch(out.String()); m != nil {
		r.achieved, _ = strconv.ParseFloat(m[1], 64)
	}
	var after int64
	pgtest.MustQueryRow(b, pl.url, `SELECT count(*) FROM items`, nil, &after)
	r.committed = after - before

	// Wait for every client to have every change.
	deadline := time.Now().Add(60 * time.Second)
	for {
		missing := r.committed - pl.nats.count()
		for _, cl := range pl.clients {
			missing += r.committed - cl.sink.count()
		}
		if missing <= 0 {
			break
		}
		if time.Now().After(deadline) {
			r.odd = fmt.Sprintf("%d deliveries missing after 60 s", missing)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.nats = pl.nats.snapshot()
	r.socket = &latHist{}
	var odd []string
	if s := pl.nats.oddities(r.committed); s != "" {
		odd = append(odd, "NATS: "+s)
	}
	for i, cl := range pl.clients {
		h := cl.sink.snapshot()
		r.socket.merge(h)
		if s := cl.sink.oddities(r.committed); s != "" && len(odd) < 5 {
			odd = append(odd, fmt.Sprintf("socket %d: %s", i, s))
		}
	}
	if len(odd) > 0 {
		r.odd += strings.Join(odd, "; ")
	}
	return r
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat times
// (100 on every Linux platform Go supports).
const clockTicks = 100

// cpuTicks reads the CPU time (user+system, clock ticks) of each process:
// postgres is the postmaster, its live children and its reaped children
// (cutime+cstime), so backends that come and go are all counted.
func (pl *pipeline) cpuTicks() map[string]int64 {
	m := map[string]int64{
		"run":   procTicks(pl.run.cmd.Process.Pid, false),
		"sync":  procTicks(pl.sync.cmd.Process.Pid, false),
		"bench": procTicks(os.Getpid(), false),
	}
	m["sync-writes"] = procWrites(pl.sync.cmd.Process.Pid)
	pg := procTicks(pl.postgres, true)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := procPPid(pid); ok && ppid == pl.postgres {
			pg += procTicks(pid, false)
		}
	}
	m["postgres"] = pg
	return m
}

// procWrites is the number of write system calls pid made (syscw of
// /proc/<pid>/io: write, writev and the like).
func procWrites(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// procStatFields returns the fields of /proc/pid/stat after the command
// name (field 3 onwards), or nil.
func procStatFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

func procPPid(pid int) (int, bool) {
	f := procStatFields(pid)
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// procTicks is utime+stime (and cutime+cstime with children) of pid.
func procTicks(pid int, children bool) int64 {
	f := procStatFields(pid)
	if len(f) < 15 {
		return 0
	}
	// f[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17.
	var t int64
	n := 2
	if children {
		n = 4
	}
	for _, s := range f[11 : 11+n] {
		v, _ := strconv.ParseInt(s, 10, 64)
		t += v
	}
	return t
}

// wsClient is one WebSocket client following public.items.
type wsClient struct {
	conn       *websocket.Conn
	sink       *latencySink
	subscribed chan struct{}
	done       chan struct{}
}

func (c *wsClient) read() {
	defer close(c.done)
	buf := make([]byte, 0, 4096)
	sub := false
	for {
		_, r, err := c.conn.NextReader()
		if err != nil {
			return
		}
		buf = buf[:0]
		for {
			if len(buf) == cap(buf) {
				buf = append(buf, 0)[:len(buf)]
			}
			n, err := r.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			if err == io.EOF {
				break
			}
			if err != nil {
				return
			}
		}
		now := time.Now().UnixMicro()
		switch {
		case bytes.HasPrefix(buf, []byte(`{"t":"change"`)):
			c.sink.observe(buf, now)
		case !sub && bytes.HasPrefix(buf, []byte(`{"t":"subscribed"`)):
			sub = true
			close(c.subscribed)
		default:
			c.sink.other(buf)
		}
	}
}

// latencySink collects one receiver's latencies and checks its order.
type latencySink struct {
	from atomic.Int64 // commitTime (Unix µs) from which latencies count

	mu      sync.Mutex // guards the following fields
	h       latHist
	n       int64 // changes received since reset
	lastSeq int64
	dups    int64 // seq at or below the last one
	bad     int64 // frames without a readable seq or commitTime
	others  []string
}

func newLatencySink() *latencySink { return &latencySink{} }

func (s *latencySink) reset() {
	s.mu.Lock()
	s.h, s.n, s.dups, s.bad, s.others = latHist{}, 0, 0, 0, nil
	s.mu.Unlock()
	s.from.Store(1 << 62)
}

// observe records an envelope (or a change frame holding one) received at
// now (Unix µs).
func (s *latencySink) observe(b []byte, now int64) {
	seq, ok1 := jsonInt(b, `"seq":`)
	ct, ok2 := commitMicros(b)
	from := s.from.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ok1 || !ok2 {
		s.bad++
		return
	}
	s.n++
	if seq <= s.lastSeq {
		s.dups++
	}
	s.lastSeq = seq
	if ct >= from {
		s.h.add(now - ct)
	}
}

func (s *latencySink) other(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.others) < 3 {
		s.others = append(s.others, string(b[:min(len(b), 200)]))
	}
}

func (s *latencySink) last() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastSeq
}

func (s *latencySink) count() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (s *latencySink) snapshot() *latHist {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.h
	return &h
}

func (s *latencySink) oddities(want int64) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var o []string
	if s.n != want {
		o = append(o, fmt.Sprintf("%d changes, want %d", s.n, want))
	}
	if s.dups > 0 {
		o = append(o, fmt.Sprintf("%d out of order or repeated", s.dups))
	}
	if s.bad > 0 {
		o = append(o, fmt.Sprintf("%d unreadable", s.bad))
	}
	if len(s.others) > 0 {
		o = append(o, fmt.Sprintf("other frames: %q", s.others))
	}
	return strings.Join(o, ", ")
}

// jsonInt reads the integer after the first occurrence of key.
func jsonInt(b []byte, key string) (int64, bool) {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return 0, false
	}
	b = b[i+len(key):]
	var v int64
	n := 0
	for ; n < len(b) && b[n] >= '0' && b[n] <= '9'; n++ {
		v = v*10 + int64(b[n]-'0')
	}
	return v, n > 0
}

// commitMicros reads "commitTime":"2006-01-02T15:04:05.000000Z" as Unix µs
// without allocating.
func commitMicros(b []byte) (int64, bool) {
	const key = `"commitTime":"`
	i := bytes.Index(b, []byte(key))
	if i < 0 || len(b) < i+len(key)+27 {
		return 0, false
	}
	t := b[i+len(key):]
	num := func(s []byte) int64 {
		var v int64
		for _, c := range s {
			v = v*10 + int64(c-'0')
		}
		return v
	}
	if t[4] != '-' || t[10] != 'T' || t[19] != '.' || t[26] != 'Z' {
		return 0, false
	}
	y, mo, d := num(t[0:4]), num(t[5:7]), num(t[8:10])
	// Days from civil (Howard Hinnant's algorithm).
	if mo <= 2 {
		y--
	}
	era := y / 400
	yoe := y - era*400
	m := mo + 9
	if mo > 2 {
		m = mo - 3
	}
	doy := (153*m+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	days := era*146097 + doe - 719468
	secs := days*86400 + num(t[11:13])*3600 + num(t[14:16])*60 + num(t[17:19])
	return secs*1_000_000 + num(t[20:26]), true
}

// latHist is a log-linear histogram of microsecond values: exact below
// 128 µs, then 64 buckets per power of two (within 1.6%).
type latHist struct {
	counts [64 * 40]uint32
	n      int64
	max    int64
}

func latBucket(us int64) int {
	if us < 128 {
		return int(us)
	}
	shift := bits.Len64(uint64(us)) - 7
	return shift*64 + int(us>>shift)
}

// latValue is the lower bound of bucket i.
func latValue(i int) int64 {
	if i < 128 {
		return int64(i)
	}
	shift := i/64 - 1
	mant := int64(i - shift*64)
	return mant << shift
}

func (h *latHist) add(us int64) {
	us = max(us, 0)
	i := min(latBucket(us), len(h.counts)-1)
	h.counts[i]++
	h.n++
	h.max = max(h.max, us)
}

func (h *latHist) merge(o *latHist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile is the q-quantile in µs (the lower bound of its bucket).
func (h *latHist) quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	want := int64(q * float64(h.n))
	var seen int64
	for i, c := range h.counts {
		seen += int64(c)
		if seen > want {
			return latValue(i)
		}
	}
	return h.max
}

// runStages are the histograms of `walcast run` that split a change's time
// from its commit to the journal, in path order.
var runStages = []struct{ name, metric string }{
	{"commit→decoded", "walcast_replication_decode_delay_seconds"},
	{"queued", "walcast_journal_queue_wait_seconds"},
	{"append", "walcast_journal_append_duration_seconds"},
}

// promHist is a Prometheus histogram read from /metrics: cumulative bucket
// counts by upper bound (the last +Inf), summed over label sets.
type promHist struct {
	le     []float64
	counts []float64
	n      float64
}

// minus is h with o's counts taken away (o read earlier; empty: h).
func (h promHist) minus(o promHist) promHist {
	out := promHist{le: h.le, counts: slices.Clone(h.counts), n: h.n - o.n}
	if len(o.counts) == len(h.counts) {
		for i := range out.counts {
			out.counts[i] -= o.counts[i]
		}
	}
	return out
}

// quantile interpolates linearly within the bucket holding q (the
// bucket's upper bound for the +Inf bucket's lower edge).
func (h promHist) quantile(q float64) float64 {
	rank := q * h.n
	lo, prev := 0.0, 0.0
	for i, c := range h.counts {
		if c >= rank && c > prev {
			if math.IsInf(h.le[i], 1) {
				return lo
			}
			return lo + (h.le[i]-lo)*(rank-prev)/(c-prev)
		}
		lo, prev = h.le[i], c
	}
	return lo
}

// stageHists reads the stage histograms (runStages, and the batch size)
// from the process's /metrics; nil when it cannot.
func (p *proc) stageHists() map[string]promHist {
	p.mu.Lock()
	addr := p.http
	p.mu.Unlock()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	want := map[string]bool{"walcast_journal_batch_size": true}
	for _, st := range runStages {
		want[st.metric] = true
	}
	byLE := map[string]map[float64]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	leRe := regexp.MustCompile(`le="([^"]+)"`)
	for sc.Scan() {
		line := sc.Text()
		name, _, ok := strings.Cut(line, "_bucket{")
		if !ok || !want[name] {
			continue
		}
		m := leRe.FindStringSubmatch(line)
		sp := strings.LastIndexByte(line, ' ')
		if m == nil || sp < 0 {
			continue
		}
		le, err1 := strconv.ParseFloat(m[1], 64)
		v, err2 := strconv.ParseFloat(line[sp+1:], 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if byLE[name] == nil {
			byLE[name] = map[float64]float64{}
		}
		byLE[name][le] += v
	}
	out := map[string]promHist{}
	for name, m := range byLE {
		var h promHist
		h.le = slices.Sorted(maps.Keys(m))
		for _, le := range h.le {
			h.counts = append(h.counts, m[le])
		}
		h.n = h.counts[len(h.counts)-1]
		out[name] = h
	}
	return out
}
