package sync

import (
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
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
