package sync

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// parkedSockets counts the node's sockets that wait without a goroutine.
func (e *syncEnv) parkedSockets() int {
	e.node.mu.Lock()
	defer e.node.mu.Unlock()
	n := 0
	for s := range e.node.sockets {
		s.mu.Lock()
		if s.parked {
			n++
		}
		s.mu.Unlock()
	}
	return n
}

// socketReaders counts goroutines in a socket's read path.
func socketReaders() int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "fanout/sync.(*socket).readLoop")
}

// TestSyncIdleSocketsPark: on Linux an idle socket waits in the node's
// epoll set with no goroutine. Every frame still arrives and is answered,
// in order, changes still go out, a frame sent a byte at a time is read
// whole, the client's close and a vanished client are seen, and the node
// closes parked sockets.
func TestSyncIdleSocketsPark(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Fatal("this test is for Linux's epoll") // CI runs on Linux
	}
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

// TestSyncParkedSocketUnderFlood: a client that sends frames as fast as it
// can, with many in the kernel at once, has each handled exactly once and
// in order (the rate limit closes it as before), and a socket that sends
// half a frame and stops is not parked and closes on idle like any other.
func TestSyncParkedSocketUnderFlood(t *testing.T) {
	e := newSyncEnv(t, func(c *Config) {
		c.InboundRate, c.InboundBurst = 1, 3000
		c.IdleTimeout = 2 * time.Second
	})
	tok := token(t, []string{orders}, "", time.Hour)
	c := e.mustDial(tok)
	c.sub(orders, "")
	c.expect("subscribed")
	const burst = 3000 - 1 // the budget less the sub
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		for range burst {
			if c.c.WriteJSON(map[string]string{"t": "bogus"}) != nil {
				return
			}
		}
	}()
	for i := range burst {
		f := c.read()
		if f.T != "error" || f.Code != "bad-request" {
			t.Fatalf("after %d errors: %+v", i, f)
		}
	}
	<-wrote
	go func() {
		for c.c.WriteJSON(map[string]string{"t": "ping"}) == nil {
			time.Sleep(time.Millisecond)
		}
	}()
	if code, _ := c.expectClose(); code != CloseFlood {
		t.Fatalf("close %d, want %d (flood)", code, CloseFlood)
	}

	half := e.mustDial(tok)
	if _, err := half.c.NetConn().Write([]byte{0x81, 0x8c, 1}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if e.parkedSockets() != 0 {
		t.Fatal("a socket mid-frame was parked")
	}
	if code, _ := half.expectClose(); code != CloseIdle {
		t.Fatalf("half a frame: close %d, want %d (idle)", code, CloseIdle)
	}
}

// expectPongs reads n pongs, skipping the position frames a ping may bring.
func (c *wsConn) expectPongs(n, round, sock int) {
	c.t.Helper()
	for n > 0 {
		switch f := c.read(); f.T {
		case "pong":
			n--
		case "position":
		default:
			c.t.Fatalf("round %d socket %d: got %+v, want pong", round, sock, f)
		}
	}
}

// TestSyncOverTLS: a node serving WSS itself (walcast sync --tls-cert-file)
// reads its sockets through TLS, where records hide frame boundaries: they
// keep a reading goroutine instead of parking, and subscribe, changes,
// pings and the node's close all work as over plain TCP.
func TestSyncOverTLS(t *testing.T) {
	e := newSyncEnv(t)
	srv := httptest.NewUnstartedServer(e.node.Handler())
	srv.StartTLS()
	t.Cleanup(srv.Close)
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second, TLSClientConfig: srv.Client().Transport.(*http.Transport).TLSClientConfig}
	u := "wss" + strings.TrimPrefix(srv.URL, "https") + "/v1/socket?access_token=" + url.QueryEscape(token(t, []string{orders}, "", time.Hour))
	const n = 3
	cs := make([]*wsConn, n)
	for i := range cs {
		c, _, err := d.Dial(u, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs[i] = &wsConn{t: t, c: c}
		cs[i].sub(orders, "")
		cs[i].expect("subscribed")
	}
	e.topicLive(orders, n)
	e.commit(ins(orders, 1))
	for i, c := range cs {
		c.expectChanges(1)
		c.send(map[string]string{"t": "ping"})
		c.expectPongs(1, 0, i)
	}
	if p := e.parkedSockets(); p != 0 {
		t.Fatalf("%d TLS sockets parked", p)
	}
	if r := socketReaders(); r != n {
		t.Fatalf("%d reading goroutines for %d TLS sockets", r, n)
	}
	e.node.Close()
	for _, c := range cs {
		if code, _ := c.expectClose(); code != CloseShutdown {
			t.Fatalf("close code %d, want %d", code, CloseShutdown)
		}
	}
}
