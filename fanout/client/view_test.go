package client

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// fakeNode is a sync node reduced to its socket: every connection's frames
// from the client arrive on subs (as JSON objects), and the test writes
// frames to the newest connection with send.
type fakeNode struct {
	t     *testing.T
	srv   *httptest.Server
	subs  chan map[string]json.RawMessage
	conns chan *websocket.Conn
	conn  *websocket.Conn // the newest connection; owned by the test goroutine
}

func newFakeNode(t *testing.T) *fakeNode {
	t.Helper()
	n := &fakeNode{t: t, subs: make(chan map[string]json.RawMessage, 64), conns: make(chan *websocket.Conn, 4)}
	up := websocket.Upgrader{}
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		n.conns <- c
		for {
			var f map[string]json.RawMessage
			if err := c.ReadJSON(&f); err != nil {
				return
			}
			if string(f["t"]) != `"ping"` {
				n.subs <- f
			}
		}
	}))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *fakeNode) url() string { return "ws" + strings.TrimPrefix(n.srv.URL, "http") }

// accept waits for the client's next connection and makes it the one send
// writes to.
func (n *fakeNode) accept() {
	n.t.Helper()
	select {
	case n.conn = <-n.conns:
	case <-time.After(10 * time.Second):
		n.t.Fatal("the client did not connect")
	}
}

func (n *fakeNode) send(frame string) {
	n.t.Helper()
	if err := n.conn.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
		n.t.Fatal(err)
	}
}

// next is the next frame the client sent, other than a ping.
func (n *fakeNode) next() map[string]json.RawMessage {
	n.t.Helper()
	select {
	case f := <-n.subs:
		return f
	case <-time.After(10 * time.Second):
		n.t.Fatal("the client sent no frame")
		return nil
	}
}

// wantSub checks a sub frame field by field: each of want's values is the
// field's JSON, "" for a field that must be absent.
func wantSub(t *testing.T, what string, f map[string]json.RawMessage, want map[string]string) {
	t.Helper()
	if string(f["t"]) != `"sub"` {
		t.Fatalf("%s: frame %v, want a sub", what, f)
	}
	for k, w := range want {
		got, ok := f[k]
		if w == "" && ok {
			t.Errorf("%s: field %s is %s, want it absent", what, k, got)
		} else if w != "" && string(got) != w {
			t.Errorf("%s: field %s is %s, want %s", what, k, got, w)
		}
	}
}

func nextEvent(t *testing.T, c *Client, next func(context.Context) (Event, error)) Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := next(ctx)
	if err != nil {
		t.Fatalf("next event: %v", err)
	}
	return ev
}

const paid = `{"col":"status","op":"=","value":"paid"}`

