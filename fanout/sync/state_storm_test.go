package sync

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/replication"
)

// liveClient is a "snapshot":true subscriber whose socket is read all the
// time by its own goroutine, which applies every frame to its stateClient
// (an application that keeps up). Tests read the state under mu.
type liveClient struct {
	id int
	ws *wsConn

	mu     sync.Mutex // guards the following fields
	c      *stateClient
	frames []string // the last frames seen, cut short
	before []string // frames up to the first error
	// bareResyncs counts resync frames: a snapshot client is answered
	// with a fresh snapshot instead.
	bareResyncs int
	reasons     []string // snapshot-begin reasons
	readErr     error
	leakErrs    []string // frames a client of this scope must never get
}

// startLiveClient dials with tok, subscribes to public.docs with
// "snapshot":true and reads until the test ends.
func startLiveClient(t *testing.T, env *stateEnv, id int, tenant, tok string) *liveClient {
	t.Helper()
	lc := &liveClient{id: id, ws: env.mustDial(tok), c: newStateClient(tenant)}
	lc.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_, b, err := lc.ws.c.ReadMessage()
			lc.mu.Lock()
			if err != nil {
				lc.readErr = err
				lc.mu.Unlock()
				return
			}
			nerr := len(lc.c.errs)
			f, err := lc.c.apply(b)
			if err != nil {
				lc.c.errs = append(lc.c.errs, err.Error())
			}
			// The last frames, cut short, for the report of the first error.
			lc.frames = append(lc.frames, string(b[:min(len(b), 200)]))
			if len(lc.frames) > 60 && lc.before == nil {
				lc.frames = lc.frames[1:]
			}
			if len(lc.c.errs) > nerr && lc.before == nil {
				lc.before = lc.frames
			}
			if f.T == "resync" {
				lc.bareResyncs++
			}
			if f.T == "snapshot-begin" {
				var r struct {
					Reason string `json:"reason"`
				}
				_ = json.Unmarshal(b, &r)
				lc.reasons = append(lc.reasons, r.Reason)
			}
			if msg := scopeLeak(tenant, b); msg != "" {
				lc.leakErrs = append(lc.leakErrs, msg)
			}
			lc.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lc.ws.c.Close()
		<-done
	})
	return lc
}

