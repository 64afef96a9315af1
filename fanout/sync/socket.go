package sync

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/internal/backoff"
	"github.com/walcast/walcast/journal"
)

// frame is one encoded node → client frame: the complete WebSocket frame
// on the wire (header and payload; server frames are not masked). The same
// frame is queued on every socket it goes to, so a delivery encodes once
// however many sockets it reaches, and a socket's writer sends whatever is
// queued with one writev. (The node negotiates no compression; a
// compressed socket would need a per-mode prepared frame instead.)
type frame struct {
	wire []byte
	size int // bytes counted against MaxBufferedBytes: len(wire)
}

// wsFrame builds an unmasked, final WebSocket frame of the given opcode.
func wsFrame(opcode byte, payload []byte) []byte {
	n := len(payload)
	var b []byte
	switch {
	case n < 126:
		b = make([]byte, 2, 2+n)
		b[1] = byte(n)
	case n <= 0xffff:
		b = make([]byte, 4, 4+n)
		b[1] = 126
		binary.BigEndian.PutUint16(b[2:], uint16(n))
	default:
		b = make([]byte, 10, 10+n)
		b[1] = 127
		binary.BigEndian.PutUint64(b[2:], uint64(n))
	}
	b[0] = 0x80 | opcode
	return append(b, payload...)
}

func newFrame(payload []byte) *frame {
	w := wsFrame(websocket.TextMessage, payload)
	return &frame{wire: w, size: len(w)}
}

// changeFrame encodes {"t":"change","topic":…,"cursor":…,"change":envelope}.
func changeFrame(topic, cursor string, envelope []byte, end bool) *frame {
	tq, _ := json.Marshal(topic)
	b := make([]byte, 0, len(envelope)+len(tq)+len(cursor)+60)
	b = append(b, `{"t":"change","topic":`...)
	b = append(b, tq...)
	if end {
		b = append(b, `,"cursor":"`...)
		b = append(b, cursor...) // base64url: nothing to escape
		b = append(b, `","end":true`...)
	}
	b = append(b, `,"change":`...)
	b = append(b, envelope...)
	b = append(b, '}')
	return newFrame(b)
}

// controlFrame encodes {"t":kind,"topic":…,"cursor":…} (subscribed,
// replay-gap, resync).
func controlFrame(kind, topic, cursor string) *frame {
	b, _ := json.Marshal(struct {
		T      string `json:"t"`
		Topic  string `json:"topic"`
		Cursor string `json:"cursor"`
	}{kind, topic, cursor})
	return newFrame(b)
}

func errorFrame(code, message, topic string) *frame {
	b, _ := json.Marshal(struct {
		T       string `json:"t"`
		Code    string `json:"code"`
		Message string `json:"message"`
		Topic   string `json:"topic,omitempty"`
	}{"error", code, message, topic})
	return newFrame(b)
}

// retryErrorFrame is an error frame that also says when to ask again:
// retryAfter, in whole seconds (at least 1), the Retry-After of an HTTP
// refusal of the same cause.
func retryErrorFrame(code, message, topic string, wait time.Duration) *frame {
	b, _ := json.Marshal(struct {
		T          string      `json:"t"`
		Code       string      `json:"code"`
		Message    string      `json:"message"`
		Topic      string      `json:"topic,omitempty"`
		RetryAfter json.Number `json:"retryAfter"`
	}{"error", code, message, topic, json.Number(retryAfter(wait))})
	return newFrame(b)
}

var pongFrame = newFrame([]byte(`{"t":"pong"}`))

// socketGap is a topic owed a replay-gap frame once the queue drains.
type socketGap struct{ topic, cursor string }

// socket is one WebSocket connection. Its reading goroutine (run) owns it:
// it starts the writer and catch-up goroutines on demand and waits for them
// before tearing it down. A parked socket has no reading goroutine; the
// run that wake starts takes ownership over (through s.mu).
type socket struct {
	n    *Node
	conn *websocket.Conn
	// nc is the connection itself, which the writer writes to; with fc
	// set gorilla reads it through fc (frameconn.go).
	nc net.Conn
	fc *frameConn
	// raw and pollID let an idle socket wait in the node's idlePoller
	// instead of a goroutine (park).
	raw    syscall.RawConn
	pollID uint64
	claims *Claims
	limKey [2]string // the client's address and subject budget keys (limits.go)
	// ctx ends when the socket's read loop has returned. It is not derived
	// from the node's: Close closes every socket and waits for them before
	// it cancels the node's context, so a child would add nothing but an
	// entry in the node's context per socket.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // writer and catch-up goroutines

	lastRecv atomic.Int64 // clock time (UnixNano) of the last inbound frame
	inbound  tokenBucket  // inbound frame budget
	// members are the socket's subscriptions, at most maxTopicsPerSocket
	// (a slice: most sockets follow one or a few topics, and a map would
	// cost an idle socket 200 bytes); owned by the reading goroutine.
	members  []*member
	readDone signal // fired when the read loop returns
	// catchUps holds a slot per catch-up holding a journal page, so one
	// socket holds at most maxCatchUpPages pages (each catchUpPageBytes)
	// outside its queue, however many topics it follows.
	catchUps slots
	// snapSlots holds a slot per snapshot this socket is reading
	// (StateConfig.PerSocket); its other snapshots wait.
	snapSlots slots

	mu sync.Mutex // guards the following fields
	// catchCtx holds the context of each member's running catch-ups;
	// nil until the first.
	catchCtx map[*member]*memberCtx
	queue    []queuedFrame // outbound, queue[head:] pending, oldest first
	head     int
	queued   int // bytes of frames queued or being written
	// writingAt is when the oldest frame of the batch being written was
	// queued (clock UnixNano; 0 when no batch is being written), gapsAt
	// when the oldest replay-gap owed was recorded (0 when none): with
	// queue[head].at they say how far behind the client is (lagLocked).
	writingAt int64
	gapsAt    int64
	// broken: a write failed part way, so no close frame can follow.
	broken  bool
	writing bool
	// held: live frames are queued and the writer's start waits for the
	// end of the NATS burst they came in (liveBurst); the socket is in
	// that burst's list.
	held bool
	// wroteAt is when the writer last finished a write (time.Now, not
	// the node's Clock: it paces syscalls); zero before the first.
	wroteAt     time.Time
	room        chan struct{} // closed by the writer when it frees bytes; nil when nobody waits
	gaps        []socketGap
	drops       DropWindow
	closing     bool
	closeCode   int
	closeReason string
	// parked: no goroutine reads the socket; the idlePoller's next event
	// for it, or the connection's close, starts one (wake). connClosed:
	// the connection is closed, so the socket may not park again.
	parked     bool
	connClosed bool
	pollArmed  bool // the connection is in the idlePoller's epoll set
}

