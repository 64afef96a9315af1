package sync

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// sseEvent is one event as a test reads it.
type sseEvent struct {
	name, id string
	data     inFrame
	raw      string
}

// sseConn is a raw event-stream reader.
type sseConn struct {
	t      testing.TB
	resp   *http.Response
	cancel context.CancelFunc
	events chan sseEvent
	// comments counts heartbeat comments.
	mu       sync.Mutex
	comments int
}

// openEvents opens GET /v1/events?query with the token in the header (or
// none) and extra headers.
func (e *syncEnv) openEvents(tok, query string, hdr map[string]string) (*sseConn, *http.Response) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/v1/events?"+query, nil)
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
		cancel()
		e.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		cancel()
		return nil, resp
	}
	c := &sseConn{t: e.t, resp: resp, cancel: cancel, events: make(chan sseEvent, 1024)}
	e.t.Cleanup(func() { cancel(); resp.Body.Close() })
	go c.read()
	return c, resp
}

func (c *sseConn) read() {
	defer close(c.events)
	sc := bufio.NewScanner(c.resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var ev sseEvent
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) > 0 {
				ev.raw = strings.Join(data, "\n")
				_ = json.Unmarshal([]byte(ev.raw), &ev.data)
				if ev.data.T == "change" {
					_ = json.Unmarshal(ev.data.Change, &ev.data.env)
				}
				c.events <- ev
			}
			ev, data = sseEvent{}, nil
		case strings.HasPrefix(line, ": heartbeat"):
			c.mu.Lock()
			c.comments++
			c.mu.Unlock()
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event: "):
			ev.name = line[7:]
		case strings.HasPrefix(line, "id: "):
			ev.id = line[4:]
		case strings.HasPrefix(line, "data: "):
			data = append(data, line[6:])
		}
	}
}

func (c *sseConn) next() sseEvent {
	c.t.Helper()
	select {
	case ev, ok := <-c.events:
		if !ok {
			c.t.Fatal("event stream ended")
		}
		return ev
	case <-time.After(20 * time.Second):
		c.t.Fatal("no event within 20s")
	}
	return sseEvent{}
}

func (c *sseConn) expect(name string) sseEvent {
	c.t.Helper()
	ev := c.next()
	if ev.name != name {
		c.t.Fatalf("event %q (%s), want %q", ev.name, ev.raw, name)
	}
	return ev
}

// TestEventsStream: an event stream gets subscribed, then each change once
// with id = its cursor, heartbeats, and resumes after Last-Event-ID with
// no duplicate and nothing missed.
func TestEventsStream(t *testing.T) {
	e := newSyncEnv(t, func(c *Config) { c.IdleTimeout = 3 * time.Second })
	const orders = "public.orders"
	tok := token(t, []string{orders}, "", time.Hour)
	s, resp := e.openEvents(tok, "topic="+orders, nil)
	if s == nil {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream refused: %d %s", resp.StatusCode, b)
	}
	if ct := s.resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	sub := s.expect("subscribed")
	if sub.id == "" || sub.id != sub.data.Cursor {
		t.Fatalf("subscribed id %q, cursor %q", sub.id, sub.data.Cursor)
	}
	e.topicLive(orders, 1)
	es := e.commit(ins(orders, 2), ins(orders, 3))
	var last string
	for i, want := range es {
		ev := s.expect("change")
		if ev.data.env.Seq != want.Seq || ev.id != ev.data.Cursor || ev.data.Topic != orders {
			t.Fatalf("change %d: seq %d id %q cursor %q, want seq %d", i, ev.data.env.Seq, ev.id, ev.data.Cursor, want.Seq)
		}
		// One transaction: only its last change has an id (a cursor)
		// and "end":true, so Last-Event-ID is always a boundary.
		if end := i == len(es)-1; ev.data.End != end || (ev.id != "") != end {
			t.Fatalf("change %d of a transaction of %d: end %v, id %q", i, len(es), ev.data.End, ev.id)
		}
		if ev.id != "" {
			last = ev.id
		}
	}
	// Heartbeats: the stream pings its socket every IdleTimeout/3 and
	// outlives the idle timeout.
	waitFor(t, "two heartbeats", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.comments >= 2
	})
	s.cancel()
	waitFor(t, "the stream's socket closed", func() bool { return e.node.Stats().SocketsOpen == 0 })

	more := e.commit(ins(orders, 4))
	r, _ := e.openEvents(tok, "topic="+orders, map[string]string{"Last-Event-ID": last})
	r.expect("subscribed")
	ev := r.expect("change")
	if ev.data.env.Seq != more[0].Seq {
		t.Fatalf("after Last-Event-ID: seq %d, want %d (nothing before it again, nothing missed)", ev.data.env.Seq, more[0].Seq)
	}
}

