package sync

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/replication"
)

// until reads frames until one of kind and returns it.
func (c *wsConn) until(kind string) inFrame {
	c.t.Helper()
	for {
		if f := c.read(); f.T == kind {
			return f
		} else if f.T == "error" && kind != "error" {
			c.t.Fatalf("error frame %+v while waiting for %q", f, kind)
		}
	}
}

// TestSnapshotRateLimited: the snapshots a client asks for are bounded per
// address and per subject (State.Rate, State.Burst): past the burst a
// "snapshot":true subscription is refused with rate-limited and GET
// /v1/snapshot with 429 and Retry-After, while plain subscriptions and the
// snapshots the node starts itself (a TRUNCATE's) go on.
func TestSnapshotRateLimited(t *testing.T) {
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) {
		c.State.Rate, c.State.Burst = 0.01, 3
	})
	pgtest.MustExec(t, env.src, `INSERT INTO docs SELECT g, 'a', 'v' FROM generate_series(1, 5) g`)
	ws := env.mustDial(stateToken(t, "a", true))
	snap := map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true}
	for range 3 {
		ws.send(snap)
		ws.until("snapshot-end")
	}
	ws.send(snap)
	if f := ws.until("error"); f.Code != "rate-limited" || f.Topic != "public.docs" || f.RetryAfter == nil || *f.RetryAfter < 1 ||
		!strings.Contains(f.Message, "after "+strconv.FormatInt(*f.RetryAfter, 10)+" s") {
		t.Fatalf("the 4th snapshot: %+v, want rate-limited with a retryAfter in whole seconds that its message names", f)
	}
	// A plain subscription costs no snapshot.
	ws.sub("public.docs", "")
	plain := ws.until("subscribed")
	// Another subject from the same address shares the address's budget.
	other := env.mustDial(stateToken(t, "b", true))
	other.send(snap)
	if f := other.until("error"); f.Code != "rate-limited" {
		t.Fatalf("another subject from the same address: %+v", f)
	}
	req, _ := http.NewRequest("GET", env.srv.URL+"/v1/snapshot?topic=public.docs", nil)
	req.Header.Set("Authorization", "Bearer "+stateToken(t, "a", true))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("GET /v1/snapshot past the budget: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	// A snapshot the node starts itself is not charged: a third socket
	// resumes from a cursor (no snapshot), and a TRUNCATE resnapshots it.
	third := env.mustDial(stateToken(t, "a", true))
	third.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true, "cursor": plain.Cursor})
	third.until("subscribed")
	pgtest.MustExec(t, env.src, `TRUNCATE docs`)
	if f := third.until("snapshot-begin"); f.T != "snapshot-begin" {
		t.Fatal(f)
	}
	third.until("snapshot-end")
	if got := env.node.Stats().Rejected["snapshot-rate"]; got != 3 {
		t.Fatalf("rejected snapshot-rate %d, want 3", got)
	}
}
