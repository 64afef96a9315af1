package sync

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/walcast/walcast/journal"
)

// Server-Sent Events (DESIGN §6, docs/sync.md "Server-Sent Events").
//
// GET /v1/events?topic=…[&topic=…][&cursor=…][&snapshot=topic] streams what
// a socket subscribed to those topics would receive, as text/event-stream:
// one event per frame, named by the frame's t (`error` frames are named
// `node-error`, so they are not taken for EventSource's own error event),
// its data the frame's JSON exactly as the socket sends it, and `id:` the
// frame's cursor when it has one. Last-Event-ID (sent by EventSource when
// it reconnects) resumes the topic that cursor belongs to.
//
// An event stream is a socket: the handler opens one on an in-memory pipe
// through serveSocket itself and acts as its client. So the stream passes
// the same checks in the same order (origin, token, per-address and
// per-subject budgets, accept rate, connection limits), is counted in the
// same metrics, is scoped to the token's tenant, shares the topic's
// encoded frames, queue bound, drop window, lag limit, token expiry, idle
// eviction and shutdown — with no second delivery path to keep in step.
// What a socket's client does by itself the handler does for the browser:
// it pings (the pong becomes an SSE comment, the heartbeat), and follows a
// replay-gap by resubscribing from the last cursor it forwarded (the
// replay-gap event is still sent, for information). When the socket closes,
// the stream sends a `close` event with the code and reason the socket
// closed with and ends.

// eventsHeartbeat is how often an event stream pings its socket (and so
// sends a heartbeat comment): every 15 s as docs/sync.md asks of clients,
// more often when --idle-timeout is short.
func (n *Node) eventsHeartbeat() time.Duration {
	return min(15*time.Second, max(time.Second, n.cfg.IdleTimeout/3))
}

// eventsTopic is one subscription of a stream.
type eventsTopic struct {
	topic    string
	cursor   string
	snapshot bool
	view     viewRequest // filter.<topic> and columns.<topic>
}

// parseEventsQuery reads the stream's topics and cursors (the query's and
// Last-Event-ID, which comes first: it is the newest). It only counts
// them; matching cursors to topics is matchCursors, once the socket is
// open. It returns a message for the client when the request is
// malformed.
func parseEventsQuery(r *http.Request) ([]eventsTopic, []string, string) {
	q := r.URL.Query()
	raw := q["topic"]
	if len(raw) > maxTopicsPerSocket {
		return nil, nil, fmt.Sprintf("a stream may follow at most %d topics", maxTopicsPerSocket)
	}
	topics := make([]eventsTopic, 0, len(raw))
	index := make(map[string]int, len(raw))
	for _, t := range raw {
		if _, dup := index[t]; !dup {
			index[t] = len(topics)
			topics = append(topics, eventsTopic{topic: t})
		}
	}
	if len(topics) == 0 {
		return nil, nil, "give at least one topic: /v1/events?topic=schema.table (several topic parameters for several topics)"
	}
	for _, s := range q["snapshot"] {
		if i, ok := index[s]; ok {
			topics[i].snapshot = true
		}
	}
	for i := range topics {
		v, msg := viewParams(q, "filter."+topics[i].topic, "columns."+topics[i].topic)
		if msg != "" {
			return nil, nil, msg
		}
		topics[i].view = v
	}
	cursors := q["cursor"]
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		cursors = append([]string{id}, cursors...)
	}
	if len(cursors) > len(topics)+1 {
		return nil, nil, "more cursor parameters than topics: give at most one cursor per topic"
	}
	return topics, cursors, ""
}

