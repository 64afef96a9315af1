package sync

import (
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
)

// hostileEnv is a node with one well-behaved client (tenant acme, "*"
// grant) following orders; every hostile case is followed by an ordinary
// change that client must receive next, in order.
type hostileEnv struct {
	*syncEnv
	good *wsConn
	next int
}

func newHostileEnv(t *testing.T, mod ...func(*Config)) *hostileEnv {
	t.Helper()
	h := &hostileEnv{syncEnv: newSyncEnv(t, mod...)}
	// orders exists in the journal, so a "*" grant may follow it.
	h.commit(ins(orders, 0))
	if err := h.node.loadEntities(syncCtx(t)); err != nil {
		t.Fatal(err)
	}
	h.good = h.mustDial(token(t, []string{"*"}, "acme", time.Hour))
	h.good.sub(orders, "")
	h.good.expect("subscribed")
	h.topicLive(orders, 1)
	// Attacks start once the node reports ready, as behind a load
	// balancer: the first delivery may precede the node's first read of
	// the journal's horizon (its LISTEN connection comes up on its own).
	waitFor(t, "the node ready", func() bool { ok, _ := h.node.Ready(); return ok })
	return h
}

// deliverOrdinary commits one ordinary row and checks the good client gets
// exactly it next (nothing the attacker caused in between).
func (h *hostileEnv) deliverOrdinary(t *testing.T) {
	t.Helper()
	h.next++
	es := h.commit(row{entity: orders, op: decoder.OpInsert, id: 1000 + h.next})
	f := h.good.expect("change")
	if f.env.Seq != es[0].Seq {
		t.Fatalf("well-behaved client got seq %d (%s), want %d", f.env.Seq, f.Change, es[0].Seq)
	}
	if ok, why := h.node.Ready(); !ok {
		t.Fatalf("node not ready: %s", why)
	}
	if ok, why := h.node.Healthy(); !ok {
		t.Fatalf("node not healthy: %s", why)
	}
}

func (h *hostileEnv) topics() int {
	h.node.mu.Lock()
	defer h.node.mu.Unlock()
	return len(h.node.topics)
}