// authorized verifies the request's token; without a valid one it answers
// 401 (counted as reason unauthorized) and returns false.
func (n *Node) authorized(w http.ResponseWriter, r *http.Request) (*Claims, bool) {
	claims, err := n.authenticate(r)
	if err != nil {
		n.stats.inc(&n.stats.rejected, "unauthorized")
		w.Header().Set("WWW-Authenticate", `Bearer realm="walcast"`)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return nil, false
	}
	return claims, true
}

// serveSocket authenticates, applies the admission limits and upgrades, then
// hands the socket to its reading goroutine.
func (n *Node) serveSocket(w http.ResponseWriter, r *http.Request) {
	if !n.checkOrigin(r) {
		n.stats.inc(&n.stats.rejected, "origin")
		http.Error(w, "origin not allowed", http.StatusForbidden)
		return
	}
	claims, ok := n.authorized(w, r)
	if !ok {
		return
	}
	if n.overloaded("memory") {
		w.Header().Set("Retry-After", retryAfter(overloadRetry))
		http.Error(w, overloadedMessage, http.StatusServiceUnavailable)
		return
	}
	// Per address and subject first, so a client over its budget spends
	// none of the node's.
	key, subKey := n.clientKey(r), subjectKey(claims)
	if why, wait := n.limits.admitSocket(key, subKey); why != "" {
		n.stats.inc(&n.stats.rejected, why)
		w.Header().Set("Retry-After", retryAfter(wait))
		http.Error(w, "too many connections from this client; retry later", http.StatusServiceUnavailable)
		return
	}
	if ok, wait := n.accept.take(); !ok {
		n.limits.releaseSocket(key, subKey)
		n.stats.inc(&n.stats.rejected, "accept-rate")
		w.Header().Set("Retry-After", strconv.Itoa(int(max(1, (wait+time.Second-1)/time.Second))))
		http.Error(w, "too many new connections; retry later", http.StatusServiceUnavailable)
		return
	}
	n.mu.Lock()
	switch {
	case n.closed:
		n.mu.Unlock()
		n.limits.releaseSocket(key, subKey)
		http.Error(w, "node shutting down", http.StatusServiceUnavailable)
		return
	case n.cfg.MaxConnections > 0 && len(n.sockets) >= n.cfg.MaxConnections:
		n.mu.Unlock()
		n.limits.releaseSocket(key, subKey)
		n.stats.inc(&n.stats.rejected, "max-connections")
		w.Header().Set("Retry-After", "5")
		http.Error(w, "connection limit reached", http.StatusServiceUnavailable)
		return
	}
	// Reserve the slot before the upgrade so concurrent handshakes cannot
	// overshoot MaxConnections.
	s := &socket{n: n, claims: claims, limKey: [2]string{key, subKey}}
	s.catchUps.max, s.snapSlots.max = maxCatchUpPages, max(1, n.cfg.State.PerSocket)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.drops = DropWindow{Max: n.cfg.MaxDroppedFrames}
	s.inbound.init(n.cfg.InboundRate, n.cfg.InboundBurst, n.cfg.Clock)
	s.lastRecv.Store(n.cfg.Clock.Now().UnixNano())
	n.sockets[s] = struct{}{}
	n.conns.Add(1)
	n.mu.Unlock()

	hw := w
	var hj *frameHijacker
	if n.poller != nil {
		hj = &frameHijacker{ResponseWriter: w}
		hw = hj
	}
	conn, err := n.upgrader.Upgrade(hw, r, nil)
	if err != nil {
		s.cancel()
		s.forget()
		return // the upgrader answered the request
	}
	s.nc = conn.NetConn()
	if hj != nil && hj.fc != nil {
		s.nc = hj.tcp // gorilla has hj.fc; writes go to the connection itself
		if raw, err := hj.tcp.SyscallConn(); err == nil {
			s.fc, s.raw = hj.fc, raw
			n.poller.add(s)
		}
	}
	if n.cfg.sndBuf > 0 {
		if tc, ok := s.nc.(*net.TCPConn); ok {
			_ = tc.SetWriteBuffer(n.cfg.sndBuf)
		}
	}
	// Every byte to the client goes through the socket's writer: gorilla's
	// own control replies are replaced.
	conn.SetPingHandler(func(data string) error {
		s.enqueue(&frame{wire: wsFrame(websocket.PongMessage, []byte(data)), size: len(data) + 2}, nil)
		return nil
	})
	conn.SetCloseHandler(func(code int, _ string) error {
		if code == websocket.CloseNoStatusReceived {
			code = websocket.CloseNormalClosure
		}
		s.closeWith(code, "", "client")
		return nil
	})
	s.mu.Lock()
	s.conn = conn
	if s.closing { // the node closed while we upgraded
		s.startWriterLocked()
	}
	s.mu.Unlock()
	n.stats.socketsOpen.Add(1)
	// The socket is read on a fresh goroutine the node owns (Close waits for
	// it through n.conns) and this handler returns: net/http's connection
	// state, its 4 KB read and write buffers and the request become garbage.
	// Waiting for a frame, the reader parks the socket in the node's
	// idlePoller and exits (plain TCP on Linux), or waits in gorilla's
	// NextReader with a small stack. An idle socket costs gorilla's small
	// read buffer and the socket's own state, and the goroutine if it has
	// one.
	go s.run(false)
}

