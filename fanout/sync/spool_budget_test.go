package sync

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
	"github.com/walcast/walcast/replication"
)

// TestCatchUpFarCursorAnsweredResync: a socket subscribing with a cursor
// further behind the journal's horizon than MaxReplayEntries gets a
// resync at the horizon instead of a replay: no page of the old range is
// read, no old change is sent.
func TestCatchUpFarCursorAnsweredResync(t *testing.T) {
	e := newSyncEnv(t, func(c *Config) { c.MaxReplayEntries = 50 })
	var rows []row
	for i := range 200 {
		rows = append(rows, ins(orders, i))
	}
	es := e.commit(rows...)
	last := es[len(es)-1].Seq
	waitFor(t, "the node to know the horizon", func() bool { return e.node.horizonKnown.Load() && e.node.horizon.Load() >= last })
	cur, _ := e.j.CursorAt(journal.Query{Entities: []string{orders}}, e.node.epoch.Load(), es[0].Seq-1)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c.sub(orders, cur)
	c.expect("subscribed")
	f := c.expect("resync")
	pos, err := e.j.CursorPosition(f.Cursor)
	if err != nil || pos != last {
		t.Fatalf("resync at %d (%v), want the horizon %d", pos, err, last)
	}
	if f, err := c.tryRead(500 * time.Millisecond); err == nil {
		t.Fatalf("after the resync: %+v", f)
	}
	s := e.node.Stats()
	t.Logf("cursor %d entries behind: resync; journal pages read %d; repairs %v", last-es[0].Seq+1, e.node.reads.queries.Load(), s.Repairs)
	if q := e.node.reads.queries.Load(); q > 1 {
		t.Errorf("%d journal pages read for a cursor past --max-replay-entries; want at most the one at the horizon", q)
	}
	if s.Repairs["replay-too-far"] != 1 {
		t.Errorf("repairs %v, want one replay-too-far", s.Repairs)
	}
}

// TestCatchUpChargedToClient: a socket's catch-up page takes a token of
// the client's read budget (--changes-rate), so the same client's GET
// /v1/changes right after it is refused with 429 and Retry-After.
func TestCatchUpChargedToClient(t *testing.T) {
	e := newSyncEnv(t, func(c *Config) { c.ChangesRate, c.ChangesBurst = 0.01, 1 })
	es := e.commit(ins(orders, 1), ins(orders, 2))
	tok := token(t, []string{orders}, "", time.Hour)
	cur, _ := e.j.CursorAt(journal.Query{Entities: []string{orders}}, e.node.epoch.Load(), es[0].Seq-1)
	c := e.mustDial(tok)
	c.sub(orders, cur)
	c.expect("subscribed")
	c.expectChanges(len(es))
	resp, err := http.Get(e.srv.URL + "/v1/changes?topic=" + orders + "&access_token=" + url.QueryEscape(tok))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	t.Logf("GET /v1/changes after a socket catch-up of the same client: %s, Retry-After %q", resp.Status, resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("GET /v1/changes after the socket's catch-up spent the client's only read: %s; want 429 with Retry-After", resp.Status)
	}
}

// TestCatchUpCancelledOnUnsub: an unsub ends the member's journal read in
// flight at once, though the socket stays open.
func TestCatchUpCancelledOnUnsub(t *testing.T) {
	e := newSyncEnv(t)
	es := e.commit(ins(orders, 1))
	started, canceled := blockReads(e)
	cur, _ := e.j.CursorAt(journal.Query{Entities: []string{orders}}, e.node.epoch.Load(), es[0].Seq-1)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c.sub(orders, cur)
	c.expect("subscribed")
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("catch-up read did not start")
	}
	c.send(map[string]string{"t": "unsub", "topic": orders})
	select {
	case <-canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the catch-up read went on after the unsub")
	}
	e.node.reads.testHook.Store(nil)
	c.send(map[string]string{"t": "ping"})
	c.expect("pong") // the socket is still open
}

