// Package client is a small Go client of walcast's sync node (DESIGN §6): it
// connects with a token, subscribes to topics, pings, follows replay-gap and
// resync frames by resubscribing with the cursor they carry, drops duplicate
// changes by seq, and reconnects with jittered exponential backoff,
// resubscribing every topic from its last cursor. With a TokenFunc it
// refreshes its token on the live socket before exp and, when the node
// closes for an expired token (4100), fetches a new one and reconnects at
// once. Close codes follow docs/sync.md ("Tokens and close codes").
// SubscribeSnapshot asks for a topic's current rows before its changes, and
// State (state.go) keeps them as a map of rows by key. SubscribeWith also
// narrows a subscription to the rows a filter matches and to some columns,
// and sends that filter and column list again with every resubscription.
//
// Transactions: a topic's changes come out of Next one source transaction
// at a time. The client holds a transaction's change frames until the
// frame that ends it ("end":true, the only one with a cursor) and then
// returns them back to back, the last with Event.End set; a transaction
// cut off by a reconnect or a replay-gap is dropped and read again from
// the last cursor, so Next never returns part of one. A transaction larger
// than Options.MaxTxnChanges or MaxTxnBytes is not returned at all: Next
// returns an EventResync at its end instead (Reason "transaction-too-large").
//
// It imports nothing of walcast's server side; it speaks the wire protocol
// only.
package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/walcast/walcast/internal/backoff"
)

// Event types.
const (
	EventChange = "change" // a change, once, in order per topic
	EventResync = "resync" // the topic's state must be refetched; changes continue after Cursor
	EventError  = "error"  // the node refused something (bad cursor, forbidden topic)

	// A snapshot (SubscribeSnapshot): EventSnapshotBegin (drop what you
	// hold of the topic), one EventRow per current row, EventChange
	// without a Cursor for the changes committed while the rows were read,
	// then EventSnapshotEnd with the cursor the state is exact as of; live
	// changes follow. State applies them for you.
	EventSnapshotBegin = "snapshot-begin"
	EventRow           = "row"
	EventSnapshotEnd   = "snapshot-end"
)

// Event is what Next returns.
type Event struct {
	Type   string
	Topic  string
	Cursor string          // the topic's cursor after this event; for EventChange, set only when End
	End    bool            // for EventChange: the last change of its transaction on the topic
	Change json.RawMessage // the envelope, for EventChange and EventRow (op "read"); a row leaving a filter is a delete with "left":"filter"
	Seq    int64           // the envelope's seq, for EventChange
	Code   string          // for EventError
	Msg    string          // for EventError

	SnapshotID int64  // for EventSnapshotBegin and EventSnapshotEnd
	Rows       int64  // the node's row estimate (begin) or the rows sent (end)
	Reason     string // why the node snapshots: "resync" when it answers one; "" when asked; for EventResync, "transaction-too-large" when the client dropped a transaction over its bounds
}

// Close codes of the sync node (docs/sync.md): 4000–4099 and the standard
// 1001 and 1013 mean reconnect with backoff; 4100–4199 mean get a new token
// and reconnect at once; 4400–4499 (and the standard 1008) mean do not
// reconnect.
const (
	CloseIdle         = 1001 // idle timeout: reconnect
	CloseBackpressure = 1013 // too slow: reconnect with backoff
	CloseShutdown     = 4000 // node shutting down: reconnect
	CloseTokenExpired = 4100 // token expired: new token, reconnect at once
	CloseBadFrame     = 4400 // the client sent a bad frame: give up
	CloseFlood        = 4429 // the client sent too many frames: give up
)

// DefaultReadLimit is the largest frame the client reads unless
// Options.ReadLimit says otherwise.
const DefaultReadLimit = 16 << 20

// ErrFrameTooLarge: the node sent a frame larger than Options.ReadLimit.
// It is terminal: the same frame would come again after a reconnect.
var ErrFrameTooLarge = errors.New("sync node sent a frame larger than Options.ReadLimit (raise it)")