// forget releases what serveSocket reserved for s: its place in the node's
// sockets and its clients' budgets.
func (s *socket) forget() {
	n := s.n
	if s.fc != nil {
		n.poller.remove(s)
	}
	n.mu.Lock()
	delete(n.sockets, s)
	n.mu.Unlock()
	n.limits.releaseSocket(s.limKey[0], s.limKey[1])
	n.conns.Done()
}

// run reads the socket until it fails or closes, then tears it down and
// forgets it.
//
// An idle socket is this goroutine parked in gorilla's NextReader, so its
// stack is most of what the socket costs: run and readLoop keep their
// frames small so that the parked chain (NextReader down to the poller,
// about 1 KB) fits the runtime's smallest stack (2 KB, of which the last
// 928 bytes are a guard), and everything a frame causes runs on another
// goroutine (readAside). A stack that grew once stays grown while the
// goroutine is parked (the runtime shrinks only stacks three quarters
// unused, guard included), so one subscribe handled here would cost the
// socket 4 KB for good. BenchmarkSyncIdleMemory10k reports the result
// (stack-bytes/socket).
//
// A socket that can wait without a goroutine (park) is read by a run that
// each wake starts and that returns once the socket is parked again.
//
// woken: the socket was parked and its connection has something to read
// (or closed), so it reads before it may park again.
func (s *socket) run(woken bool) {
	if s.readLoop(woken) {
		s.teardown()
		s.forget()
	}
}

// readLoop waits for each inbound message and hands it to readAside. It
// returns true when the connection fails or closes, false when the socket
// is parked (another run will go on). Keep it this small (see run).
func (s *socket) readLoop(woken bool) bool {
	for {
		if !woken && s.park() {
			return false
		}
		woken = false
		_, r, err := s.conn.NextReader()
		if err != nil || !s.readAside(r) {
			return true
		}
	}
}

// park hands the wait for the next frame to the node's idlePoller when
// everything read so far ended a frame (nothing of the next one sits in
// gorilla's buffer). It reports true when the socket is parked or another
// goroutine already reads it: the caller must stop reading.
func (s *socket) park() bool {
	if s.fc == nil || !s.fc.atBoundary() {
		return false
	}
	s.mu.Lock()
	if s.connClosed {
		s.mu.Unlock()
		return false
	}
	// Decided under mu: the next reader (started by wake, which takes mu)
	// may run before arm returns.
	s.parked = true
	add := !s.pollArmed
	s.pollArmed = true
	s.mu.Unlock()
	if err := s.n.poller.arm(s, add); err != nil {
		s.mu.Lock()
		mine := s.parked
		s.parked = false
		s.mu.Unlock()
		return !mine // a wake took the socket: its run reads on
	}
	return true
}

// wake starts a reading goroutine for a parked socket: the idlePoller saw
// its connection readable or closed, or closeConn closed it.
func (s *socket) wake() {
	s.mu.Lock()
	if !s.parked {
		s.mu.Unlock()
		return
	}
	s.parked = false
	s.mu.Unlock()
	go s.run(true)
}

// closeConn closes the connection and wakes the socket if it is parked, so
// its reader sees the close and tears it down.
func (s *socket) closeConn() {
	_ = s.conn.Close()
	s.mu.Lock()
	s.connClosed = true
	s.mu.Unlock()
	s.wake()
}

// readAside reads and handles the message r on a short-lived goroutine and
// waits for it (so handle keeps its single-goroutine ownership of
// s.members: the reader does nothing else meanwhile). It reports false when
// reading failed and the socket must stop.
func (s *socket) readAside(r io.Reader) bool {
	ok := make(chan bool, 1)
	go func() { ok <- s.readMessage(r) }()
	return <-ok
}

// readMessage reads one inbound message and applies the socket's limits to
// it before handling it. It reports false when the connection failed.
func (s *socket) readMessage(r io.Reader) bool {
	if s.isClosing() {
		return true // drain until the peer answers our close
	}
	b, err := io.ReadAll(io.LimitReader(r, int64(s.n.cfg.MaxFrameBytes)+1))
	if err != nil {
		return false
	}
	now := s.n.cfg.Clock.Now()
	s.lastRecv.Store(now.UnixNano())
	switch {
	case s.tokenExpired(now): // between sweeps (auth_socket.go)
		s.closeExpired()
	case len(b) > s.n.cfg.MaxFrameBytes:
		s.closeWith(CloseBadFrame, "frame too large", "oversized-frame")
	default:
		if ok, _ := s.inbound.take(); !ok {
			s.closeWith(CloseFlood, "rate limit exceeded", "flood")
			return true
		}
		s.handle(b)
	}
	return true
}

// teardown leaves every topic, closes the socket and waits for its writer
// and catch-ups. The read loop has returned.
func (s *socket) teardown() {
	s.readDone.fire()
	for _, m := range s.members {
		s.n.leave(m)
	}
	s.members = nil
	s.cancel()
	s.closeWith(websocket.CloseNormalClosure, "", "client")
	s.wg.Wait()
	_ = s.conn.Close()
	s.n.stats.socketsOpen.Add(-1)
}

// clientFrame is what a client sends.
type clientFrame struct {
	T      string `json:"t"`
	Topic  string `json:"topic"`
	Cursor string `json:"cursor"`
	Token  string `json:"token"` // refresh
	// Snapshot asks a sub for the topic's current rows first (state.go).
	Snapshot bool `json:"snapshot"`
	// Filter and Columns narrow a sub to some rows and columns (view.go):
	// Columns absent (or null) is every column, [] the key columns only.
	Filter  json.RawMessage `json:"filter"`
	Columns *[]string       `json:"columns"`
}

