package sync

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/fanout/client"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
	"github.com/walcast/walcast/replication"
)

// txnTables are the two tables the whole-transaction test writes.
var txnTables = []string{"public.docs", "public.notes"}

// txnFollower follows both tables with the Go client in one tenant scope,
// groups what Next returns into transactions (a run of changes of a topic
// ending at the one with End) and applies each group to its rows.
type txnFollower struct {
	tenant string

	mu     gosync.Mutex
	groups map[string][][]int64          // topic → delivered transactions, as seqs
	commit map[string][]string           // topic → each group's commitLsn ("" when its changes disagree)
	rows   map[string]map[string]string  // topic → id → normalized row
	open   map[string][]decoder.Envelope // topic → the group being returned
	errs   []string
}

func (f *txnFollower) event(ev client.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch ev.Type {
	case client.EventError:
		f.errs = append(f.errs, ev.Code+": "+ev.Msg)
	case client.EventResync:
		// A TRUNCATE's resync: the truncate change cleared the rows.
		if len(f.open[ev.Topic]) > 0 {
			f.errs = append(f.errs, "a resync inside a transaction of "+ev.Topic)
		}
	case client.EventChange:
		var e decoder.Envelope
		if err := json.Unmarshal(ev.Change, &e); err != nil {
			f.errs = append(f.errs, err.Error())
			return
		}
		if (ev.Cursor != "") != ev.End {
			f.errs = append(f.errs, fmt.Sprintf("seq %d: end %v with cursor %q", e.Seq, ev.End, ev.Cursor))
		}
		f.open[ev.Topic] = append(f.open[ev.Topic], e)
		if !ev.End {
			return
		}
		g := f.open[ev.Topic]
		f.open[ev.Topic] = nil
		seqs := make([]int64, len(g))
		commit := g[0].CommitLSN.String()
		for i, e := range g {
			seqs[i] = e.Seq
			if e.CommitLSN.String() != commit {
				commit = ""
			}
			applyTxnEnvelope(f.rows[ev.Topic], &e)
		}
		f.groups[ev.Topic] = append(f.groups[ev.Topic], seqs)
		f.commit[ev.Topic] = append(f.commit[ev.Topic], commit)
	}
}

func applyTxnEnvelope(rows map[string]string, e *decoder.Envelope) {
	switch e.Op {
	case decoder.OpInsert, decoder.OpUpdate:
		if old, ok := e.Before["id"]; ok {
			delete(rows, string(old))
		}
		rows[string(e.Key["id"])] = normRow(e.After)
	case decoder.OpDelete:
		delete(rows, string(e.Key["id"]))
	case decoder.OpTruncate:
		clear(rows)
	}
}

// txnWriter runs n random transactions on docs and notes: inserts,
// updates (of values, and of tenants: rows move between 'a', 'b' and no
// tenant), deletes, and once, half way, a TRUNCATE of docs with inserts
// after it in the same transaction.
func txnWriter(t *testing.T, url string, seed uint64, n int) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close(ctx)
	r := rand.New(rand.NewPCG(seed, seed))
	tenant := func() any {
		switch r.IntN(3) {
		case 0:
			return "a"
		case 1:
			return "b"
		}
		return nil
	}
	for i := range n {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		if i == n/2 {
			if _, err := tx.Exec(ctx, `TRUNCATE docs`); err != nil {
				t.Error(err)
				return
			}
		}
		for range 2 + r.IntN(6) {
			table := []string{"docs", "notes"}[r.IntN(2)]
			id := 1 + r.IntN(40)
			var sql string
			var args []any
			switch r.IntN(5) {
			case 0, 1:
				sql, args = `INSERT INTO `+table+` VALUES ($1, $2, $3) ON CONFLICT (id) DO UPDATE SET val = excluded.val`, []any{id, tenant(), fmt.Sprintf("v%d", i)}
			case 2:
				sql, args = `UPDATE `+table+` SET tenant = $2, val = $3 WHERE id = $1`, []any{id, tenant(), fmt.Sprintf("m%d", i)}
			case 3:
				sql, args = `UPDATE `+table+` SET val = $2 WHERE id BETWEEN $1 AND $1 + 3`, []any{id, fmt.Sprintf("u%d", i)}
			default:
				sql, args = `DELETE FROM `+table+` WHERE id = $1`, []any{id}
			}
			if _, err := tx.Exec(ctx, sql, args...); err != nil {
				t.Error(err)
				return
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Error(err)
			return
		}
		if r.IntN(4) == 0 {
			time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond)
		}
	}
}

