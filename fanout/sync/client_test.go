package sync

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/client"
	"github.com/walcast/walcast/journal"
)

func (e *syncEnv) client(tok string, opts client.Options) *client.Client {
	e.t.Helper()
	opts.Token = tok
	c, err := client.Dial(syncCtx(e.t), e.wsURL(""), opts)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// collect reads n changes from c, failing on anything else but resync.
func collect(t *testing.T, c *client.Client, n int) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []int64
	for len(got) < n {
		ev, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("after %d changes: %v", len(got), err)
		}
		switch ev.Type {
		case client.EventChange:
			got = append(got, ev.Seq)
		case client.EventError:
			t.Fatalf("error event %+v", ev)
		}
	}
	return got
}

// The Go client against a slow application: its buffer fills, the node drops
// and sends a replay-gap, the client resubscribes with its cursor, and the
// application ends with every change once, in order.
func TestClientFollowsReplayGap(t *testing.T) {
	e := newSyncEnv(t, func(c *Config) {
		c.MaxBufferedBytes = 16 << 10
		c.MaxDroppedFrames = 100000
		c.sndBuf = 4096
	})
	d := &websocket.Dialer{NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			_ = conn.(*net.TCPConn).SetReadBuffer(4096)
		}
		return conn, err
	}}
	c := e.client(token(t, []string{orders}, "", time.Hour), client.Options{Dialer: d, Buffer: 2})
	if err := c.Subscribe(orders, ""); err != nil {
		t.Fatal(err)
	}
	e.topicLive(orders, 1)
	var want []int64
	for i := range 60 {
		for _, en := range e.commit(row{entity: orders, op: decoder.OpInsert, id: i, pad: 2000}) {
			want = append(want, en.Seq)
		}
	}
	waitFor(t, "drops", func() bool { return e.node.Stats().FramesDropped > 0 })
	if got := collect(t, c, len(want)); !slices.Equal(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	if e.node.Stats().ReplayGaps == 0 {
		t.Fatal("no replay-gap was needed; the test did not exercise it")
	}
}

// The client reconnects after the node closes its socket and resumes from
// its cursor.
func TestClientReconnectsFromCursor(t *testing.T) {
	e := newSyncEnv(t)
	c := e.client(token(t, []string{orders}, "", time.Hour), client.Options{})
	if err := c.Subscribe(orders, ""); err != nil {
		t.Fatal(err)
	}
	e.topicLive(orders, 1)
	var want []int64
	for i := range 3 {
		want = append(want, e.commit(ins(orders, i))[0].Seq)
	}
	got := collect(t, c, 3)
	// Kick every socket; commit while the client is away.
	e.node.mu.Lock()
	for s := range e.node.sockets {
		s.closeWith(websocket.CloseGoingAway, "test", "test")
	}
	e.node.mu.Unlock()
	for i := 3; i < 6; i++ {
		want = append(want, e.commit(ins(orders, i))[0].Seq)
	}
	e.topicLive(orders, 1)
	for i := 6; i < 8; i++ {
		want = append(want, e.commit(ins(orders, i))[0].Seq)
	}
	got = append(got, collect(t, c, 5)...)
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// Refused handshakes are reported.
	_, err := client.Dial(syncCtx(t), e.wsURL(""), client.Options{Token: "bad"})
	var he *client.HandshakeError
	if !errors.As(err, &he) || he.Status != 401 {
		t.Fatalf("bad token: %v", err)
	}
}

// A journal resync reaches the application as an EventResync with the new
// cursor; changes continue after it.
func TestClientResync(t *testing.T) {
	e := newSyncEnv(t)
	c := e.client(token(t, []string{orders}, "", time.Hour), client.Options{})
	if err := c.Subscribe(orders, ""); err != nil {
		t.Fatal(err)
	}
	e.topicLive(orders, 1)
	res, err := e.j.AppendResync(syncCtx(t), e.gen, journal.Resync{Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(e.entries(res.FirstSeq, res.LastSeq)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ev, err := c.Next(ctx)
	if err != nil || ev.Type != client.EventResync || ev.Topic != orders || ev.Cursor == "" || c.Cursor(orders) != ev.Cursor {
		t.Fatalf("got %+v %v", ev, err)
	}
	next := e.commit(ins(orders, 1))[0].Seq
	if got := collect(t, c, 1); got[0] != next {
		t.Fatalf("got %v, want %d", got, next)
	}
}