func (f *clientFrame) view() viewRequest {
	r := viewRequest{}.withFilter(f.Filter)
	if f.Columns != nil {
		r.columns, r.hasCols = *f.Columns, true
	}
	return r
}

func (s *socket) handle(b []byte) {
	var f clientFrame
	if err := json.Unmarshal(b, &f); err != nil || f.T == "" {
		s.closeWith(CloseBadFrame, "invalid JSON frame", "invalid-frame")
		return
	}
	switch f.T {
	case "ping":
		s.enqueue(pongFrame, nil)
		s.sendPositions()
	case "sub":
		s.subscribe(f.Topic, f.Cursor, f.Snapshot, f.view())
	case "refresh":
		s.refresh(f.Token)
	case "unsub":
		if m := s.removeMember(f.Topic); m != nil {
			s.endCatchUps(m)
			s.n.leave(m)
		}
	default:
		s.enqueue(errorFrame("bad-request", "unknown frame type "+strconv.Quote(f.T), ""), nil)
	}
}

// member returns the socket's member for topic, or nil. Reading goroutine
// only.
func (s *socket) member(topic string) *member {
	for _, m := range s.members {
		if m.topic == topic {
			return m
		}
	}
	return nil
}

// removeMember removes and returns the socket's member for topic, or nil.
// Reading goroutine only.
func (s *socket) removeMember(topic string) *member {
	for i, m := range s.members {
		if m.topic == topic {
			s.members = slices.Delete(s.members, i, i+1)
			return m
		}
	}
	return nil
}

// maxTopicsPerSocket bounds one socket's subscriptions.
const maxTopicsPerSocket = 256

// MaxTopicBytes bounds a topic name: two PostgreSQL identifiers of 63 bytes,
// each quoted with every quote doubled (decoder.EntityName), and the dot.
// Every topic within it makes a subscription subject well inside the NATS
// control-line limit (bus.MaxSubjectBytes).
const MaxTopicBytes = 2*(2*63+2) + 1

// checkTopic validates a topic before anything is spent on it
// (Node.checkTopic, shared with the HTTP reads). It returns the error
// frame to send, or nil.
func (s *socket) checkTopic(topic string) *frame {
	code, msg := s.n.checkTopic(s.claims, topic)
	switch {
	case code == "":
		return nil
	case len(topic) > MaxTopicBytes:
		topic = "" // not echoed
	}
	return errorFrame(code, msg, topic)
}

// subscribe makes the socket a member of topic: live subscription first,
// then the journal from the cursor (or from now), then live. With snapshot
// and no cursor (or one that needs a resync) the topic's rows come first
// (state.go).
func (s *socket) subscribe(topic, cursor string, snapshot bool, vreq viewRequest) {
	n := s.n
	if f := s.checkTopic(topic); f != nil {
		s.enqueue(f, nil)
		return
	}
	if snapshot {
		if code, msg := n.checkSnapshot(s.claims); code != "" {
			s.enqueue(errorFrame(code, msg, topic), nil)
			return
		}
	}
	v, code, msg := n.openView(s.ctx, topic, vreq)
	if code != "" {
		s.enqueue(errorFrame(code, msg, topic), nil)
		return
	}
	if old := s.removeMember(topic); old != nil {
		s.endCatchUps(old)
		n.leave(old)
	} else if len(s.members) >= maxTopicsPerSocket {
		s.enqueue(errorFrame("too-many-topics", fmt.Sprintf("a socket may follow at most %d topics", maxTopicsPerSocket), topic), nil)
		return
	}
	q := journal.Query{Entities: []string{topic}, Tenant: s.claims.Tenant}
	if v != nil {
		q.View = v.text
	}
	m := &member{s: s, topic: topic, q: q, state: memberCatchingUp, snapshot: snapshot,
		tenantTok: bus.TenantToken(s.claims.Tenant, s.claims.Tenant != ""), view: v}
	resync := false
	if cursor != "" {
		q.Cursor = cursor
		pos, epoch, reason, err := n.j.CheckCursor(q)
		switch {
		case errors.Is(err, journal.ErrCursorTampered):
			s.enqueue(errorFrame("bad-cursor", "cursor is malformed or not signed by this deployment; subscribe without one", topic), nil)
			return
		case errors.Is(err, journal.ErrCursorScope):
			s.enqueue(errorFrame("bad-cursor", "cursor was issued for another topic, tenant, filter or column list", topic), nil)
			return
		case errors.Is(err, journal.ErrForeignJournal):
			s.enqueue(errorFrame("bad-cursor", "cursor was issued by another journal", topic), nil)
			return
		case err != nil:
			s.enqueue(errorFrame("unavailable", "cannot check the cursor now; retry", topic), nil)
			return
		case reason != "":
			resync = true
		case !n.inEpoch(epoch):
			resync = true // a cursor of another epoch (DESIGN §5)
		default:
			m.pos, m.epoch = pos, epoch
		}
	}
	if v != nil {
		// A client that resumes holds rows the node cannot know of; one
		// that starts afresh holds none (a snapshot records its rows).
		m.rows = n.newRows(v)
		if cursor != "" {
			m.rows.forget()
		}
	}
	if cursor == "" || resync {
		m.epoch = n.epoch.Load()
		h, err := n.currentHorizon(s.ctx, q)
		if err != nil {
			s.enqueue(errorFrame("unavailable", "journal unavailable; retry", topic), nil)
			return
		}
		m.pos = h
	}
	cur, err := n.j.CursorAt(q, m.epoch, m.pos)
	if err != nil {
		s.enqueue(errorFrame("unavailable", "cannot issue cursors", topic), nil)
		return
	}
	switch {
	case snapshot && (cursor == "" || resync):
		// snapshot-begin says where the topic starts; no subscribed frame.
	case resync:
		s.enqueue(controlFrame("resync", topic, cur), nil)
	default:
		s.enqueue(controlFrame("subscribed", topic, cur), nil)
	}
	if snapshot && (cursor == "" || resync) {
		if n.overloaded("memory") {
			s.enqueue(errorFrame("overloaded", overloadedMessage+"; the topic is not subscribed; subscribe again after "+retryAfter(overloadRetry)+" s", topic), nil)
			return
		}
		// The client asks for the rows (a stale cursor asks as surely as
		// none): charged to its snapshot budget.
		if wait := n.limits.takeSnapshot(s.limKey[0], s.limKey[1]); wait > 0 {
			n.stats.inc(&n.stats.rejected, "snapshot-rate")
			n.snapshotEnded("refused", time.Time{})
			s.enqueue(retryErrorFrame("rate-limited", "too many snapshots from this client; the topic is not subscribed; subscribe again after "+retryAfter(wait)+" s", topic, wait), nil)
			return
		}
	}
	if _, err := n.join(s.ctx, m); err != nil {
		n.warnEvery("subscribe", "subscribe failed", "topic", topic, "err", err)
		s.enqueue(errorFrame("unavailable", "cannot subscribe now; retry", topic), nil)
		return
	}
	s.members = append(s.members, m)
	m.t.mu.Lock()
	if snapshot && (cursor == "" || resync) {
		reason := ""
		if resync {
			reason = "resync"
		}
		s.startSnapshot(m, reason, false) // charged above
	} else {
		n.alignEpochLocked(m)
		if m.state == memberCatchingUp {
			s.startCatchUp(m)
		}
	}
	m.t.mu.Unlock()
}

