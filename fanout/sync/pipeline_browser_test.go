package sync

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/fanout/publish"
	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
	"github.com/walcast/walcast/journal/journaltest"
	"github.com/walcast/walcast/replication"
)

// Settings of TestBrowserPipeline.
const (
	pipelineTopic = "public.items"
	// pipelineChanges is how many changes the workload commits (and the
	// sample the commit-to-callback latency is measured over).
	pipelineChanges = 1000
	// pipelinePace is the least time between two of the workload's
	// commits, so the workload lasts several token lifetimes.
	pipelinePace = 7 * time.Millisecond
	// pipelineTokenTTL is the life of the page's tokens (exp is in whole
	// seconds, so a token lives between 2 and 3 s) and pipelineLeeway the
	// node's --jwt-leeway: a token that is not refreshed ends its socket
	// (4100) within a second of its exp.
	pipelineTokenTTL = 3 * time.Second
	pipelineLeeway   = 500 * time.Millisecond
)

// browserPipeline is the whole pipeline of walcast in one process: a
// source database with a published table, a real replicator journaling it
// into a journal database of its own, a real publisher sending the journal
// to NATS, and a sync node (with its console, the test pages under /test/
// and a token issuer at /token) on a loopback address.
type browserPipeline struct {
	src  string // the source database
	j    *journal.Journal
	node *Node
	base string // the node's URL, http://127.0.0.1:port
	// tokens counts the tokens /token issued.
	tokens atomic.Int64

	// mu guards node and srv across restart.
	mu       sync.Mutex
	srv      *http.Server
	served   chan struct{}
	openNode func() (*Node, error)
	mux      *http.ServeMux
	handler  http.Handler // the node's, with its console
	restarts int
}

// stop closes the node (its sockets first) and its HTTP server.
func (p *browserPipeline) stop() {
	p.mu.Lock()
	node, srv, served := p.node, p.srv, p.served
	p.mu.Unlock()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	node.Close()
	_ = srv.Shutdown(sctx)
	<-served
}

// serve starts the node's HTTP server on ln.
func (p *browserPipeline) serve(ln net.Listener) {
	p.handler = p.node.HandlerWithConsole()
	p.srv = p.node.HTTPServer()
	p.srv.Handler = p.mux
	served := make(chan struct{})
	p.served = served
	srv := p.srv
	go func() { defer close(served); _ = srv.Serve(ln) }()
}