// matchCursors gives each topic the first of cursors (the newest first)
// issued for it in the tenant's scope, and returns the cursors issued for
// none of the topics, or not authentic. A cursor is matched by its scope
// hash through a map and authenticated only when it matches, once: a
// request costs at most one MAC per topic and one per cursor, not one per
// (cursor, topic) pair. A matched cursor the socket cannot serve (a
// rotated secret, another journal) is left for the socket to judge, as a
// sub frame's cursor is.
func (n *Node) matchCursors(topics []eventsTopic, cursors []string, tenant string) []string {
	if len(cursors) == 0 {
		return nil
	}
	byScope := make(map[[16]byte]int, len(topics))
	for i := range topics {
		cur, err := n.j.CursorAt(journal.Query{Entities: []string{topics[i].topic}, Tenant: tenant, View: topics[i].view.text()}, 0, 0)
		if err != nil {
			continue // no cursor can match it; the socket reports the topic itself
		}
		if k, ok := cursorScope(cur); ok {
			if _, dup := byScope[k]; !dup {
				byScope[k] = i
			}
		}
	}
	var unmatched []string
	for _, c := range cursors {
		k, ok := cursorScope(c)
		i, found := byScope[k]
		if ok && found {
			_, err := n.j.CursorPosition(c) // authentic under a current or previous secret
			if err == nil {
				if topics[i].cursor == "" {
					topics[i].cursor = c
				}
				continue
			}
		}
		unmatched = append(unmatched, c)
	}
	return unmatched
}

// cursorScope returns the scope hash a cursor carries, without
// authenticating it. The layout is the journal's (journal/cursor.go):
// base64url of version 2 | journal(16) | epoch(8) | position(8) | scope(16)
// | MAC(32), or version 1 without the epoch; TestEventsCursorMatchLinear keeps the
// two in step.
func cursorScope(s string) ([16]byte, bool) {
	var k [16]byte
	if len(s) > 128 {
		return k, false
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return k, false
	}
	var off int
	switch {
	case len(b) == 1+16+8+8+16+32 && b[0] == 2:
		off = 1 + 16 + 8 + 8
	case len(b) == 1+16+8+16+32 && b[0] == 1:
		off = 1 + 16 + 8
	default:
		return k, false
	}
	copy(k[:], b[off:off+16])
	return k, true
}

// serveEvents streams the topics of the request as Server-Sent Events.
// The origin was checked by Handler (api). The token is verified first,
// once: a request without a valid one costs nothing per topic or cursor.
// The socket's handshake then applies the budgets and limits, with the
// claims verified here; only then are the cursors matched to the topics.
func (n *Node) serveEvents(w http.ResponseWriter, r *http.Request) {
	claims, ok := n.authorized(w, r)
	if !ok {
		return
	}
	topics, cursors, bad := parseEventsQuery(r)
	if bad != "" {
		http.Error(w, bad, http.StatusBadRequest)
		return
	}
	rc := http.NewResponseController(w)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()

	conn, refused := n.openEventsSocket(ctx, r, claims)
	if conn == nil {
		for _, k := range []string{"WWW-Authenticate", "Retry-After", "Content-Type"} {
			if v := refused.header.Get(k); v != "" {
				w.Header().Set(k, v)
			}
		}
		status := refused.status
		if status == 0 || status == http.StatusSwitchingProtocols {
			status = http.StatusServiceUnavailable
		}
		w.WriteHeader(status)
		_, _ = w.Write(refused.body.Bytes())
		return
	}
	defer conn.Close()
	unmatched := n.matchCursors(topics, cursors, claims.Tenant)

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	es := &eventStream{n: n, w: w, rc: rc, conn: conn, cursors: map[string]string{}, views: map[string]viewRequest{}, poke: make(chan struct{}, 1),
		inbound: newTokenBucket(n.cfg.InboundRate, n.cfg.InboundBurst, n.cfg.Clock)}
	if err := es.comment("walcast event stream"); err != nil {
		return
	}
	for range unmatched {
		// The cursor is not echoed: say only what happened.
		b, _ := json.Marshal(struct {
			T       string `json:"t"`
			Code    string `json:"code"`
			Message string `json:"message"`
		}{"error", "bad-cursor", "a cursor (query or Last-Event-ID) was issued for none of the stream's topics, or is malformed; it was ignored"})
		if err := es.event("node-error", "", b); err != nil {
			return
		}
	}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		es.pingLoop(ctx, topics)
	}()
	code, reason := es.forward()
	cancel()
	wg.Wait()
	if code != 0 {
		b, _ := json.Marshal(struct {
			Code   int    `json:"code"`
			Reason string `json:"reason"`
		}{code, reason})
		_ = es.event("close", "", b)
	}
}

// refusal is serveSocket's answer to a handshake it refused.
type refusal struct {
	status int
	header http.Header
	body   bytes.Buffer
}

// pipeWriter is the http.ResponseWriter serveSocket answers an event
// stream's handshake on: a refusal is recorded, an upgrade hijacks the
// server end of the pipe.
type pipeWriter struct {
	refusal
	conn     net.Conn
	br       *bufio.Reader
	hijacked bool
}