// currentHorizon is where a subscription without a cursor starts: the
// journal horizon the node follows, or a fresh read before it is known.
// Starting a little early is harmless (the client sees a few recent
// changes); late would lose them, and cannot happen because the catch-up
// read follows the live subscription.
func (n *Node) currentHorizon(ctx context.Context, q journal.Query) (int64, error) {
	if n.horizonKnown.Load() {
		return n.horizon.Load(), nil
	}
	// From the journal's server, as the horizon the node follows is (a
	// standby journal's could be of an epoch the node has left).
	st, err := n.j.State(ctx)
	if err != nil {
		return 0, err
	}
	return st.Horizon, nil
}

// maxCatchUpPages bounds the journal pages one socket holds at once.
const maxCatchUpPages = 4

// catchUpPageBytes bounds the envelope bytes of one catch-up page: a
// quarter of MaxBufferedBytes (at least 64 KiB), so the pages a socket holds
// outside its queue add at most MaxBufferedBytes (plus one envelope each).
func (n *Node) catchUpPageBytes() int {
	return max(64<<10, n.cfg.MaxBufferedBytes/maxCatchUpPages)
}

// startCatchUp runs m's catch-up on a goroutine the socket owns. m.t.mu is
// held.
func (s *socket) startCatchUp(m *member) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	if s.catchCtx == nil {
		s.catchCtx = map[*member]*memberCtx{}
	}
	mc := s.catchCtx[m]
	if mc == nil {
		mc = &memberCtx{}
		mc.ctx, mc.cancel = context.WithCancel(s.ctx)
		s.catchCtx[m] = mc
	}
	mc.runs++
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		s.catchUp(mc.ctx, m)
		s.mu.Lock()
		if mc.runs--; mc.runs == 0 && s.catchCtx[m] == mc {
			delete(s.catchCtx, m)
			mc.cancel()
			if len(s.catchCtx) == 0 {
				s.catchCtx = nil // an idle socket keeps no map
			}
		}
		s.mu.Unlock()
	}()
}

// memberCtx is the context of a member's catch-ups: an unsub ends the
// journal read in flight at once (endCatchUps).
type memberCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
	runs   int // catch-ups of the member running; guarded by socket.mu
}

// endCatchUps cancels m's catch-ups (m is leaving the socket).
func (s *socket) endCatchUps(m *member) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if mc := s.catchCtx[m]; mc != nil {
		delete(s.catchCtx, m)
		mc.cancel()
	}
}

// chargeCatchUpPage waits until the client's read budget (the
// --changes-* limits, kept per address and subject as for GET
// /v1/changes) admits one more journal page, and returns the func that
// ends it. nil when ctx ends first.
func (s *socket) chargeCatchUpPage(ctx context.Context) func() {
	for {
		done, wait := s.n.limits.beginRead(s.limKey[0], s.limKey[1])
		if done != nil {
			return done
		}
		select {
		case <-s.n.cfg.Clock.After(max(wait, 10*time.Millisecond)):
		case <-ctx.Done():
			return nil
		}
	}
}

