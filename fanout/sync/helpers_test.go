package sync

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

var (
	syncTestSecret = []byte("sync-test-cursor-secret-0123456789")
	syncJWTSecret  = []byte("sync-test-jwt-secret-0123456789ab")
)

// syncEnv is a journal on a fresh database, an embedded NATS server, a
// test publisher and a sync node served over loopback.
type syncEnv struct {
	t    testing.TB
	url  string // the journal's database
	j    *journal.Journal
	gen  int64
	nats *natstest.Server
	pub  *nats.Conn
	node *Node
	srv  *httptest.Server

	mu        sync.Mutex // guards the following fields
	xid       uint32
	lsn       decoder.LSN
	published int64 // newest seq published
}

func syncCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newSyncEnv starts everything; mod adjusts the node's configuration.
func newSyncEnv(t testing.TB, mod ...func(*Config)) *syncEnv {
	t.Helper()
	return newSyncEnvAt(t, pgtest.NewDatabase(t), nil, mod...)
}

// newSyncEnvAt is newSyncEnv with the journal on url; jmod adjusts the
// journal's configuration.
func newSyncEnvAt(t testing.TB, url string, jmod func(*journal.Config), mod ...func(*Config)) *syncEnv {
	t.Helper()
	ctx := syncCtx(t)
	e := &syncEnv{t: t, lsn: 0x1000000}
	var err error
	e.url = url
	jcfg := journal.Config{URL: e.url, CursorSecret: syncTestSecret}
	if jmod != nil {
		jmod(&jcfg)
	}
	e.j, err = journal.Open(ctx, jcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.j.Close)
	if e.gen, err = e.j.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	e.nats = natstest.Start(t)
	e.pub, err = nats.Connect(e.nats.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pub.Close)
	auth, err := NewHMACAuth(syncJWTSecret)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{NATS: bus.NATSConfig{URL: e.nats.URL()}, Journal: e.j, Auth: auth}
	for _, f := range mod {
		f(&cfg)
	}
	e.node, err = Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewUnstartedServer(e.node.Handler())
	hs := e.node.HTTPServer()
	e.srv.Config.ReadHeaderTimeout, e.srv.Config.WriteTimeout = hs.ReadHeaderTimeout, hs.WriteTimeout
	e.srv.Config.IdleTimeout, e.srv.Config.MaxHeaderBytes = hs.IdleTimeout, hs.MaxHeaderBytes
	e.srv.Start()
	t.Cleanup(func() {
		e.node.Close()
		e.srv.Close()
	})
	return e
}

// row describes one change to journal.
type row struct {
	entity string
	op     decoder.Op
	id     int
	tenant string
	state  decoder.TenantState
	pad    int
	doc    string // embedded JSON for an "doc" column; "" for none
}

func ins(entity string, id int) row { return row{entity: entity, op: decoder.OpInsert, id: id} }

// appendRows journals one transaction of rows and returns its entries as
// read back from the journal.
func (e *syncEnv) appendRows(rows ...row) []journal.Entry {
	e.t.Helper()
	return e.appendRowsAt(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), rows...)
}

// appendRowsAt is appendRows with the envelopes' commitTime set to ct.
func (e *syncEnv) appendRowsAt(ct time.Time, rows ...row) []journal.Entry {
	e.t.Helper()
	e.mu.Lock()
	e.xid++
	xid := e.xid
	e.lsn += decoder.LSN(len(rows) + 10)
	end := e.lsn
	e.mu.Unlock()
	chs := make([]decoder.Change, len(rows))
	for i, r := range rows {
		lsn := end - decoder.LSN(len(rows)) + decoder.LSN(i)
		env := decoder.Envelope{LSN: lsn, CommitLSN: end, Xid: xid, CommitTime: ct, Entity: r.entity, Op: r.op}
		key := []byte(fmt.Sprintf(`{"id":%d}`, r.id))
		switch r.op {
		case decoder.OpTruncate:
			key = nil
			env.Truncate = &decoder.TruncateInfo{}
		case decoder.OpDelete:
			env.Key = map[string]json.RawMessage{"id": json.RawMessage(strconv.Itoa(r.id))}
		default:
			env.Key = map[string]json.RawMessage{"id": json.RawMessage(strconv.Itoa(r.id))}
			env.After = map[string]json.RawMessage{"id": json.RawMessage(strconv.Itoa(r.id)),
				"pad": json.RawMessage(strconv.Quote(strings.Repeat("x", r.pad)))}
			if r.doc != "" {
				env.After["doc"] = json.RawMessage(r.doc)
			}
		}
		if r.state == decoder.TenantKnown {
			env.Tenant = r.tenant
		}
		body, err := json.Marshal(env)
		if err != nil {
			e.t.Fatal(err)
		}
		chs[i] = decoder.Change{LSN: lsn, Entity: r.entity, Op: env.Op, Key: key, Tenant: r.tenant, TenantState: r.state, Body: body}
	}
	tx := decoder.NewTransaction(xid, end-decoder.LSN(len(rows))-1, end, ct, chs)
	res, err := e.j.Append(syncCtx(e.t), e.gen, []*decoder.Transaction{tx})
	if err != nil {
		e.t.Fatal(err)
	}
	return e.entries(res.FirstSeq, res.LastSeq)
}