func (p *pipeWriter) Header() http.Header { return p.header }
func (p *pipeWriter) WriteHeader(status int) {
	if p.status == 0 {
		p.status = status
	}
}
func (p *pipeWriter) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	return p.body.Write(b)
}
func (p *pipeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	p.hijacked = true
	return p.conn, bufio.NewReadWriter(p.br, bufio.NewWriter(p.conn)), nil
}

// openEventsSocket opens the stream's socket through serveSocket on an
// in-memory pipe, with the request's claims (verified by serveEvents and
// not again: see authenticate), origin, forwarding header and client
// address. It returns the client end, or serveSocket's refusal.
func (n *Node) openEventsSocket(ctx context.Context, r *http.Request, claims *Claims) (*websocket.Conn, *refusal) {
	server, client := net.Pipe()
	pw := &pipeWriter{refusal: refusal{header: http.Header{}}, conn: server}
	served := make(chan struct{})
	go func() {
		defer close(served)
		br := bufio.NewReader(server)
		req, err := http.ReadRequest(br)
		if err != nil {
			_ = server.Close()
			return
		}
		pw.br = br
		req.RemoteAddr = r.RemoteAddr
		// The socket's log lines name the stream's URL (redacted there).
		u := *r.URL
		req.URL = &u
		req = req.WithContext(context.WithValue(ctx, verifiedClaimsKey{}, claims))
		n.serveSocket(pw, req)
		if !pw.hijacked {
			_ = server.Close()
		}
	}()
	hdr := http.Header{}
	for _, k := range []string{"Origin", "X-Forwarded-For", "User-Agent"} {
		if v := r.Header.Values(k); len(v) > 0 {
			hdr[k] = v
		}
	}
	host := r.Host
	if host == "" {
		host = "localhost"
	}
	d := websocket.Dialer{
		NetDialContext:   func(context.Context, string, string) (net.Conn, error) { return client, nil },
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   4096,
		WriteBufferSize:  512,
	}
	conn, resp, err := d.DialContext(ctx, "ws://"+host+"/v1/socket", hdr)
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		_ = client.Close()
		<-served
		if pw.status == 0 {
			pw.status = http.StatusServiceUnavailable
			pw.body.WriteString("cannot open the event stream now; retry\n")
		}
		return nil, &pw.refusal
	}
	<-served
	return conn, nil
}

// eventStream is one open stream: the handler's goroutine reads the
// socket and is the only writer of the response (forward); pingLoop is
// the only writer of the socket after the subscriptions, which it sends.
type eventStream struct {
	n       *Node
	w       http.ResponseWriter
	rc      *http.ResponseController
	conn    *websocket.Conn
	inbound *tokenBucket // paces what the stream sends to its socket, so the node's inbound budget never closes it

	mu      sync.Mutex             // guards the following fields
	cursors map[string]string      // topic → the last cursor forwarded
	views   map[string]viewRequest // topic → its filter and columns, sent again with each resubscription
	resubs  []string               // topics owed a resubscription (after a replay-gap)

	poke chan struct{} // tells pingLoop of resubs
}

// subFrame is the sub frame a stream sends its socket.
type subFrame struct {
	T        string          `json:"t"`
	Topic    string          `json:"topic"`
	Cursor   string          `json:"cursor,omitempty"`
	Snapshot bool            `json:"snapshot,omitempty"`
	Filter   json.RawMessage `json:"filter,omitempty"`
	Columns  *[]string       `json:"columns,omitempty"`
}

// newSubFrame is the sub frame of topic with its filter and columns.
func newSubFrame(topic, cursor string, snapshot bool, v viewRequest) subFrame {
	f := subFrame{T: "sub", Topic: topic, Cursor: cursor, Snapshot: snapshot, Filter: v.filter}
	if v.hasCols {
		f.Columns = &v.columns
	}
	return f
}

