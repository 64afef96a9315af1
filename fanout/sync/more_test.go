package sync

import (
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/internal/telemetry"
	"github.com/walcast/walcast/journal"
)

// Storms: many sockets replaying the same range wait on one journal read.
func TestSyncStormSharesJournalReads(t *testing.T) {
	release := make(chan struct{})
	e := newSyncEnv(t)
	hook := func(context.Context) { <-release }
	e.node.reads.testHook.Store(&hook)
	es := e.commit(ins(orders, 1), ins(orders, 2), ins(orders, 3))
	cur, _ := e.j.CursorAt(journal.Query{Entities: []string{orders}}, 0, es[0].Seq-1)
	const n = 40
	var conns []*wsConn
	tok := token(t, []string{orders}, "", time.Hour)
	for range n {
		c := e.mustDial(tok)
		c.sub(orders, cur)
		conns = append(conns, c)
	}
	waitFor(t, "every socket waiting on one read", func() bool {
		e.node.reads.mu.Lock()
		defer e.node.reads.mu.Unlock()
		c := e.node.reads.inflight[readKey{entity: orders, from: es[0].Seq - 1}]
		return c != nil && c.waiters == n
	})
	close(release)
	for _, c := range conns {
		c.expect("subscribed")
		if got := seqsOf(c.expectChanges(3)); !slices.Equal(got, entrySeqs(es)) {
			t.Fatalf("got %v", got)
		}
	}
	// One read for the shared range; the rest are the (also shared, but
	// not necessarily concurrent) follow-ups at the horizon.
	if q := e.node.reads.queries.Load(); q > n/2 {
		t.Fatalf("%d journal reads for %d sockets", q, n)
	}
}

// An oversize envelope (published without its row data) is fetched from
// the journal before delivery.
func TestSyncOversizeFetchedFromJournal(t *testing.T) {
	e := newSyncEnv(t)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c.sub(orders, "")
	c.expect("subscribed")
	e.topicLive(orders, 1)
	en := e.appendRows(row{entity: orders, op: decoder.OpInsert, id: 1, pad: 5000})[0]
	full := en.Envelope
	ref := bytes.Replace(full, []byte(`"op":"insert"`), []byte(`"op":"insert","oversize":true`), 1)
	ref = ref[:bytes.Index(ref, []byte(`,"key"`))]
	ref = append(ref, '}')
	en.Envelope = ref
	e.publish(en)
	f := c.expect("change")
	if !bytes.Equal(f.Change, full) {
		t.Fatalf("delivered %s\nwant the journaled envelope", f.Change)
	}
}

func TestSyncMetrics(t *testing.T) {
	m, err := telemetry.NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	e := newSyncEnv(t, func(c *Config) { c.Meter = m.Meter("walcast/sync") })
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c.sub(orders, "")
	c.expect("subscribed")
	e.topicLive(orders, 1)
	e.commit(ins(orders, 1))
	c.expect("change")
	_, _, _ = e.dial("", 0)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		"walcast_sync_sockets_open 1",
		"walcast_sync_frames_sent_total 2",
		"walcast_sync_frames_dropped_total 0",
		"walcast_sync_replay_gaps_total 0",
		`walcast_sync_connections_rejected_total{reason="unauthorized"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("metrics lack %q:\n%s", want, body)
		}
	}
	// The horizon is read in the background after the node starts.
	waitFor(t, "the node to be ready", func() bool { ok, _ := e.node.Ready(); return ok })
}

// Any number of nodes serve one NATS and one journal: a cursor issued by one
// node resumes on another.
func TestSyncTwoNodesShareCursors(t *testing.T) {
	e := newSyncEnv(t)
	auth, _ := NewHMACAuth(syncJWTSecret)
	n2, err := Open(syncCtx(t), Config{NATS: bus.NATSConfig{URL: e.nats.URL()}, Journal: e.j, Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	srv2 := httptest.NewServer(n2.Handler())
	t.Cleanup(func() {
		n2.Close()
		srv2.Close()
	})
	tok := token(t, []string{orders}, "", time.Hour)
	a := e.mustDial(tok)
	a.sub(orders, "")
	a.expect("subscribed")
	e.topicLive(orders, 1)
	first := e.commit(ins(orders, 1))[0]
	fa := a.expect("change")
	if fa.env.Seq != first.Seq {
		t.Fatalf("got %+v", fa)
	}
	more := e.commit(ins(orders, 2), ins(orders, 3))
	// Resume on the second node from the first node's cursor.
	e2 := &syncEnv{t: t, srv: srv2}
	b := e2.mustDial(tok)
	b.sub(orders, fa.Cursor)
	b.expect("subscribed")
	if got := seqsOf(b.expectChanges(2)); !slices.Equal(got, entrySeqs(more)) {
		t.Fatalf("node 2 replayed %v, want %v", got, entrySeqs(more))
	}
	if got := seqsOf(a.expectChanges(2)); !slices.Equal(got, entrySeqs(more)) {
		t.Fatalf("node 1 delivered %v", got)
	}
}

// A row whose embedded JSON holds the envelope's own words is just a row: no
// re-read, no journal fetch.
func TestSyncEmbeddedJSONLooksLikeEnvelope(t *testing.T) {
	e := newSyncEnv(t)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c.sub(orders, "")
	c.expect("subscribed")
	e.topicLive(orders, 1)
	es := e.commit(row{entity: orders, op: decoder.OpInsert, id: 1, doc: `{"op":"truncate","oversize":true}`}, ins(orders, 2))
	got := c.expectChanges(2)
	if !slices.Equal(seqsOf(got), entrySeqs(es)) || got[0].env.Op != decoder.OpInsert {
		t.Fatalf("got %+v", got)
	}
}