// scopeLeak says what is wrong with frame b for a client of scope tenant
// (DESIGN §5): a row or change of another tenant, a tenant-unknown change,
// or, for an unscoped client, any tenant's; "" when nothing is.
func scopeLeak(tenant string, b []byte) string {
	var f struct {
		T      string          `json:"t"`
		Row    json.RawMessage `json:"row"`
		Change json.RawMessage `json:"change"`
	}
	if json.Unmarshal(b, &f) != nil {
		return ""
	}
	body := f.Row
	if f.T == "change" {
		body = f.Change
	}
	if f.T != "row" && f.T != "change" {
		return ""
	}
	var e struct {
		Op            string  `json:"op"`
		Tenant        *string `json:"tenant"`
		TenantUnknown bool    `json:"tenantUnknown"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return fmt.Sprintf("%s frame that does not parse: %v", f.T, err)
	}
	switch {
	case e.TenantUnknown:
		return fmt.Sprintf("tenant-unknown %s %s reached a client of scope %q: %s", f.T, e.Op, tenant, body)
	case e.Tenant != nil && tenant == "":
		return fmt.Sprintf("%s %s of tenant %q reached an unscoped client: %s", f.T, e.Op, *e.Tenant, body)
	case e.Tenant != nil && *e.Tenant != tenant:
		return fmt.Sprintf("%s %s of tenant %q reached a client of tenant %q: %s", f.T, e.Op, *e.Tenant, tenant, body)
	}
	return ""
}

// converged reports whether lc has finished a snapshot and its state equals
// want, and the difference when not.
func (lc *liveClient) converged(want map[string]string) (bool, string) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.readErr != nil {
		return false, "socket ended: " + lc.readErr.Error()
	}
	if lc.c.snaps == 0 || lc.c.inSnap {
		return false, "no snapshot finished yet"
	}
	d := diffStates(lc.c.rows, want)
	return d == "", d
}

// waitConverged waits until every client's state equals the table scoped
// as it is, which must no longer change.
func waitConverged(t *testing.T, env *stateEnv, clients []*liveClient) {
	t.Helper()
	want := map[string]map[string]string{}
	for _, lc := range clients {
		if want[lc.c.tenant] == nil {
			want[lc.c.tenant] = tableState(t, env.src, lc.c.tenant)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, lc := range clients {
		for {
			ok, d := lc.converged(want[lc.c.tenant])
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("client %d (tenant %q): state differs from the table:\n%s", lc.id, lc.c.tenant, d)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (lc *liveClient) check(t *testing.T) {
	t.Helper()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if len(lc.c.errs) > 0 {
		t.Errorf("client %d (tenant %q): %s\nthe frames up to the first error:\n%s", lc.id, lc.c.tenant, strings.Join(lc.c.errs, "; "),
			strings.Join(lc.before, "\n"))
	}
	if len(lc.leakErrs) > 0 {
		t.Errorf("client %d (tenant %q): %d frames out of scope, first: %s", lc.id, lc.c.tenant, len(lc.leakErrs), lc.leakErrs[0])
	}
}

func (lc *liveClient) snapshots() int {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return lc.c.snaps
}

// TestStateStorm100Clients is the validator of "state, then changes" under
// load: while writers insert, update (moving rows to other keys) and delete,
// and a TRUNCATE empties the table half way, 100 clients of two tenants and
// unscoped ones subscribe with "snapshot":true at random moments. Every
// client keeps its state from the frames alone; once the writes stop, each
// must equal a SELECT of the table scoped as it is, with no change applied
// twice or missing (stateClient) and nothing out of scope. Clients whose
// snapshot had ended before the TRUNCATE must have been given a fresh one.
func TestStateStorm100Clients(t *testing.T) {
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) { c.State.MaxConcurrent = 8 })
	const ids = 600
	pgtest.MustExec(t, env.src, fmt.Sprintf(`INSERT INTO docs SELECT g, (ARRAY['a','b',NULL])[g %% 3 + 1], 'seed' FROM generate_series(1, %d) g ON CONFLICT DO NOTHING`, ids))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go stormWriter(t, env.src, uint64(100+w), ids, stop, wg.Done)
	}
	tenants := []string{"a", "b", ""}
	toks := map[string]string{}
	for _, tn := range tenants {
		toks[tn] = stateToken(t, tn, true)
	}
	rng := rand.New(rand.NewPCG(42, 1))
	var clients []*liveClient
	var endedBeforeTruncate []*liveClient
	for i := range 100 {
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond) // random moments during the storm
		if i == 50 {
			for _, lc := range clients {
				if lc.snapshots() > 0 {
					endedBeforeTruncate = append(endedBeforeTruncate, lc)
				}
			}
			pgtest.MustExec(t, env.src, `TRUNCATE docs`)
		}
		tn := tenants[rng.IntN(len(tenants))]
		clients = append(clients, startLiveClient(t, env, i, tn, toks[tn]))
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if len(endedBeforeTruncate) == 0 {
		t.Fatal("no snapshot had ended before the TRUNCATE; the test proves nothing about resnapshots (raise the pause before it)")
	}
	waitConverged(t, env, clients)
	for _, lc := range clients {
		lc.check(t)
	}
	for _, lc := range endedBeforeTruncate {
		if n := lc.snapshots(); n < 2 {
			t.Errorf("client %d's snapshot ended before the TRUNCATE, yet it got %d snapshots, want a fresh one after it", lc.id, n)
		}
	}
	s := env.node.Stats()
	t.Logf("%d clients (%d snapshotted before the TRUNCATE); snapshots %v, %d rows sent", len(clients), len(endedBeforeTruncate), s.Snapshots, s.SnapshotRows)
	if s.Snapshots["failed"] > 0 || s.Snapshots["refused"] > 0 {
		t.Errorf("snapshots by outcome %v: none may fail or be refused", s.Snapshots)
	}
}

// stateTokenTopics signs a snapshot token for topics.
func stateTokenTopics(t testing.TB, tenant string, topics ...string) string {
	t.Helper()
	c := Claims{Topics: topics, Tenant: tenant, Snapshot: true, RegisteredClaims: jwt.RegisteredClaims{
		Subject: "test", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(syncJWTSecret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStateScopeNeverLeaks: rows and changes of other tenants, rows of the
// empty-string tenant for unscoped clients, and tenant-unknown key-only
// deletes (rows older than the journal, so no journaled change names their
// tenant) reach no client out of scope — not in the rows, not in the
// changes delivered between the rows and snapshot-end, not live. Over the
// socket and GET /v1/snapshot.
//
// A writer runs every kind of write all along, so some commit while a
// snapshot reads its rows and come in its changes part; a snapshot whose
// changes part happened to get none is taken again (the part must have
// been exercised for every scope).
func TestStateScopeNeverLeaks(t *testing.T) {
	// Rows 1000..8999 predate the slot: never journaled, so deleting one
	// journals a tenant-unknown delete.
	env := newStateEnv(t, `INSERT INTO docs SELECT g, (ARRAY['a','b',NULL,''])[g % 4 + 1], 'old' FROM generate_series(1000, 8999) g`)
	// Rows 100..199 are journaled: their tenants are known.
	pgtest.MustExec(t, env.src, `INSERT INTO docs SELECT g, (ARRAY['a','b',NULL,''])[g % 4 + 1], 'new' FROM generate_series(100, 199) g`)
	waitJournaled(t, env)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	wconn, err := pgx.Connect(context.Background(), env.src)
	if err != nil {
		t.Fatal(err)
	}
	defer wconn.Close(context.Background())
	go func() {
		defer wg.Done()
		for round := 1; ; round++ {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			// Tenant-unknown deletes of every tenant's rows, ten a round
			// until the old rows are gone (after some 800 rounds).
			lo := 1000 + (round*10)%8000
			for _, sql := range []string{
				fmt.Sprintf(`DELETE FROM docs WHERE id BETWEEN %d AND %d`, lo, lo+9),
				// Known tenants, every one (the client's own too):
				// updates, deletes, inserts.
				fmt.Sprintf(`UPDATE docs SET val = 'r%d' WHERE id BETWEEN 100 AND 199`, round),
				fmt.Sprintf(`DELETE FROM docs WHERE id = %d`, 100+round%100),
				fmt.Sprintf(`INSERT INTO docs SELECT g, (ARRAY['a','b',NULL,''])[g %% 4 + 1], 'ins' FROM generate_series(%d, %d) g`, 10000+round*4, 10003+round*4),
			} {
				if _, err := wconn.Exec(context.Background(), sql); err != nil {
					t.Errorf("writer: %s: %v", sql, err)
					return
				}
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	marker := 30000
	for _, tenant := range []string{"a", "b", "", "A"} {
		between := 0 // change frames between the rows and snapshot-end
		for attempt := 1; between == 0; attempt++ {
			if attempt > 5 {
				t.Fatalf("tenant %q: no snapshot of 5 had a change before its snapshot-end; the changes part went untested", tenant)
			}
			ws := env.mustDial(stateTokenTopics(t, tenant, "public.docs"))
			ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
			c := newStateClient(tenant)
			var leaks []string
			done := false
			for !done || c.rows[fmt.Sprint(marker)] == "" {
				_ = ws.c.SetReadDeadline(time.Now().Add(30 * time.Second))
				_, b, err := ws.c.ReadMessage()
				if err != nil {
					t.Fatalf("tenant %q: read: %v", tenant, err)
				}
				f, err := c.apply(b)
				if err != nil {
					t.Fatal(err)
				}
				if f.T == "change" && c.inSnap {
					between++
				}
				if msg := scopeLeak(tenant, b); msg != "" {
					leaks = append(leaks, msg)
				}
				if f.T == "snapshot-end" && !done {
					done = true
					marker++
					pgtest.MustExec(t, env.src, fmt.Sprintf(`INSERT INTO docs VALUES (%d, NULL, 'marker')`, marker)) // after live changes
				}
			}
			ws.c.Close()
			if len(leaks) > 0 {
				t.Errorf("tenant %q: %d frames out of scope, first: %s", tenant, len(leaks), leaks[0])
			}
			for _, e := range c.errs {
				// A withheld tenant-unknown delete leaves a row no later
				// change of this test touches; nothing may be wrong.
				t.Errorf("tenant %q: %s", tenant, e)
			}
			t.Logf("tenant %q, attempt %d: %d rows, %d changes (%d before snapshot-end)", tenant, attempt, len(c.rows), c.changes, between)
		}
	}

	// GET /v1/snapshot: the same.
	between := 0
	for attempt := 1; between == 0; attempt++ {
		if attempt > 5 {
			t.Fatal("HTTP: no snapshot of 5 had a change before its snapshot-end")
		}
		req, _ := http.NewRequest("GET", env.srv.URL+"/v1/snapshot?topic=public.docs", nil)
		req.Header.Set("Authorization", "Bearer "+stateTokenTopics(t, "b", "public.docs"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(resp.Body)
		inSnap := false
		for dec.More() {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				t.Fatal(err)
			}
			var f stateFrame
			_ = json.Unmarshal(raw, &f)
			switch f.T {
			case "snapshot-begin":
				inSnap = true
			case "change":
				if inSnap {
					between++
				}
			case "snapshot-end":
				inSnap = false
			case "error":
				t.Fatalf("HTTP snapshot: %s", raw)
			}
			if msg := scopeLeak("b", raw); msg != "" {
				t.Errorf("HTTP snapshot of tenant b: %s", msg)
			}
		}
		resp.Body.Close()
	}
}

// waitSnapshotBlocked waits until a snapshot's source session waits for a
// lock.
func waitSnapshotBlocked(t *testing.T, env *stateEnv) {
	t.Helper()
	waitFor(t, "a snapshot waiting for the table lock", func() bool {
		var n int
		err := env.srcQueryRow(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = 'walcast sync (snapshots)' AND wait_event_type = 'Lock'`, &n)
		return err == nil && n > 0
	})
}