// TestHostileClients: each attacker is refused or closed with the
// documented code; the node's NATS connection, its health and the
// well-behaved client's stream survive every one. The node's memory high
// water mark is logged at the end.
func TestHostileClients(t *testing.T) {
	h := newHostileEnv(t, func(c *Config) { c.ReadHeaderTimeout = 500 * time.Millisecond }, hostileLimits)
	star := token(t, []string{"*"}, "", time.Hour)
	expectErr := func(t *testing.T, c *wsConn, code string) {
		t.Helper()
		if f := c.expect("error"); f.Code != code {
			t.Fatalf("got error %q (%s), want %q", f.Code, f.Message, code)
		}
	}
	cases := []struct {
		name   string
		attack func(t *testing.T)
	}{
		{"long topic under a star grant", func(t *testing.T) {
			// Before: escaping tripled the '*'s into a >4 KB SUB line, the
			// server answered "maximum control line exceeded" and nats.go
			// closed the node's connection for good.
			c := h.mustDial(star)
			c.sub("public."+strings.Repeat("*", 1400), "")
			expectErr(t, c, "bad-topic")
			c.sub(`"`+strings.Repeat(".", 200)+`"."`+strings.Repeat(">", 200)+`"`, "")
			expectErr(t, c, "bad-topic")
		}},
		{"nonexistent topics under a star grant", func(t *testing.T) {
			before, reads := h.topics(), h.node.reads.queries.Load()
			c := h.mustDial(star)
			for i := range 40 {
				c.sub("public.nope_"+strings.Repeat("x", i), "")
				expectErr(t, c, "unknown-topic")
			}
			if h.topics() != before || h.node.reads.queries.Load() != reads {
				t.Fatalf("unknown topics cost subscriptions or journal reads: %d topics, %d reads", h.topics()-before, h.node.reads.queries.Load()-reads)
			}
		}},
		{"topic not granted", func(t *testing.T) {
			c := h.mustDial(token(t, []string{"public.items"}, "", time.Hour))
			c.sub(orders, "")
			expectErr(t, c, "forbidden")
		}},
		{"lookalike tenants", func(t *testing.T) {
			// A row of tenant 'acme ' (or "acme\r\n", or '') must not
			// reach acme live; nats.go trims header values, so routing is
			// on the subject's exact tenant token.
			for i, tn := range []string{"acme ", "acme\r\n", " acme", ""} {
				h.commit(row{entity: orders, op: decoder.OpInsert, id: 500 + i, tenant: tn, state: decoder.TenantKnown})
			}
		}},
		{"tenant of 5 KB", func(t *testing.T) {
			big := strings.Repeat("b", 5<<10)
			c := h.mustDial(token(t, []string{orders}, big, time.Hour))
			c.sub(orders, "")
			c.expect("subscribed")
			h.topicLive(orders, 2)
			es := h.commit(row{entity: orders, op: decoder.OpInsert, id: 600, tenant: big, state: decoder.TenantKnown})
			// A subscription without a cursor starts about now: the
			// untenanted row committed just before it may come first.
			f := c.expect("change")
			for f.env.Seq < es[0].Seq && f.env.Tenant == "" {
				f = c.expect("change")
			}
			if f.env.Seq != es[0].Seq || f.env.Tenant != big {
				t.Fatalf("the 5 KB tenant's own client got seq %d (tenant of %d bytes, op %s), want seq %d", f.env.Seq, len(f.env.Tenant), f.env.Op, es[0].Seq)
			}
			c.send(map[string]string{"t": "unsub", "topic": orders})
			h.topicLive(orders, 1)
		}},
		{"bad handshakes", func(t *testing.T) {
			for i := range 100 {
				tok := []string{"", "x.y.z", star[:len(star)-3] + "AAA"}[i%3]
				_, resp, err := h.dial(tok, 0)
				if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
					t.Fatalf("bad token %d: %v %v", i, err, resp)
				}
			}
		}},
		{"oversized frame", func(t *testing.T) {
			c := h.mustDial(star)
			_ = c.c.WriteMessage(websocket.TextMessage, []byte(`{"t":"sub","topic":"`+strings.Repeat("x", 64<<10)+`"}`))
			if code, reason := c.expectClose(); code != CloseBadFrame || reason != "frame too large" {
				t.Fatalf("closed %d %q", code, reason)
			}
		}},
		{"malformed frame", func(t *testing.T) {
			c := h.mustDial(star)
			_ = c.c.WriteMessage(websocket.TextMessage, []byte("\xff\x00{"))
			if code, reason := c.expectClose(); code != CloseBadFrame || reason != "invalid JSON frame" {
				t.Fatalf("closed %d %q", code, reason)
			}
		}},
		{"10k subscriptions", func(t *testing.T) {
			before := h.topics()
			c := h.mustDial(star)
			for i := range 10000 {
				if err := c.c.WriteJSON(map[string]string{"t": "sub", "topic": "public.t" + strings.Repeat("x", i%50)}); err != nil {
					break // closed under us
				}
			}
			if code, reason := c.expectClose(); code != CloseFlood || reason != "rate limit exceeded" {
				t.Fatalf("closed %d %q", code, reason)
			}
			if h.topics() != before {
				t.Fatalf("%d topics left behind", h.topics()-before)
			}
		}},
		{"slowloris", func(t *testing.T) {
			// Headers trickled forever: the connection is closed after
			// ReadHeaderTimeout (set short for this node).
			conn, err := net.Dial("tcp", h.srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			_, _ = conn.Write([]byte("GET /v1/socket HTTP/1.1\r\nHost: x\r\n"))
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, 512)
			for {
				if _, err := conn.Read(buf); err != nil {
					break
				}
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("a slow header kept its connection %s", el)
			}
		}},
		{"body slowloris", func(t *testing.T) {
			// A request that declares a body and sends two bytes of it,
			// on every path, with no token. Before, net/http read the
			// rest after the handler with no deadline: no answer, the
			// connection held for good (1,100 of them took every file
			// descriptor of a node). Now each is answered 413 and closed
			// at once, unread.
			paths := []string{"/v1/changes?topic=" + orders, "/v1/snapshot?topic=" + orders, "/v1/events?topic=" + orders,
				"/v1/socket", "/v1/nothing-here"}
			var conns []net.Conn
			for i := range 40 {
				conn, err := net.Dial("tcp", h.srv.Listener.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				body := "Content-Length: 100000\r\n\r\nab"
				if i%2 == 1 {
					body = "Transfer-Encoding: chunked\r\n\r\n186a0\r\nab"
				}
				if _, err := conn.Write([]byte("GET " + paths[i%len(paths)] + " HTTP/1.1\r\nHost: x\r\n" + body)); err != nil {
					t.Fatal(err)
				}
				conns = append(conns, conn)
			}
			for i, conn := range conns {
				_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				got, err := io.ReadAll(conn) // to EOF: the node closes it
				if err != nil {
					t.Fatalf("%s: %v after %q (the connection was neither answered nor closed)", paths[i%len(paths)], err, got)
				}
				if !strings.HasPrefix(string(got), "HTTP/1.1 413 ") || !strings.Contains(string(got), "Connection: close") {
					t.Fatalf("%s: got %q, want a 413 that closes the connection", paths[i%len(paths)], got)
				}
			}
		}},
		{"huge headers", func(t *testing.T) {
			req, _ := http.NewRequest("GET", h.srv.URL+"/v1/changes?topic="+orders, nil)
			req.Header.Set("X-Pad", strings.Repeat("x", 64<<10))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
				t.Fatalf("64 KB of headers: %d", resp.StatusCode)
			}
		}},
		{"client that never reads", func(t *testing.T) {
			c, _, err := h.dial(star, 4096)
			if err != nil {
				t.Fatal(err)
			}
			c.sub(orders, "")
			h.topicLive(orders, 2)
			for i := range 40 {
				h.commit(row{entity: orders, op: decoder.OpInsert, id: 700 + i, pad: 60 << 10})
				h.good.expect("change")
			}
			_ = c.c.Close()
		}},
	}
	cases = append(cases, hostileBudgetCases(h)...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.attack(t)
			h.deliverOrdinary(t)
		})
	}
	logMemory(t)
}