// restart stops the sync node and starts a new one on the same address,
// as an operator's restart would: every socket is closed, and clients
// come back to a node that knows nothing of them but their cursors.
func (p *browserPipeline) restart() error {
	p.stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	n, err := p.openNode()
	if err != nil {
		return err
	}
	var ln net.Listener
	for i := 0; ; i++ {
		ln, err = net.Listen("tcp", strings.TrimPrefix(p.base, "http://"))
		if err == nil {
			break
		}
		if i == 50 {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.node = n
	p.restarts++
	p.serve(ln)
	return nil
}

func newBrowserPipeline(t *testing.T, control http.Handler) *browserPipeline {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &browserPipeline{src: pgtest.NewDatabase(t)}
	jurl := pgtest.NewDatabase(t)
	pgtest.MustExec(t, p.src,
		`CREATE TABLE items (id int PRIMARY KEY, val text NOT NULL, n int NOT NULL)`,
		`CREATE PUBLICATION pub FOR TABLE items`)
	logger := slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	j, err := journal.Open(ctx, journal.Config{URL: jurl, CursorSecret: syncTestSecret})
	if err != nil {
		t.Fatal(err)
	}
	p.j = j
	ns := natstest.Start(t)
	pubConn, err := nats.Connect(ns.URL(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	r, err := replication.New(replication.Config{DatabaseURL: p.src, Publication: "pub", Slot: stateSlot(t),
		Standby: true, StatusInterval: time.Second, BackoffBase: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
		Logger: logger}, j)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = r.Run(ctx) }()
	pub := publish.New(publish.Config{}, j, pubConn)
	go func() { defer wg.Done(); _ = pub.Run(ctx) }()
	auth, err := NewAuthenticator(AuthConfig{Secret: syncJWTSecret, Leeway: pipelineLeeway})
	if err != nil {
		t.Fatal(err)
	}
	// The page pings every second and each frame it sends checks exp: a
	// socket whose token is not refreshed is closed (4100) within a second
	// of exp plus the leeway.
	p.openNode = func() (*Node, error) {
		return Open(ctx, Config{NATS: bus.NATSConfig{URL: ns.URL()}, Journal: j, Auth: auth,
			State:  StateConfig{SourceURL: p.src, MaxConcurrent: 2},
			Logger: logger})
	}
	p.node, err = p.openNode()
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/test/", http.StripPrefix("/test/", http.FileServer(http.Dir(filepath.Join(jsDir, "test", "browser")))))
	// GET /token?ttl=short: a token of pipelineTokenTTL; ttl=long: of 40
	// days (past setTimeout's 2^31 - 1 ms).
	mux.HandleFunc("/token", func(w http.ResponseWriter, r *http.Request) {
		ttl := pipelineTokenTTL
		if r.URL.Query().Get("ttl") == "long" {
			ttl = 40 * 24 * time.Hour
		}
		c := Claims{Topics: []string{pipelineTopic}, Snapshot: true, RegisteredClaims: jwt.RegisteredClaims{
			Subject: "page", ExpiresAt: jwt.NewNumericDate(time.Now().Add(ttl))}}
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(syncJWTSecret)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		p.tokens.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte(s))
	})
	mux.Handle("/control/", control)
	// The node's handlers are asked for on each request: a restart
	// replaces the node.
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		h := p.handler
		p.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	p.mux = mux
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.base = "http://" + ln.Addr().String()
	p.serve(ln)
	t.Cleanup(func() {
		p.stop()
		cancel()
		wg.Wait()
		pubConn.Close()
		j.Close()
	})
	// The slot is created while the replicator starts: write until a
	// change reaches the journal, so every later commit is journaled.
	waitFor(t, "the first change to be journaled", func() bool {
		pgtest.MustExec(t, p.src, `INSERT INTO items VALUES (0, 'first', 0) ON CONFLICT (id) DO UPDATE SET val = 'first'`)
		time.Sleep(100 * time.Millisecond)
		return p.node.known(pipelineTopic)
	})
	return p
}

// seed commits rows that predate the page (they reach it in its snapshot)
// and waits until they are journaled and published, so a subscription
// from the horizon starts after them.
func (p *browserPipeline) seed(t *testing.T, sql string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, p.src)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var lsn string
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	after, err := decoder.ParseLSN(lsn)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the seed rows journaled and published", func() bool {
		st, err := p.j.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.Watermark >= after && st.Published >= st.Horizon
	})
}