func (env *stateEnv) srcQueryRow(t *testing.T, sql string, dst ...any) error {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.src)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dst...)
}

// waitJournaled waits until the journal's watermark has passed the
// source's current WAL position: every commit so far is journaled.
func waitJournaled(t *testing.T, env *stateEnv) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.src)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var text string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&text); err != nil {
		t.Fatal(err)
	}
	var at decoder.LSN
	if err := at.UnmarshalText([]byte(text)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the journal to pass "+text, func() bool {
		wm, err := env.j.Watermark(ctx)
		return err == nil && wm >= at
	})
}

// TestStateResyncResnapshots: the replication slot vanishes under the
// running replicator (changes may be lost), which recreates it
// (--recreate-lost-slot), journals a resync entry and starts a new journal
// epoch. Every "snapshot":true client is answered with a fresh snapshot
// (reason "resync"), not a bare resync, and its state equals the table
// again, the writes the stream lost included.
func TestStateResyncResnapshots(t *testing.T) {
	env := newStateEnvWith(t, func(r *replication.Config, _ *Config) { r.RecreateLostSlot = true })
	pgtest.MustExec(t, env.src, `INSERT INTO docs SELECT g, (ARRAY['a','b',NULL])[g % 3 + 1], 'seed' FROM generate_series(1, 600) g`)
	var clients []*liveClient
	for i, tn := range []string{"a", "b", "", "a", "b", ""} {
		clients = append(clients, startLiveClient(t, env, i, tn, stateToken(t, tn, true)))
	}
	waitConverged(t, env, clients)
	epochs := env.node.Stats().EpochChanges

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.src)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	slot := stateSlot(t)
	waitFor(t, "the slot dropped under the replicator", func() bool {
		_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
		return err == nil
	})
	// Written while the slot is gone (or being recreated): the stream may
	// never carry them.
	pgtest.MustExec(t, env.src, `UPDATE docs SET val = 'lost' WHERE id % 5 = 0`, `DELETE FROM docs WHERE id % 7 = 0`,
		`INSERT INTO docs SELECT g, (ARRAY['a','b',NULL])[g % 3 + 1], 'lost' FROM generate_series(601, 650) g`)
	for _, lc := range clients {
		waitFor(t, fmt.Sprintf("client %d's fresh snapshot", lc.id), func() bool {
			lc.mu.Lock()
			defer lc.mu.Unlock()
			return slices.Contains(lc.reasons, "resync")
		})
	}
	if got := env.node.Stats().EpochChanges; got <= epochs {
		t.Errorf("epoch changes %d → %d: the recreated slot's resync entry must start a new epoch", epochs, got)
	}
	pgtest.MustExec(t, env.src, `UPDATE docs SET val = 'after' WHERE id % 11 = 0`)
	waitConverged(t, env, clients)
	for _, lc := range clients {
		lc.check(t)
		lc.mu.Lock()
		if lc.bareResyncs > 0 {
			t.Errorf("client %d got %d bare resyncs, want a fresh snapshot instead", lc.id, lc.bareResyncs)
		}
		lc.mu.Unlock()
	}
}

