package sync

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
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

// The node in these tests is started with no publication and no tenant
// column of its own (StateConfig has neither): its snapshots' scope comes
// from the journal's catalog, which the replicator (--tenant-column tenant,
// publication pub) writes.

func catalogToken(t testing.TB, tenant string, topics ...string) string {
	t.Helper()
	c := Claims{Topics: topics, Tenant: tenant, Snapshot: true, RegisteredClaims: jwt.RegisteredClaims{
		Subject: "test", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(syncJWTSecret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// httpSnapshot GETs /v1/snapshot of topic and returns the status, the row
// frames' envelopes (decoded) and the body of an error.
func httpSnapshot(t *testing.T, env *stateEnv, topic, tok string) (int, []map[string]json.RawMessage, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", env.srv.URL+"/v1/snapshot?topic="+url.QueryEscape(topic), nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, nil, string(b)
	}
	var rows []map[string]json.RawMessage
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var f struct {
			T   string                     `json:"t"`
			Row map[string]json.RawMessage `json:"row"`
			Msg string                     `json:"message"`
		}
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			t.Fatalf("frame %s: %v", sc.Bytes(), err)
		}
		switch f.T {
		case "row":
			rows = append(rows, f.Row)
		case "error":
			t.Fatalf("snapshot of %s ended with an error: %s", topic, f.Msg)
		}
	}
	return resp.StatusCode, rows, ""
}

// socketSnapshot subscribes with "snapshot":true and returns the rows up to
// snapshot-end, or the error frame's message.
func socketSnapshot(t *testing.T, env *stateEnv, topic, tok string) ([]map[string]json.RawMessage, string) {
	t.Helper()
	ws := env.mustDial(tok)
	defer ws.c.Close()
	ws.send(map[string]any{"t": "sub", "topic": topic, "snapshot": true})
	var rows []map[string]json.RawMessage
	for {
		_ = ws.c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, b, err := ws.c.ReadMessage()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		var f struct {
			T   string                     `json:"t"`
			Row map[string]json.RawMessage `json:"row"`
			Msg string                     `json:"message"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatal(err)
		}
		switch f.T {
		case "row":
			rows = append(rows, f.Row)
		case "snapshot-end":
			return rows, ""
		case "error":
			return rows, f.Msg
		}
	}
}

// ids lists the rows' key ids, sorted.
func ids(t *testing.T, rows []map[string]json.RawMessage) []string {
	t.Helper()
	var out []string
	for _, r := range rows {
		var key map[string]json.RawMessage
		if err := json.Unmarshal(r["key"], &key); err != nil {
			t.Fatalf("row %v: %v", r, err)
		}
		out = append(out, string(key["id"]))
	}
	sort.Strings(out)
	return out
}

// A node with no tenant flag serves tenant a its rows and the rows with no
// tenant, never b's, over HTTP and on a socket; a reader with no tenant
// gets only the rows with no tenant.
func TestCatalogTenantScopeWithoutNodeFlags(t *testing.T) {
	env := newStateEnv(t)
	pgtest.MustExec(t, env.src, `INSERT INTO docs VALUES (1, 'a', 'x'), (2, 'b', 'secret of b'), (3, NULL, 'z'), (4, 'a', 'w')`)
	for _, tc := range []struct {
		tenant string
		want   string
	}{{"a", "0,1,3,4"}, {"b", "0,2,3"}, {"", "0,3"}} {
		tok := catalogToken(t, tc.tenant, "public.docs")
		status, rows, msg := httpSnapshot(t, env, "public.docs", tok)
		if status != http.StatusOK {
			t.Fatalf("tenant %q: GET /v1/snapshot %d %s", tc.tenant, status, msg)
		}
		if got := strings.Join(ids(t, rows), ","); got != tc.want {
			t.Errorf("tenant %q over HTTP: rows %s, want %s", tc.tenant, got, tc.want)
		}
		rows, msg = socketSnapshot(t, env, "public.docs", tok)
		if msg != "" {
			t.Fatalf("tenant %q: socket snapshot refused: %s", tc.tenant, msg)
		}
		if got := strings.Join(ids(t, rows), ","); got != tc.want {
			t.Errorf("tenant %q on a socket: rows %s, want %s", tc.tenant, got, tc.want)
		}
		for _, r := range rows {
			if tn := string(r["tenant"]); tn != "" && tn != `"`+tc.tenant+`"` {
				t.Errorf("tenant %q got a row of tenant %s", tc.tenant, tn)
			}
		}
	}
}

// A publication column list and row filter: snapshot rows carry only the
// published columns (never password_hash) and only the rows the filter
// publishes, as the stream's inserts do.
func TestCatalogColumnListAndRowFilter(t *testing.T) {
	env := newStateEnv(t,
		`CREATE TABLE users (id int PRIMARY KEY, tenant text, email text, password_hash text)`,
		`ALTER PUBLICATION pub ADD TABLE users (id, tenant, email) WHERE (id < 100)`,
		`INSERT INTO users VALUES (1, 'a', 'one@example.com', 'hash-1'), (2, 'b', 'two@example.com', 'hash-2'),
			(3, 'a', 'three@example.com', 'hash-3'), (200, 'a', 'filtered@example.com', 'hash-200')`)
	tok := catalogToken(t, "a", "public.users")
	status, hrows, msg := httpSnapshot(t, env, "public.users", tok)
	if status != http.StatusOK {
		t.Fatalf("GET /v1/snapshot: %d %s", status, msg)
	}
	srows, msg := socketSnapshot(t, env, "public.users", tok)
	if msg != "" {
		t.Fatalf("socket snapshot refused: %s", msg)
	}
	for name, rows := range map[string][]map[string]json.RawMessage{"HTTP": hrows, "socket": srows} {
		if got := strings.Join(ids(t, rows), ","); got != "1,3" {
			t.Errorf("%s: rows %s, want 1,3 (tenant a, inside the row filter)", name, got)
		}
		for _, r := range rows {
			var after map[string]json.RawMessage
			if err := json.Unmarshal(r["after"], &after); err != nil {
				t.Fatal(err)
			}
			if _, ok := after["password_hash"]; ok || len(after) != 3 || after["email"] == nil {
				t.Errorf("%s: row %s, want exactly id, tenant and email", name, r["after"])
			}
		}
	}
	// The journal's insert of row 1 has the same columns as its row frame.
	pgtest.MustExec(t, env.src, `INSERT INTO users VALUES (5, 'a', 'five@example.com', 'hash-5')`)
	waitFor(t, "the insert journaled", func() bool {
		res, err := env.j.Changes(context.Background(), journal.Query{Entities: []string{"public.users"}, Tenant: "a", FromOldest: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range res.Changes {
			if strings.Contains(string(e.Envelope), `"key":{"id":5}`) {
				if strings.Contains(string(e.Envelope), "password_hash") {
					t.Fatalf("the stream carries password_hash: %s", e.Envelope)
				}
				return true
			}
		}
		return false
	})
}

// A table that is not published, though the node's source role can read
// it, gets the refusal a missing table gets, word for word.
func TestCatalogUnpublishedTableRefusedAsMissing(t *testing.T) {
	env := newStateEnv(t, `CREATE TABLE hidden (id int PRIMARY KEY, tenant text, val text)`, `INSERT INTO hidden VALUES (1, 'a', 'x')`)
	for _, tc := range []struct{ topic, want string }{
		{"public.hidden", "table public.hidden does not exist in the source database"},
		{"public.nothere", "table public.nothere does not exist in the source database"},
	} {
		tok := catalogToken(t, "a", tc.topic)
		status, _, body := httpSnapshot(t, env, tc.topic, tok)
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal([]byte(body), &e)
		if status != http.StatusUnprocessableEntity || e.Message != tc.want {
			t.Errorf("GET /v1/snapshot of %s: %d %s; want 422 with %q", tc.topic, status, body, tc.want)
		}
		rows, msg := socketSnapshot(t, env, tc.topic, tok)
		if len(rows) != 0 || msg != tc.want+"; the subscription has ended" {
			t.Errorf("socket snapshot of %s: %d rows, error %q; want %q", tc.topic, len(rows), msg, tc.want)
		}
	}
}

// The publication's column list, altered while walcast runs, leaves the
// tenant column out: the table's new changes reach no tenant-scoped and no
// unscoped reader, and its snapshots are refused.
func TestCatalogTenantColumnUnpublishedWhileRunning(t *testing.T) {
	env := newStateEnv(t)
	pgtest.MustExec(t, env.src, `INSERT INTO docs VALUES (1, 'a', 'x')`)
	cursors := map[string]string{}
	for _, tenant := range []string{"a", ""} {
		c := newStateClient(tenant)
		req, _ := http.NewRequest("GET", env.srv.URL+"/v1/snapshot?topic=public.docs", nil)
		req.Header.Set("Authorization", "Bearer "+catalogToken(t, tenant, "public.docs"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if _, err := c.apply(sc.Bytes()); err != nil {
				t.Fatal(err)
			}
		}
		resp.Body.Close()
		if c.snaps != 1 || c.cursor == "" {
			t.Fatalf("tenant %q: no snapshot-end before the alter (%v)", tenant, c.errs)
		}
		cursors[tenant] = c.cursor
	}

	pgtest.MustExec(t, env.src, `ALTER PUBLICATION pub SET TABLE docs (id, val), beat`,
		`INSERT INTO docs VALUES (7, 'a', 'after the alter')`, `UPDATE docs SET val = 'changed after the alter' WHERE id = 1`)
	waitFor(t, "the changes after the alter journaled", func() bool {
		res, err := env.j.Changes(context.Background(), journal.Query{Entities: []string{"public.docs"}, AllTenants: true, FromOldest: true, Limit: journal.MaxLimit})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range res.Changes {
			if e.Op == "quarantine" && e.TenantUnknown {
				n++
			}
		}
		return n == 2
	})
	for tenant, cur := range cursors {
		req, _ := http.NewRequest("GET", env.srv.URL+"/v1/changes?topic=public.docs&cursor="+url.QueryEscape(cur), nil)
		req.Header.Set("Authorization", "Bearer "+catalogToken(t, tenant, "public.docs"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.Contains(string(b), "after the alter") || strings.Contains(string(b), "quarantine") {
			t.Errorf("tenant %q read the changes after the alter: %d %s", tenant, resp.StatusCode, b)
		}
	}
	waitFor(t, "snapshots of public.docs refused", func() bool {
		status, _, body := httpSnapshot(t, env, "public.docs", catalogToken(t, "a", "public.docs"))
		return status == http.StatusUnprocessableEntity && strings.Contains(body, "cannot be scoped to a tenant")
	})
	if _, msg := socketSnapshot(t, env, "public.docs", catalogToken(t, "", "public.docs")); !strings.Contains(msg, "cannot be scoped to a tenant") {
		t.Errorf("socket snapshot for an unscoped reader: error %q", msg)
	}
	if n := env.node.Stats().SnapshotTenantUnknown["table"]; n < 2 {
		t.Errorf("snapshots refused as unscoped counted %d times, want at least 2", n)
	}
}

// A live table that is no longer what its newest catalog entry describes
// is refused as retryable rather than served in a shape the stream does not
// have; once walcast run records the table as it is, it is served again,
// in the new shape.
func TestCatalogLiveTableMismatchRefused(t *testing.T) {
	env := newStateEnv(t)
	ctx := context.Background()
	pgtest.MustExec(t, env.src, `INSERT INTO docs VALUES (1, 'a', 'x')`)
	docs := journal.Table{Schema: "public", Name: "docs"}
	e, ok, err := env.j.Catalog(ctx, docs)
	if err != nil || !ok {
		t.Fatalf("catalog entry of public.docs: ok %v, err %v", ok, err)
	}
	gen, err := env.j.Generation(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// An entry that describes another shape of the table (as after a
	// change walcast run has not recorded yet).
	stale := e
	stale.TableShape = "not the live table's"
	if _, wrote, err := env.j.RecordCatalog(ctx, gen, stale); err != nil || !wrote {
		t.Fatalf("record the stale entry: wrote %v, err %v", wrote, err)
	}
	tok := catalogToken(t, "a", "public.docs")
	status, _, body := httpSnapshot(t, env, "public.docs", tok)
	if status != http.StatusUnprocessableEntity || !strings.Contains(body, "changed in the source database") || !strings.Contains(body, "in a few seconds") {
		t.Fatalf("GET /v1/snapshot under a stale entry: %d %s", status, body)
	}
	if rows, msg := socketSnapshot(t, env, "public.docs", tok); len(rows) != 0 || !strings.Contains(msg, "changed in the source database") {
		t.Fatalf("socket snapshot under a stale entry: %d rows, error %q", len(rows), msg)
	}

	// The table changes for real: walcast run records it, and the rows
	// come with the new column.
	pgtest.MustExec(t, env.src, `ALTER TABLE docs ADD COLUMN extra text DEFAULT 'e'`)
	var rows []map[string]json.RawMessage
	waitFor(t, "the snapshot served again", func() bool {
		status, rows, _ = httpSnapshot(t, env, "public.docs", tok)
		return status == http.StatusOK
	})
	if got := strings.Join(ids(t, rows), ","); got != "0,1" {
		t.Fatalf("rows %s, want 0,1", got)
	}
	for _, r := range rows {
		if !strings.Contains(string(r["after"]), `"extra":"e"`) {
			t.Fatalf("row %s lacks the new column", r["after"])
		}
	}
}

// asciiStateEnv is the pipeline over a source in a SQL_ASCII database
// (where text holds any bytes, so a tenant value can be one the journal
// cannot store) with the journal in an ordinary database.
func asciiStateEnv(t *testing.T, setup ...string) *stateEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := pgtest.Shared(t)
	name := fmt.Sprintf("ascii_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	if err := c.Exec(ctx, "postgres", "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+
		" ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	src := c.URL(name)
	pgtest.MustExec(t, src, append([]string{
		`CREATE TABLE docs (id int PRIMARY KEY, tenant text, val text)`,
		`CREATE TABLE beat (id serial PRIMARY KEY)`,
		`CREATE PUBLICATION pub FOR TABLE docs, beat`,
	}, setup...)...)
	jurl := pgtest.NewDatabase(t)
	j, err := journal.Open(ctx, journal.Config{URL: jurl, CursorSecret: syncTestSecret})
	if err != nil {
		t.Fatal(err)
	}
	ns := natstest.Start(t)
	pubConn, err := nats.Connect(ns.URL(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r, err := replication.New(replication.Config{DatabaseURL: src, Publication: "pub", Slot: stateSlot(t), TenantColumn: "tenant",
		Standby: true, StatusInterval: time.Second, BackoffBase: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
		Logger: logger}, j)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := NewHMACAuth(syncJWTSecret)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); _ = r.Run(ctx) }()
	go func() { // the heartbeat: see newStateEnvWith
		defer wg.Done()
		conn, err := pgx.Connect(ctx, src)
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
	node, err := Open(ctx, Config{NATS: bus.NATSConfig{URL: ns.URL()}, Journal: j, Auth: auth,
		State: StateConfig{SourceURL: src, MaxConcurrent: 2}, Logger: logger})
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
		if err := c.DropDatabase(context.Background(), name); err != nil {
			t.Error(err)
		}
	})
	se := &syncEnv{t: t, url: jurl, j: j, node: node, srv: srv}
	waitFor(t, "the first change to be journaled", func() bool {
		pgtest.MustExec(t, src, `INSERT INTO docs VALUES (0, NULL, 'first') ON CONFLICT (id) DO UPDATE SET val = 'first'`)
		time.Sleep(100 * time.Millisecond)
		return node.known("public.docs")
	})
	return &stateEnv{syncEnv: se, src: src}
}

// A row whose tenant cannot be known (a value the journal cannot carry as
// a tenant) is sent to no reader, tenant-scoped or not.
func TestCatalogUnknownTenantRowWithheld(t *testing.T) {
	env := asciiStateEnv(t)
	pgtest.MustExec(t, env.src, `INSERT INTO docs VALUES (1, 'a', 'x'), (2, E'a\xe9', 'secret'), (3, NULL, 'z')`)
	for _, tc := range []struct{ tenant, want string }{{"a", "0,1,3"}, {"a\u00e9", "0,3"}, {"", "0,3"}} {
		status, rows, msg := httpSnapshot(t, env, "public.docs", catalogToken(t, tc.tenant, "public.docs"))
		if status != http.StatusOK {
			t.Fatalf("tenant %q: %d %s", tc.tenant, status, msg)
		}
		if got := strings.Join(ids(t, rows), ","); got != tc.want {
			t.Errorf("tenant %q: rows %s, want %s", tc.tenant, got, tc.want)
		}
	}
}