// TestMemoryBoundRefuses: with a client that does not read holding more
// than --max-memory-bytes in its socket's queue, a new socket is refused
// with 503 and Retry-After and counted; once that client is gone the
// node's memory is back to zero and sockets are accepted again.
func TestMemoryBoundRefuses(t *testing.T) {
	// Half of the one catch-up page the slow socket queues (about 70 KB):
	// what the kernel's socket buffers take off the queue cannot bring it
	// under the bound.
	const memBound = 32 << 10
	e := newSyncEnv(t, func(c *Config) {
		c.MaxMemoryBytes, c.MaxBufferedBytes, c.sndBuf = memBound, 256<<10, 4096
		// The slow socket must hold its queue until the test closes it,
		// however long a loaded machine takes over the steps between.
		c.MaxLag, c.WriteTimeout, c.IdleTimeout = -1, time.Hour, time.Hour
	})
	var rows []row
	for i := range 400 {
		rows = append(rows, row{entity: orders, op: decoder.OpInsert, id: i, pad: 2000})
	}
	es := e.commit(rows...)
	tok := token(t, []string{orders}, "", time.Hour)
	cur, _ := e.j.CursorAt(journal.Query{Entities: []string{orders}}, e.node.epoch.Load(), es[0].Seq-1)
	slow, _, err := e.dial(tok, 4096)
	if err != nil {
		t.Fatal(err)
	}
	slow.sub(orders, cur)
	waitFor(t, "the slow client's queue past the bound", func() bool { return e.node.Stats().MemoryBytes >= memBound })
	_, resp, err := e.dial(tok, 0)
	if err == nil || resp == nil {
		t.Fatalf("a socket was accepted with %d bytes queued, --max-memory-bytes %d", e.node.Stats().MemoryBytes, memBound)
	}
	s := e.node.Stats()
	t.Logf("memory %d bytes: new socket %s, Retry-After %q, rejected %v", s.MemoryBytes, resp.Status, resp.Header.Get("Retry-After"), s.Rejected)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("refused with %s, Retry-After %q; want 503 with Retry-After", resp.Status, resp.Header.Get("Retry-After"))
	}
	// The same bound holds on every path that makes the node hold more:
	// a Server-Sent Events stream and a journal read over HTTP.
	// A stream that was not refused would never end: the client gives up.
	hc := &http.Client{Timeout: 30 * time.Second}
	for _, path := range []string{"/v1/events?topic=" + orders, "/v1/changes?topic=" + orders} {
		if m := e.node.Stats().MemoryBytes; m < memBound {
			t.Fatalf("the slow socket's queue drained to %d bytes before GET %s", m, path)
		}
		req, _ := http.NewRequest("GET", e.srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "--max-memory-bytes") {
			t.Errorf("GET %s at the memory bound: %s, Retry-After %q, %s; want 503 with Retry-After naming --max-memory-bytes", path, resp.Status, resp.Header.Get("Retry-After"), b)
		}
	}
	if s := e.node.Stats(); s.Rejected["memory"] != 3 {
		t.Errorf("rejected %v, want three for memory (socket, events, changes)", s.Rejected)
	}
	_ = slow.c.Close()
	waitFor(t, "the node's memory to drain", func() bool { return e.node.Stats().MemoryBytes == 0 })
	ok := e.mustDial(tok)
	ok.send(map[string]string{"t": "ping"})
	ok.expect("pong")
}

// TestSnapshotRefusalsNameTheFix: a table whose rows would pass
// --snapshot-spool-bytes is refused with a message naming the flag (and
// the spool holds nothing afterwards); a table kept under an ACCESS
// EXCLUSIVE lock through every lock attempt is refused with a message
// saying so, and the lock holder never waited for the node.
func TestSnapshotRefusalsNameTheFix(t *testing.T) {
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) { c.State.SpoolBytes = 64 << 10 },
		`INSERT INTO docs SELECT g, 'a', repeat('v', 100) FROM generate_series(1, 2000) g`)
	snapshot := func() (int, string) {
		req, _ := http.NewRequest("GET", env.srv.URL+"/v1/snapshot?topic=public.docs", nil)
		req.Header.Set("Authorization", "Bearer "+stateToken(t, "a", true))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	status, body := snapshot()
	t.Logf("past the spool bound: %d %s", status, strings.TrimSpace(lastLine(body)))
	if !strings.Contains(body, "--snapshot-spool-bytes") || strings.Contains(lastLine(body), `"snapshot-end"`) {
		t.Errorf("a snapshot past --snapshot-spool-bytes: %d %s; want refused naming the flag", status, lastLine(body))
	}
	waitFor(t, "the spool to be empty", func() bool { return env.node.Stats().SpoolBytes == 0 })

	lockTables(t, env, "docs")
	start := time.Now()
	status, body = snapshot()
	t.Logf("under a held ACCESS EXCLUSIVE lock, after %s: %d %s", time.Since(start).Round(time.Millisecond), status, strings.TrimSpace(body))
	if status != http.StatusUnprocessableEntity || !strings.Contains(body, "locked by another transaction") {
		t.Errorf("a snapshot of a table locked throughout: %d %s; want 422 saying the table stayed locked", status, body)
	}
}

