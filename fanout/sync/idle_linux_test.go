//go:build linux

package sync

import (
	"net"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestSyncIdleSocketsPark: on Linux an idle socket waits in the node's
// epoll set with no goroutine. Every frame still arrives and is answered,
// in order, changes still go out, a frame sent a byte at a time is read
// whole, the client's close and a vanished client are seen, and the node
// closes parked sockets.
func TestSyncIdleSocketsPark(t *testing.T) {
	e := newSyncEnv(t)
	if e.node.poller == nil {
		t.Fatal("no idle poller on Linux")
	}
	const n = 20
	tok := token(t, []string{orders}, "", time.Hour)
	cs := make([]*wsConn, n)
	for i := range cs {
		cs[i] = e.mustDial(tok)
		cs[i].sub(orders, "")
		cs[i].expect("subscribed")
	}
	e.topicLive(orders, n)
	waitFor(t, "all sockets parked", func() bool { return e.parkedSockets() == n })
	if r := socketReaders(); r != 0 {
		t.Fatalf("%d goroutines read parked sockets", r)
	}

	// Changes go out to parked sockets; requests wake them, in order.
	e.commit(ins(orders, 1), ins(orders, 2))
	for _, c := range cs {
		if got := seqsOf(c.expectChanges(2)); len(got) != 2 || got[0] >= got[1] {
			t.Fatalf("changes %v", got)
		}
	}
	for round := range 3 {
		for _, c := range cs {
			for range 5 {
				c.send(map[string]string{"t": "ping"})
			}
		}
		for i, c := range cs {
			c.expectPongs(5, round, i)
		}
		waitFor(t, "sockets parked again", func() bool { return e.parkedSockets() == n })
	}

	// A frame dribbled a byte at a time: the socket wakes on the first
	// byte and reads the rest as it comes.
	raw := cs[0].c.NetConn()
	frame := wsRawFrame(websocket.TextMessage, true, true, []byte(`{"t":"ping"}`))
	for k := range frame[6:] { // mask the payload with the key 1,2,3,4
		frame[6+k] ^= byte(1 + k%4)
	}
	for _, b := range frame {
		if _, err := raw.Write([]byte{b}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Millisecond)
	}
	cs[0].expectPongs(1, 0, 0)

	// The client closes; another vanishes without a close frame.
	before := e.node.Stats().SocketsOpen
	_ = cs[1].c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
	if code, _ := cs[1].expectClose(); code != websocket.CloseNormalClosure {
		t.Fatalf("close code %d", code)
	}
	_ = cs[2].c.NetConn().(*net.TCPConn).SetLinger(0)
	_ = cs[2].c.NetConn().Close()
	waitFor(t, "two sockets gone", func() bool { return e.node.Stats().SocketsOpen == before-2 })

	// The node closes the parked rest with 1001 and waits for them.
	waitFor(t, "sockets parked again", func() bool { return e.parkedSockets() == n-2 })
	done := make(chan struct{})
	go func() { e.node.Close(); close(done) }()
	for _, c := range cs[3:] {
		if code, _ := c.expectClose(); code != CloseShutdown {
			t.Fatalf("close code %d, want %d", code, CloseShutdown)
		}
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return with parked sockets")
	}
	if s := e.node.Stats(); s.SocketsOpen != 0 {
		t.Fatalf("sockets open after Close: %d", s.SocketsOpen)
	}
}
