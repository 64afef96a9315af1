// Package client is a small Go client of walcast's sync node (DESIGN §6): it
// connects with a token, subscribes to topics, pings, follows replay-gap and
// resync frames by resubscribing with the cursor they carry, drops duplicate
// changes by seq, and reconnects with jittered exponential backoff,
// resubscribing every topic from its last cursor.
//
// It imports nothing of walcast's server side; it speaks the wire protocol
// only.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
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
)

// Event is what Next returns.
type Event struct {
	Type   string
	Topic  string
	Cursor string          // the topic's cursor after this event
	Change json.RawMessage // the envelope, for EventChange
	Seq    int64           // the envelope's seq, for EventChange
	Code   string          // for EventError
	Msg    string          // for EventError
}

// Options configure a Client.
type Options struct {
	// Token is the JWT sent as Authorization: Bearer.
	Token string
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
}

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
	err    error // terminal error
}

type topicState struct {
	cursor  string
	lastSeq int64
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
	c := &Client{url: url, opts: opts, events: make(chan Event, opts.Buffer), topics: map[string]*topicState{}, done: make(chan struct{})}
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
	if c.opts.Token != "" {
		h.Set("Authorization", "Bearer "+c.opts.Token)
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
	return conn, nil
}

// Subscribe follows topic from cursor ("" for now). It is remembered across
// reconnects.
func (c *Client) Subscribe(topic, cursor string) error {
	c.mu.Lock()
	st := c.topics[topic]
	if st == nil {
		st = &topicState{}
		c.topics[topic] = st
	}
	if cursor != "" {
		st.cursor = cursor
	}
	cursor = st.cursor
	c.mu.Unlock()
	return c.send(map[string]string{"t": "sub", "topic": topic, "cursor": cursor})
}

// Unsubscribe stops following topic.
func (c *Client) Unsubscribe(topic string) error {
	c.mu.Lock()
	delete(c.topics, topic)
	c.mu.Unlock()
	return c.send(map[string]string{"t": "unsub", "topic": topic})
}

// Ping sends a ping (the node answers pong; any frame keeps the socket
// from being evicted as idle).
func (c *Client) Ping() error { return c.send(map[string]string{"t": "ping"}) }

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

func (c *Client) send(v map[string]string) error {
	if v["cursor"] == "" {
		delete(v, "cursor")
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.conn == nil {
		return nil // reconnecting: run resubscribes
	}
	_ = c.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return c.conn.WriteJSON(v)
}

// Next returns the next event. After Close, or when the node refuses the
// client for good (a 401 on reconnect), it returns the error.
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

// run owns the connection: it reads it, pings, and reconnects.
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
		var ce *websocket.CloseError
		if errors.As(err, &ce) && ce.Code == websocket.ClosePolicyViolation {
			c.setErr(fmt.Errorf("sync node closed the socket: %w", err))
			return
		}
		for {
			if _, err := bo.Wait(c.ctx); err != nil {
				c.setErr(ErrClosed)
				return
			}
			conn, err = c.dial(c.ctx)
			var he *HandshakeError
			if errors.As(err, &he) && he.Status == http.StatusUnauthorized {
				c.setErr(err)
				return
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
		subs := map[string]string{}
		for t, st := range c.topics {
			subs[t] = st.cursor
		}
		c.mu.Unlock()
		for t, cur := range subs {
			_ = c.send(map[string]string{"t": "sub", "topic": t, "cursor": cur})
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
	Change  json.RawMessage `json:"change"`
	Code    string          `json:"code"`
	Message string          `json:"message"`
}

// session reads one connection until it fails.
func (c *Client) session(conn *websocket.Conn) error {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(c.opts.PingInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = c.Ping()
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
			st.lastSeq, st.cursor = seq.Seq, f.Cursor
			ev = &Event{Type: EventChange, Topic: f.Topic, Cursor: f.Cursor, Change: f.Change, Seq: seq.Seq}
		case "subscribed":
			if st != nil && st.cursor == "" {
				st.cursor = f.Cursor
			}
		case "replay-gap":
			if st != nil {
				// Resubscribe from the last change we were given (ours may
				// be later than the node's if a frame raced the gap).
				cur := st.cursor
				if cur == "" {
					cur = f.Cursor
				}
				c.mu.Unlock()
				_ = c.send(map[string]string{"t": "sub", "topic": f.Topic, "cursor": cur})
				c.mu.Lock()
			}
		case "resync":
			if st != nil {
				st.cursor = f.Cursor
				ev = &Event{Type: EventResync, Topic: f.Topic, Cursor: f.Cursor}
			}
		case "error":
			ev = &Event{Type: EventError, Topic: f.Topic, Code: f.Code, Msg: f.Message}
		}
		c.mu.Unlock()
		if ev != nil {
			select {
			case c.events <- *ev:
			case <-c.ctx.Done():
				return c.ctx.Err()
			}
		}
	}
}