// TestWholeTransactions: a writer runs transactions over two tables and
// two tenants (rows with no tenant too), moving rows between tenants,
// deleting, and truncating once, while Go clients of each scope (tenant
// a, tenant b, no tenant) follow both tables through sockets with small
// receive buffers and a node with a tiny queue (so frames are dropped and
// topics repaired from the journal), and every socket is closed twice
// mid-stream (the clients reconnect with their cursors). Each client must
// have been given only whole transactions — every run of changes up to an
// end mark is exactly the changes of one source transaction in its scope,
// as the journal groups them — and end with each table's rows of its
// scope.
func TestWholeTransactions(t *testing.T) {
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) {
		c.MaxBufferedBytes = 4096
		c.MaxDroppedFrames = 1 << 20
		c.MaxLag = time.Minute
	}, `CREATE TABLE notes (id int PRIMARY KEY, tenant text, val text)`, `ALTER PUBLICATION pub ADD TABLE notes`)
	pgtest.MustExec(t, env.src, `DELETE FROM docs`)
	waitFor(t, "notes to be known", func() bool {
		pgtest.MustExec(t, env.src, `INSERT INTO notes VALUES (0, NULL, 'x')`, `DELETE FROM notes`)
		time.Sleep(100 * time.Millisecond)
		return env.node.known("public.notes")
	})
	waitJournaled(t, env)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var readers gosync.WaitGroup
	var fs []*txnFollower
	for _, tenant := range []string{"a", "b", ""} {
		claims := Claims{Topics: txnTables, Tenant: tenant, RegisteredClaims: jwt.RegisteredClaims{
			Subject: "test", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}}
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(syncJWTSecret)
		if err != nil {
			t.Fatal(err)
		}
		d := &websocket.Dialer{HandshakeTimeout: 10 * time.Second, NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetReadBuffer(4096)
			}
			return c, err
		}}
		c, err := client.Dial(ctx, env.wsURL(""), client.Options{Token: tok, Dialer: d, Buffer: 8})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		f := &txnFollower{tenant: tenant, groups: map[string][][]int64{}, commit: map[string][]string{},
			rows: map[string]map[string]string{}, open: map[string][]decoder.Envelope{}}
		for _, topic := range txnTables {
			f.rows[topic] = map[string]string{}
			if err := c.Subscribe(topic, ""); err != nil {
				t.Fatal(err)
			}
		}
		fs = append(fs, f)
		readers.Add(1)
		go func() {
			defer readers.Done()
			r := rand.New(rand.NewPCG(uint64(len(tenant)), 7))
			for {
				ev, err := c.Next(ctx)
				if err != nil {
					return
				}
				f.event(ev)
				if r.IntN(50) == 0 {
					time.Sleep(5 * time.Millisecond) // a slow reader: its socket backs up
				}
			}
		}()
	}
	for _, topic := range txnTables {
		env.topicLive(topic, 3)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		txnWriter(t, env.src, 42, 300)
	}()
	for range 2 {
		time.Sleep(700 * time.Millisecond)
		env.node.mu.Lock()
		for s := range env.node.sockets {
			s.closeWith(websocket.CloseGoingAway, "test", "test")
		}
		env.node.mu.Unlock()
	}
	<-done
	waitJournaled(t, env)

	for _, f := range fs {
		for _, topic := range txnTables {
			table := strings.TrimPrefix(topic, "public.")
			var diff string
			deadline := time.Now().Add(60 * time.Second)
			for time.Now().Before(deadline) {
				f.mu.Lock()
				diff = diffStates(f.rows[topic], scopedRows(t, env.src, table, f.tenant))
				f.mu.Unlock()
				if diff == "" {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if diff != "" {
				t.Errorf("client of tenant %q, %s: rows differ from the table after 60 s:\n%s", f.tenant, topic, diff)
			}
		}
	}
	cancel()
	readers.Wait()

	// The journal's grouping: per entity and scope, the seqs of each
	// transaction (by commit LSN) a reader of that scope is given.
	want := map[string]map[string][]int64{} // tenant/topic → commit → seqs
	var lastSeq int64
	for pos := int64(0); ; {
		lg, err := env.j.ReadAfter(context.Background(), pos, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(lg.Entries) == 0 {
			break
		}
		for _, e := range lg.Entries {
			for _, tenant := range []string{"a", "b", ""} {
				if e.TenantUnknown || e.HasTenant && (tenant == "" || e.Tenant != tenant) {
					continue
				}
				k := tenant + "/" + e.Entity
				if want[k] == nil {
					want[k] = map[string][]int64{}
				}
				want[k][e.CommitLSN.String()] = append(want[k][e.CommitLSN.String()], e.Seq)
			}
			lastSeq = e.Seq
		}
		pos = lg.Entries[len(lg.Entries)-1].Seq
	}
	groups := 0
	multi := 0
	for _, f := range fs {
		f.mu.Lock()
		if len(f.errs) > 0 {
			t.Errorf("client of tenant %q: %s", f.tenant, strings.Join(f.errs, "; "))
		}
		for _, topic := range txnTables {
			for i, g := range f.groups[topic] {
				c := f.commit[topic][i]
				if c == "" {
					t.Errorf("client of tenant %q, %s: a transaction of several commit LSNs: %v", f.tenant, topic, g)
					continue
				}
				if w := want[f.tenant+"/"+topic][c]; !slices.Equal(g, w) {
					t.Errorf("client of tenant %q, %s: transaction %s delivered as %v, the journal has %v in the scope", f.tenant, topic, c, g, w)
				}
				groups++
				if len(g) > 1 {
					multi++
				}
			}
			if len(f.open[topic]) > 0 {
				t.Errorf("client of tenant %q, %s: %d changes returned without their transaction's end", f.tenant, topic, len(f.open[topic]))
			}
		}
		f.mu.Unlock()
	}
	st := env.node.Stats()
	t.Logf("%d transactions delivered (%d of several changes), journal horizon %d; frames dropped %d, replay-gaps %d",
		groups, multi, lastSeq, st.FramesDropped, st.ReplayGaps)
	if multi == 0 {
		t.Fatal("no transaction of several changes was delivered: the test checked nothing")
	}
}

// TestChangesHTTPWholeTransactions: GET /v1/changes pages end at
// transaction boundaries: a page that would end inside a transaction ends
// at the last boundary in it, and a transaction larger than the page comes
// as partial pages linked by continue values (never accepted as cursors),
// the last of which, not partial, carries the cursor after it.
func TestChangesHTTPWholeTransactions(t *testing.T) {
	e := newSyncEnv(t)
	one := e.commit(ins(orders, 1))
	big := e.commit(ins(orders, 2), ins(orders, 3), ins(orders, 4), ins(orders, 5), ins(orders, 6))
	get := func(query string) (int, changesResponse) {
		t.Helper()
		req, _ := http.NewRequest("GET", e.srv.URL+"/v1/changes?topic="+orders+"&"+query, nil)
		req.Header.Set("Authorization", "Bearer "+token(t, []string{orders}, "", time.Hour))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out changesResponse
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	seqs := func(out changesResponse) []int64 {
		var s []int64
		for _, c := range out.Changes {
			var env decoder.Envelope
			_ = json.Unmarshal(c, &env)
			s = append(s, env.Seq)
		}
		return s
	}
	start, _ := e.j.CursorAt(journal.Query{Entities: []string{orders}}, 0, one[0].Seq-1)
	// Two changes would end inside the big transaction: the page ends
	// after the first.
	code, out := get("limit=2&cursor=" + url.QueryEscape(start))
	if code != 200 || out.Partial || !out.More || !slices.Equal(seqs(out), []int64{one[0].Seq}) {
		t.Fatalf("first page: %d %+v", code, out)
	}
	// The big transaction, two changes a page.
	var got []int64
	code, out = get("limit=2&cursor=" + url.QueryEscape(out.Cursor))
	for i := 0; code == 200 && out.Partial && i < 5; i++ {
		if out.Cursor != "" || out.Continue == "" || !out.More {
			t.Fatalf("partial page: %+v", out)
		}
		got = append(got, seqs(out)...)
		if c, _ := get("cursor=" + url.QueryEscape(out.Continue)); c != 400 {
			t.Fatalf("a continue value taken as a cursor: %d", c)
		}
		code, out = get("limit=2&continue=" + url.QueryEscape(out.Continue))
	}
	got = append(got, seqs(out)...)
	if code != 200 || out.Partial || out.Cursor == "" || !slices.Equal(got, entrySeqs(big)) {
		t.Fatalf("big transaction: %d %+v, changes %v, want %v", code, out, got, entrySeqs(big))
	}
	if pos, err := e.j.CursorPosition(out.Cursor); err != nil || pos != big[len(big)-1].Seq {
		t.Fatalf("cursor after the transaction at %d (%v), want %d", pos, err, big[len(big)-1].Seq)
	}
}

// TestClientTransactionBound: the Go client returns a transaction's
// changes only together, at its end, and one over MaxTxnChanges not at
// all: its end comes back as an EventResync (ReasonTxnTooLarge) with the
// cursor after it, and the stream goes on.
func TestClientTransactionBound(t *testing.T) {
	e := newSyncEnv(t)
	c := e.client(token(t, []string{orders}, "", time.Hour), client.Options{MaxTxnChanges: 3})
	if err := c.Subscribe(orders, ""); err != nil {
		t.Fatal(err)
	}
	e.topicLive(orders, 1)
	small := e.commit(ins(orders, 1), ins(orders, 2), ins(orders, 3))
	e.commit(ins(orders, 4), ins(orders, 5), ins(orders, 6), ins(orders, 7))
	last := e.commit(ins(orders, 8))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []string
	for len(got) < 5 {
		ev, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		switch ev.Type {
		case client.EventChange:
			got = append(got, fmt.Sprintf("change %d %v", ev.Seq, ev.End))
		case client.EventResync:
			got = append(got, "resync "+ev.Reason)
			if pos, err := e.j.CursorPosition(ev.Cursor); err != nil || pos != last[0].Seq-1 {
				t.Fatalf("resync cursor at %d (%v), want after the large transaction, %d", pos, err, last[0].Seq-1)
			}
		}
	}
	want := []string{fmt.Sprintf("change %d false", small[0].Seq), fmt.Sprintf("change %d false", small[1].Seq),
		fmt.Sprintf("change %d true", small[2].Seq), "resync " + client.ReasonTxnTooLarge}
	if !slices.Equal(got[:4], want) || got[4] != fmt.Sprintf("change %d true", last[0].Seq) {
		t.Fatalf("got %v, want %v then the last change", got, want)
	}
}

// TestNoPositionInsideATransaction: while a client holds part of a
// transaction, a publisher position does not move its cursor and no
// position frame is sent; the transaction's last change brings the cursor.
func TestNoPositionInsideATransaction(t *testing.T) {
	e := newSyncEnv(t)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c.sub(orders, "")
	c.expect("subscribed")
	e.topicLive(orders, 1)
	es := e.appendRows(ins(orders, 1), ins(orders, 2), ins(orders, 3))
	for _, en := range es[:2] {
		if err := e.pub.PublishMsg(publishedMsg("walcast", e.j.ID(), en)); err != nil {
			t.Fatal(err)
		}
	}
	e.position(es[1].Seq)
	if f := c.expect("change"); f.env.Seq != es[0].Seq || f.End || f.Cursor != "" {
		t.Fatalf("first change: %+v", f)
	}
	time.Sleep(200 * time.Millisecond) // the position is applied off the NATS callback
	// Position frames follow a pong: a second pong right after the first
	// says none was sent.
	c.send(map[string]string{"t": "ping"})
	c.expect("pong")
	c.send(map[string]string{"t": "ping"})
	c.expect("pong")
	m := publishedMsg("walcast", e.j.ID(), es[2])
	m.Header.Set(bus.HeaderTxnEnd, bus.TxnEndEntity)
	if err := e.pub.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	if f := c.expect("change"); f.env.Seq != es[1].Seq || f.End || f.Cursor != "" {
		t.Fatalf("second change: %+v", f)
	}
	f := c.expect("change")
	if pos, err := e.j.CursorPosition(f.Cursor); f.env.Seq != es[2].Seq || !f.End || err != nil || pos != es[2].Seq {
		t.Fatalf("last change: %+v (cursor at %d, %v)", f, pos, err)
	}
}
