package sync

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
	"github.com/walcast/walcast/replication"
)

// dbName is the database of a pgtest URL.
func dbName(url string) string { return url[strings.LastIndex(url, "/")+1 : strings.Index(url, "?")] }

// expectRun reads change frames until it has seqs from..to, failing on a
// frame out of order, twice, missing, or a resync or error frame. Position,
// pong and subscribed frames are skipped.
func (c *wsConn) expectRun(who string, from, to int64) {
	c.t.Helper()
	next := from
	for next <= to {
		f := c.read()
		switch f.T {
		case "change":
			if f.env.Seq != next {
				c.t.Fatalf("%s: change seq %d, want %d (every change once, in order)", who, f.env.Seq, next)
			}
			next++
		case "subscribed", "position", "pong":
		default:
			c.t.Fatalf("%s: frame %s %s %s while expecting seq %d", who, f.T, f.Code, f.Message, next)
		}
	}
}

// A node whose journal reads go to a hot standby (--journal-read-url):
// while the standby's replay is paused, a client catching up from a cursor
// and a live client repairing a lost message get every change once and in
// order — the reads the standby cannot answer wait for it and then go to
// the journal's server, which the standby metrics count — and after replay
// resumes the standby serves them again.
func TestJournalStandbyCatchUpAndRepair(t *testing.T) {
	ctx := syncCtx(t)
	primary := pgtest.Start(t, pgtest.Options{})
	url := primary.NewDatabase(t)
	j0, err := journal.Open(ctx, journal.Config{URL: url, CursorSecret: syncTestSecret}) // the schema, before the base backup
	if err != nil {
		t.Fatal(err)
	}
	j0.Close()
	standby := primary.StartStandby(t)
	e := newSyncEnvAt(t, url, func(c *journal.Config) {
		c.ReadURL = standby.URL(dbName(url))
		c.ReadMaxWait = 200 * time.Millisecond
	})
	q := journal.Query{Entities: []string{orders}}
	cursorAt := func(pos int64) string {
		c, err := e.j.CursorAt(q, 0, pos)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	tok := token(t, []string{orders}, "", time.Hour)
	for i := range 20 {
		e.commit(ins(orders, i+1))
	}
	if err := standby.CatchUp(ctx, primary); err != nil {
		t.Fatal(err)
	}
	live := e.mustDial(tok)
	live.sub(orders, cursorAt(20))
	live.expect("subscribed")
	e.topicLive(orders, 1)
	before := e.node.Stats().JournalStandby

	if err := standby.PauseReplay(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		e.commit(ins(orders, 21+i)) // seqs 21..30
	}
	e.appendRows(ins(orders, 31)) // seq 31: journaled, its message lost on the way
	e.commit(ins(orders, 32))     // seq 32: the entitySeq jump makes the node repair from the journal
	late := e.mustDial(tok)
	late.sub(orders, cursorAt(5)) // a client catching up from far behind the standby too
	live.expectRun("live client (repair)", 21, 32)
	late.expectRun("client from seq 5", 6, 32)
	during := e.node.Stats().JournalStandby
	if during.Waits == before.Waits || during.Fallbacks[journal.FallbackBehind] == before.Fallbacks[journal.FallbackBehind] {
		t.Fatalf("standby stats while replay was paused: %+v (before %+v): want waits and fallbacks (behind)", during, before)
	}

	if err := standby.ResumeReplay(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		e.commit(ins(orders, 33+i)) // seqs 33..40
	}
	if err := standby.CatchUp(ctx, primary); err != nil {
		t.Fatal(err)
	}
	after := e.mustDial(tok)
	after.sub(orders, cursorAt(10))
	live.expectRun("live client", 33, 40)
	late.expectRun("client from seq 5", 33, 40)
	after.expectRun("client from seq 10 after replay resumed", 11, 40)
	end := e.node.Stats().JournalStandby
	if end.Reads == during.Reads {
		t.Fatalf("no journal read reached the standby after replay resumed: %+v", end)
	}
}

// A snapshot whose source (--database-url) is a hot standby, taken while
// writers change the table and while the standby's replay is paused, then
// after it resumes: every client's rows and changes rebuild the primary's
// table exactly — no change missing, none twice (stateClient) — though the
// standby's snapshot lists no transaction in progress and stands far behind
// the journal.
func TestSnapshotFromHotStandby(t *testing.T) {
	ctx := syncCtx(t)
	primary := pgtest.Start(t, pgtest.Options{})
	url := primary.NewDatabase(t)
	standby := primary.StartStandby(t)
	env := newStateEnvAt(t, url, func(_ *replication.Config, c *Config) { c.State.SourceURL = standby.URL(dbName(url)) })
	pgtest.MustExec(t, env.src, `INSERT INTO docs SELECT g, (ARRAY['a','b',NULL])[g % 3 + 1], 'seed' FROM generate_series(1, 2000) g ON CONFLICT DO NOTHING`)
	if err := standby.CatchUp(ctx, primary); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go stormWriter(t, env.src, uint64(w+11), 2000, stop, wg.Done)
	}
	type sub struct {
		ws *stateConn
		c  *stateClient
	}
	var subs []sub
	subscribe := func(tenant string) {
		ws := dialState(env, stateToken(t, tenant, true))
		ws.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
		subs = append(subs, sub{ws, newStateClient(tenant)})
	}
	// A transaction that takes its xid before the writers' next ones and
	// commits after the standby stops replaying: the standby counts it as
	// running, but its snapshot's xip list is empty, so only the replay
	// position tells that the rows lack it.
	held, err := pgx.Connect(ctx, env.src)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close(ctx)
	heldTx, err := held.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := heldTx.Exec(ctx, `INSERT INTO docs VALUES (5000, NULL, 'held')`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	subscribe("a") // replaying
	time.Sleep(200 * time.Millisecond)
	if err := standby.CatchUp(ctx, primary); err != nil {
		t.Fatal(err)
	}
	if err := standby.PauseReplay(ctx); err != nil {
		t.Fatal(err)
	}
	if err := heldTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the primary and the journal move on
	subscribe("")                      // from the paused standby
	subscribe("b")
	time.Sleep(300 * time.Millisecond)
	if err := standby.ResumeReplay(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	subscribe("a") // replaying again, catching up
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	for i, s := range subs {
		follow(t, env, s.ws, s.c)
		if len(s.c.errs) > 0 {
			t.Errorf("client %d (tenant %q): %s", i, s.c.tenant, strings.Join(s.c.errs, "; "))
		}
	}
	if st := env.node.Stats(); st.Snapshots["done"] < int64(len(subs)) {
		t.Fatalf("snapshots %v, want %d done", st.Snapshots, len(subs))
	}
}
