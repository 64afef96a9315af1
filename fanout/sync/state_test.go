package sync

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/fanout/publish"
	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
	"github.com/walcast/walcast/replication"
)

// stateEnv is the whole pipeline on one database: source tables, a real
// replicator journaling them, a real publisher, and a sync node that reads
// the same database as its snapshot source.
type stateEnv struct {
	*syncEnv
	src string // the source (and journal) database
}

func newStateEnv(t *testing.T, setup ...string) *stateEnv {
	t.Helper()
	return newStateEnvWith(t, nil, setup...)
}

// newStateEnvWith is newStateEnv with mod adjusting the replicator's and
// the node's configuration before they start.
func newStateEnvWith(t testing.TB, mod func(*replication.Config, *Config), setup ...string) *stateEnv {
	t.Helper()
	return newStateEnvAt(t, pgtest.NewDatabase(t), mod, setup...)
}

// newStateEnvAt is newStateEnvWith on the database at url.
func newStateEnvAt(t testing.TB, url string, mod func(*replication.Config, *Config), setup ...string) *stateEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pgtest.MustExec(t, url, append([]string{
		`CREATE TABLE docs (id int PRIMARY KEY, tenant text, val text)`,
		`CREATE TABLE beat (id serial PRIMARY KEY)`,
		`CREATE PUBLICATION pub FOR TABLE docs, beat`,
	}, setup...)...)
	j, err := journal.Open(ctx, journal.Config{URL: url, CursorSecret: syncTestSecret})
	if err != nil {
		t.Fatal(err)
	}
	ns := natstest.Start(t)
	pubConn, err := nats.Connect(ns.URL(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	rcfg := replication.Config{DatabaseURL: url, Publication: "pub", Slot: stateSlot(t), TenantColumn: "tenant",
		Standby: true, StatusInterval: time.Second, BackoffBase: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	auth, err := NewHMACAuth(syncJWTSecret)
	if err != nil {
		t.Fatal(err)
	}
	ncfg := Config{NATS: bus.NATSConfig{URL: ns.URL()}, Journal: j, Auth: auth,
		// Every test client has one address and one subject: the
		// per-client share (spool_test.go tests it) would serialize them.
		State:  StateConfig{SourceURL: url, MaxConcurrent: 4, PerClient: 64},
		Logger: slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if mod != nil {
		mod(&rcfg, &ncfg)
	}
	r, err := replication.New(rcfg, j)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); _ = r.Run(ctx) }()
	// A heartbeat: published commits keep the journal's watermark moving
	// past each snapshot's WAL position (docs/sync.md: an idle source
	// delays snapshot-end).
	go func() {
		defer wg.Done()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		for ctx.Err() == nil {
			_, _ = conn.Exec(ctx, `INSERT INTO beat DEFAULT VALUES`)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	p := publish.New(publish.Config{}, j, pubConn)
	go func() { defer wg.Done(); _ = p.Run(ctx) }()
	node, err := Open(ctx, ncfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(node.Handler())
	t.Cleanup(func() {
		srv.Close()
		node.Close()
		cancel()
		wg.Wait()
		pubConn.Close()
		j.Close()
	})
	// The journal knows the entity once its first change is journaled
	// (written again until the slot, created meanwhile, has seen one).
	se := &syncEnv{t: t, url: url, j: j, node: node, srv: srv}
	waitFor(t, "the first change to be journaled", func() bool {
		pgtest.MustExec(t, url, `INSERT INTO docs VALUES (0, NULL, 'first') ON CONFLICT (id) DO UPDATE SET val = 'first'`)
		time.Sleep(100 * time.Millisecond)
		return node.known("public.docs")
	})
	return &stateEnv{syncEnv: se, src: url}
}

type testLog struct{ t testing.TB }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// stateSlot is a slot name of the test's own (slots are per cluster).
func stateSlot(t testing.TB) string {
	return "w" + strings.ToLower(strings.NewReplacer("/", "_", "-", "_").Replace(t.Name()))
}

func stateToken(t testing.TB, tenant string, snapshot bool) string {
	t.Helper()
	c := Claims{Topics: []string{"public.docs"}, Tenant: tenant, Snapshot: snapshot, RegisteredClaims: jwt.RegisteredClaims{
		Subject: "test", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(syncJWTSecret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// stateClient keeps a client's state of public.docs from the frames of a
// "snapshot":true subscription, as an application would: rows and changes
// applied to a map by key. It records what no correct stream can cause.
type stateClient struct {
	tenant  string
	rows    map[string]string // id → the after row's JSON, normalized
	inSnap  bool
	snaps   int // snapshot-ends seen
	cursor  string
	errs    []string
	changes int
}

func newStateClient(tenant string) *stateClient {
	return &stateClient{tenant: tenant, rows: map[string]string{}}
}

type stateFrame struct {
	T      string          `json:"t"`
	Cursor string          `json:"cursor"`
	Code   string          `json:"code"`
	Msg    string          `json:"message"`
	Row    json.RawMessage `json:"row"`
	Change json.RawMessage `json:"change"`
}

type stateEnvelope struct {
	Op     string                     `json:"op"`
	Key    map[string]json.RawMessage `json:"key"`
	Before map[string]json.RawMessage `json:"before"`
	After  map[string]json.RawMessage `json:"after"`
	Tenant *string                    `json:"tenant"`
}

func normRow(m map[string]json.RawMessage) string {
	var tenant, val string = "null", "null"
	if v, ok := m["tenant"]; ok {
		tenant = string(v)
	}
	if v, ok := m["val"]; ok {
		val = string(v)
	}
	return tenant + "|" + val
}

func (c *stateClient) apply(b []byte) (stateFrame, error) {
	var f stateFrame
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("frame %s: %w", b, err)
	}
	switch f.T {
	case "snapshot-begin":
		c.rows, c.inSnap = map[string]string{}, true
	case "row":
		var e stateEnvelope
		if err := json.Unmarshal(f.Row, &e); err != nil {
			return f, err
		}
		if e.Op != "read" {
			c.errs = append(c.errs, "row frame with op "+e.Op)
		}
		if e.Tenant != nil && *e.Tenant != c.tenant {
			c.errs = append(c.errs, fmt.Sprintf("row of tenant %q in the snapshot of tenant %q", *e.Tenant, c.tenant))
		}
		id := string(e.Key["id"])
		if _, dup := c.rows[id]; dup {
			c.errs = append(c.errs, "row "+id+" twice in one snapshot")
		}
		c.rows[id] = normRow(e.After)
	case "change":
		var e stateEnvelope
		if err := json.Unmarshal(f.Change, &e); err != nil {
			return f, err
		}
		c.changes++
		switch e.Op {
		case "insert":
			id := string(e.Key["id"])
			if _, dup := c.rows[id]; dup {
				// Keys are unique and tenants never change here: an insert
				// of a key the state has means a change delivered twice
				// (or one the rows already held).
				c.errs = append(c.errs, "insert of "+id+" already in the state")
			}
			c.rows[id] = normRow(e.After)
		case "update", "read":
			if e.Before != nil {
				delete(c.rows, string(e.Before["id"]))
			}
			c.rows[string(e.Key["id"])] = normRow(e.After)
		case "delete":
			id := string(e.Key["id"])
			if _, ok := c.rows[id]; !ok {
				c.errs = append(c.errs, "delete of "+id+" not in the state")
			}
			delete(c.rows, id)
		case "truncate":
			c.rows = map[string]string{}
		}
		if f.Cursor != "" {
			c.cursor = f.Cursor
		}
	case "snapshot-end":
		c.inSnap, c.cursor = false, f.Cursor
		c.snaps++
	case "error":
		c.errs = append(c.errs, "error frame "+f.Code+": "+f.Msg)
	}
	return f, nil
}

// tableState is SELECT of public.docs scoped as the client is.
func tableState(t *testing.T, url, tenant string) map[string]string {
	t.Helper()
	return scopedRows(t, url, "docs", tenant)
}

// scopedRows is SELECT of table (with columns id, tenant and val) scoped
// as a client of tenant is: its tenant's rows and those with no tenant.
func scopedRows(t *testing.T, url, table, tenant string) map[string]string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	q := `SELECT id, json_build_object('tenant', tenant, 'val', val)::text FROM ` + table + ` WHERE tenant IS NULL`
	args := []any{}
	if tenant != "" {
		q += ` OR tenant = $1`
		args = append(args, tenant)
	}
	rows, err := conn.Query(ctx, q, args...)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var id int
		var obj string
		if err := rows.Scan(&id, &obj); err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(obj), &m); err != nil {
			t.Fatal(err)
		}
		out[fmt.Sprint(id)] = normRow(m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func diffStates(got, want map[string]string) string {
	var d []string
	for k, v := range want {
		if got[k] != v {
			d = append(d, fmt.Sprintf("%s: client %q table %q", k, got[k], v))
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			d = append(d, fmt.Sprintf("%s: client %q, not in the table", k, v))
		}
	}
	sort.Strings(d)
	if len(d) > 10 {
		d = append(d[:10], fmt.Sprintf("… %d more", len(d)-10))
	}
	return strings.Join(d, "\n")
}

// stateConn is a socket read by its own goroutine into frames.
type stateConn struct {
	ws     *wsConn
	frames chan []byte
	err    chan error
}

func dialState(env *stateEnv, tok string) *stateConn {
	sc := &stateConn{ws: env.mustDial(tok), frames: make(chan []byte, 1024), err: make(chan error, 1)}
	go func() {
		for {
			_, b, err := sc.ws.c.ReadMessage()
			if err != nil {
				sc.err <- err
				return
			}
			sc.frames <- b
		}
	}()
	return sc
}

// next is the socket's next frame, applied to c.
func (sc *stateConn) next(t *testing.T, c *stateClient) stateFrame {
	t.Helper()
	select {
	case b := <-sc.frames:
		f, err := c.apply(b)
		if err != nil {
			t.Fatal(err)
		}
		return f
	case err := <-sc.err:
		t.Fatalf("read: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("no frame within 60 s")
	}
	return stateFrame{}
}

// follow reads c's socket until the client's state equals the table (scoped
// as the client is) after its snapshot-end, failing after 60 s.
func follow(t *testing.T, env *stateEnv, sc *stateConn, c *stateClient) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		if c.snaps > 0 && !c.inSnap && len(sc.frames) == 0 {
			if diffStates(c.rows, tableState(t, env.src, c.tenant)) == "" {
				return
			}
		}
		select {
		case b := <-sc.frames:
			if _, err := c.apply(b); err != nil {
				t.Fatal(err)
			}
		case err := <-sc.err:
			t.Fatalf("read: %v", err)
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatalf("client of tenant %q: state differs from the table after 60 s:\n%s", c.tenant, diffStates(c.rows, tableState(t, env.src, c.tenant)))
		}
	}
}

// writer runs random transactions on public.docs until stop: inserts,
// updates (some moving a row to another key), deletes, over ids 1..n of
// tenants a, b and none (a row keeps its tenant).
func stormWriter(t *testing.T, url string, seed uint64, n int, stop <-chan struct{}, done func()) {
	defer done()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close(ctx)
	rng := rand.New(rand.NewPCG(seed, 7))
	tenants := []any{"a", "b", nil}
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		id := rng.IntN(n) + 1
		var sql string
		var args []any
		switch rng.IntN(6) {
		case 0, 1:
			// The tenant is a function of the id, so no row changes tenant.
			sql, args = `INSERT INTO docs VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, []any{id, tenants[id%3], fmt.Sprint("v", i)}
		case 2, 3:
			sql, args = `UPDATE docs SET val = $2 WHERE id = $1`, []any{id, fmt.Sprint("u", i)}
		case 4:
			// A key change within the same tenant (ids congruent mod 3).
			to := id + 3*(rng.IntN(5)+1)
			if to > n {
				to = id - 3
			}
			sql, args = `UPDATE docs SET id = $2 WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM docs WHERE id = $2)`, []any{id, to}
		case 5:
			sql, args = `DELETE FROM docs WHERE id = $1`, []any{id}
		}
		if _, err := conn.Exec(ctx, sql, args...); err != nil && !strings.Contains(err.Error(), "duplicate key") {
			t.Error(err)
			return
		}
	}
}

// TestStateUnderConcurrentWriters: clients of two tenants and an unscoped
// one subscribe with "snapshot":true at random moments while writers
// insert, update (with key changes) and delete; each client's rows and then
// changes must rebuild the table exactly as scoped: no change twice, none
// missing, no row of another tenant.
func TestStateUnderConcurrentWriters(t *testing.T) {
	env := newStateEnv(t)
	// Rows that predate the clients, many enough that snapshots take a
	// while and overlap the writes.
	pgtest.MustExec(t, env.src, `INSERT INTO docs SELECT g, (ARRAY['a','b',NULL])[g % 3 + 1], 'seed' FROM generate_series(1, 3000) g ON CONFLICT DO NOTHING`)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go stormWriter(t, env.src, uint64(w+1), 3000, stop, wg.Done)
	}
	type sub struct {
		ws *stateConn
		c  *stateClient
	}
	var subs []sub
	tenants := []string{"a", "b", ""}
	for i := range 9 {
		time.Sleep(time.Duration(rand.IntN(150)) * time.Millisecond) // random moments during the storm
		tenant := tenants[i%3]
		ws := dialState(env, stateToken(t, tenant, true))
		ws.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
		subs = append(subs, sub{ws, newStateClient(tenant)})
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	for _, s := range subs {
		follow(t, env, s.ws, s.c)
		if len(s.c.errs) > 0 {
			t.Errorf("client of tenant %q: %s", s.c.tenant, strings.Join(s.c.errs, "; "))
		}
	}
	// A reconnect with the snapshot-end's cursor resumes exactly: the
	// last client's cursor, applied to its state, keeps it equal after
	// more writes.
	last := subs[len(subs)-1]
	last.ws.ws.c.Close()
	ws := dialState(env, stateToken(t, last.c.tenant, true))
	ws.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "cursor": last.c.cursor, "snapshot": true})
	pgtest.MustExec(t, env.src, `UPDATE docs SET val = 'after' WHERE id % 7 = 0`, `DELETE FROM docs WHERE id % 11 = 0`)
	if f := ws.next(t, last.c); f.T != "subscribed" {
		t.Fatalf("a resume with the snapshot-end's cursor got %+v, want subscribed (no snapshot, no resync)", f)
	}
	follow(t, env, ws, last.c)
	if len(last.c.errs) > 0 {
		t.Errorf("resumed client: %s", strings.Join(last.c.errs, "; "))
	}
}

// TestStateScopedAndRefused: a tenant's snapshot holds its rows and rows
// without a tenant, an unscoped one only the latter; a token without the
// snapshot claim is refused with an error frame; a row frame is shaped as
// the insert of the same row.
func TestStateScopedAndRefused(t *testing.T) {
	env := newStateEnv(t)
	pgtest.MustExec(t, env.src, `INSERT INTO docs VALUES (1, 'a', 'x'), (2, 'b', 'y'), (3, NULL, 'z'), (4, 'a ', 'w')`)
	// The insert of row 1 as journaled, to compare the row frame with.
	var insert []byte
	waitFor(t, "row 1's insert journaled", func() bool {
		res, err := env.j.Changes(context.Background(), journal.Query{Entities: []string{"public.docs"}, Tenant: "a", FromOldest: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range res.Changes {
			if strings.Contains(string(e.Envelope), `"key":{"id":1}`) {
				insert = e.Envelope
				return true
			}
		}
		return false
	})
	for _, tc := range []struct {
		tenant string
		want   []string
	}{{"a", []string{"0", "1", "3"}}, {"", []string{"0", "3"}}, {"a ", []string{"0", "3", "4"}}} {
		ws := dialState(env, stateToken(t, tc.tenant, true))
		ws.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
		c := newStateClient(tc.tenant)
		var row1 []byte
		for c.snaps == 0 {
			f := ws.next(t, c)
			if f.T == "row" && strings.Contains(string(f.Row), `"key":{"id":1}`) {
				row1 = f.Row
			}
		}
		var got []string
		for k := range c.rows {
			got = append(got, k)
		}
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(tc.want, ",") || len(c.errs) > 0 {
			t.Errorf("tenant %q: rows %v, want %v; %v", tc.tenant, got, tc.want, c.errs)
		}
		if tc.tenant == "a" {
			var ins, row map[string]json.RawMessage
			_ = json.Unmarshal(insert, &ins)
			_ = json.Unmarshal(row1, &row)
			for _, k := range []string{"key", "after", "tenant", "entity"} {
				if string(ins[k]) != string(row[k]) {
					t.Errorf("row frame %s = %s, the insert's %s", k, row[k], ins[k])
				}
			}
			if string(row["op"]) != `"read"` {
				t.Errorf("row op %s", row["op"])
			}
		}
	}
	ws := env.mustDial(stateToken(t, "a", false))
	ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	f := ws.expect("error")
	if f.Code != "forbidden" || !strings.Contains(f.Message, `"snapshot": true`) || f.Topic != "public.docs" {
		t.Errorf("refusal %+v", f)
	}
}

// TestStateTruncateResnapshots: a TRUNCATE reaches a "snapshot":true client
// as the truncate change and then a fresh snapshot, not a resync.
func TestStateTruncateResnapshots(t *testing.T) {
	env := newStateEnv(t)
	ws := dialState(env, stateToken(t, "", true))
	ws.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	c := newStateClient("")
	follow(t, env, ws, c)
	pgtest.MustExec(t, env.src, `TRUNCATE docs`, `INSERT INTO docs VALUES (9, NULL, 'after')`)
	var kinds []string
	for c.snaps < 2 {
		f := ws.next(t, c)
		kinds = append(kinds, f.T)
		if f.T == "resync" {
			t.Fatalf("got a resync, want a fresh snapshot: %v", kinds)
		}
	}
	if kinds[0] != "change" || kinds[1] != "snapshot-begin" {
		t.Errorf("frames after the truncate: %v", kinds)
	}
	follow(t, env, ws, c)
	if len(c.errs) > 0 {
		t.Error(c.errs)
	}
}

// TestStateTruncateFromTheJournalResnapshots: a "snapshot":true
// subscription that resumes from a cursor and reads a TRUNCATE from the
// journal gets a fresh snapshot after it, as a live one does; its state
// ends equal to the table.
func TestStateTruncateFromTheJournalResnapshots(t *testing.T) {
	env := newStateEnv(t)
	pgtest.MustExec(t, env.src, `INSERT INTO docs SELECT g, NULL, 'v' FROM generate_series(1, 5) g`)
	first := dialState(env, stateToken(t, "", true))
	first.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	fc := newStateClient("")
	follow(t, env, first, fc)
	from := fc.cursor
	pgtest.MustExec(t, env.src, `TRUNCATE docs`, `INSERT INTO docs VALUES (9, NULL, 'after')`)
	follow(t, env, first, fc) // journaled: the first client saw it live
	if fc.snaps != 2 {
		t.Fatalf("live: %d snapshots, want 2", fc.snaps)
	}

	sc := dialState(env, stateToken(t, "", true))
	sc.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true, "cursor": from})
	c := newStateClient("")
	var kinds []string
	for c.snaps < 1 {
		f := sc.next(t, c)
		kinds = append(kinds, f.T)
	}
	if len(kinds) < 3 || kinds[0] != "subscribed" || kinds[1] != "change" || kinds[2] != "snapshot-begin" {
		t.Fatalf("frames from the cursor: %v, want subscribed, the truncate, then a snapshot", kinds)
	}
	follow(t, env, sc, c)
	if len(c.errs) > 0 || len(fc.errs) > 0 {
		t.Error(c.errs, fc.errs)
	}
}

// TestStateHTTP: GET /v1/snapshot streams the same frames as NDJSON, the
// last one the snapshot-end with a cursor GET /v1/changes continues from.
func TestStateHTTP(t *testing.T) {
	env := newStateEnv(t)
	pgtest.MustExec(t, env.src, `INSERT INTO docs SELECT g, 'a', 'v' FROM generate_series(1, 1200) g`)
	get := func(path, tok string) *http.Response {
		req, _ := http.NewRequest("GET", env.srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := get("/v1/snapshot?topic=public.docs", stateToken(t, "a", false))
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("without the claim: %d", resp.StatusCode)
	}
	resp.Body.Close()
	resp = get("/v1/snapshot?topic=public.docs", stateToken(t, "a", true))
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	c := newStateClient("a")
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if _, err := c.apply(sc.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	if c.snaps != 1 || len(c.errs) > 0 {
		t.Fatalf("snapshot-ends %d, errors %v", c.snaps, c.errs)
	}
	if d := diffStates(c.rows, tableState(t, env.src, "a")); d != "" {
		t.Fatalf("NDJSON snapshot differs from the table:\n%s", d)
	}
	pgtest.MustExec(t, env.src, `DELETE FROM docs WHERE id = 5`)
	waitFor(t, "the delete after the snapshot read from its cursor", func() bool {
		resp := get("/v1/changes?topic=public.docs&cursor="+url.QueryEscape(c.cursor), stateToken(t, "a", true))
		defer resp.Body.Close()
		var out changesResponse
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		if out.ResyncRequired {
			t.Fatalf("the snapshot-end cursor needs a resync: %+v", out)
		}
		for _, ch := range out.Changes {
			if _, err := c.apply([]byte(`{"t":"change","change":` + string(ch) + `}`)); err != nil {
				t.Fatal(err)
			}
		}
		c.cursor = out.Cursor
		return c.changes > 0
	})
	if d := diffStates(c.rows, tableState(t, env.src, "a")); d != "" || len(c.errs) > 0 || c.changes != 1 {
		t.Fatalf("after the delete (%d changes, %v):\n%s", c.changes, c.errs, d)
	}
}