// TestStateTruncateDuringSnapshot: a TRUNCATE that commits after a
// snapshot has begun but before it reads its rows. TRUNCATE is not
// MVCC-safe: a transaction whose snapshot predates it reads the table
// empty, so a node that fixed its source snapshot first read no rows and
// then delivered, as changes the rows lacked, deletes and updates of rows
// the client never had (the state at snapshot-end was not the table as of
// its cursor). The node locks the table before fixing the snapshot, so the
// snapshot waits for the TRUNCATE and reads what it left.
func TestStateTruncateDuringSnapshot(t *testing.T) {
	env := newStateEnv(t)
	pgtest.MustExec(t, env.src, `INSERT INTO docs SELECT g, NULL, 'v' FROM generate_series(1, 50) g`)
	waitJournaled(t, env)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.src)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE docs IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	ws := dialState(env, stateToken(t, "", true))
	ws.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	waitSnapshotBlocked(t, env)
	for _, sql := range []string{`DELETE FROM docs WHERE id <= 10`, `UPDATE docs SET val = 'u' WHERE id <= 20`,
		`TRUNCATE docs`, `INSERT INTO docs VALUES (100, NULL, 'after')`} {
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	c := newStateClient("")
	for c.snaps == 0 {
		ws.next(t, c)
	}
	if len(c.errs) > 0 {
		t.Errorf("up to snapshot-end: %s", strings.Join(c.errs, "; "))
	}
	follow(t, env, ws, c)
	if len(c.errs) > 0 {
		t.Errorf("after: %s", strings.Join(c.errs, "; "))
	}
}