// catchUp reads the journal from m's position (sharing reads with every
// member at the same place) until it has covered everything the topic has
// seen live, then makes m live.
//
// Each page is charged to the client's read budget, and ctx ends when the
// member leaves (unsub). A member further behind the journal's horizon
// than MaxReplayEntries gets a resync (or, subscribed with a snapshot, a
// fresh snapshot) instead of a replay.
func (s *socket) catchUp(ctx context.Context, m *member) {
	t := m.t
	n := s.n
	bo := backoff.New(100*time.Millisecond, 5*time.Second)
	// carry: a member of a view was given a change on an earlier page
	// whose transaction's end in the scope that page did not reach; the
	// next page starts after that page (carry.readFrom) while m.pos stays
	// before the change (viewPageLocked).
	var carry *viewCarry
	for {
		t.mu.Lock()
		if m.state != memberCatchingUp {
			t.mu.Unlock()
			return
		}
		// need: a seq the topic has received live, so the journal holds
		// it; a read from a standby journal that has not replayed it
		// waits for it or is made on the journal's server, so a lagging
		// standby never ends the catch-up short of it.
		base, epoch, need := m.pos, m.epoch, t.lastSeen
		if carry != nil && (carry.base != base || carry.epoch != epoch) {
			carry = nil // moved meanwhile
		}
		from := base
		if carry != nil {
			from = carry.readFrom
		}
		if limit := n.cfg.MaxReplayEntries; limit > 0 && n.horizonKnown.Load() && epoch == n.epoch.Load() {
			if h := n.horizon.Load(); h-from > limit {
				n.stats.inc(&n.stats.repairs, "replay-too-far")
				s.cursorResyncLocked(m, n.resyncFrame(m, h), h)
				moved := m.pos != from || m.state != memberCatchingUp
				t.mu.Unlock()
				if !moved {
					return // the socket is closing
				}
				continue
			}
		}
		m.repair = false
		t.mu.Unlock()

		if !s.catchUps.acquire(ctx) {
			return
		}
		charged := s.chargeCatchUpPage(ctx)
		if charged == nil {
			s.catchUps.release()
			return
		}
		q := m.q
		q.AtLeast = need
		var page readPage
		var err error
		if m.view != nil {
			page, err = n.reads.readView(ctx, q, epoch, from)
		} else {
			page, err = n.reads.read(ctx, q, epoch, from)
		}
		charged()
		if err != nil {
			s.catchUps.release()
			if ctx.Err() != nil {
				return
			}
			n.warnEvery("catch-up", "journal read for a socket failed; retrying", "topic", m.topic, "err", err)
			if _, err := bo.Wait(ctx); err != nil {
				return
			}
			continue
		}
		bo.Reset()

		t.mu.Lock()
		if m.state != memberCatchingUp || m.pos != base || m.epoch != epoch {
			t.mu.Unlock() // moved by a resync meanwhile: read again from there
			s.catchUps.release()
			carry = nil
			continue
		}
		if page.resync != nil {
			carry = nil
			if page.resyncEpoch != n.epoch.Load() {
				n.pokeEpoch()
			}
			m.epoch = page.resyncEpoch
			s.cursorResyncLocked(m, page.resync, page.resyncPos)
			t.mu.Unlock()
			s.catchUps.release()
			continue
		}
		if m.view != nil {
			page, carry = m.viewPageLocked(page, carry, epoch)
		}
		t.mu.Unlock()
		// A replay is paced by the socket: it waits for room in the queue
		// instead of dropping (only live frames are dropped).
		moved := false
		for i := 0; i < len(page.frames); {
			f, seq := page.frames[i], page.seqs[i]
			t.mu.Lock()
			if m.state != memberCatchingUp || m.epoch != epoch || m.pos > seq || m.pos < base {
				t.mu.Unlock()
				moved = true
				break
			}
			if m.pos == seq {
				t.mu.Unlock()
				i++
				continue
			}
			if f == nil {
				// A change the member's view could not judge: the
				// client re-reads once its transaction has ended.
				m.pos = seq
				m.owesResync, m.unjudged = true, true
				m.endedLocked(seq, page.ends[i])
				t.mu.Unlock()
				i++
				continue
			}
			queued, wait := s.enqueueReplay(f)
			if queued {
				m.pos = seq
				m.setMidLocked(!page.ends[i])
				if page.truncate != nil && page.truncate[i] {
					// The truncate also means: re-read the entity
					// (DESIGN §6), whether it reaches the member
					// live or, as here, from the journal — once
					// its transaction has ended, so the resync's
					// cursor is at a boundary. A fresh snapshot
					// moves m off this catch-up.
					m.owesResync = true
				}
				m.endedLocked(seq, page.ends[i])
				i++
			}
			t.mu.Unlock()
			if !queued && wait == nil {
				return // closing
			}
			if wait != nil {
				select {
				case <-wait:
				case <-ctx.Done():
					return
				}
			}
		}
		s.catchUps.release() // the page is queued (or abandoned): no longer held here
		t.mu.Lock()
		if moved || m.state != memberCatchingUp {
			t.mu.Unlock()
			continue
		}
		if carry != nil {
			carry.base, carry.readFrom, carry.epoch = m.pos, page.end, epoch
			t.mu.Unlock()
			continue
		}
		m.pos = max(m.pos, page.end)
		m.setMidLocked(m.mid) // no change of the scope lies after the last one sent up to page.end
		if page.more || m.repair || t.lastSeen > m.pos {
			t.mu.Unlock()
			continue
		}
		m.state = memberLive
		m.held = nil
		t.mu.Unlock()
		return
	}
}

// cursorResyncLocked is resyncLocked for a resync the member's own
// position caused (found during its catch-up: a cursor pruned or too far
// behind): a member subscribed with "snapshot":true gets a fresh snapshot
// charged to its client, any other the resync frame f (at seq). t.mu is
// held.
func (s *socket) cursorResyncLocked(m *member, f *frame, seq int64) {
	if m.snapshot && m.state != memberGone && s.startSnapshot(m, "resync", true) {
		return
	}
	if s.enqueue(f, nil) {
		m.pos = seq
	}
}

// enqueueReplay queues a replayed frame if it fits; otherwise it returns a
// channel closed when the writer frees room. Replays are never dropped. It
// returns (false, nil) once the socket is closing.
func (s *socket) enqueueReplay(f *frame) (bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing || s.conn == nil {
		return false, nil
	}
	if s.queued > 0 && s.queued+f.size > s.n.cfg.MaxBufferedBytes {
		if s.room == nil {
			s.room = make(chan struct{})
		}
		return false, s.room
	}
	s.pushLocked(f)
	return true, nil
}

func (s *socket) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// enqueue queues f and starts the writer; see enqueueIn.
func (s *socket) enqueue(f *frame, m *member) bool { return s.enqueueIn(f, m, nil) }