// lockTables takes an ACCESS EXCLUSIVE lock on tables of env's source in a
// transaction of its own, held until the returned release (or the test's
// end) rolls it back.
func lockTables(t *testing.T, env *stateEnv, tables string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.src)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+tables+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	done := false
	release = func() {
		if done {
			return
		}
		done = true
		if err := tx.Rollback(ctx); err != nil {
			t.Error(err)
		}
		_ = conn.Close(ctx)
	}
	t.Cleanup(release)
	return release
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestCursorResnapshotCharged: a "snapshot":true subscription with a
// cursor too far behind (MaxReplayEntries) makes the node start a
// snapshot for it during the catch-up; that snapshot is charged to the
// client's snapshot budget (burst 1 here): the first client's runs, the
// same client's second waits for its budget instead of reading the source
// again at once.
func TestCursorResnapshotCharged(t *testing.T) {
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) {
		c.MaxReplayEntries = 5
		c.State.Rate, c.State.Burst = 0.01, 1
	})
	ctx := context.Background()
	cur, err := env.j.CursorAt(journal.Query{Entities: []string{"public.docs"}, Tenant: "a"}, env.node.epoch.Load(), 0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the journal more than 5 entries long", func() bool {
		h, err := env.j.HorizonCursor(ctx, journal.Query{Entities: []string{"public.docs"}})
		if err != nil {
			return false
		}
		pos, _ := env.j.CursorPosition(h)
		return pos > 20 && env.node.horizon.Load() > 20
	})
	sub := map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true, "cursor": cur}
	first := env.mustDial(stateToken(t, "a", true))
	first.send(sub)
	first.until("snapshot-end")
	second := env.mustDial(stateToken(t, "a", true))
	second.send(sub)
	second.until("subscribed")
	for {
		f, err := second.tryRead(3 * time.Second)
		if err != nil {
			break // nothing more: the snapshot waits for the client's budget
		}
		if f.T == "snapshot-begin" {
			t.Fatalf("a second snapshot started for a stale cursor at once; want it charged to the client's spent budget")
		}
	}
	s := env.node.Stats()
	t.Logf("stale-cursor snapshots: %v, reads %d, queued %d", s.Snapshots, s.SnapshotReads, s.SnapshotsQueued)
	if s.Snapshots["done"] != 1 {
		t.Errorf("snapshots %v, want one done", s.Snapshots)
	}
}

// TestSnapshotReadTimeoutNamesTheFlag: a table that cannot be read into
// the spool within --snapshot-read-timeout is refused with a message
// naming the flag, and leaves no session in a transaction on the source.
func TestSnapshotReadTimeoutNamesTheFlag(t *testing.T) {
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) { c.State.ReadTimeout = 200 * time.Millisecond },
		`INSERT INTO docs SELECT g, 'a', 'v' FROM generate_series(1, 300000) g`)
	req, _ := http.NewRequest("GET", env.srv.URL+"/v1/snapshot?topic=public.docs", nil)
	req.Header.Set("Authorization", "Bearer "+stateToken(t, "a", true))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	last := lastLine(string(b))
	t.Logf("%d rows read in 200 ms at most: %s %s", 300000, resp.Status, last)
	if !strings.Contains(last, "--snapshot-read-timeout") || strings.Contains(last, `"snapshot-end"`) {
		t.Fatalf("a table too big for --snapshot-read-timeout: %s %s; want refused naming the flag", resp.Status, last)
	}
	waitFor(t, "no source session in a transaction", func() bool {
		for _, s := range sourceSessions(t, env.src) {
			if s.inTx || s.locks > 0 {
				return false
			}
		}
		return true
	})
}