// entries reads the entries first..last back as the publisher does (with
// their epochs).
func (e *syncEnv) entries(first, last int64) []journal.Entry {
	e.t.Helper()
	var out []journal.Entry
	for pos := first - 1; pos < last; {
		lg, err := e.j.ReadAfter(syncCtx(e.t), pos, int(last-pos))
		if err != nil {
			e.t.Fatal(err)
		}
		if len(lg.Entries) == 0 {
			e.t.Fatalf("entries %d..%d: nothing after %d", first, last, pos)
		}
		out = append(out, lg.Entries...)
		pos = lg.Entries[len(lg.Entries)-1].Seq
	}
	return out
}

// publish publishes entries as the publisher does.
func (e *syncEnv) publish(entries ...journal.Entry) {
	e.t.Helper()
	for i, en := range entries {
		m := publishedMsg("walcast", e.j.ID(), en)
		if end := txnEndMark(entries, i); end != "" {
			m.Header.Set(bus.HeaderTxnEnd, end)
		}
		if err := e.pub.PublishMsg(m); err != nil {
			e.t.Fatal(err)
		}
		e.mu.Lock()
		e.published = max(e.published, en.Seq)
		e.mu.Unlock()
	}
	if err := e.pub.Flush(); err != nil {
		e.t.Fatal(err)
	}
}

// txnEndMark is the Walcast-Txn-End header the publisher gives
// entries[i], when entries holds whole transactions.
func txnEndMark(entries []journal.Entry, i int) string {
	en := entries[i]
	end := bus.TxnEndEntity
	for _, o := range entries[i+1:] {
		if o.CommitLSN != en.CommitLSN {
			break
		}
		if o.Entity == en.Entity {
			end = bus.TxnEndTenant
			if o.Tenant == en.Tenant && o.HasTenant == en.HasTenant && o.TenantUnknown == en.TenantUnknown {
				return ""
			}
		}
	}
	return end
}

func (e *syncEnv) commit(rows ...row) []journal.Entry {
	e.t.Helper()
	es := e.appendRows(rows...)
	e.publish(es...)
	return es
}

// publishedMsg builds the NATS message of an entry (the publisher's
// contract).
func publishedMsg(prefix string, id [16]byte, en journal.Entry) *nats.Msg {
	m := nats.NewMsg(bus.Subject(prefix, en.Op, en.Entity, en.Tenant, en.HasTenant))
	m.Data = en.Envelope
	m.Header.Set("Nats-Msg-Id", fmt.Sprintf("%x:%s:%d", id, journal.EpochHex(en.Epoch), en.Seq))
	m.Header.Set("Walcast-Epoch", journal.EpochHex(en.Epoch))
	m.Header.Set("Walcast-Seq", strconv.FormatInt(en.Seq, 10))
	m.Header.Set("Walcast-Entity-Seq", strconv.FormatInt(en.EntitySeq, 10))
	m.Header.Set("Walcast-Entity", en.Entity)
	m.Header.Set("Walcast-Commit-Lsn", en.CommitLSN.String())
	if en.HasTenant {
		m.Header.Set("Walcast-Tenant", en.Tenant)
	}
	if en.TenantUnknown {
		m.Header.Set("Walcast-Tenant-Unknown", "true")
	}
	return m
}

// token signs a socket token.
func token(t testing.TB, topics []string, tenant string, exp time.Duration) string {
	t.Helper()
	c := Claims{Topics: topics, Tenant: tenant, RegisteredClaims: jwt.RegisteredClaims{
		Subject: "test", ExpiresAt: jwt.NewNumericDate(time.Now().Add(exp))}}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(syncJWTSecret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (e *syncEnv) wsURL(tok string) string {
	u := "ws" + strings.TrimPrefix(e.srv.URL, "http") + "/v1/socket"
	if tok != "" {
		u += "?access_token=" + url.QueryEscape(tok)
	}
	return u
}

// wsConn is a raw test client.
type wsConn struct {
	t testing.TB
	c *websocket.Conn
}

// inFrame is a node → client frame as a test reads it.
type inFrame struct {
	T       string          `json:"t"`
	Topic   string          `json:"topic"`
	Cursor  string          `json:"cursor"`
	End     bool            `json:"end"`
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Change  json.RawMessage `json:"change"`
	// RetryAfter is set on a rate-limited error: whole seconds.
	RetryAfter *int64 `json:"retryAfter"`
	env        decoder.Envelope
}

func (e *syncEnv) dial(tok string, rcvBuf int) (*wsConn, *http.Response, error) {
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	if rcvBuf > 0 {
		d.NetDialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				_ = c.(*net.TCPConn).SetReadBuffer(rcvBuf)
			}
			return c, err
		}
	}
	c, resp, err := d.Dial(e.wsURL(tok), nil)
	if err != nil {
		return nil, resp, err
	}
	e.t.Cleanup(func() { c.Close() })
	return &wsConn{t: e.t, c: c}, resp, nil
}

