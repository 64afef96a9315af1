package sync

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

const orders = "public.orders"

func TestSyncAuthRefusedBeforeUpgrade(t *testing.T) {
	e := newSyncEnv(t)
	expired := token(t, []string{"*"}, "", -time.Minute)
	wrongSig := token(t, []string{"*"}, "", time.Hour)
	wrongSig = wrongSig[:len(wrongSig)-4] + "AAAA"
	for name, tok := range map[string]string{"none": "", "expired": expired, "wrong-signature": wrongSig, "garbage": "x.y.z"} {
		_, resp, err := e.dial(tok, 0)
		if err == nil {
			t.Fatalf("%s: socket accepted", name)
		}
		if resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s: got %v, want 401", name, resp)
		}
	}
	// A token without exp is refused too.
	noExp, _ := jwtNoExp()
	if _, resp, err := e.dial(noExp, 0); err == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("token without exp: %v", resp)
	}
	// Bearer header works; a topic outside the claims is refused.
	d := websocket.Dialer{}
	c, _, err := d.Dial(e.wsURL(""), http.Header{"Authorization": {"Bearer " + token(t, []string{"public.items"}, "", time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ws := &wsConn{t: t, c: c}
	ws.sub(orders, "")
	if f := ws.expect("error"); f.Code != "forbidden" || f.Topic != orders {
		t.Fatalf("got %+v", f)
	}
	ws.sub("public.items", "")
	ws.expect("subscribed")
	if got := e.node.Stats().Rejected["unauthorized"]; got < 5 {
		t.Fatalf("unauthorized rejections = %d", got)
	}
}

func jwtNoExp() (string, error) {
	return jwtSign(map[string]any{"sub": "x", "topics": []string{"*"}})
}

func TestSyncLiveThenReplayWithCursor(t *testing.T) {
	e := newSyncEnv(t)
	tok := token(t, []string{orders}, "", time.Hour)
	c := e.mustDial(tok)
	c.sub(orders, "")
	c.expect("subscribed")
	e.topicLive(orders, 1)
	var want []journal.Entry
	for i := range 5 {
		want = append(want, e.commit(ins(orders, i), ins("public.other", i))[0])
	}
	got := c.expectChanges(5)
	if !slices.Equal(seqsOf(got), entrySeqs(want)) {
		t.Fatalf("live seqs %v, want %v", seqsOf(got), entrySeqs(want))
	}
	for _, f := range got {
		if f.Topic != orders || f.env.Entity != orders || f.Cursor == "" {
			t.Fatalf("bad frame %+v", f)
		}
	}
	last := got[len(got)-1].Cursor
	c.c.Close()

	// Missed while away: replayed from the journal, then live, no gap, no
	// duplicate.
	for i := 5; i < 8; i++ {
		want = append(want, e.commit(ins(orders, i))...)
	}
	c = e.mustDial(tok)
	c.sub(orders, last)
	if f := c.expect("subscribed"); f.Cursor != last {
		t.Fatalf("subscribed at %q, want the given cursor", f.Cursor)
	}
	got = c.expectChanges(3)
	e.topicLive(orders, 1)
	want = append(want, e.commit(ins(orders, 8))...)
	got = append(got, c.expectChanges(1)...)
	if !slices.Equal(seqsOf(got), entrySeqs(want[5:])) {
		t.Fatalf("replayed %v, want %v", seqsOf(got), entrySeqs(want[5:]))
	}
	c.send(map[string]string{"t": "ping"})
	c.expect("pong")
}

// A subscription with a cursor while changes keep committing and publishing
// sees every change once, in order.
func TestSyncReplayRacesLive(t *testing.T) {
	e := newSyncEnv(t)
	tok := token(t, []string{orders}, "", time.Hour)
	first := e.commit(ins(orders, 0))
	cur, err := e.j.CursorAt(journal.Query{Entities: []string{orders}}, 0, first[0].Seq)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var want []int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; i <= 60; i++ {
			es := e.appendRows(ins(orders, i))
			want = append(want, es[0].Seq)
			e.publish(es...)
		}
	}()
	var conns []*wsConn
	for range 5 {
		c := e.mustDial(tok)
		c.sub(orders, cur)
		conns = append(conns, c)
	}
	wg.Wait()
	for _, c := range conns {
		c.expect("subscribed")
		got := seqsOf(c.expectChanges(60))
		if !slices.Equal(got, want) {
			t.Fatalf("got %v\nwant %v", got, want)
		}
	}
}

func TestSyncSlowConsumerReplayGap(t *testing.T) {
	e := newSyncEnv(t, func(c *Config) {
		c.MaxBufferedBytes = 16 << 10
		c.MaxDroppedFrames = 100000
		c.sndBuf = 4096
	})
	tok := token(t, []string{orders, "public.items"}, "", time.Hour)
	c, _, err := e.dial(tok, 4096)
	if err != nil {
		t.Fatal(err)
	}
	c.sub(orders, "")
	c.sub("public.items", "")
	c.expect("subscribed")
	c.expect("subscribed")
	e.topicLive(orders, 1)
	e.topicLive("public.items", 1)
	// The client reads nothing while 200 changes of 2 KB each arrive.
	var want []journal.Entry
	for i := range 40 {
		var rows []row
		for k := range 5 {
			ent := orders
			if k%2 == 1 {
				ent = "public.items"
			}
			rows = append(rows, row{entity: ent, op: decoder.OpInsert, id: i*5 + k, pad: 2000})
		}
		want = append(want, e.commit(rows...)...)
	}
	waitFor(t, "drops", func() bool { return e.node.Stats().FramesDropped > 0 })
	got := map[string][]int64{}
	ended := map[string]int{} // len(got[topic]) at its last transaction end
	gaps := map[string]string{}
	for len(gaps) < 2 {
		f := c.read()
		switch f.T {
		case "change":
			got[f.Topic] = append(got[f.Topic], f.env.Seq)
			if f.End {
				ended[f.Topic] = len(got[f.Topic])
			}
		case "replay-gap":
			if _, dup := gaps[f.Topic]; dup {
				t.Fatalf("second replay-gap for %s", f.Topic)
			}
			// The cursor is at the last transaction boundary: a
			// transaction given in part comes again whole.
			got[f.Topic] = got[f.Topic][:ended[f.Topic]]
			gaps[f.Topic] = f.Cursor
		default:
			t.Fatalf("unexpected %+v", f)
		}
	}
	for topic, cur := range gaps {
		c.sub(topic, cur)
	}
	wantBy := map[string][]int64{}
	for _, en := range want {
		wantBy[en.Entity] = append(wantBy[en.Entity], en.Seq)
	}
	for sum(got) < len(want) {
		f := c.read()
		switch f.T {
		case "change":
			got[f.Topic] = append(got[f.Topic], f.env.Seq)
		case "subscribed":
		default:
			t.Fatalf("unexpected %+v", f)
		}
	}
	for topic, w := range wantBy {
		if !slices.Equal(got[topic], w) {
			t.Fatalf("%s: got %v\nwant %v", topic, got[topic], w)
		}
	}
	if s := e.node.Stats(); s.ReplayGaps != 2 || s.Closed["backpressure"] != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func sum(m map[string][]int64) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

func TestSyncBackpressureCloses1013(t *testing.T) {
	e := newSyncEnv(t, func(c *Config) {
		c.MaxBufferedBytes = 8 << 10
		c.MaxDroppedFrames = 3
		c.sndBuf = 4096
	})
	// Granted by name: these entities have no journaled change yet.
	topics := []string{"public.a", "public.b", "public.c", "public.d", "public.e"}
	tok := token(t, topics, "", time.Hour)
	c, _, err := e.dial(tok, 4096)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range topics {
		c.sub(tp, "")
		c.expect("subscribed")
	}
	for _, tp := range topics {
		e.topicLive(tp, 1)
	}
	for i := range 30 {
		var rows []row
		for _, tp := range topics {
			rows = append(rows, row{entity: tp, op: decoder.OpInsert, id: i, pad: 3000})
		}
		e.commit(rows...)
	}
	waitFor(t, "backpressure close", func() bool { return e.node.Stats().Closed["backpressure"] == 1 })
	if code, reason := c.expectClose(); code != websocket.CloseTryAgainLater || reason != "backpressure" {
		t.Fatalf("closed %d %q", code, reason)
	}
}

func TestDropWindow(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := DropWindow{Max: 5}
	// Five drops in a burst never trip; the sixth inside 10 s does.
	for i := range 5 {
		if w.Add(t0.Add(time.Duration(i) * time.Millisecond)) {
			t.Fatalf("tripped at drop %d", i+1)
		}
	}
	if !w.Add(t0.Add(9 * time.Second)) {
		t.Fatal("six drops within 10 s did not trip")
	}
	// The same number spread out never trips, however long it goes on.
	w = DropWindow{Max: 5}
	for i := range 10000 {
		if w.Add(t0.Add(time.Duration(i) * 2001 * time.Millisecond)) {
			t.Fatalf("tripped at spread drop %d", i+1)
		}
	}
	w = DropWindow{Max: 0}
	if !w.Add(t0) {
		t.Fatal("max 0: the first drop must trip")
	}
}

// The DropWindow on a live socket with an injected clock: drops spread over
// more than 10 s never close it.
func TestSyncDropsSpreadOutDoNotClose(t *testing.T) {
	clock := newFakeClock()
	e := newSyncEnv(t, func(c *Config) {
		c.MaxBufferedBytes = 8 << 10
		c.MaxDroppedFrames = 2
		c.sndBuf = 4096
		c.Clock = clock
		c.IdleTimeout = time.Hour
		c.MaxLag = time.Hour // this test is about the drop window alone
	})
	// Granted by name: these entities have no journaled change yet.
	topics := []string{"public.a", "public.b", "public.c", "public.d", "public.e", "public.f", "public.g", "public.h"}
	tok := token(t, topics, "", time.Hour)
	c, _, err := e.dial(tok, 4096)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range topics {
		c.sub(tp, "")
		c.expect("subscribed")
		e.topicLive(tp, 1)
	}
	// Fill the queue, then drop one frame per 6 s of injected time: after
	// 8 drops over 42 s the socket is still open. Each commit is handled
	// by the node before the next, so drops are seen one at a time.
	i := 0
	for drops := int64(0); drops < 8; {
		e.commit(row{entity: topics[i%len(topics)], op: decoder.OpInsert, id: i, pad: 3000})
		i++
		waitFor(t, "message handled", func() bool { return e.node.stats.liveHandled.Load() == int64(i) })
		if d := e.node.Stats().FramesDropped; d > drops {
			if d > drops+1 {
				t.Fatalf("%d drops at once", d-drops)
			}
			drops = d
			clock.Advance(6 * time.Second)
		}
		if i > 2000 {
			t.Fatal("no drops")
		}
	}
	if n := e.node.Stats().Closed["backpressure"]; n != 0 {
		t.Fatalf("closed for backpressure although drops were spread out")
	}
	// The socket is healthy: once read, it ends with replay-gaps, not a close.
	gaps := 0
	for gaps == 0 {
		f := c.read()
		if f.T == "replay-gap" {
			gaps++
		}
	}
}

func TestSyncGapRepairFromJournal(t *testing.T) {
	e := newSyncEnv(t)
	tok := token(t, []string{orders}, "", time.Hour)
	var conns []*wsConn
	for range 3 {
		c := e.mustDial(tok)
		c.sub(orders, "")
		c.expect("subscribed")
		conns = append(conns, c)
	}
	e.topicLive(orders, 3)
	var want []int64
	for i := range 10 {
		es := e.appendRows(ins(orders, i))
		want = append(want, es[0].Seq)
		if i == 3 || i == 4 {
			continue // the node never sees these: the next one is a jump
		}
		e.publish(es...)
	}
	for _, c := range conns {
		if got := seqsOf(c.expectChanges(10)); !slices.Equal(got, want) {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	if e.node.Stats().Repairs["gap"] == 0 {
		t.Fatal("no gap repair counted")
	}
	// A republished message (publisher restart) is ignored.
	e.publish(e.entries(want[8], want[9])...)
	want = append(want, e.commit(ins(orders, 10))[0].Seq)
	for _, c := range conns {
		if f := c.expect("change"); f.env.Seq != want[10] {
			t.Fatalf("after republish got seq %d, want %d", f.env.Seq, want[10])
		}
	}
}

func TestSyncNATSRestartRepairs(t *testing.T) {
	e := newSyncEnv(t)
	tok := token(t, []string{orders}, "", time.Hour)
	var conns []*wsConn
	for range 3 {
		c := e.mustDial(tok)
		c.sub(orders, "")
		c.expect("subscribed")
		conns = append(conns, c)
	}
	e.topicLive(orders, 3)
	var want []int64
	for i := range 3 {
		want = append(want, e.commit(ins(orders, i))[0].Seq)
	}
	e.nats.Shutdown()
	// Journaled while NATS is down: never published.
	for i := 3; i < 6; i++ {
		want = append(want, e.appendRows(ins(orders, i))[0].Seq)
	}
	e.nats.Restart(t)
	waitFor(t, "node reconnected", func() bool { return e.node.Stats().Repairs["reconnect"] > 0 })
	waitFor(t, "publisher reconnected", func() bool { return e.pub.IsConnected() })
	e.topicLive(orders, 3)
	for i := 6; i < 9; i++ {
		want = append(want, e.commit(ins(orders, i))[0].Seq)
	}
	for _, c := range conns {
		if got := seqsOf(c.expectChanges(9)); !slices.Equal(got, want) {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestSyncTenancy(t *testing.T) {
	e := newSyncEnv(t)
	a := e.mustDial(token(t, []string{orders}, "acme", time.Hour))
	b := e.mustDial(token(t, []string{orders}, "beta", time.Hour))
	u := e.mustDial(token(t, []string{orders}, "", time.Hour))
	for _, c := range []*wsConn{a, b, u} {
		c.sub(orders, "")
		c.expect("subscribed")
	}
	e.topicLive(orders, 3)
	es := e.commit(
		row{entity: orders, op: decoder.OpInsert, id: 1, tenant: "acme", state: decoder.TenantKnown},
		row{entity: orders, op: decoder.OpInsert, id: 2, tenant: "beta", state: decoder.TenantKnown},
		row{entity: orders, op: decoder.OpInsert, id: 3},
		row{entity: orders, op: decoder.OpDelete, id: 99, state: decoder.TenantUnresolved}, // tenant-unknown
		row{entity: orders, op: decoder.OpDelete, id: 1, state: decoder.TenantUnresolved},  // resolved to acme
	)
	if !es[3].TenantUnknown || es[4].Tenant != "acme" {
		t.Fatalf("fixture: %+v %+v", es[3], es[4])
	}
	marker := e.commit(row{entity: orders, op: decoder.OpInsert, id: 100})[0].Seq
	check := func(c *wsConn, want ...int64) {
		t.Helper()
		want = append(want, marker)
		got := seqsOf(c.expectChanges(len(want)))
		if !slices.Equal(got, want) {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	check(a, es[0].Seq, es[2].Seq, es[4].Seq)
	check(b, es[1].Seq, es[2].Seq)
	check(u, es[2].Seq)

	// Replays obey the same scope; a cursor of another tenant is refused.
	acmeCur, _ := e.j.CursorAt(journal.Query{Entities: []string{orders}, Tenant: "acme"}, 0, es[0].Seq-1)
	b.sub(orders, acmeCur)
	if f := b.expect("error"); f.Code != "bad-cursor" {
		t.Fatalf("got %+v", f)
	}
	a2 := e.mustDial(token(t, []string{orders}, "acme", time.Hour))
	a2.sub(orders, acmeCur)
	a2.expect("subscribed")
	check(a2, es[0].Seq, es[2].Seq, es[4].Seq)
}

func TestSyncCursorsForgedForeignExpired(t *testing.T) {
	e := newSyncEnv(t)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	es := e.commit(ins(orders, 1), ins(orders, 2))
	good, _ := e.j.CursorAt(journal.Query{Entities: []string{orders}}, 0, es[0].Seq)
	forged := good[:len(good)-2] + "AA"
	if forged == good {
		forged = good[:len(good)-2] + "BA"
	}
	for _, cur := range []string{forged, "garbage", good + "x"} {
		c.sub(orders, cur)
		if f := c.expect("error"); f.Code != "bad-cursor" || !strings.Contains(f.Message, "cursor") {
			t.Fatalf("cursor %q: got %+v", cur, f)
		}
	}
	// Another topic's cursor.
	other, _ := e.j.CursorAt(journal.Query{Entities: []string{"public.items"}}, 0, 0)
	c.sub(orders, other)
	if f := c.expect("error"); f.Code != "bad-cursor" {
		t.Fatalf("got %+v", f)
	}
	// A journal recreated (same secret, other id): resync, not served.
	j2, err := journal.Open(syncCtx(t), journal.Config{URL: pgtest.NewDatabase(t), CursorSecret: syncTestSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer j2.Close()
	foreign, _ := j2.CursorAt(journal.Query{Entities: []string{orders}}, 0, 1)
	c.sub(orders, foreign)
	if f := c.expect("resync"); f.Cursor == "" {
		t.Fatalf("got %+v", f)
	}
	// Pruned past the cursor: resync. (The resynced subscription is live
	// meanwhile.)
	e.topicLive(orders, 1)
	e.commit(ins(orders, 3), ins(orders, 4))
	c.expectChanges(2)
	if _, err := e.j.Prune(syncCtx(t), journal.Retention{MaxRows: 1}); err != nil {
		t.Fatal(err)
	}
	c.sub(orders, good)
	c.expect("subscribed")
	if f := c.expect("resync"); f.Topic != orders {
		t.Fatalf("got %+v", f)
	}
}

// TestSyncTruncateFromTheJournalResyncs: a TRUNCATE a member reads from
// the journal (catching up from a cursor) brings the same resync after it
// as one delivered live; before, only the live path sent it, so whether a
// client re-read the table depended on timing (TestSnapshotRateLimited
// failed in CI this way).
func TestSyncTruncateFromTheJournalResyncs(t *testing.T) {
	e := newSyncEnv(t)
	tok := token(t, []string{orders}, "", time.Hour)
	live := e.mustDial(tok)
	live.sub(orders, "")
	from := live.expect("subscribed").Cursor
	e.topicLive(orders, 1)
	rows := e.commit(ins(orders, 1), row{entity: orders, op: decoder.OpTruncate}, ins(orders, 2), row{entity: orders, op: decoder.OpTruncate})
	// One transaction: its four changes, then one resync after its end
	// (a cursor inside a transaction is never issued).
	frames := func(c *wsConn) []string {
		var out []string
		for len(out) < 5 {
			f := c.read()
			switch f.T {
			case "change":
				out = append(out, fmt.Sprintf("change %s %d %v", f.env.Op, f.env.Seq, f.End))
			case "resync":
				out = append(out, "resync "+f.Cursor)
			default:
				t.Fatalf("got %+v", f)
			}
		}
		return out
	}
	want := frames(live)
	for i, r := range rows {
		if w := fmt.Sprintf("change %s %d %v", r.Op, r.Seq, i == len(rows)-1); want[i] != w {
			t.Fatalf("live frame %d: %q, want %q (%v)", i, want[i], w, want)
		}
	}
	if !strings.HasPrefix(want[4], "resync ") {
		t.Fatalf("live: no resync after the transaction's end (%v)", want)
	}
	replay := e.mustDial(tok)
	replay.sub(orders, from)
	replay.expect("subscribed")
	if got := frames(replay); !slices.Equal(got, want) {
		t.Fatalf("from the journal: %v\nlive: %v", got, want)
	}
}

func TestSyncTruncateAndResync(t *testing.T) {
	e := newSyncEnv(t)
	var conns []*wsConn
	for i := range 3 {
		c := e.mustDial(token(t, []string{orders, "public.items"}, "", time.Hour))
		c.sub(orders, "")
		c.expect("subscribed")
		if i == 0 {
			c.sub("public.items", "")
			c.expect("subscribed")
		}
		conns = append(conns, c)
	}
	e.topicLive(orders, 3)
	tr := e.commit(row{entity: orders, op: decoder.OpTruncate})[0]
	for _, c := range conns {
		f := c.expect("change")
		if f.env.Op != decoder.OpTruncate || f.env.Seq != tr.Seq {
			t.Fatalf("got %+v", f)
		}
		if r := c.expect("resync"); r.Topic != orders {
			t.Fatalf("got %+v", r)
		}
	}
	res, err := e.j.AppendResync(syncCtx(t), e.gen, journal.Resync{Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(e.entries(res.FirstSeq, res.LastSeq)...)
	for i, c := range conns {
		topics := []string{c.expect("resync").Topic}
		if i == 0 {
			topics = append(topics, c.expect("resync").Topic)
		}
		slices.Sort(topics)
		if i == 0 && !slices.Equal(topics, []string{"public.items", orders}) || i > 0 && topics[0] != orders {
			t.Fatalf("socket %d resync topics %v", i, topics)
		}
	}
	// After the resync, the stream continues.
	next := e.commit(ins(orders, 5))[0]
	for _, c := range conns {
		if f := c.expect("change"); f.env.Seq != next.Seq {
			t.Fatalf("got %+v", f)
		}
	}
}

func TestSyncIdleEviction(t *testing.T) {
	clock := newFakeClock()
	e := newSyncEnv(t, func(c *Config) {
		c.Clock = clock
		c.IdleTimeout = 8 * time.Second
	})
	tok := token(t, []string{orders}, "", time.Hour)
	idle := e.mustDial(tok)
	busy := e.mustDial(tok)
	waitFor(t, "sockets open", func() bool { return e.node.Stats().SocketsOpen == 2 })
	// The sweep runs every max(1 s, 8 s/4) = 2 s of clock time.
	for range 5 {
		waitFor(t, "sweeper waiting", func() bool { return clock.sleepers() > 0 })
		busy.send(map[string]string{"t": "ping"})
		busy.expect("pong")
		clock.Advance(2 * time.Second)
	}
	if code, reason := idle.expectClose(); code != websocket.CloseGoingAway || reason != "idle timeout" {
		t.Fatalf("closed %d %q", code, reason)
	}
	busy.send(map[string]string{"t": "ping"})
	busy.expect("pong")
	if e.node.Stats().Closed["idle"] != 1 {
		t.Fatalf("stats %+v", e.node.Stats())
	}
}

// A socket does not outlive its token.
func TestSyncTokenExpiryClosesSocket(t *testing.T) {
	clock := newFakeClock()
	e := newSyncEnv(t, func(c *Config) {
		c.Clock = clock
		c.IdleTimeout = 24 * time.Hour
	})
	short := e.mustDial(token(t, []string{orders}, "", time.Hour))
	long := e.mustDial(token(t, []string{orders}, "", 1000*time.Hour))
	waitFor(t, "sockets open", func() bool { return e.node.Stats().SocketsOpen == 2 })
	waitFor(t, "sweeper waiting", func() bool { return clock.sleepers() > 0 })
	// The sweep runs every 24 h/4 = 6 h of clock time. The fake clock starts
	// at the real time; one sweep period later the short token (1 h) has
	// expired and the long one (1000 h) has not.
	clock.Advance(6 * time.Hour)
	if code, reason := short.expectClose(); code != CloseTokenExpired || reason != "token expired" {
		t.Fatalf("closed %d %q", code, reason)
	}
	long.send(map[string]string{"t": "ping"})
	long.expect("pong")
}

func TestSyncPolicyViolations(t *testing.T) {
	clock := newFakeClock()
	e := newSyncEnv(t, func(c *Config) {
		c.Clock = clock
		c.InboundRate = 10
		c.InboundBurst = 20
		c.MaxFrameBytes = 1024
	})
	tok := token(t, []string{orders}, "", time.Hour)
	cases := []struct {
		name   string
		send   func(c *wsConn)
		reason string
		code   int
	}{
		{"flood", func(c *wsConn) {
			for range 25 {
				_ = c.c.WriteMessage(websocket.TextMessage, []byte(`{"t":"ping"}`))
			}
		}, "rate limit exceeded", CloseFlood},
		{"oversized", func(c *wsConn) {
			_ = c.c.WriteMessage(websocket.TextMessage, []byte(`{"t":"ping","pad":"`+strings.Repeat("x", 4096)+`"}`))
		}, "frame too large", CloseBadFrame},
		{"invalid-json", func(c *wsConn) { _ = c.c.WriteMessage(websocket.TextMessage, []byte(`{"t":`)) }, "invalid JSON frame", CloseBadFrame},
	}
	for _, tc := range cases {
		c := e.mustDial(tok)
		tc.send(c)
		if code, reason := c.expectClose(); code != tc.code || reason != tc.reason {
			t.Fatalf("%s: closed %d %q", tc.name, code, reason)
		}
	}
	// Within the budget (the clock refills it) nothing closes.
	c := e.mustDial(tok)
	for range 5 {
		for range 10 {
			c.send(map[string]string{"t": "ping"})
			c.expect("pong")
		}
		clock.Advance(time.Second)
	}
}

func TestSyncAdmission(t *testing.T) {
	clock := newFakeClock()
	e := newSyncEnv(t, func(c *Config) {
		c.MaxConnections = 2
		c.AcceptRate = 1
		c.AcceptBurst = 3
		c.Clock = clock
	})
	tok := token(t, []string{orders}, "", time.Hour)
	e.mustDial(tok)
	e.mustDial(tok)
	_, resp, err := e.dial(tok, 0)
	if err == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("third socket: %v %v", err, resp)
	}
	_, resp, err = e.dial(tok, 0)
	if err == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("beyond the accept budget: %v %v", err, resp)
	}
	// A browser origin from another site is refused at the upgrade.
	clock.Advance(10 * time.Second)
	d := websocket.Dialer{}
	_, resp, err = d.Dial(e.wsURL(tok), http.Header{"Origin": {"https://evil.example"}})
	if err == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("foreign origin: %v %v", err, resp)
	}
	s := e.node.Stats()
	if s.Rejected["max-connections"] != 1 || s.Rejected["accept-rate"] != 1 {
		t.Fatalf("rejections %v", s.Rejected)
	}
}

func TestSyncChangesHTTP(t *testing.T) {
	e := newSyncEnv(t)
	es := e.commit(
		row{entity: orders, op: decoder.OpInsert, id: 1, tenant: "acme", state: decoder.TenantKnown},
		row{entity: orders, op: decoder.OpInsert, id: 2, tenant: "beta", state: decoder.TenantKnown},
		ins(orders, 3),
	)
	get := func(tok, query string) (int, changesResponse) {
		t.Helper()
		req, _ := http.NewRequest("GET", e.srv.URL+"/v1/changes?"+query, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out changesResponse
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	acme := token(t, []string{orders}, "acme", time.Hour)
	if code, _ := get("", "topic="+orders); code != 401 {
		t.Fatalf("no token: %d", code)
	}
	if code, _ := get(acme, "topic=public.items"); code != 403 {
		t.Fatalf("other topic: %d", code)
	}
	if code, _ := get(acme, "topic="+orders+"&cursor=forged"); code != 400 {
		t.Fatalf("forged cursor: %d", code)
	}
	start, _ := e.j.CursorAt(journal.Query{Entities: []string{orders}, Tenant: "acme"}, 0, es[0].Seq-1)
	code, out := get(acme, "topic="+orders+"&limit=10&cursor="+start)
	if code != 200 || len(out.Changes) != 2 || out.Cursor == "" {
		t.Fatalf("%d %+v", code, out)
	}
	var got []int64
	for _, c := range out.Changes {
		var env decoder.Envelope
		_ = json.Unmarshal(c, &env)
		got = append(got, env.Seq)
	}
	if !slices.Equal(got, []int64{es[0].Seq, es[2].Seq}) {
		t.Fatalf("got %v", got)
	}
}

// Hundreds of concurrent sockets, several topics and tenants, all under
// -race: every socket gets exactly its changes, in order.
func TestSyncManySockets(t *testing.T) {
	e := newSyncEnv(t)
	const n = 300
	topics := []string{"public.a", "public.b", "public.c"}
	tenants := []string{"", "t1", "t2"}
	type sock struct {
		c             *wsConn
		topic, tenant string
	}
	socks := make([]sock, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := sock{topic: topics[i%3], tenant: tenants[(i/3)%3]}
			c, _, err := e.dial(token(t, []string{s.topic}, s.tenant, time.Hour), 0)
			if err != nil {
				errs <- err
				return
			}
			s.c = c
			socks[i] = s
			_ = c.c.WriteJSON(map[string]string{"t": "sub", "topic": s.topic})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, tp := range topics {
		e.topicLive(tp, n/3)
	}
	var all []journal.Entry
	for i := range 20 {
		var rows []row
		for k, tp := range topics {
			r := row{entity: tp, op: decoder.OpInsert, id: i*10 + k}
			if tn := tenants[(i+k)%3]; tn != "" {
				r.tenant, r.state = tn, decoder.TenantKnown
			}
			rows = append(rows, r)
		}
		all = append(all, e.commit(rows...)...)
	}
	errs2 := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := socks[i]
			var want []int64
			for _, en := range all {
				if en.Entity == s.topic && (en.Tenant == "" || en.Tenant == s.tenant) {
					want = append(want, en.Seq)
				}
			}
			f, err := s.c.tryRead(20 * time.Second)
			if err != nil || f.T != "subscribed" {
				errs2 <- fmt.Errorf("socket %d: %v %+v", i, err, f)
				return
			}
			var got []int64
			for len(got) < len(want) {
				f, err := s.c.tryRead(20 * time.Second)
				if err != nil {
					errs2 <- fmt.Errorf("socket %d: %v after %v", i, err, got)
					return
				}
				got = append(got, f.env.Seq)
			}
			if !slices.Equal(got, want) {
				errs2 <- fmt.Errorf("socket %d: got %v want %v", i, got, want)
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs2:
		t.Fatal(err)
	default:
	}
}