// TestEventsTopicsAndCursors: several topics on one stream, each resumed
// from its own cursor (matched to its topic whatever the order), and a
// cursor of no topic reported without being echoed.
func TestEventsTopicsAndCursors(t *testing.T) {
	e := newSyncEnv(t)
	const a, b = "public.a", "public.b"
	ea := e.commit(ins(a, 1), ins(a, 2))
	eb := e.commit(ins(b, 1), ins(b, 2))
	tok := token(t, []string{a, b}, "", time.Hour)
	ca, err := e.j.CursorAt(journal.Query{Entities: []string{a}}, e.node.epoch.Load(), ea[0].Seq)
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := e.j.CursorAt(journal.Query{Entities: []string{b}}, e.node.epoch.Load(), eb[0].Seq)
	cx, _ := e.j.CursorAt(journal.Query{Entities: []string{"public.x"}}, e.node.epoch.Load(), 1)
	q := url.Values{"topic": {a, b}, "cursor": {cb, ca, cx}}
	s, _ := e.openEvents(tok, q.Encode(), nil)
	bad := s.expect("node-error")
	if bad.data.Code != "bad-cursor" || strings.Contains(bad.raw, cx) {
		t.Fatalf("unmatched cursor: %s", bad.raw)
	}
	got := map[string][]int64{}
	for len(got[a]) < 1 || len(got[b]) < 1 {
		ev := s.next()
		if ev.name == "change" {
			got[ev.data.Topic] = append(got[ev.data.Topic], ev.data.env.Seq)
		}
	}
	if got[a][0] != ea[1].Seq || got[b][0] != eb[1].Seq {
		t.Fatalf("replayed %v, want %s from %d and %s from %d", got, a, ea[1].Seq, b, eb[1].Seq)
	}
}

// TestEventsAuthAndLimits: the stream's token, tenancy and limits are the
// socket's: no token is 401 (and the access_token query parameter is
// accepted and never logged), an ungranted topic is a node-error, a
// tenant sees only its rows, the connection limit is a 503 with
// Retry-After, and node shutdown ends the stream with close 4000.
func TestEventsAuthAndLimits(t *testing.T) {
	var logs bytes.Buffer
	var logMu sync.Mutex
	e := newSyncEnv(t, func(c *Config) {
		c.MaxConnections = 1
		c.Logger = slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	const orders = "public.orders"
	e.commit(ins(orders, 1))

	_, resp := e.openEvents("", "topic="+orders, nil)
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("no token: %d %v", resp.StatusCode, resp.Header)
	}
	_, resp = e.openEvents(token(t, []string{"*"}, "", time.Hour), "", nil)
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("no topic: %d", resp.StatusCode)
	}
	expired := token(t, []string{"*"}, "", -time.Hour)
	_, resp = e.openEvents("", "topic="+orders+"&access_token="+url.QueryEscape(expired), nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("expired token: %d", resp.StatusCode)
	}

	tok := token(t, []string{"public.other"}, "acme", time.Hour)
	s, _ := e.openEvents("", "topic="+orders+"&topic=public.other&access_token="+url.QueryEscape(tok), nil)
	if ev := s.expect("node-error"); ev.data.Code != "forbidden" || ev.data.Topic != orders {
		t.Fatalf("ungranted topic: %s", ev.raw)
	}
	s.expect("subscribed")
	e.topicLive("public.other", 1)
	e.commit(row{entity: "public.other", op: decoder.OpInsert, id: 1, tenant: "globex", state: decoder.TenantKnown},
		row{entity: "public.other", op: decoder.OpInsert, id: 2, tenant: "acme", state: decoder.TenantKnown})
	if ev := s.expect("change"); ev.data.env.Tenant != "acme" {
		t.Fatalf("tenant acme's stream got %s", ev.raw)
	}

	_, resp = e.openEvents(tok, "topic=public.other", nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("over --max-connections: %d %v", resp.StatusCode, resp.Header)
	}
	st := e.node.Stats()
	if st.SocketsOpen != 1 || st.Rejected["max-connections"] != 1 || st.Rejected["unauthorized"] != 2 {
		t.Fatalf("stats %+v", st)
	}

	e.node.Close()
	ev := s.expect("close")
	var c struct {
		Code   int    `json:"code"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal([]byte(ev.raw), &c); err != nil || c.Code != CloseShutdown {
		t.Fatalf("close event %s", ev.raw)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if strings.Contains(logs.String(), expired) || strings.Contains(logs.String(), tok) {
		t.Fatalf("a token reached the log:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "access_token=REDACTED") {
		t.Fatalf("the refused request was not logged redacted:\n%s", logs.String())
	}
}

// TestEventsCORS: a preflight from an allowed origin is answered, another
// origin is refused.
func TestEventsCORS(t *testing.T) {
	e := newSyncEnv(t, func(c *Config) { c.AllowedOrigins = []string{"https://app.example"} })
	for origin, want := range map[string]int{"https://app.example": http.StatusNoContent, "https://evil.example": http.StatusForbidden} {
		req, _ := http.NewRequest("OPTIONS", e.srv.URL+"/v1/events?topic=public.orders", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Headers", "authorization")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s: %d, want %d", origin, resp.StatusCode, want)
		}
		if want == http.StatusNoContent && resp.Header.Get("Access-Control-Allow-Origin") != origin {
			t.Fatalf("allow-origin %q", resp.Header.Get("Access-Control-Allow-Origin"))
		}
	}
	_, resp := e.openEvents(token(t, []string{"*"}, "", time.Hour), "topic=public.orders", map[string]string{"Origin": "https://evil.example"})
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("stream from a refused origin: %d", resp.StatusCode)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