// The filter and column list go with the first sub, with the sub after a
// replay-gap, and with every sub after a reconnect, next to the cursor the
// client holds; a refused filter reaches the application as an EventError.
func TestSubscribeWithKeepsTheView(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	c, err := Dial(ctx, n.url(), Options{Token: "tok", PingInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n.accept()
	// Spaces in the filter are not sent: it is compacted once.
	if err := c.SubscribeWith("public.orders", SubscribeOptions{Filter: json.RawMessage(" {\"col\": \"status\", \"op\":\"=\", \"value\":\"paid\"} "), Columns: []string{"status", "amount"}}); err != nil {
		t.Fatal(err)
	}
	view := map[string]string{"topic": `"public.orders"`, "filter": paid, "columns": `["status","amount"]`}
	wantSub(t, "first sub", n.next(), merge(view, map[string]string{"cursor": "", "snapshot": ""}))

	n.send(`{"t":"subscribed","topic":"public.orders","cursor":"c0"}`)
	n.send(`{"t":"change","topic":"public.orders","cursor":"c1","end":true,"change":{"seq":5,"op":"insert","key":{"id":1},"after":{"id":1,"status":"paid"}}}`)
	if ev := nextEvent(t, c, c.Next); ev.Type != EventChange || ev.Cursor != "c1" {
		t.Fatalf("event %+v", ev)
	}
	n.send(`{"t":"replay-gap","topic":"public.orders","cursor":"c1"}`)
	wantSub(t, "sub after a replay-gap", n.next(), merge(view, map[string]string{"cursor": `"c1"`}))

	// The node refuses a view: the message is the application's to read.
	if err := c.SubscribeWith("public.items", SubscribeOptions{Filter: json.RawMessage(`{"col":"amount","op":"=","value":"x"}`), Columns: []string{}}); err != nil {
		t.Fatal(err)
	}
	wantSub(t, "keys-only sub", n.next(), map[string]string{"topic": `"public.items"`, "columns": `[]`})
	n.send(`{"t":"error","code":"bad-filter","message":"filter.value: column \"amount\" is int4; give an integer","topic":"public.items"}`)
	ev := nextEvent(t, c, c.Next)
	if ev.Type != EventError || ev.Code != "bad-filter" || ev.Topic != "public.items" || !strings.Contains(ev.Msg, `column "amount" is int4`) {
		t.Fatalf("bad-filter event %+v", ev)
	}

	// A reconnect resubscribes both topics with their views.
	n.conn.Close()
	n.accept()
	got := map[string]map[string]json.RawMessage{}
	for range 2 {
		f := n.next()
		var topic string
		_ = json.Unmarshal(f["topic"], &topic)
		got[topic] = f
	}
	wantSub(t, "orders after a reconnect", got["public.orders"], merge(view, map[string]string{"cursor": `"c1"`}))
	wantSub(t, "items after a reconnect", got["public.items"], map[string]string{"columns": `[]`, "filter": `{"col":"amount","op":"=","value":"x"}`})
}

func merge(a, b map[string]string) map[string]string {
	m := maps.Clone(a)
	maps.Copy(m, b)
	return m
}

// A changed view drops the cursor of the old one (the node would refuse it
// as bad-cursor); the same view keeps it. Columns nil and empty are
// different views; a filter that is not JSON is refused before it is sent.
func TestSubscribeWithViewChanges(t *testing.T) {
	n := newFakeNode(t)
	c, err := Dial(context.Background(), n.url(), Options{Token: "tok", PingInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n.accept()
	sub := func(o SubscribeOptions) map[string]json.RawMessage {
		t.Helper()
		if err := c.SubscribeWith("public.orders", o); err != nil {
			t.Fatal(err)
		}
		return n.next()
	}
	wantSub(t, "from a cursor", sub(SubscribeOptions{Cursor: "c7", Filter: json.RawMessage(paid)}), map[string]string{"cursor": `"c7"`, "filter": paid, "columns": ""})
	wantSub(t, "the same view", sub(SubscribeOptions{Filter: json.RawMessage(paid)}), map[string]string{"cursor": `"c7"`, "filter": paid})
	wantSub(t, "keys only", sub(SubscribeOptions{Filter: json.RawMessage(paid), Columns: []string{}}), map[string]string{"cursor": "", "columns": `[]`})
	if c.Cursor("public.orders") != "" {
		t.Fatalf("cursor %q kept across a view change", c.Cursor("public.orders"))
	}
	wantSub(t, "no view", sub(SubscribeOptions{Cursor: "c8", Filter: json.RawMessage(`null`)}), map[string]string{"cursor": `"c8"`, "filter": "", "columns": ""})
	if err := c.SubscribeWith("public.orders", SubscribeOptions{Filter: json.RawMessage(`{"col":`)}); err == nil {
		t.Fatal("a filter that is not JSON was accepted")
	}
	// Subscribe and SubscribeSnapshot are SubscribeWith without a view.
	if err := c.SubscribeSnapshot("public.docs", ""); err != nil {
		t.Fatal(err)
	}
	wantSub(t, "SubscribeSnapshot", n.next(), map[string]string{"topic": `"public.docs"`, "snapshot": "true", "filter": "", "columns": ""})
}

// The fresh snapshot State asks for after a resync carries the view, as
// does the resubscription after a reconnect in the middle of a snapshot;
// a row that leaves the filter leaves the state.
func TestStateResnapshotKeepsTheView(t *testing.T) {
	n := newFakeNode(t)
	c, err := Dial(context.Background(), n.url(), Options{Token: "tok", PingInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n.accept()
	s := NewState(c)
	if err := s.SubscribeWith("public.orders", SubscribeOptions{Filter: json.RawMessage(paid), Columns: []string{"status"}}); err != nil {
		t.Fatal(err)
	}
	view := map[string]string{"snapshot": "true", "filter": paid, "columns": `["status"]`}
	wantSub(t, "first sub", n.next(), merge(view, map[string]string{"cursor": ""}))
	for _, f := range []string{
		`{"t":"snapshot-begin","topic":"public.orders","snapshotId":1}`,
		`{"t":"row","topic":"public.orders","row":{"op":"read","key":{"id":1},"after":{"id":1,"status":"paid"}}}`,
		`{"t":"row","topic":"public.orders","row":{"op":"read","key":{"id":2},"after":{"id":2,"status":"paid"}}}`,
		`{"t":"snapshot-end","topic":"public.orders","cursor":"c1","snapshotId":1}`,
		`{"t":"change","topic":"public.orders","cursor":"c2","end":true,"change":{"seq":9,"op":"delete","key":{"id":2},"before":{"id":2},"left":"filter"}}`,
	} {
		n.send(f)
		nextEvent(t, c, s.Next)
	}
	if rows := s.Rows("public.orders"); len(rows) != 1 || rows[`{"id":1}`] == nil {
		t.Fatalf("rows after a removal: %v", rows)
	}
	n.send(`{"t":"resync","topic":"public.orders","cursor":"c3"}`)
	if ev := nextEvent(t, c, s.Next); ev.Type != EventResync {
		t.Fatalf("event %+v", ev)
	}
	wantSub(t, "fresh snapshot after a resync", n.next(), merge(view, map[string]string{"cursor": ""}))

	// Cut off in the middle of the fresh snapshot: asked for again whole.
	n.send(`{"t":"snapshot-begin","topic":"public.orders","snapshotId":2,"reason":"resync"}`)
	if ev := nextEvent(t, c, s.Next); ev.Type != EventSnapshotBegin {
		t.Fatalf("event %+v", ev)
	}
	n.conn.Close()
	n.accept()
	wantSub(t, "sub after a reconnect mid-snapshot", n.next(), merge(view, map[string]string{"cursor": ""}))
}
