package sync

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/journal"
	"github.com/walcast/walcast/journal/journaltest"
)

// TestSyncEpochRestoredJournal: the journal database is restored from a
// backup taken at seq 2 after the node delivered seqs 3 and 4, and walcast
// resets the history (a new epoch). Before epochs, the node and the client
// both held position 4 and took the new seq 4 for the one they had seen:
// the live client skipped it, and a client reconnecting with its cursor was
// served from the new seq 5 on. Now the live client gets a resync and then
// every change of the new history, and an old cursor gets a resync — on
// the socket and over /v1/changes.
func TestSyncEpochRestoredJournal(t *testing.T) {
	e := newSyncEnv(t)
	ctx := syncCtx(t)
	tok := token(t, []string{orders}, "", time.Hour)
	c := e.mustDial(tok)
	c.sub(orders, "")
	c.expect("subscribed")
	e.topicLive(orders, 1)

	e.commit(ins(orders, 1), ins(orders, 2))
	c.expectChanges(2)
	restore, err := journaltest.Backup(ctx, e.url, journal.DefaultSchema)
	if err != nil {
		t.Fatal(err)
	}
	lost := e.commit(ins(orders, 3), ins(orders, 4))
	got := c.expectChanges(2)
	oldCursor := got[1].Cursor
	if got[1].env.Seq != 4 {
		t.Fatalf("before the restore: %v", seqsOf(got))
	}

	if err := restore(ctx); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	lsn := e.lsn
	e.mu.Unlock()
	res, err := e.j.AppendResync(ctx, e.gen, journal.Resync{Reason: "journal restored from a backup", Watermark: lsn, ResetWatermark: true})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(e.entries(res.FirstSeq, res.LastSeq)...)
	r := c.expect("resync")
	if r.Topic != orders {
		t.Fatalf("resync %+v", r)
	}
	waitFor(t, "the node in the new epoch", func() bool { return e.node.Stats().EpochChanges == 1 })

	fresh := e.commit(ins(orders, 40), ins(orders, 50)) // seqs 4 and 5 of the new epoch
	if fresh[0].Seq != lost[1].Seq {
		t.Fatalf("the restored journal assigned seq %d, want %d again", fresh[0].Seq, lost[1].Seq)
	}
	if fresh[0].Epoch == lost[1].Epoch {
		t.Fatalf("seq %d has epoch %d in both histories", fresh[0].Seq, fresh[0].Epoch)
	}
	if a, b := publishedMsg("walcast", e.j.ID(), lost[1]).Header.Get("Nats-Msg-Id"), publishedMsg("walcast", e.j.ID(), fresh[0]).Header.Get("Nats-Msg-Id"); a == b {
		t.Fatalf("the lost and the new seq %d share the message id %s", fresh[0].Seq, a)
	}
	after := c.expectChanges(2)
	if after[0].env.Seq != 4 || string(after[0].env.Key["id"]) != "40" || string(after[1].env.Key["id"]) != "50" {
		t.Fatalf("after the resync: %v", seqsOf(after))
	}

	// A client back with the cursor of the lost seq 4 is told to resync.
	c2 := e.mustDial(tok)
	c2.sub(orders, oldCursor)
	if f := c2.expect("resync"); f.Cursor == "" || f.Cursor == oldCursor {
		t.Fatalf("old-epoch cursor on the socket: %+v", f)
	}
	next := e.commit(ins(orders, 60))[0]
	if f := c2.expect("change"); f.env.Seq != next.Seq {
		t.Fatalf("after the resync: %+v", f)
	}
	if f := c.expect("change"); f.env.Seq != next.Seq {
		t.Fatalf("live client: %+v", f)
	}

	// The same over HTTP.
	req, _ := http.NewRequest("GET", e.srv.URL+"/v1/changes?topic="+url.QueryEscape(orders)+"&cursor="+url.QueryEscape(oldCursor), nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out changesResponse
	if err := json.Unmarshal(body, &out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if !out.ResyncRequired || out.Reason != "epoch" || len(out.Changes) != 0 {
		t.Fatalf("/v1/changes with an old-epoch cursor: %s", body)
	}
}

// TestSyncEpochStragglerIgnored: a message of another epoch that the
// journal does not hold as current (a republished straggler, or a forged
// header) is ignored and counted; delivery of the current epoch goes on.
func TestSyncEpochStragglerIgnored(t *testing.T) {
	e := newSyncEnv(t)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c.sub(orders, "")
	c.expect("subscribed")
	e.topicLive(orders, 1)
	es := e.appendRows(ins(orders, 1), ins(orders, 2))
	stray := es[0]
	stray.Epoch = 0x1234
	if err := e.pub.PublishMsg(publishedMsg("walcast", e.j.ID(), stray)); err != nil {
		t.Fatal(err)
	}
	e.publish(es...)
	got := c.expectChanges(2)
	if got[0].env.Seq != es[0].Seq || got[1].env.Seq != es[1].Seq {
		t.Fatalf("got %v", seqsOf(got))
	}
	waitFor(t, "the straggler counted", func() bool { return e.node.Stats().EpochIgnored == 1 })
	if s := e.node.Stats(); s.EpochChanges != 0 {
		t.Fatalf("a straggler switched the node: %+v", s)
	}
}

// position publishes the publisher's position seq (epoch 0), as the
// publisher does after the entries it covers.
func (e *syncEnv) position(seq int64) {
	e.t.Helper()
	m := nats.NewMsg(bus.PositionSubject("walcast"))
	m.Header.Set(bus.HeaderSeq, strconv.FormatInt(seq, 10))
	m.Header.Set(bus.HeaderEpoch, journal.EpochHex(0))
	if err := e.pub.PublishMsg(m); err != nil {
		e.t.Fatal(err)
	}
	if err := e.pub.Flush(); err != nil {
		e.t.Fatal(err)
	}
}

// TestSyncQuietTopicPosition: a tenant that sees none of the changes made
// while it is connected keeps a current cursor. Before position frames its
// cursor stayed at its subscription, so once retention pruned past it a
// reconnect got a resync though the client had missed nothing. Now the
// publisher's position moves the member, the client gets a position frame
// after its pong, and reconnecting with that cursor is a plain subscribe.
func TestSyncQuietTopicPosition(t *testing.T) {
	e := newSyncEnv(t)
	tok := token(t, []string{orders}, "quiet", time.Hour)
	c := e.mustDial(tok)
	c.sub(orders, "")
	start := c.expect("subscribed").Cursor
	e.topicLive(orders, 1)

	var last journal.Entry
	for i := range 20 {
		es := e.commit(row{entity: orders, op: decoder.OpInsert, id: i, tenant: "busy", state: decoder.TenantKnown},
			ins("public.items", i))
		last = es[len(es)-1]
	}
	e.position(last.Seq)
	waitFor(t, "the member moved", func() bool { return e.node.stats.positionsMoved.Load() >= 1 })
	c.send(map[string]string{"t": "ping"})
	c.expect("pong")
	p := c.expect("position")
	pos, err := e.j.CursorPosition(p.Cursor)
	if err != nil || p.Topic != orders || pos != last.Seq {
		t.Fatalf("position frame %+v at %d (%v), want %d", p, pos, err, last.Seq)
	}
	// Nothing new: the next pong brings no position frame (the pong of a
	// second ping would come after it).
	c.send(map[string]string{"t": "ping"})
	c.expect("pong")
	c.send(map[string]string{"t": "ping"})
	c.expect("pong")

	if _, err := e.j.Prune(syncCtx(t), journal.Retention{MaxRows: 1}); err != nil {
		t.Fatal(err)
	}
	c2 := e.mustDial(tok)
	c2.sub(orders, p.Cursor)
	if f := c2.expect("subscribed"); f.T != "subscribed" {
		t.Fatalf("got %+v", f)
	}
	c3 := e.mustDial(tok)
	c3.sub(orders, start) // the cursor it held before: pruned past, a resync
	c3.expect("subscribed")
	c3.expect("resync")
	mine := e.commit(row{entity: orders, op: decoder.OpInsert, id: 99, tenant: "quiet", state: decoder.TenantKnown})[0]
	for i, cc := range []*wsConn{c, c2} {
		f, err := cc.tryRead(10 * time.Second)
		if err != nil || f.T != "change" || f.env.Seq != mine.Seq {
			t.Fatalf("socket %d: got %+v %v", i, f, err)
		}
	}
}

// TestSyncPositionWaitsForQueuedMessages: a position reaches the node on
// its own subscription, possibly before the entity's subscription has
// handled the messages published before it. The barrier holds the move
// until they are handled, so no change at or below the position is skipped.
func TestSyncPositionWaitsForQueuedMessages(t *testing.T) {
	e := newSyncEnv(t)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c.sub(orders, "")
	c.expect("subscribed")
	e.topicLive(orders, 1)
	var want []int64
	for round := range 20 {
		es := e.appendRows(ins(orders, round*3), ins(orders, round*3+1), ins(orders, round*3+2))
		for _, en := range es {
			if err := e.pub.PublishMsg(publishedMsg("walcast", e.j.ID(), en)); err != nil {
				t.Fatal(err)
			}
			want = append(want, en.Seq)
		}
		e.position(es[len(es)-1].Seq) // flushes
	}
	got := seqsOf(c.expectChanges(len(want)))
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestSyncBadPositionAndEpochHeaders: position messages and epoch headers
// the node cannot read (not numbers, negative, not 16 hex digits, 10 KB
// long, a position far ahead with a foreign epoch) are ignored; no member
// moves and delivery goes on.
func TestSyncBadPositionAndEpochHeaders(t *testing.T) {
	e := newSyncEnv(t)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c.sub(orders, "")
	c.expect("subscribed")
	e.topicLive(orders, 1)
	for _, h := range []struct{ seq, epoch string }{
		{"", ""}, {"abc", journal.EpochHex(0)}, {"-5", journal.EpochHex(0)}, {"99999999999", "zz"},
		{"7", strings.Repeat("a", 10<<10)}, {"1000000", journal.EpochHex(0x1234)}, {"1e9", journal.EpochHex(0)},
	} {
		m := nats.NewMsg(bus.PositionSubject("walcast"))
		m.Header.Set(bus.HeaderSeq, h.seq)
		m.Header.Set(bus.HeaderEpoch, h.epoch)
		if err := e.pub.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	bad := e.appendRows(ins(orders, 1))[0]
	m := publishedMsg("walcast", e.j.ID(), bad)
	m.Header.Set(bus.HeaderEpoch, "not-an-epoch")
	if err := e.pub.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	next := e.commit(ins(orders, 2))[0]
	// The change with the unreadable epoch is repaired from the journal
	// (its entitySeq is then missing live), so both arrive, in order.
	got := seqsOf(c.expectChanges(2))
	if !slices.Equal(got, []int64{bad.Seq, next.Seq}) {
		t.Fatalf("got %v, want %v", got, []int64{bad.Seq, next.Seq})
	}
	if n := e.node.stats.positionsMoved.Load(); n != 0 {
		t.Fatalf("%d members moved by unreadable or foreign positions", n)
	}
}

// TestSyncPositionAheadOfTheJournal: a position message beyond the journal's
// horizon (a buggy or forged publisher) moves no member past what the
// journal holds, so later changes are still delivered.
func TestSyncPositionAheadOfTheJournal(t *testing.T) {
	e := newSyncEnv(t)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c.sub(orders, "")
	c.expect("subscribed")
	e.topicLive(orders, 1)
	first := e.commit(ins(orders, 1))[0]
	c.expect("change")
	waitFor(t, "the node's horizon", func() bool { return e.node.horizon.Load() >= first.Seq })
	e.position(first.Seq + 1_000_000)
	c.send(map[string]string{"t": "ping"})
	c.expect("pong")
	next := e.commit(ins(orders, 2))[0]
	if f := c.expect("change"); f.env.Seq != next.Seq {
		t.Fatalf("got %+v, want the change at %d", f, next.Seq)
	}
}
