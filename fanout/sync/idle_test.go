package sync

import (
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
