package sync

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/fanout/bus"
)

// jsDir is the browser client package (fanout/client/js).
const jsDir = "../client/js"

// needJS fails (never skips) when what the browser tests need is missing:
// .ci/run installs Debian's chromium and runs npm ci.
func needJS(t *testing.T, chromium bool) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node not found: install Node.js 20+ (the CI machine has it; see .ci/run)")
	}
	if _, err := os.Stat(filepath.Join(jsDir, "node_modules", "playwright-core")); err != nil {
		t.Fatalf("fanout/client/js/node_modules is missing: run `npm ci` in fanout/client/js (.ci/run does): %v", err)
	}
	if chromium {
		if _, err := os.Stat(chromiumPath()); err != nil {
			t.Fatalf("Chromium not found at %s: install Debian's package (`apt-get install -y chromium`; .ci/run does) or set CHROMIUM", chromiumPath())
		}
	}
}

func chromiumPath() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	return "/usr/bin/chromium"
}

// restartableNode is a sync node served on a fixed loopback address that a
// test can stop and start again there (clients see the node go away and
// come back at the same URL), with the test page and the console mounted.
type restartableNode struct {
	t    *testing.T
	e    *syncEnv
	cfg  Config
	addr string

	mu   sync.Mutex // guards the following fields
	node *Node
	srv  *http.Server
	done chan struct{}
}

func (r *restartableNode) start() {
	r.t.Helper()
	n, err := Open(syncCtx(r.t), r.cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		n.Close()
		r.t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	mux := http.NewServeMux()
	mux.Handle("/test/", http.StripPrefix("/test/", http.FileServer(http.Dir(filepath.Join(jsDir, "test", "browser")))))
	mux.Handle("/", n.HandlerWithConsole())
	srv := n.HTTPServer()
	srv.Handler = mux
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	r.mu.Lock()
	r.node, r.srv, r.done = n, srv, done
	r.mu.Unlock()
}

func (r *restartableNode) stop() {
	r.mu.Lock()
	n, srv, done := r.node, r.srv, r.done
	r.node = nil
	r.mu.Unlock()
	if n == nil {
		return
	}
	n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
	<-done
}

// TestBrowser drives Debian's Chromium (playwright-core, never a
// downloaded browser) through pages that use the client package against a
// real node: changes written to the journal arrive once and in order;
// after the node restarts the page resumes from its cursor with nothing
// missed and nothing twice; a reloaded page resumes from the cursor in
// localStorage; behind a proxy that refuses WebSockets the page falls back
// to Server-Sent Events and gets the same stream; the console shows live
// rows (its screenshot is kept, under $WALCAST_ARTIFACTS or
// $TMPDIR/walcast-browser-test, and named in the log). Its changes come
// from a test publisher; TestBrowserPipeline runs a page against the real
// pipeline (SQL, replicator, publisher).
func TestBrowser(t *testing.T) {
	needJS(t, true)
	e := newSyncEnv(t)
	const topic = "public.orders"
	auth, err := NewHMACAuth(syncJWTSecret)
	if err != nil {
		t.Fatal(err)
	}
	// --allowed-origins lists another site's origin, as a deployment for a
	// separate app does: the node's own pages (the console, the test
	// pages) are still allowed.
	rn := &restartableNode{t: t, e: e, addr: "127.0.0.1:0",
		cfg: Config{NATS: bus.NATSConfig{URL: e.nats.URL()}, Journal: e.j, Auth: auth, AllowedOrigins: []string{"https://app.example.com"}}}
	rn.start()
	t.Cleanup(rn.stop)
	base := "http://" + rn.addr

	// A proxy in front of the node that refuses every WebSocket upgrade,
	// as some corporate proxies do, and passes everything else (streamed).
	target, _ := url.Parse(base)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1
	blocked := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "WebSockets are not allowed through this proxy", http.StatusForbidden)
			return
		}
		proxy.ServeHTTP(w, r)
	}))

	var nextID = 1000
	var idMu sync.Mutex
	commit := func(n int) []int64 {
		idMu.Lock()
		defer idMu.Unlock()
		var rows []row
		for range n {
			nextID++
			rows = append(rows, ins(topic, nextID))
		}
		var seqs []int64
		for _, en := range e.commit(rows...) {
			seqs = append(seqs, en.Seq)
		}
		return seqs
	}
	commit(1) // the topic exists before the pages subscribe
	reply := func(w http.ResponseWriter, seqs []int64) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string][]int64{"seqs": seqs})
	}
	control := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n < 1 || n > 1000 {
			http.Error(w, "n must be 1..1000", http.StatusBadRequest)
			return
		}
		switch r.URL.Path {
		case "/commit":
			reply(w, commit(n))
		case "/restart":
			rn.stop()
			seqs := commit(n) // journaled (and published) while no node runs
			rn.start()
			reply(w, seqs)
		default:
			http.NotFound(w, r)
		}
	}))

	// The screenshot outlives the test (it is the test's artifact).
	shot := filepath.Join(artifactDir(t), "console.png")
	_ = os.Remove(shot) // a stale one must not pass for this run's
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "test/browser/run.mjs")
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(), "WALCAST_BASE="+base, "WALCAST_BLOCKED="+blocked, "WALCAST_CONTROL="+control,
		"WALCAST_TOKEN="+token(t, []string{topic}, "", time.Hour), "WALCAST_TOPIC="+topic,
		"WALCAST_SCREENSHOT="+shot, "CHROMIUM="+chromiumPath())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("browser driver: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	var out struct {
		WS, Reload, SSE []int64
		TransportSSE    string
		ConsoleRows     int
		Expected        struct{ WS, Reload, SSE []int64 }
		Errors          []string
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &out); err != nil {
		t.Fatalf("driver output: %v\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	for _, c := range []struct {
		name      string
		got, want []int64
	}{{"WebSocket page across a node restart", out.WS, out.Expected.WS},
		{"reloaded page", out.Reload, out.Expected.Reload},
		{"SSE page behind a proxy that refuses WebSockets", out.SSE, out.Expected.SSE}} {
		if err := exactlyOnceInOrder(c.got, c.want); err != nil {
			t.Errorf("%s: %v (got %v, want %v)", c.name, err, c.got, c.want)
		}
	}
	if out.TransportSSE != "sse" {
		t.Errorf("behind the blocking proxy the page used %q, want sse", out.TransportSSE)
	}
	if out.ConsoleRows < 4 {
		t.Errorf("the console showed %d change rows, want at least 4", out.ConsoleRows)
	}
	if _, err := os.Stat(shot); err != nil {
		t.Errorf("no console screenshot: %v", err)
	}
	t.Logf("console screenshot: %s", shot)
}

// exactlyOnceInOrder is the validator the browser streams are checked with:
// every expected seq once, in order, nothing else.
func exactlyOnceInOrder(got, want []int64) error {
	if len(want) == 0 {
		return errors.New("nothing was expected: the test wrote no changes")
	}
	if !slices.IsSorted(want) {
		return errors.New("expected seqs out of order")
	}
	seen := map[int64]bool{}
	for i, s := range got {
		if seen[s] {
			return fmt.Errorf("seq %d received twice", s)
		}
		seen[s] = true
		if i > 0 && s < got[i-1] {
			return fmt.Errorf("seq %d after %d: out of order", s, got[i-1])
		}
	}
	for _, s := range want {
		if !seen[s] {
			return fmt.Errorf("seq %d missing", s)
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("%d changes received, %d written", len(got), len(want))
	}
	return nil
}

// startServer serves h on loopback until the test ends and returns its URL.
func startServer(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return "http://" + ln.Addr().String()
}