// pipelineWorkload commits n changes to items, each statement its own
// transaction except every 50th step, a transaction of three changes
// (insert, update, delete): inserts of new ids, updates, key changes and
// deletes, at least pace apart. Every insert and update sets n to a
// counter of its own, so a change is identified by its n ("n<n>"), a
// delete by its key ("d<id>": ids are never reused). It records each
// change with Commit of every validator in vs, in commit order (one
// connection, one commit after the other), and returns the n of the last
// change, an insert.
func pipelineWorkload(ctx context.Context, url string, vs []*journaltest.Validator, n int, pace time.Duration) (last int, err error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT id FROM items ORDER BY id`)
	if err != nil {
		return 0, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return 0, err
	}
	rng := rand.New(rand.NewPCG(15, 1))
	nextID, counter := 100_000, 0
	newID := func() int { nextID++; return nextID }
	pick := func() (int, int) { i := rng.IntN(len(ids)); return i, ids[i] }
	tick := time.NewTicker(pace)
	defer tick.Stop()
	for done, step := 0, 0; done < n; step++ {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
		var changes []string
		if step%50 == 49 && n-done > 3 && len(ids) > 1 {
			// Three changes in one transaction: the page gets them in
			// statement order, with one commit time.
			id := newID()
			i, old := pick()
			b := &pgx.Batch{}
			b.Queue(`BEGIN`)
			b.Queue(`INSERT INTO items VALUES ($1, 'txn', $2)`, id, counter+1)
			b.Queue(`UPDATE items SET val = 'txn-updated', n = $2 WHERE id = $1`, id, counter+2)
			b.Queue(`DELETE FROM items WHERE id = $1`, old)
			b.Queue(`COMMIT`)
			if err := conn.SendBatch(ctx, b).Close(); err != nil {
				return 0, err
			}
			changes = []string{fmt.Sprintf("n%d", counter+1), fmt.Sprintf("n%d", counter+2), fmt.Sprintf("d%d", old)}
			counter += 2
			ids[i] = id
		} else {
			op := rng.IntN(10)
			if len(ids) < 10 || done == n-1 {
				op = 0 // keep rows to change; end with an insert
			}
			counter++
			switch {
			case op < 4:
				id := newID()
				_, err = conn.Exec(ctx, `INSERT INTO items VALUES ($1, $2, $3)`, id, fmt.Sprint("v", counter), counter)
				ids = append(ids, id)
				changes = []string{fmt.Sprintf("n%d", counter)}
			case op < 7:
				_, id := pick()
				_, err = conn.Exec(ctx, `UPDATE items SET val = $2, n = $3 WHERE id = $1`, id, fmt.Sprint("u", counter), counter)
				changes = []string{fmt.Sprintf("n%d", counter)}
			case op < 8:
				// A key change: live() moves the row to its new key.
				i, id := pick()
				to := newID()
				_, err = conn.Exec(ctx, `UPDATE items SET id = $2, n = $3 WHERE id = $1`, id, to, counter)
				ids[i] = to
				changes = []string{fmt.Sprintf("n%d", counter)}
			default:
				i, id := pick()
				_, err = conn.Exec(ctx, `DELETE FROM items WHERE id = $1`, id)
				ids = slices.Delete(ids, i, i+1)
				changes = []string{fmt.Sprintf("d%d", id)}
			}
			if err != nil {
				return 0, err
			}
		}
		for _, v := range vs {
			v.Commit(changes...)
		}
		done += len(changes)
	}
	return counter, nil
}

// pageChange is one change as the page's live() callback saw it.
type pageChange struct {
	Seq, EntitySeq int64
	Op             string
	ID             *int64  // key.id
	N              *int64  // after.n
	At             float64 // performance.timeOrigin + performance.now() at the callback, ms
	Commit         float64 // the envelope's commitTime, ms since the epoch
	CommitLsn      string  // the envelope's commitLsn: its transaction
}

// TestBrowserPipeline drives Debian's Chromium through a page that keeps
// public.items with the client's live() helper, against the real
// pipeline: a throwaway PostgreSQL, the replicator, the publisher, NATS and
// a sync node. Inserts, updates, key changes and deletes made in SQL
// reach the page: its received stream is checked by journaltest.Validator
// (every committed change once, in commit order, nothing else) and its
// rows equal SELECT * of the table. Its tokens live 2-3 s (getToken) and
// the workload lasts several of them: the one socket is refreshed in place
// (refresh frames, no 4100 close, no second socket) without losing a
// change. It logs the time from each commit to the page's callback (p50,
// p99 over the 1,000 changes), measured in the page, and keeps a
// screenshot of the console showing the same changes arriving live.
func TestBrowserPipeline(t *testing.T) {
	needJS(t, true)
	// The workload's changes, checked against the live() page's stream (v)
	// and the long-lived-token client's (vLong).
	v, vLong := journaltest.New(), journaltest.New()
	var p *browserPipeline
	control := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/control/workload" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		start := time.Now()
		n, err := pipelineWorkload(r.Context(), p.src, []*journaltest.Validator{v, vLong}, pipelineChanges, pipelinePace)
		if err != nil {
			t.Errorf("workload: %v", err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		t.Logf("workload: %d changes committed in %v", pipelineChanges, time.Since(start).Round(time.Millisecond))
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]int{"last": n})
	})
	p = newBrowserPipeline(t, control)
	p.seed(t, `INSERT INTO items SELECT g, 'seed', 0 FROM generate_series(1, 200) g`)

	shot := filepath.Join(artifactDir(t), "console-pipeline.png")
	_ = os.Remove(shot) // a stale one must not pass for this run's
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "test/browser/pipeline.mjs")
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(), "WALCAST_BASE="+p.base, "WALCAST_TOPIC="+pipelineTopic,
		"WALCAST_CONSOLE_TOKEN="+token(t, []string{pipelineTopic}, "", time.Hour),
		"WALCAST_SCREENSHOT="+shot, "CHROMIUM="+chromiumPath())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("browser driver: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	type sockets struct{ Sockets, Refreshes, Refreshed, Tokens int }
	var out struct {
		Stream      []pageChange
		Rows        []map[string]any
		ConsoleRows int
		Errors      []string
		sockets
		Long struct {
			sockets
			Stream []pageChange
			Errors []string
		}
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &out); err != nil {
		t.Fatalf("driver output: %v\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Logf("driver stderr:\n%s", s)
	}

	// 1. The streams: every committed change once, in commit order, to
	// the live() page and to the client of long-lived tokens alike.
	var lats []float64
	for _, c := range out.Stream {
		lats = append(lats, c.At-c.Commit)
	}
	for _, s := range []struct {
		name   string
		v      *journaltest.Validator
		stream []pageChange
	}{{"the live() page's stream", v, out.Stream}, {"the stream of the client of long-lived tokens", vLong, out.Long.Stream}} {
		for _, c := range s.stream {
			var id string
			switch {
			case c.Op == "delete" && c.ID != nil:
				id = fmt.Sprintf("d%d", *c.ID)
			case c.N != nil:
				id = fmt.Sprintf("n%d", *c.N)
			default:
				id = fmt.Sprintf("%s seq %d without key.id or after.n", c.Op, c.Seq)
			}
			s.v.Observe(journaltest.Item{Seq: c.Seq, Entity: pipelineTopic, EntitySeq: c.EntitySeq, ID: id})
		}
		if err := s.v.Check(); err != nil {
			t.Errorf("%s (%d changes):\n%v", s.name, len(s.stream), err)
		}
		if s.v.Observed() != pipelineChanges {
			t.Errorf("%s: %d changes, the workload committed %d", s.name, s.v.Observed(), pipelineChanges)
		}
	}

	// 1b. Whole transactions: the changes of one transaction (the
	// workload's three-change ones) reached the live() callback in one
	// call.
	multi := 0
	byTxn := map[string][]pageChange{}
	for _, c := range out.Stream {
		byTxn[c.CommitLsn] = append(byTxn[c.CommitLsn], c)
	}
	for lsn, cs := range byTxn {
		if len(cs) > 1 {
			multi++
		}
		for _, c := range cs[1:] {
			if c.At != cs[0].At {
				t.Errorf("transaction %s reached the page in more than one callback: %+v", lsn, cs)
				break
			}
		}
	}
	if multi == 0 {
		t.Errorf("the page's stream holds no transaction of several changes")
	}

	// 2. The page's state is the table.
	rows, err := pgx.Connect(context.Background(), p.src)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close(context.Background())
	var table []byte
	if err := rows.QueryRow(context.Background(), `SELECT coalesce(jsonb_agg(to_jsonb(i) ORDER BY id), '[]') FROM items i`).Scan(&table); err != nil {
		t.Fatal(err)
	}
	var want []map[string]any
	if err := json.Unmarshal(table, &want); err != nil {
		t.Fatal(err)
	}
	got := out.Rows
	sort.Slice(got, func(i, j int) bool { return fmt.Sprint(got[i]["id"]) < fmt.Sprint(got[j]["id"]) })
	sort.Slice(want, func(i, j int) bool { return fmt.Sprint(want[i]["id"]) < fmt.Sprint(want[j]["id"]) })
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the page's live rows differ from SELECT * FROM items (%d rows in the page, %d in the table)%s", len(got), len(want), rowsDiff(got, want))
	}

	// 3. Tokens: several expired during the workload, and each was
	// replaced on the open socket by a refresh frame, not by a reconnect.
	st := p.node.Stats()
	if out.Refreshed < 2 || out.Refreshes != out.Refreshed {
		t.Errorf("the page sent %d refresh frames and got %d refreshed answers; want at least 2, all answered", out.Refreshes, out.Refreshed)
	}
	if out.Sockets != 1 || st.Closed["token-expired"] != 0 {
		t.Errorf("the page opened %d sockets and the node closed %d for an expired token; want 1 socket refreshed in place (closes: %v)",
			out.Sockets, st.Closed["token-expired"], st.Closed)
	}
	if len(out.Errors) > 0 {
		t.Errorf("the page's client reported errors: %v", out.Errors)
	}
	// Its token outlives the test: nothing to refresh, one socket.
	if l := out.Long; l.Refreshes != 0 || l.Sockets != 1 || len(l.Errors) > 0 {
		t.Errorf("the client of 40-day tokens sent %d refresh frames over %d sockets (want 0 over 1); errors: %v", l.Refreshes, l.Sockets, l.Errors)
	}

	// 4. The console showed the changes arriving.
	if out.ConsoleRows < 10 {
		t.Errorf("the console showed %d change rows, want at least 10", out.ConsoleRows)
	}
	if _, err := os.Stat(shot); err != nil {
		t.Errorf("no console screenshot: %v", err)
	}

	// The measurement (not an assertion): commit to callback, in the page.
	if len(lats) > 0 {
		slices.Sort(lats)
		q := func(f float64) float64 { return lats[min(len(lats)-1, int(f*float64(len(lats))))] }
		t.Logf("commit → page callback over %d changes: p50 %.1f ms, p99 %.1f ms, max %.1f ms (tokens issued %d, refreshed in place %d, sockets %d)",
			len(lats), q(0.50), q(0.99), lats[len(lats)-1], p.tokens.Load(), out.Refreshed, out.Sockets)
	}
	t.Logf("console screenshot (real pipeline): %s", shot)
}

// artifactDir is where the browser tests keep what outlives them:
// $WALCAST_ARTIFACTS, else a fixed directory under the system's temp.
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("WALCAST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "walcast-browser-test")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// rowsDiff names the first rows where got and want (sorted alike) differ.
func rowsDiff(got, want []map[string]any) string {
	byID := func(rs []map[string]any) map[string]map[string]any {
		m := map[string]map[string]any{}
		for _, r := range rs {
			m[fmt.Sprint(r["id"])] = r
		}
		return m
	}
	g, w := byID(got), byID(want)
	var b strings.Builder
	n := 0
	for id, wr := range w {
		if gr, ok := g[id]; !ok || !reflect.DeepEqual(gr, wr) {
			if n++; n <= 5 {
				fmt.Fprintf(&b, "\n  id %s: page %v, table %v", id, gr, wr)
			}
		}
	}
	for id, gr := range g {
		if _, ok := w[id]; !ok {
			if n++; n <= 5 {
				fmt.Fprintf(&b, "\n  id %s: page %v, not in the table", id, gr)
			}
		}
	}
	return b.String()
}
