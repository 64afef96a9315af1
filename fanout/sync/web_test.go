package sync

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// get sends GET path with the token (if any) and headers, and returns the
// response with its body read.
func (e *syncEnv) get(path, tok string, hdr map[string]string) (*http.Response, string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", e.srv.URL+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	// An event stream does not end: its first bytes are enough.
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		rest, _ := io.ReadAll(resp.Body)
		b = append(b, rest...)
	}
	return resp, string(b)
}

// dialOrigin opens a socket with the given Origin header ("" for none).
func (e *syncEnv) dialOrigin(tok, origin string) (*http.Response, error) {
	e.t.Helper()
	h := http.Header{}
	if origin != "" {
		h.Set("Origin", origin)
	}
	c, resp, err := (&websocket.Dialer{HandshakeTimeout: 10 * time.Second}).Dial(e.wsURL(tok), h)
	if err == nil {
		c.Close()
	}
	return resp, err
}

// TestOriginRule: --allowed-origins applies to requests with an Origin
// header only. A service, a CLI or curl (no Origin) is never refused; the
// node's own origin (its console) is always allowed; a listed origin is
// allowed and may read /v1/changes and /v1/snapshot across origins (CORS,
// no credentials); any other origin gets 403 saying what to do, on every
// endpoint, counted, and logged once per origin. Before, a list locked
// out every request without an Origin and the node's own pages.
func TestOriginRule(t *testing.T) {
	var logs bytes.Buffer
	var logMu sync.Mutex
	const app, evil = "https://app.example.com", "https://evil.example"
	e := newSyncEnv(t, func(c *Config) {
		c.AllowedOrigins = []string{app}
		c.Logger = slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))
	})
	e.commit(ins(orders, 1))
	tok := token(t, []string{orders}, "", time.Hour)
	own := e.srv.URL // http://127.0.0.1:port: the node's own origin

	for _, origin := range []string{"", own, app} {
		if resp, err := e.dialOrigin(tok, origin); err != nil {
			t.Fatalf("socket with Origin %q: %v %v", origin, err, resp)
		}
		if resp, body := e.get("/v1/changes?topic="+orders, tok, map[string]string{"Origin": origin}); resp.StatusCode != http.StatusOK {
			t.Fatalf("/v1/changes with Origin %q: %d %s", origin, resp.StatusCode, body)
		}
		if resp, body := e.get("/v1/events?topic="+orders, tok, map[string]string{"Origin": origin}); resp.StatusCode != http.StatusOK {
			t.Fatalf("/v1/events with Origin %q: %d %s", origin, resp.StatusCode, body)
		}
	}
	// A listed origin may read the answer; no credentials are offered.
	resp, _ := e.get("/v1/changes?topic="+orders, tok, map[string]string{"Origin": app})
	if resp.Header.Get("Access-Control-Allow-Origin") != app || resp.Header.Get("Access-Control-Allow-Credentials") != "" {
		t.Fatalf("/v1/changes CORS for %s: %v", app, resp.Header)
	}
	resp, _ = e.get("/v1/changes?topic="+orders, tok, nil)
	if resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("/v1/changes without Origin carries CORS headers: %v", resp.Header)
	}
	for _, p := range []string{"/v1/changes", "/v1/snapshot", "/v1/events"} {
		req, _ := http.NewRequest("OPTIONS", e.srv.URL+p+"?topic="+orders, nil)
		req.Header.Set("Origin", app)
		req.Header.Set("Access-Control-Request-Headers", "authorization")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != app ||
			!strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "Authorization") {
			t.Fatalf("preflight of %s: %d %v", p, resp.StatusCode, resp.Header)
		}
	}

	// Another origin: 403 with the fix, on every endpoint.
	before := e.node.Stats().Rejected["origin"]
	resp, err := e.dialOrigin(tok, evil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("socket from %s: %v %v", evil, err, resp)
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), evil) || !strings.Contains(string(body), "--allowed-origins") {
		t.Fatalf("403 body %q does not name the origin and the fix", body)
	}
	for _, p := range []string{"/v1/changes", "/v1/snapshot", "/v1/events"} {
		resp, body := e.get(p+"?topic="+orders, tok, map[string]string{"Origin": evil})
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "--allowed-origins") ||
			resp.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Fatalf("%s from %s: %d %q %v", p, evil, resp.StatusCode, body, resp.Header)
		}
	}
	if got := e.node.Stats().Rejected["origin"] - before; got != 4 {
		t.Fatalf("origin refusals counted %d, want 4", got)
	}
	logMu.Lock()
	n := strings.Count(logs.String(), "origin="+evil)
	logMu.Unlock()
	if n != 1 {
		t.Fatalf("the refused origin was logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestOriginRuleWithoutList: without --allowed-origins the node's own
// origin and requests without one are allowed, other origins refused.
func TestOriginRuleWithoutList(t *testing.T) {
	e := newSyncEnv(t)
	tok := token(t, []string{orders}, "", time.Hour)
	for origin, want := range map[string]bool{"": true, e.srv.URL: true, "https://app.example.com": false, "null": false} {
		_, err := e.dialOrigin(tok, origin)
		if (err == nil) != want {
			t.Fatalf("socket with Origin %q: %v, want allowed %v", origin, err, want)
		}
	}
}

// TestOriginLogBounded: however many origins are refused, the node
// remembers at most maxLoggedOrigins of them, each cut to maxOriginBytes.
func TestOriginLogBounded(t *testing.T) {
	e := newSyncEnv(t)
	for i := range maxLoggedOrigins + 500 {
		r := httptest.NewRequest("GET", "/v1/socket", nil)
		r.Header.Set("Origin", "https://o"+strconv.Itoa(i)+"."+strings.Repeat("y", i%600))
		e.node.refuseOrigin(httptest.NewRecorder(), r)
	}
	e.node.refusedOrigins.mu.Lock()
	defer e.node.refusedOrigins.mu.Unlock()
	if len(e.node.refusedOrigins.seen) != maxLoggedOrigins {
		t.Fatalf("%d origins remembered, want %d", len(e.node.refusedOrigins.seen), maxLoggedOrigins)
	}
	for o := range e.node.refusedOrigins.seen {
		if len(o) > maxOriginBytes {
			t.Fatalf("an origin of %d bytes remembered", len(o))
		}
	}
}

// TestHTTPNoStore: the HTTP reads carry rows, cursors and possibly a token
// in the URL: no cache may keep them, errors included.
func TestHTTPNoStore(t *testing.T) {
	e := newSyncEnv(t)
	e.commit(ins(orders, 1))
	tok := token(t, []string{orders}, "", time.Hour)
	for _, tc := range []struct {
		path, tok string
		status    int
	}{
		{"/v1/changes?topic=" + orders, tok, http.StatusOK},
		{"/v1/changes?topic=" + orders, "", http.StatusUnauthorized},
		{"/v1/changes?topic=nodot", tok, http.StatusBadRequest},
		{"/v1/changes?topic=" + orders + "&cursor=forged", tok, http.StatusBadRequest},
		{"/v1/snapshot?topic=" + orders, "", http.StatusUnauthorized},
		{"/v1/snapshot?topic=public.other", tok, http.StatusForbidden},
		{"/v1/events?topic=" + orders, "", http.StatusUnauthorized},
		{"/v1/events?topic=" + orders, tok, http.StatusOK},
	} {
		resp, body := e.get(tc.path, tc.tok, nil)
		if resp.StatusCode != tc.status || resp.Header.Get("Cache-Control") != "no-store" {
			t.Fatalf("%s: %d, Cache-Control %q (%s); want %d, no-store", tc.path, resp.StatusCode, resp.Header.Get("Cache-Control"), body, tc.status)
		}
	}
}