func (e *syncEnv) mustDial(tok string) *wsConn {
	e.t.Helper()
	c, _, err := e.dial(tok, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (c *wsConn) send(v any) {
	c.t.Helper()
	if err := c.c.WriteJSON(v); err != nil {
		c.t.Fatal(err)
	}
}

func (c *wsConn) sub(topic, cursor string) {
	c.t.Helper()
	f := map[string]string{"t": "sub", "topic": topic}
	if cursor != "" {
		f["cursor"] = cursor
	}
	c.send(f)
}

// read reads the next frame; it fails the test on a close or timeout.
func (c *wsConn) read() inFrame {
	c.t.Helper()
	f, err := c.tryRead(20 * time.Second)
	if err != nil {
		c.t.Fatal(err)
	}
	return f
}

func (c *wsConn) tryRead(timeout time.Duration) (inFrame, error) {
	_ = c.c.SetReadDeadline(time.Now().Add(timeout))
	var f inFrame
	_, b, err := c.c.ReadMessage()
	if err != nil {
		return f, err
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("frame %s: %w", b, err)
	}
	if f.T == "change" {
		if err := json.Unmarshal(f.Change, &f.env); err != nil {
			return f, err
		}
	}
	return f, nil
}

// expect reads one frame of kind t.
func (c *wsConn) expect(kind string) inFrame {
	c.t.Helper()
	f := c.read()
	if f.T != kind {
		c.t.Fatalf("got frame %+v, want %q", f, kind)
	}
	return f
}

// expectChanges reads n change frames and returns their seqs.
func (c *wsConn) expectChanges(n int) []inFrame {
	c.t.Helper()
	out := make([]inFrame, 0, n)
	for len(out) < n {
		out = append(out, c.expect("change"))
	}
	return out
}

// expectClose reads until the connection closes and returns the close code
// and reason.
func (c *wsConn) expectClose() (int, string) {
	c.t.Helper()
	for {
		_ = c.c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, _, err := c.c.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if ok := asCloseError(err, &ce); ok {
			return ce.Code, ce.Text
		}
		c.t.Fatalf("connection ended without a close frame: %v", err)
	}
}

func asCloseError(err error, ce **websocket.CloseError) bool {
	e, ok := err.(*websocket.CloseError)
	if ok {
		*ce = e
	}
	return ok
}

func seqsOf(fs []inFrame) []int64 {
	out := make([]int64, len(fs))
	for i, f := range fs {
		out[i] = f.env.Seq
	}
	return out
}

func entrySeqs(es []journal.Entry) []int64 {
	out := make([]int64, len(es))
	for i, e := range es {
		out[i] = e.Seq
	}
	return out
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	waitForWithin(t, 20*time.Second, what, cond)
}

// waitForWithin is waitFor with its own deadline, for what a fresh cluster
// or a loaded machine may take longer to reach.
func waitForWithin(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// topicLive waits until every member of entity on the node is live.
func (e *syncEnv) topicLive(entity string, members int) {
	e.t.Helper()
	waitFor(e.t, entity+" members live", func() bool {
		e.node.mu.Lock()
		t := e.node.topics[entity]
		e.node.mu.Unlock()
		if t == nil {
			return false
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		if len(t.members) != members {
			return false
		}
		for m := range t.members {
			if m.state != memberLive {
				return false
			}
		}
		return true
	})
}

// fakeClock is a Clock advanced by hand.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []fakeWaiter
}

type fakeWaiter struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.waiters = append(c.waiters, fakeWaiter{c.now.Add(d), ch})
	return ch
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
			continue
		}
		kept = append(kept, w)
	}
	c.waiters = kept
}

// sleepers reports how many After calls are waiting.
func (c *fakeClock) sleepers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

func jwtSign(claims map[string]any) (string, error) {
	return jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims(claims)).SignedString(syncJWTSecret)
}