// Options configure a Client.
type Options struct {
	// Token is the JWT sent as Authorization: Bearer. With TokenFunc it is
	// the first token (TokenFunc is called when it is empty).
	Token string
	// TokenFunc, when set, returns a fresh token: before the token in use
	// expires (sent as a refresh frame on the live socket), after the node
	// closes the socket for an expired token (4100), and after a 401 on
	// reconnect (up to 3 in a row, then the 401 is terminal). Without it an
	// expired token ends the client at the next reconnect (401).
	TokenFunc func(ctx context.Context) (string, error)
	// RefreshBefore is how long before the token's exp the client refreshes
	// it on the live socket (with TokenFunc); default 30 s, but no sooner
	// than half the token's remaining life. A TokenFunc that returns the
	// token in use is not sent again.
	RefreshBefore time.Duration
	// ReadLimit is the largest frame the client accepts; default
	// DefaultReadLimit (16 MiB). A larger frame ends the client with
	// ErrFrameTooLarge.
	ReadLimit int64
	// Header holds extra handshake headers (Origin).
	Header http.Header
	// Dialer dials the socket; default websocket.DefaultDialer.
	Dialer *websocket.Dialer
	// PingInterval between pings; default 15 s (DESIGN §6).
	PingInterval time.Duration
	// Buffer is how many events may wait for Next; default 1024. A full
	// buffer stops reading the socket, which the node answers with drops
	// and a replay-gap the client follows.
	Buffer int
	// MaxTxnChanges and MaxTxnBytes bound the changes (and their envelope
	// bytes) the client holds for one topic while it waits for the end of
	// a transaction; defaults 100,000 and 64 MiB. A larger transaction is
	// dropped, and its end answered with an EventResync (the topic's
	// state must be read again; a snapshot subscription asks for a fresh
	// snapshot itself through State).
	MaxTxnChanges int
	MaxTxnBytes   int
}

// ReasonTxnTooLarge is the Reason of an EventResync the client makes for
// a transaction over Options.MaxTxnChanges or MaxTxnBytes.
const ReasonTxnTooLarge = "transaction-too-large"

// ErrClosed: Close was called.
var ErrClosed = errors.New("client closed")

// HandshakeError is a refused handshake (401, 503 …).
type HandshakeError struct {
	Status int
	Body   string
}

func (e *HandshakeError) Error() string {
	return fmt.Sprintf("sync node refused the socket: %d %s", e.Status, e.Body)
}

// Client is one logical connection to a sync node. Its methods are safe for
// concurrent use.
type Client struct {
	url    string
	opts   Options
	events chan Event
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns

	wmu  sync.Mutex // serializes writes on conn
	conn *websocket.Conn

	mu     sync.Mutex // guards the following fields
	topics map[string]*topicState
	token  string // the token in use
	err    error  // terminal error
}

type topicState struct {
	cursor   string
	lastSeq  int64
	snapshot bool // subscribed with SubscribeSnapshot
	// The subscription's view, sent with every sub: filter compacted (nil:
	// every row), columns (nil: every column; empty: the key columns only).
	filter  json.RawMessage
	columns []string

	// The transaction being received (session only, under Client.mu):
	// its changes so far, their bytes, and whether it went over the
	// bounds (then its changes are dropped until its end). endSeq is the
	// seq of the last change of the last whole transaction (lastSeq
	// goes back to it when the partial one is dropped); inSnapshot: between
	// snapshot-begin and snapshot-end, where changes carry no end marks
	// and belong to the snapshot.
	txn        []Event
	txnBytes   int
	txnOver    bool
	endSeq     int64
	inSnapshot bool
}

// dropTxn forgets the partial transaction: it is read again from the
// cursor, which is at the last transaction boundary.
func (st *topicState) dropTxn() {
	st.txn, st.txnBytes, st.txnOver = nil, 0, false
	st.lastSeq = st.endSeq
}