// send writes a client frame to the socket within the node's inbound
// budget (waiting for it).
func (es *eventStream) send(ctx context.Context, v any) error {
	for {
		ok, wait := es.inbound.take()
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-es.n.cfg.Clock.After(wait):
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_ = es.conn.SetWriteDeadline(time.Now().Add(es.n.cfg.WriteTimeout))
	return es.conn.WriteMessage(websocket.TextMessage, b)
}

// pingLoop subscribes to the stream's topics, then pings every heartbeat
// and resubscribes topics after replay-gaps, until ctx ends; then it
// closes the socket (1000), which ends forward.
func (es *eventStream) pingLoop(ctx context.Context, topics []eventsTopic) {
	defer func() {
		_ = es.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	}()
	es.mu.Lock()
	for _, t := range topics {
		es.views[t.topic] = t.view
	}
	es.mu.Unlock()
	for _, t := range topics {
		if es.send(ctx, newSubFrame(t.topic, t.cursor, t.snapshot, t.view)) != nil {
			return
		}
	}
	every := es.n.eventsHeartbeat()
	for {
		select {
		case <-ctx.Done():
			return
		case <-es.n.cfg.Clock.After(every):
			if es.send(ctx, struct {
				T string `json:"t"`
			}{"ping"}) != nil {
				return
			}
		case <-es.poke:
			es.mu.Lock()
			resubs := es.resubs
			es.resubs = nil
			es.mu.Unlock()
			for _, topic := range resubs {
				es.mu.Lock()
				cur, v := es.cursors[topic], es.views[topic]
				es.mu.Unlock()
				if es.send(ctx, newSubFrame(topic, cur, false, v)) != nil {
					return
				}
			}
		}
	}
}

// streamFrame is the part of a node frame the stream reads.
type streamFrame struct {
	T      string `json:"t"`
	Topic  string `json:"topic"`
	Cursor string `json:"cursor"`
}

// forward copies the socket's frames to the response until the socket
// closes, and returns the close code and reason to report (0 when the
// response itself failed: nothing more can be written).
func (es *eventStream) forward() (int, string) {
	for {
		_, b, err := es.conn.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				return ce.Code, ce.Text
			}
			return websocket.CloseAbnormalClosure, "the stream's socket ended"
		}
		var f streamFrame
		if json.Unmarshal(b, &f) != nil {
			continue
		}
		if f.T == "pong" {
			if es.comment("heartbeat") != nil {
				return 0, ""
			}
			continue
		}
		name := f.T
		switch f.T {
		case "error":
			name = "node-error"
		case "change", "position", "resync", "snapshot-end":
			es.setCursor(f.Topic, f.Cursor)
		case "subscribed":
			es.mu.Lock()
			if es.cursors[f.Topic] == "" {
				es.cursors[f.Topic] = f.Cursor
			}
			es.mu.Unlock()
		case "replay-gap":
			es.mu.Lock()
			if es.cursors[f.Topic] == "" {
				es.cursors[f.Topic] = f.Cursor
			}
			if !slices.Contains(es.resubs, f.Topic) {
				es.resubs = append(es.resubs, f.Topic)
			}
			es.mu.Unlock()
			select {
			case es.poke <- struct{}{}:
			default:
			}
		}
		if es.event(name, f.Cursor, b) != nil {
			return 0, ""
		}
	}
}

func (es *eventStream) setCursor(topic, cursor string) {
	if cursor == "" {
		return
	}
	es.mu.Lock()
	es.cursors[topic] = cursor
	es.mu.Unlock()
}

// event writes one event and flushes it, within the write timeout.
func (es *eventStream) event(name, id string, data []byte) error {
	var b strings.Builder
	b.Grow(len(data) + len(name) + len(id) + 24)
	b.WriteString("event: ")
	b.WriteString(name)
	b.WriteByte('\n')
	if id != "" && !strings.ContainsAny(id, "\r\n\x00") {
		b.WriteString("id: ")
		b.WriteString(id)
		b.WriteByte('\n')
	}
	// JSON from the node has no raw newlines; split anyway so no value can
	// end the event early.
	for line := range strings.SplitSeq(string(data), "\n") {
		b.WriteString("data: ")
		b.WriteString(strings.TrimSuffix(line, "\r"))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	return es.write(b.String())
}

func (es *eventStream) comment(text string) error { return es.write(": " + text + "\n\n") }

func (es *eventStream) write(s string) error {
	_ = es.rc.SetWriteDeadline(time.Now().Add(es.n.cfg.WriteTimeout))
	if _, err := io.WriteString(es.w, s); err != nil {
		return err
	}
	return es.rc.Flush()
}
