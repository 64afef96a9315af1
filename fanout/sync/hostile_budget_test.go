package sync

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
)

// hostileLimits are the per-client budgets of the hostile suite's node,
// small enough to reach in a test. The suite's own clients (and the
// well-behaved one) come from 127.0.0.1; each budget attacker from an
// address of its own.
func hostileLimits(c *Config) {
	c.MaxConnectionsPerIP = 20
	c.MaxConnectionsPerSubject = 20
	c.AcceptRatePerIP, c.AcceptBurstPerIP = 1, 30
	c.ChangesRate, c.ChangesBurst, c.ChangesConcurrency = 2, 5, 2
}

// getChanges reads GET /v1/changes as a client at address ip.
func (h *hostileEnv) getChanges(ip, tok string) (*http.Response, changesResponse) {
	h.t.Helper()
	req, _ := http.NewRequest("GET", h.srv.URL+"/v1/changes?topic="+orders, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := httpFrom(ip).Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out changesResponse
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp, out
}

// expectReader checks a well-behaved reader (its own address and subject)
// is served while an attacker is refused.
func (h *hostileEnv) expectReader(t *testing.T) {
	t.Helper()
	resp, out := h.getChanges("127.0.0.1", subToken(t, "reader", []string{orders}, "acme"))
	if resp.StatusCode != http.StatusOK || out.Horizon == 0 {
		t.Fatalf("well-behaved reader: %d %+v", resp.StatusCode, out)
	}
}

// hostileBudgetCases are the hostile suite's cases of per-client budgets
// ("unbounded work per client"): each attacker is refused with
// the documented status while the well-behaved client keeps its stream.
func hostileBudgetCases(h *hostileEnv) []struct {
	name   string
	attack func(t *testing.T)
} {
	tok := func(t *testing.T) string { return token(t, []string{orders}, "acme", time.Hour) }
	return []struct {
		name   string
		attack func(t *testing.T)
	}{
		{"connections from one address", func(t *testing.T) {
			// Before: only --max-connections (node-wide) bounded them. The
			// X-Forwarded-For header is the client's own word (no trusted
			// proxies here): ignored.
			base := h.node.Stats().SocketsOpen
			tabs := subToken(t, "many-tabs", []string{orders}, "acme")
			var conns []*wsConn
			for i := range 20 {
				c, resp, err := h.dialFromWith("127.0.0.2", tabs, 0, http.Header{"X-Forwarded-For": {fmt.Sprintf("203.0.113.%d", i)}})
				if err != nil {
					t.Fatalf("socket %d of the address's 20: %v %v", i, err, resp)
				}
				conns = append(conns, c)
			}
			_, resp, err := h.dialFromWith("127.0.0.2", tabs, 0, http.Header{"X-Forwarded-For": {"198.51.100.1"}})
			if err == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("21st socket from one address: %v %v", err, resp)
			}
			if n := h.node.Stats().Rejected["max-connections-per-ip"]; n != 1 {
				t.Fatalf("rejections %v", h.node.Stats().Rejected)
			}
			// Another address is admitted meanwhile.
			c := h.mustDial(tok(t))
			c.sub(orders, "")
			c.expect("subscribed")
			_ = c.c.Close()
			for _, c := range conns {
				_ = c.c.Close()
			}
			waitFor(t, "sockets closed", func() bool { return h.node.Stats().SocketsOpen == base })
		}},
		{"sockets of one subject from many addresses", func(t *testing.T) {
			base := h.node.Stats().SocketsOpen
			roamer := subToken(t, "roamer-ws", []string{orders}, "acme")
			var conns []*wsConn
			for i := range 20 {
				c, resp, err := h.dialFrom(fmt.Sprintf("127.0.2.%d", i+1), roamer, 0)
				if err != nil {
					t.Fatalf("socket %d of the subject's 20: %v %v", i, err, resp)
				}
				conns = append(conns, c)
			}
			_, resp, err := h.dialFrom("127.0.2.99", roamer, 0)
			if err == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("21st socket of one subject: %v %v", err, resp)
			}
			if n := h.node.Stats().Rejected["max-connections-per-subject"]; n != 1 {
				t.Fatalf("rejections %v", h.node.Stats().Rejected)
			}
			for _, c := range conns {
				_ = c.c.Close()
			}
			waitFor(t, "sockets closed", func() bool { return h.node.Stats().SocketsOpen == base })
		}},
		{"reconnect storm from one address", func(t *testing.T) {
			// Before: --accept-rate was node-wide only, so one address
			// could spend every other client's budget.
			refused := false
			base := h.node.Stats().SocketsOpen
			for i := 0; i < 40 && !refused; i++ {
				c, resp, err := h.dialFrom("127.0.0.3", tok(t), 0)
				if err != nil {
					if resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
						t.Fatalf("dial %d: %v %v", i, err, resp)
					}
					refused = true
					break
				}
				_ = c.c.Close()
				waitFor(t, "socket closed", func() bool { return h.node.Stats().SocketsOpen == base })
			}
			if !refused || h.node.Stats().Rejected["accept-rate-per-ip"] == 0 {
				t.Fatalf("40 reconnects in a burst of 30 were not refused: %v", h.node.Stats().Rejected)
			}
			c := h.mustDial(tok(t)) // another address: admitted
			_ = c.c.Close()
		}},
		{"journal reads from one address", func(t *testing.T) {
			// Before: GET /v1/changes had no rate, concurrency or byte
			// limit per client.
			flooder := subToken(t, "flooder", []string{orders}, "acme")
			ok, limited := 0, 0
			for range 20 {
				resp, _ := h.getChanges("127.0.0.4", flooder)
				switch resp.StatusCode {
				case http.StatusOK:
					ok++
				case http.StatusTooManyRequests:
					if resp.Header.Get("Retry-After") == "" {
						t.Fatal("429 without Retry-After")
					}
					limited++
				default:
					t.Fatalf("status %d", resp.StatusCode)
				}
			}
			if ok < 5 || limited == 0 {
				t.Fatalf("%d served, %d refused", ok, limited)
			}
			h.expectReader(t)
		}},
		{"journal reads under one subject from many addresses", func(t *testing.T) {
			roamer := subToken(t, "roamer", []string{orders}, "acme")
			limited := 0
			for i := range 20 {
				resp, _ := h.getChanges(fmt.Sprintf("127.0.1.%d", 10+i), roamer)
				if resp.StatusCode == http.StatusTooManyRequests {
					limited++
				}
			}
			if limited == 0 {
				t.Fatal("one subject read 20 times at once from 20 addresses unrefused")
			}
			h.expectReader(t)
		}},
		{"concurrent journal reads", func(t *testing.T) {
			release := make(chan struct{})
			var held atomic.Int32
			hook := func(r *http.Request) {
				if h.node.clientKey(r) == "ip:127.0.0.5" {
					held.Add(1)
					select {
					case <-release:
					case <-r.Context().Done():
					}
				}
			}
			h.node.changesHook.Store(&hook)
			defer h.node.changesHook.Store(nil)
			slow := subToken(t, "slow", []string{orders}, "acme")
			done := make(chan int, 2)
			for range 2 {
				go func() {
					req, _ := http.NewRequest("GET", h.srv.URL+"/v1/changes?topic="+orders, nil)
					req.Header.Set("Authorization", "Bearer "+slow)
					resp, err := httpFrom("127.0.0.5").Do(req)
					if err != nil {
						done <- 0
						return
					}
					resp.Body.Close()
					done <- resp.StatusCode
				}()
			}
			waitFor(t, "two reads in flight", func() bool { return held.Load() == 2 })
			if resp, _ := h.getChanges("127.0.0.5", slow); resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("a third read in flight: %d", resp.StatusCode)
			}
			h.expectReader(t)
			close(release)
			for range 2 {
				if code := <-done; code != http.StatusOK {
					t.Fatalf("held read: %d", code)
				}
			}
		}},
		{"oversize change on a stalled journal", func(t *testing.T) {
			// Before: the oversize envelope was fetched on the NATS callback
			// with no timeout, so a slow journal stalled the entity's
			// delivery to every member. Now the members that see it catch
			// up on their own goroutines; the others keep receiving.
			beta := h.mustDial(token(t, []string{orders}, "beta", time.Hour))
			beta.sub(orders, "")
			beta.expect("subscribed")
			h.topicLive(orders, 2)
			release := make(chan struct{})
			hook := func(ctx context.Context) {
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			h.node.reads.testHook.Store(&hook)
			en := h.appendRows(row{entity: orders, op: decoder.OpInsert, id: 800, tenant: "beta", state: decoder.TenantKnown, pad: 5000})[0]
			full := en.Envelope
			ref := bytes.Replace(full, []byte(`"op":"insert"`), []byte(`"op":"insert","oversize":true`), 1)
			ref = append(ref[:bytes.Index(ref, []byte(`,"key"`))], '}')
			en.Envelope = ref
			h.publish(en)
			h.deliverOrdinary(t) // acme's stream goes on while beta's read is held
			h.node.reads.testHook.Store(nil)
			close(release)
			if f := beta.expect("change"); !bytes.Equal(f.Change, full) {
				t.Fatalf("beta got %s\nwant the journaled envelope", f.Change)
			}
			if f := beta.expect("change"); f.env.Seq <= en.Seq {
				t.Fatalf("beta then got seq %d", f.env.Seq)
			}
			beta.send(map[string]string{"t": "unsub", "topic": orders})
			h.topicLive(orders, 1)
		}},
	}
}