// Dial connects to url (ws:// or wss://…/v1/socket) and keeps the
// connection up until Close or ctx ends. A handshake refusal on the first
// attempt is returned as a *HandshakeError.
func Dial(ctx context.Context, url string, opts Options) (*Client, error) {
	if opts.Dialer == nil {
		opts.Dialer = websocket.DefaultDialer
	}
	if opts.PingInterval <= 0 {
		opts.PingInterval = 15 * time.Second
	}
	if opts.Buffer <= 0 {
		opts.Buffer = 1024
	}
	if opts.RefreshBefore <= 0 {
		opts.RefreshBefore = 30 * time.Second
	}
	if opts.ReadLimit <= 0 {
		opts.ReadLimit = DefaultReadLimit
	}
	if opts.MaxTxnChanges <= 0 {
		opts.MaxTxnChanges = 100_000
	}
	if opts.MaxTxnBytes <= 0 {
		opts.MaxTxnBytes = 64 << 20
	}
	c := &Client{url: url, opts: opts, events: make(chan Event, opts.Buffer), topics: map[string]*topicState{}, done: make(chan struct{}),
		token: opts.Token}
	if c.token == "" && opts.TokenFunc != nil {
		if _, err := c.newToken(ctx); err != nil {
			return nil, err
		}
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.conn = conn
	c.ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	go c.run(conn)
	return c, nil
}

func (c *Client) dial(ctx context.Context) (*websocket.Conn, error) {
	h := http.Header{}
	for k, v := range c.opts.Header {
		h[k] = v
	}
	c.mu.Lock()
	tok := c.token
	c.mu.Unlock()
	if tok != "" {
		h.Set("Authorization", "Bearer "+tok)
	}
	conn, resp, err := c.opts.Dialer.DialContext(ctx, c.url, h)
	if err != nil {
		if resp != nil {
			var body [512]byte
			n, _ := resp.Body.Read(body[:])
			return nil, &HandshakeError{Status: resp.StatusCode, Body: string(body[:n])}
		}
		return nil, err
	}
	conn.SetReadLimit(c.opts.ReadLimit)
	return conn, nil
}

// newToken asks TokenFunc for a token and makes it the one in use.
func (c *Client) newToken(ctx context.Context) (string, error) {
	tok, err := c.opts.TokenFunc(ctx)
	if err != nil {
		return "", fmt.Errorf("token source: %w", err)
	}
	c.mu.Lock()
	c.token = tok
	c.mu.Unlock()
	return tok, nil
}

// tokenExpiry reads a JWT's exp without verifying it (the node verifies;
// the client only schedules its refresh). Zero when there is none.
func tokenExpiry(tok string) time.Time {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}
	}
	var claims struct {
		Exp float64 `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil || claims.Exp <= 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(claims.Exp*float64(time.Second)))
}

// SubscribeOptions say how SubscribeWith follows a topic.
type SubscribeOptions struct {
	// Cursor resumes after this cursor ("" resumes from the one the
	// client holds for the topic, or starts from now). A cursor is bound
	// to the filter and column list it was issued under: given another
	// Filter or Columns, the node refuses it (bad-cursor).
	Cursor string
	// Snapshot asks for the topic's current rows before its changes (the
	// token needs the claim "snapshot": true); see SubscribeSnapshot.
	Snapshot bool
	// Filter is a row filter in the language of docs/filters.md, as JSON
	// (`{"col":"status","op":"=","value":"paid"}`); nil for every row. The
	// subscription then receives only the rows it matches, and a row that
	// stops matching as a removal: an EventChange whose envelope has op
	// "delete", the old key in key and before, and "left":"filter".
	Filter json.RawMessage
	// Columns lists the published columns wanted of each row image. nil
	// means every column; an empty, non-nil list (`[]string{}`) the key
	// columns only. The key columns are always included.
	Columns []string
}

// SubscribeWith follows topic as o says, replacing what an earlier
// subscription of the topic asked for. The filter and column list are
// kept with the topic and sent again on every resubscription the client
// makes itself (a reconnect, a replay-gap, a fresh snapshot after a
// resync), so its cursors stay valid. Changing the filter or the column
// list of a subscribed topic drops the cursor the client held for it
// (unless o.Cursor gives one), as that cursor belongs to the old view.
//
// A filter or column list the node refuses comes back from Next as an
// EventError with Code "bad-filter" and a Msg that names the problem
// (`filter.value: column "amount" is int4; …`); the topic is then not
// subscribed, and the client asks again only after a reconnect: call
// SubscribeWith with a corrected view, or Unsubscribe.
func (c *Client) SubscribeWith(topic string, o SubscribeOptions) error {
	filter, err := compactFilter(o.Filter)
	if err != nil {
		return err
	}
	c.mu.Lock()
	st := c.topics[topic]
	if st == nil {
		st = &topicState{}
		c.topics[topic] = st
	}
	if !bytes.Equal(st.filter, filter) || !sameColumns(st.columns, o.Columns) {
		st.cursor = "" // bound to the old view
	}
	st.snapshot, st.filter, st.columns = o.Snapshot, filter, slices.Clone(o.Columns)
	if o.Cursor != "" {
		st.cursor = o.Cursor
	}
	f := st.subFrame(topic, st.cursor, st.snapshot)
	c.mu.Unlock()
	return c.send(f)
}

// compactFilter checks that f is one JSON value and returns a compact copy
// of it; nil for no filter (nil, empty, or JSON null).
func compactFilter(f json.RawMessage) (json.RawMessage, error) {
	t := bytes.TrimSpace(f)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil, nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, t); err != nil {
		return nil, fmt.Errorf("subscription filter is not JSON: %w", err)
	}
	return b.Bytes(), nil
}

// sameColumns reports whether two column lists ask for the same columns,
// telling nil (every column) from empty (the key columns only).
func sameColumns(a, b []string) bool {
	return (a == nil) == (b == nil) && slices.Equal(a, b)
}

// Subscribe follows topic from cursor ("" for now), every row and column.
// It is remembered across reconnects. It is SubscribeWith without a
// snapshot, filter or column list.
func (c *Client) Subscribe(topic, cursor string) error {
	return c.SubscribeWith(topic, SubscribeOptions{Cursor: cursor})
}

// SubscribeSnapshot follows topic with its current rows first (the token
// needs the claim "snapshot": true): the node sends snapshot-begin, the rows,
// the changes committed while it read them, snapshot-end with a cursor, then
// live changes (docs/sync.md, "State, then changes"). With a cursor (a
// snapshot-end's or a later change's) the node resumes from it and
// snapshots only when it can no longer serve it. After a reconnect the
// client resumes the same way; a reconnect in the middle of a snapshot,
// before its snapshot-end, asks for a fresh one. Any resync of the topic
// the node answers with a fresh snapshot. It is SubscribeWith with
// Snapshot and neither filter nor column list.
func (c *Client) SubscribeSnapshot(topic, cursor string) error {
	return c.SubscribeWith(topic, SubscribeOptions{Cursor: cursor, Snapshot: true})
}

// resnapshot asks for a fresh snapshot of topic, dropping its cursor; the
// topic's filter and column list go with it.
func (c *Client) resnapshot(topic string) error {
	c.mu.Lock()
	st := c.topics[topic]
	if st == nil {
		c.mu.Unlock()
		return nil
	}
	st.snapshot, st.cursor, st.lastSeq, st.endSeq = true, "", 0, 0
	st.txn, st.txnBytes, st.txnOver = nil, 0, false
	f := st.subFrame(topic, "", true)
	c.mu.Unlock()
	return c.send(f)
}

// subFrame is {"t":"sub",…} for topic with the topic's filter and column
// list, without an empty cursor. Client.mu is held.
func (st *topicState) subFrame(topic, cursor string, snapshot bool) map[string]any {
	f := map[string]any{"t": "sub", "topic": topic}
	if cursor != "" {
		f["cursor"] = cursor
	}
	if snapshot {
		f["snapshot"] = true
	}
	if st.filter != nil {
		f["filter"] = st.filter
	}
	if st.columns != nil {
		f["columns"] = st.columns
	}
	return f
}

// Unsubscribe stops following topic.
func (c *Client) Unsubscribe(topic string) error {
	c.mu.Lock()
	delete(c.topics, topic)
	c.mu.Unlock()
	return c.send(map[string]any{"t": "unsub", "topic": topic})
}

// Ping sends a ping (the node answers pong; any frame keeps the socket
// from being evicted as idle).
func (c *Client) Ping() error { return c.send(map[string]any{"t": "ping"}) }

// Cursor returns topic's current cursor: after the last change Next
// returned, or where a resync left it.
func (c *Client) Cursor(topic string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.topics[topic]; st != nil {
		return st.cursor
	}
	return ""
}

func (c *Client) send(v map[string]any) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.conn == nil {
		return nil // reconnecting: run resubscribes
	}
	_ = c.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return c.conn.WriteJSON(v)
}

// Next returns the next event. After Close, or when the node refuses the
// client for good (a 403 on reconnect, or a 401 a new token does not
// cure), it returns the error: a *HandshakeError for those.
func (c *Client) Next(ctx context.Context) (Event, error) {
	select {
	case ev, ok := <-c.events:
		if ok {
			return ev, nil
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return Event{}, c.err
	case <-ctx.Done():
		return Event{}, ctx.Err()
	}
}

// Close closes the connection and stops reconnecting.
func (c *Client) Close() error {
	c.cancel()
	c.wmu.Lock()
	if c.conn != nil {
		_ = c.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		_ = c.conn.Close()
	}
	c.wmu.Unlock()
	<-c.done
	return nil
}

// closeAction is what a close code tells the client to do.
type closeAction int

const (
	reconnect  closeAction = iota // with backoff
	renewToken                    // new token, reconnect at once
	giveUp                        // terminal
)

func actionOf(code int) closeAction {
	switch {
	case code >= 4100 && code <= 4199:
		return renewToken
	case code >= 4400 && code <= 4499, code == websocket.ClosePolicyViolation,
		code == websocket.CloseUnsupportedData, code == websocket.CloseInvalidFramePayloadData:
		return giveUp
	}
	return reconnect
}

// run owns the connection: it reads it, pings, refreshes the token, and
// reconnects.
func (c *Client) run(conn *websocket.Conn) {
	defer close(c.done)
	defer close(c.events)
	bo := backoff.New(250*time.Millisecond, 30*time.Second)
	for {
		err := c.session(conn)
		c.wmu.Lock()
		c.conn = nil
		c.wmu.Unlock()
		_ = conn.Close()
		if c.ctx.Err() != nil {
			c.setErr(ErrClosed)
			return
		}
		if errors.Is(err, websocket.ErrReadLimit) {
			c.setErr(ErrFrameTooLarge)
			return
		}
		var ce *websocket.CloseError
		renew := false
		if errors.As(err, &ce) {
			switch actionOf(ce.Code) {
			case giveUp:
				c.setErr(fmt.Errorf("sync node closed the socket: %w", err))
				return
			case renewToken:
				renew = c.opts.TokenFunc != nil
			}
		}
		unauthorized := 0
		for {
			if renew {
				// Expired, not refused: a new token is all it takes, so
				// the first attempt does not wait.
				renew = false
				if _, err := c.newToken(c.ctx); err != nil {
					if c.ctx.Err() != nil {
						c.setErr(ErrClosed)
						return
					}
					renew = true // the token source failed: retry it after a backoff
					if _, err := bo.Wait(c.ctx); err != nil {
						c.setErr(ErrClosed)
						return
					}
					continue
				}
			} else if _, err := bo.Wait(c.ctx); err != nil {
				c.setErr(ErrClosed)
				return
			}
			conn, err = c.dial(c.ctx)
			var he *HandshakeError
			if errors.As(err, &he) && he.Status == http.StatusForbidden {
				// The node refuses the connection itself (its origin
				// rule): the same request would be refused again.
				c.setErr(err)
				return
			}
			if errors.As(err, &he) && he.Status == http.StatusUnauthorized {
				// A 401 with a token source may be a token that went stale
				// in flight: try a few new ones before giving up.
				if unauthorized++; c.opts.TokenFunc == nil || unauthorized > 3 {
					c.setErr(err)
					return
				}
				if _, err := bo.Wait(c.ctx); err != nil {
					c.setErr(ErrClosed)
					return
				}
				renew = true
				continue
			}
			if err == nil {
				break
			}
		}
		bo.Reset()
		c.wmu.Lock()
		c.conn = conn
		c.wmu.Unlock()
		c.mu.Lock()
		var subs []map[string]any
		for t, st := range c.topics {
			st.dropTxn() // resumed from the cursor, its last boundary
			subs = append(subs, st.subFrame(t, st.cursor, st.snapshot))
		}
		c.mu.Unlock()
		for _, f := range subs {
			_ = c.send(f)
		}
	}
}

func (c *Client) setErr(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
}

// frame is a node → client frame.
type frame struct {
	T       string          `json:"t"`
	Topic   string          `json:"topic"`
	Cursor  string          `json:"cursor"`
	End     bool            `json:"end"`
	Change  json.RawMessage `json:"change"`
	Code    string          `json:"code"`
	Message string          `json:"message"`

	Row        json.RawMessage `json:"row"`
	SnapshotID int64           `json:"snapshotId"`
	Rows       int64           `json:"rows"`
	Reason     string          `json:"reason"`
}

// session reads one connection until it fails. Its helper goroutine pings
// and, with a TokenFunc, refreshes the token before exp.
func (c *Client) session(conn *websocket.Conn) error {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(c.opts.PingInterval)
		defer t.Stop()
		refresh := time.NewTimer(c.refreshIn())
		defer refresh.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = c.Ping()
			case <-refresh.C:
				next := c.refresh()
				refresh.Reset(next)
			}
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()
	for {
		var f frame
		if err := conn.ReadJSON(&f); err != nil {
			return err
		}
		var evs []Event
		var ev *Event
		c.mu.Lock()
		st := c.topics[f.Topic]
		switch f.T {
		case "change":
			var seq struct {
				Seq int64 `json:"seq"`
			}
			if json.Unmarshal(f.Change, &seq) != nil || st == nil || seq.Seq <= st.lastSeq {
				break // a duplicate, or a topic we left
			}
			st.lastSeq = seq.Seq
			e := Event{Type: EventChange, Topic: f.Topic, Cursor: f.Cursor, End: f.End, Change: f.Change, Seq: seq.Seq}
			if st.inSnapshot {
				// A change of a snapshot's catch-up has no cursor: until
				// its snapshot-end there is nothing to resume from, and
				// the snapshot (with these changes) applies as a whole
				// at snapshot-end.
				ev = &e
				break
			}
			if !f.End {
				// Inside a transaction: held until its end.
				if !st.txnOver {
					st.txn = append(st.txn, e)
					st.txnBytes += len(f.Change)
					if len(st.txn) > c.opts.MaxTxnChanges || st.txnBytes > c.opts.MaxTxnBytes {
						st.txn, st.txnBytes, st.txnOver = nil, 0, true
					}
				}
				break
			}
			st.cursor, st.endSeq = f.Cursor, seq.Seq
			if len(st.txn)+1 > c.opts.MaxTxnChanges || st.txnBytes+len(f.Change) > c.opts.MaxTxnBytes {
				st.txnOver = true // the end makes it too large
			}
			if st.txnOver {
				st.txn, st.txnBytes, st.txnOver = nil, 0, false
				ev = &Event{Type: EventResync, Topic: f.Topic, Cursor: f.Cursor, Reason: ReasonTxnTooLarge}
				break
			}
			evs = append(st.txn, e)
			st.txn, st.txnBytes = nil, 0
		case "snapshot-begin":
			if st != nil {
				// The catch-up's seqs may precede ones already seen, and a
				// reconnect before snapshot-end must ask for a new snapshot.
				st.cursor, st.lastSeq, st.endSeq = "", 0, 0
				st.txn, st.txnBytes, st.txnOver, st.inSnapshot = nil, 0, false, true
				ev = &Event{Type: EventSnapshotBegin, Topic: f.Topic, SnapshotID: f.SnapshotID, Rows: f.Rows, Reason: f.Reason}
			}
		case "row":
			if st != nil {
				ev = &Event{Type: EventRow, Topic: f.Topic, Change: f.Row}
			}
		case "snapshot-end":
			if st != nil {
				st.cursor, st.endSeq, st.inSnapshot = f.Cursor, st.lastSeq, false
				ev = &Event{Type: EventSnapshotEnd, Topic: f.Topic, Cursor: f.Cursor, SnapshotID: f.SnapshotID, Rows: f.Rows}
			}
		case "subscribed":
			if st != nil && st.cursor == "" {
				st.cursor = f.Cursor
			}
		case "position":
			// The topic was quiet: nothing of ours up to this cursor, so
			// a reconnect resumes from here (dedup by seq is unchanged).
			if st != nil && len(st.txn) == 0 && !st.txnOver {
				st.cursor = f.Cursor
			}
		case "replay-gap":
			if st != nil {
				// The node dropped frames: the partial transaction is
				// incomplete; it comes again from the cursor.
				st.dropTxn()
				// Resubscribe from the last change we were given (ours may
				// be later than the node's if a frame raced the gap).
				cur := st.cursor
				if cur == "" {
					cur = f.Cursor
				}
				sub := st.subFrame(f.Topic, cur, st.snapshot)
				c.mu.Unlock()
				_ = c.send(sub)
				c.mu.Lock()
			}
		case "resync":
			if st != nil {
				// Seqs after a resync need not follow the ones before it (a
				// restored or another journal): dedup starts over.
				st.cursor, st.lastSeq, st.endSeq = f.Cursor, 0, 0
				st.txn, st.txnBytes, st.txnOver, st.inSnapshot = nil, 0, false, false
				ev = &Event{Type: EventResync, Topic: f.Topic, Cursor: f.Cursor}
			}
		case "error":
			ev = &Event{Type: EventError, Topic: f.Topic, Code: f.Code, Msg: f.Message}
		}
		c.mu.Unlock()
		if ev != nil {
			evs = append(evs, *ev)
		}
		for _, ev := range evs {
			select {
			case c.events <- ev:
			case <-c.ctx.Done():
				return c.ctx.Err()
			}
		}
	}
}

// never is a timer duration that does not fire in practice.
const never = 100 * 365 * 24 * time.Hour

// refreshIn is how long until the token in use should be refreshed:
// RefreshBefore before its exp, but no sooner than half its remaining life
// (and at least a second) so a short-lived token is not refreshed in a
// loop. never without a TokenFunc or an exp.
func (c *Client) refreshIn() time.Duration {
	if c.opts.TokenFunc == nil {
		return never
	}
	c.mu.Lock()
	exp := tokenExpiry(c.token)
	c.mu.Unlock()
	if exp.IsZero() {
		return never
	}
	left := time.Until(exp)
	if left <= 0 {
		return never // expired: the node closes with 4100 and run renews it
	}
	return max(left-c.opts.RefreshBefore, left/2, time.Second)
}

// refresh fetches a new token and sends it on the live socket
// ({"t":"refresh","token":…}); it returns when to refresh next. A refresh
// the node refuses comes back as an EventError; the old token stays until
// the node closes at its exp, and run then gets a new one.
func (c *Client) refresh() time.Duration {
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	c.mu.Lock()
	old := c.token
	c.mu.Unlock()
	tok, err := c.newToken(ctx)
	if err != nil {
		return 5 * time.Second
	}
	if tok == old {
		return never // nothing newer yet: the expiry close (4100) renews it
	}
	_ = c.send(map[string]any{"t": "refresh", "token": tok})
	return c.refreshIn()
}