// TestSyncNATSClosedFailsHealth: a connection nats.go closes for good
// (after a protocol error, or once it stops reconnecting) makes the node
// unhealthy and unready and closes Failed, so `walcast sync` exits and is
// replaced. Before, no closed handler was registered and /healthz stayed ok.
func TestSyncNATSClosedFailsHealth(t *testing.T) {
	e := newSyncEnv(t)
	if ok, _ := e.node.Healthy(); !ok {
		t.Fatal("unhealthy at start")
	}
	e.node.nc.Close()
	select {
	case <-e.node.Failed():
	case <-time.After(10 * time.Second):
		t.Fatal("Failed not closed")
	}
	if ok, why := e.node.Healthy(); ok || !strings.Contains(why, "closed") {
		t.Fatalf("healthy after the connection closed: %s", why)
	}
	if ok, why := e.node.Ready(); ok || !strings.Contains(why, "closed") {
		t.Fatalf("ready after the connection closed: %s", why)
	}
}

// TestSyncNewEntityBecomesTopic: under a "*" grant, a table's first change
// makes it a topic within the refresh interval.
func TestSyncNewEntityBecomesTopic(t *testing.T) {
	e := newSyncEnv(t)
	c := e.mustDial(token(t, []string{"*"}, "", time.Hour))
	c.sub("public.fresh", "")
	if f := c.expect("error"); f.Code != "unknown-topic" {
		t.Fatalf("got %+v", f)
	}
	e.commit(ins("public.fresh", 1))
	waitFor(t, "public.fresh known", func() bool { return e.node.known("public.fresh") })
	c.sub("public.fresh", "")
	c.expect("subscribed")
}

// TestSyncSubjectTokens: the node's subscription and the publisher's
// subjects come from the same bus functions, hashed tokens included.
func TestSyncSubjectTokens(t *testing.T) {
	long := decoder.EntityName("s", strings.Repeat("é", 31))
	if got := bus.EntitySubjects("walcast", long); len(got) > bus.MaxSubjectBytes+2 {
		t.Fatalf("subscription subject of %d bytes", len(got))
	}
	if len(long) > MaxTopicBytes {
		t.Fatalf("a 63-byte identifier (%d bytes as a topic) exceeds MaxTopicBytes", len(long))
	}
}

// logMemory logs the test process's peak and current RSS (the node runs in
// it, beside Postgres clients and the embedded NATS server).
func logMemory(t *testing.T) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") || strings.HasPrefix(l, "VmRSS:") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	t.Logf("node process memory after the hostile suite: %s", strings.Join(out, ", "))
}