// enqueueIn queues f. With m nil, f is a control frame (subscribed, resync,
// error, pong, …): it may use ControlReserveBytes beyond MaxBufferedBytes
// and is never dropped; when even the reserve is full the client cannot
// keep up and the socket is closed with 1013 backpressure. With m set, f is
// a live frame of m's topic: one that does not fit in MaxBufferedBytes is
// dropped, counted, m's topic is owed a replay-gap and the drop window may
// close the socket. It reports whether f was queued. Callers may hold t.mu.
//
// With burst set (a live frame, t.mu held), a socket whose writer is not
// running does not start it: the socket joins the burst, whose end starts
// it, so the frames of a burst of NATS messages go out in one write.
func (s *socket) enqueueIn(f *frame, m *member, burst *liveBurst) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing || s.conn == nil {
		return false
	}
	// An empty queue takes any frame, so a change larger than the bound is
	// still deliverable.
	limit := s.n.cfg.MaxBufferedBytes
	if m == nil {
		limit += ControlReserveBytes
	}
	if s.queued > 0 && s.queued+f.size > limit {
		if m == nil {
			s.n.stats.controlOverflows.Add(1)
			s.closeLocked(CloseBackpressure, "backpressure", "backpressure")
			return false
		}
		s.n.stats.framesDropped.Add(1)
		if !slices.ContainsFunc(s.gaps, func(g socketGap) bool { return g.topic == m.topic }) {
			cur, _ := s.n.j.CursorAt(m.q, m.epoch, m.boundaryLocked())
			s.gaps = append(s.gaps, socketGap{m.topic, cur})
			if s.gapsAt == 0 {
				s.gapsAt = s.n.cfg.Clock.Now().UnixNano()
			}
		}
		if s.drops.Add(s.n.cfg.Clock.Now()) {
			s.closeLocked(CloseBackpressure, "backpressure", "backpressure")
		}
		return false
	}
	if burst != nil && !s.writing {
		s.appendLocked(f)
		if !s.held {
			s.held = true
			burst.hold(s)
		}
		return true
	}
	s.pushLocked(f)
	return true
}

// liveBurst gathers, for one topic's NATS subscription, the sockets that
// live frames were queued on while more messages of the subscription were
// waiting to be handled: their writers start once the subscription has no
// message pending, or after maxBurstMessages messages or maxBurstDelay,
// whichever comes first. A socket then writes a burst's frames with one
// writev instead of one write (and one wake-up of its client) per frame,
// which under load is most of a node's CPU; a frame waits at most
// maxBurstDelay plus the handling of one message for it. Guarded by the
// topic's mu.
type liveBurst struct {
	sockets []*socket
	msgs    int       // messages handled since the first socket was held
	since   time.Time // when the first socket was held
}

// Bounds of a liveBurst.
const (
	maxBurstMessages = 64
	maxBurstDelay    = time.Millisecond
)

func (b *liveBurst) hold(s *socket) {
	if len(b.sockets) == 0 {
		b.since = time.Now()
		b.msgs = 0
	}
	b.sockets = append(b.sockets, s)
}

// endLocked is called by the handler of each message of the subscription
// sub, at its end: it returns the sockets whose writers must start now,
// and forgets them. t.mu is held.
func (b *liveBurst) endLocked(sub *nats.Subscription, gone bool) []*socket {
	if len(b.sockets) == 0 {
		return nil
	}
	b.msgs++
	if !gone && sub != nil && b.msgs < maxBurstMessages && time.Since(b.since) < maxBurstDelay {
		// nats.go counts the message being handled as pending until its
		// handler returns: more than one means another is waiting. (Were
		// it not counted, the last message of a burst would only release
		// the writers one message early: never a frame left waiting.)
		if n, _, err := sub.Pending(); err == nil && n > 1 {
			return nil
		}
	}
	ss := b.sockets
	b.sockets = nil
	return ss
}

// release starts the writer of a socket held by a liveBurst.
func (s *socket) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = false
	if s.head < len(s.queue) && !s.closing && s.conn != nil {
		s.startWriterLocked()
	}
}

// endBurst ends t's burst when it is due (liveBurst); onMsg defers it, and
// leave calls it for a topic that is gone (its pending messages are never
// handled).
func (t *syncTopic) endBurst(sub *nats.Subscription) {
	t.mu.Lock()
	ss := t.burst.endLocked(sub, t.gone)
	t.mu.Unlock()
	for _, s := range ss {
		s.release()
	}
}

// ControlReserveBytes is the room each socket keeps for control frames
// beyond MaxBufferedBytes: enough for a resync on each of its
// maxTopicsPerSocket topics (names of MaxTopicBytes) and then some.
const ControlReserveBytes = 128 << 10

// queuedFrame is a frame in a socket's queue and when it was queued (clock
// UnixNano).
type queuedFrame struct {
	f  *frame
	at int64
}

// pushLocked appends f to the queue and starts the writer. s.mu is held.
func (s *socket) pushLocked(f *frame) {
	s.appendLocked(f)
	s.startWriterLocked()
}

// appendLocked appends f to the queue. s.mu is held.
func (s *socket) appendLocked(f *frame) {
	s.queue = append(s.queue, queuedFrame{f, s.n.cfg.Clock.Now().UnixNano()})
	s.setQueuedLocked(s.queued + f.size)
}

// setQueuedLocked sets s.queued to v (at least 0), keeping the node's sum
// of every socket's queued bytes (its memory bound) in step. s.mu is
// held.
func (s *socket) setQueuedLocked(v int) {
	v = max(0, v)
	s.n.stats.queuedBytes.Add(int64(v - s.queued))
	s.queued = v
}

