package sync

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/fanout/client"
)

// TestClientOriginRefusalIsTerminal: a Go client whose reconnect is
// refused with 403 (its Origin is not allowed by the node it reaches now)
// stops and reports the refusal from Next, with the node's advice. Before,
// it retried forever with nothing reported.
func TestClientOriginRefusalIsTerminal(t *testing.T) {
	const origin = "https://app.example.com"
	e := newSyncEnv(t, func(c *Config) { c.AllowedOrigins = []string{origin} })
	// The node that answers reconnects: the same journal and NATS, no
	// --allowed-origins (only its own origin and requests without one).
	auth, err := NewHMACAuth(syncJWTSecret)
	if err != nil {
		t.Fatal(err)
	}
	strict, err := Open(syncCtx(t), Config{NATS: bus.NATSConfig{URL: e.nats.URL()}, Journal: e.j, Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	defer strict.Close()
	var h atomic.Pointer[http.Handler]
	first := e.node.Handler()
	h.Store(&first)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*h.Load()).ServeHTTP(w, r) }))
	defer srv.Close()

	c, err := client.Dial(syncCtx(t), "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/socket", client.Options{
		Token: token(t, []string{orders}, "", time.Hour), Header: http.Header{"Origin": {origin}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	second := strict.Handler()
	h.Store(&second)
	e.node.Close() // 4000: the client reconnects, to the strict node

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		_, err := c.Next(ctx)
		if err == nil {
			continue
		}
		var he *client.HandshakeError
		if !errors.As(err, &he) || he.Status != http.StatusForbidden || !strings.Contains(he.Body, "--allowed-origins") {
			t.Fatalf("Next: %v, want the 403 origin refusal", err)
		}
		return
	}
}