// lagLocked is how long the oldest thing the socket owes its client has
// waited at now (clock UnixNano): a queued frame, the batch being written,
// or a replay-gap (owed until the queue drains). 0 when it owes nothing.
// s.mu is held.
func (s *socket) lagLocked(now int64) time.Duration {
	oldest := s.writingAt
	if s.head < len(s.queue) && (oldest == 0 || s.queue[s.head].at < oldest) {
		oldest = s.queue[s.head].at
	}
	if s.gapsAt != 0 && (oldest == 0 || s.gapsAt < oldest) {
		oldest = s.gapsAt
	}
	if oldest == 0 || now <= oldest {
		return 0
	}
	return time.Duration(now - oldest)
}

func (s *socket) startWriterLocked() {
	if s.writing {
		return
	}
	s.writing = true
	s.wg.Add(1)
	go s.write()
}

// closeWith closes the socket with code and reason (once; later calls do
// nothing). metricReason labels the close in metrics.
func (s *socket) closeWith(code int, reason, metricReason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked(code, reason, metricReason)
}

func (s *socket) closeLocked(code int, reason, metricReason string) {
	if s.closing {
		return
	}
	s.closing, s.closeCode, s.closeReason = true, code, reason
	s.n.stats.inc(&s.n.stats.closed, metricReason)
	clear(s.queue[s.head:])
	s.queue, s.head, s.gaps, s.gapsAt = nil, 0, nil, 0
	if !s.writing {
		s.setQueuedLocked(0) // else the writer's batch is counted until it returns
	}
	if s.conn != nil {
		s.startWriterLocked()
	}
}

// write is the socket's only writer. It runs while frames are queued and
// exits when the queue is empty, so an idle socket holds no writer
// goroutine. Once drained it sends the replay-gaps owed; once closing it
// sends the close frame and closes the connection.
func (s *socket) write() {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		if s.closing {
			s.writing = false
			s.setQueuedLocked(0) // nothing more is written
			code, reason := s.closeCode, s.closeReason
			broken := s.broken
			s.mu.Unlock()
			if broken {
				code = websocket.CloseAbnormalClosure // no frame can follow a partial one
			}
			s.sendClose(code, reason)
			return
		}
		if s.head == len(s.queue) {
			if len(s.gaps) == 0 {
				s.queue, s.head = s.queue[:0], 0
				s.writing = false
				s.mu.Unlock()
				return
			}
			seen := map[string]bool{}
			for _, g := range s.gaps {
				if !seen[g.topic] {
					seen[g.topic] = true
					f := controlFrame("replay-gap", g.topic, g.cursor)
					s.queue = append(s.queue, queuedFrame{f, s.gapsAt})
					s.setQueuedLocked(s.queued + f.size)
					s.n.stats.replayGaps.Add(1)
				}
			}
			s.gaps, s.gapsAt = nil, 0
		}
		// A socket that wrote less than writeLinger ago is busy: let what
		// follows the oldest frame join it for the rest of writeLinger,
		// so a steady stream goes out several frames per write. An idle
		// socket writes at once.
		if wait := writeLinger - time.Since(s.wroteAt); wait > 0 && !s.wroteAt.IsZero() {
			s.mu.Unlock()
			time.Sleep(wait)
			s.mu.Lock()
			if s.closing || s.head == len(s.queue) {
				s.mu.Unlock()
				continue
			}
		}
		// Take everything queued (bounded) and send it with one writev.
		bp := writeBatchPool.Get().(*net.Buffers)
		bufs := (*bp)[:0]
		size := 0
		s.writingAt = s.queue[s.head].at
		for s.head < len(s.queue) && len(bufs) < 512 && size < 1<<20 {
			f := s.queue[s.head].f
			s.queue[s.head] = queuedFrame{}
			s.head++
			bufs = append(bufs, f.wire)
			size += f.size
		}
		s.mu.Unlock()

		nc := s.nc
		_ = nc.SetWriteDeadline(time.Now().Add(s.n.cfg.WriteTimeout))
		frames := len(bufs)
		var err error
		if frames == 1 {
			// One frame (most writes: a fan-out queues one change on
			// each socket) is a plain write; a writev would also leave
			// an iovec array on the connection for good.
			_, err = nc.Write(bufs[0])
		} else {
			*bp = bufs
			_, err = bp.WriteTo(nc) // consumes *bp
		}
		clear(bufs)
		*bp = bufs[:0]
		writeBatchPool.Put(bp)
		s.mu.Lock()
		s.writingAt = 0
		s.wroteAt = time.Now()
		if s.closing {
			s.setQueuedLocked(0)
		} else {
			s.setQueuedLocked(s.queued - size)
		}
		if s.room != nil {
			close(s.room)
			s.room = nil
		}
		s.mu.Unlock()
		if err != nil {
			s.mu.Lock()
			s.broken = true
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// The batch was not taken within WriteTimeout: the client
				// reads nothing, or far too slowly.
				s.closeLocked(CloseBackpressure, "backpressure", "backpressure")
			} else {
				s.closeLocked(websocket.CloseAbnormalClosure, "", "write-error")
			}
			s.mu.Unlock()
			s.closeConn()
			continue
		}
		s.n.stats.framesSent.Add(int64(frames))
	}
}

var writeBatchPool = sync.Pool{New: func() any { return new(net.Buffers) }}

// writeLinger is how long a busy socket's writer waits after its last
// write before the next, gathering frames: under a steady stream one
// writev (and one wake-up of the client) carries every frame of the last
// writeLinger instead of each its own, which is most of a node's CPU at a
// few thousand changes a second to a few hundred sockets. It adds at most
// writeLinger to a frame's delivery, and nothing to a socket that was idle.
const writeLinger = 2 * time.Millisecond

// sendClose sends the close frame, waits briefly for the client's answer
// (so the client reads the frame rather than a reset) and closes.
func (s *socket) sendClose(code int, reason string) {
	if code != websocket.CloseAbnormalClosure {
		nc := s.nc
		_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = nc.Write(wsFrame(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason)))
	}
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-s.readDone.wait():
	case <-t.C:
	}
	s.closeConn()
}
