package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal/journaltest"
)

// TestJetStreamClusterFailover: a 3-server NATS cluster, each
// server its own process, with an R3 stream. `walcast run` publishes to
// server A; two `walcast sync` nodes, on B and on C, serve two WebSocket
// clients each. Under a steady write load:
//
//   - A is killed (SIGKILL): the publisher fails over to B or C — its
//     /metrics and /readyz say which — and goes on; A is restarted;
//   - that server is paused (SIGSTOP) for 5 s, so the publisher's acks stop
//     and its sync node's clients see an outage while its routes are cut,
//     then resumed (SIGCONT);
//   - the stream's leader is made to step down.
//
// Afterwards the stream holds every journal entry exactly once, in seq
// order, and every socket got strictly increasing seqs with no duplicate
// and, after catching up (replay-gaps answered by resubscribing from the
// socket's last cursor, as clients do), exactly the journal's changes.
func TestJetStreamClusterFailover(t *testing.T) {
	url := pgtest.NewDatabase(t)
	setupSource(t, url)
	nodes := natstest.StartProcessCluster(t, 3)
	a, b, c := nodes[0], nodes[1], nodes[2]
	admin, err := nats.Connect(a.URL()+","+b.URL()+","+c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	// walcast run refuses to start (exit 2) when it cannot create the
	// stream: wait for the cluster's JetStream to elect its meta leader.
	waitUntil(t, "JetStream on the cluster", 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	})

	run := startWalcast(t, runArgs(url, "--nats-url", a.URL(), "--jetstream-stream", "WALCAST", "--jetstream-replicas", "3")...)
	waitUntil(t, "run active", 60*time.Second, func() bool { return strings.HasPrefix(run.readyz(), "active") })
	if m := scrapeProc(t, run); natsServer(m) != "n1" {
		t.Fatalf("walcast run is not on n1 before the faults:\n%s", m)
	}
	syncB, wsB := startSyncNode(t, url, b.URL())
	syncC, wsC := startSyncNode(t, url, c.URL())
	var clients []*rawSocket
	for i, ws := range []string{wsB, wsB, wsC, wsC} {
		clients = append(clients, dialRawSocket(t, fmt.Sprintf("client %d (node on %s)", i+1, map[string]string{wsB: "n2", wsC: "n3"}[ws]), ws))
	}
	received := func(n int) func() bool {
		return func() bool {
			for _, cl := range clients {
				if cl.count() < n {
					return false
				}
			}
			return true
		}
	}

	w := startWriter(t, url)
	waitUntil(t, "changes on every socket", 60*time.Second, received(100))

	// A goes away; the publisher fails over, and /metrics says where.
	acked := promValue(t, scrapeProc(t, run), "walcast_jetstream_acked")
	a.Kill(t)
	var after string
	waitUntil(t, "walcast run failed over to another server", 60*time.Second, func() bool {
		after = scrapeProc(t, run)
		return strings.Contains(after, "walcast_nats_connected 1\n") && natsServer(after) != "" && natsServer(after) != "n1"
	})
	if promValue(t, after, "walcast_nats_reconnects_total") < 1 {
		t.Fatalf("failed over with no reconnect counted:\n%s", after)
	}
	if r := run.readyz(); !strings.HasPrefix(r, "active") || !strings.Contains(r, "(server "+natsServer(after)+",") {
		t.Fatalf("/readyz after the failover: %q", r)
	}
	t.Logf("walcast run failed over from n1 to %s", natsServer(after))
	waitUntil(t, "publishing after the failover", 60*time.Second, func() bool {
		return promValue(t, scrapeProc(t, run), "walcast_jetstream_acked") > acked+100
	})
	a.Start(t)

	// The server the publisher moved to hangs: the publisher's acks stop
	// coming (its connection stays open: nothing tells it the server is
	// gone), and that server's sync node's clients get nothing while it
	// is paused.
	hung := b
	if natsServer(after) == c.Name {
		hung = c
	}
	n := clients[0].count()
	hung.Pause(t)
	time.Sleep(5 * time.Second)
	hung.Resume(t)
	waitUntil(t, "changes on every socket after the pause", 60*time.Second, received(n+100))

	// A leader election of the stream.
	waitUntil(t, "a stream leader stepdown", 60*time.Second, func() bool {
		resp, err := admin.Request("$JS.API.STREAM.LEADER.STEPDOWN.WALCAST", nil, 5*time.Second)
		return err == nil && strings.Contains(string(resp.Data), `"success":true`)
	})
	time.Sleep(time.Second)
	committed := w.finish()

	validateJournal(t, url, committed)
	entries := journalItems(t, url)
	checkStreamHolds(t, admin, "WALCAST", entries)
	var want []int64
	for _, e := range entries {
		if e.Entity == "public.items" {
			want = append(want, e.Seq)
		}
	}
	for _, cl := range clients {
		waitUntil(t, cl.name+" caught up", 60*time.Second, func() bool { return cl.last() >= want[len(want)-1] })
		if err := cl.check(want); err != nil {
			t.Error(err)
		}
	}
	if m := scrapeProc(t, run); promValue(t, m, "walcast_jetstream_lag") != 0 || promValue(t, m, "walcast_nats_connected") != 1 {
		t.Errorf("walcast run after catching up:\n%s", m)
	}
	for _, p := range []*proc{syncB, syncC} {
		m := scrapeProc(t, p)
		if promValue(t, m, "walcast_nats_connected") != 1 || natsServer(m) == "" {
			t.Errorf("sync node after the faults:\n%s", m)
		}
		t.Logf("sync node on %s: %s; repairs: %s", natsServer(m), p.readyz(), strings.Join(regexp.MustCompile(`walcast_sync_repairs_total\{[^}]*\} \d+`).FindAllString(m, -1), ", "))
	}
	for _, cl := range clients {
		t.Logf("%s: %d changes, %d replay-gaps", cl.name, cl.count(), cl.gapCount())
	}
	t.Logf("%d entries in the journal and the stream", len(entries))
}

// checkStreamHolds waits until stream holds as many messages as the
// journal has entries, then checks that message i holds entry i.
func checkStreamHolds(t *testing.T, nc *nats.Conn, name string, entries []journaltest.Item) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var info *jetstream.StreamInfo
	waitUntil(t, "every journal entry in the stream", 60*time.Second, func() bool {
		ictx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		s, err := js.Stream(ictx, name)
		if err != nil {
			return false
		}
		info, err = s.Info(ictx)
		return err == nil && info.State.Msgs >= uint64(len(entries))
	})
	if info.State.Msgs != uint64(len(entries)) {
		t.Fatalf("the stream holds %d messages for %d journal entries", info.State.Msgs, len(entries))
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(0); i < info.State.Msgs; i++ {
		m, err := s.GetMsg(ctx, info.State.FirstSeq+i)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Header.Get("Walcast-Seq"); got != strconv.FormatInt(entries[i].Seq, 10) {
			t.Fatalf("stream message %d holds journal seq %s, want %d", i+1, got, entries[i].Seq)
		}
	}
}

// startSyncNode runs `walcast sync` on natsURL and returns it with its
// socket URL.
func startSyncNode(t *testing.T, url, natsURL string) (*proc, string) {
	t.Helper()
	p := startWalcast(t, "sync", "--nats-url", natsURL, "--journal-url", url, "--listen", "127.0.0.1:0",
		"--http-listen", "127.0.0.1:0", "--jwt-secret", syncJWTSecret, "--cursor-secret", string(cursorSecret),
		"--idle-timeout", "10m", "--log-format", "json")
	listenRe := regexp.MustCompile(`"listen":"(ws://[^"]+)"`)
	var ws string
	waitUntil(t, "sync listening", 60*time.Second, func() bool {
		if m := listenRe.FindStringSubmatch(p.log()); m != nil {
			ws = m[1]
		}
		return ws != "" && strings.HasPrefix(p.readyz(), "ready")
	})
	return p, ws
}

// scrapeProc returns the body of a process's /metrics ("" when it cannot
// be read).
func scrapeProc(t *testing.T, p *proc) string {
	t.Helper()
	p.mu.Lock()
	addr := p.http
	p.mu.Unlock()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

var serverNameRe = regexp.MustCompile(`walcast_nats_server_info\{[^}]*server_name="([^"]*)"`)

// natsServer is the server_name of walcast_nats_server_info in body.
func natsServer(body string) string {
	if m := serverNameRe.FindStringSubmatch(body); m != nil {
		return m[1]
	}
	return ""
}

// promValue is the value of the unlabelled sample name in body (-1 when
// absent).
func promValue(t *testing.T, body, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// rawSocket is a raw WebSocket client of public.items that records every
// change frame as delivered — no deduplication, unlike fanout/client — and
// answers a replay-gap by subscribing again from its last cursor, dropping
// the changes of a transaction it was given only in part (they come again
// from that cursor, the transaction's start).
type rawSocket struct {
	t    *testing.T
	name string
	conn *websocket.Conn
	wmu  sync.Mutex // serializes writes

	mu     sync.Mutex // guards the following fields
	seqs   []int64
	ended  int // len(seqs) at the last transaction end
	cursor string
	gaps   int
	bad    []string
}

func dialRawSocket(t *testing.T, name, ws string) *rawSocket {
	t.Helper()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": name, "topics": []string{"public.items"}, "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(syncJWTSecret))
	if err != nil {
		t.Fatal(err)
	}
	conn, _, err := websocket.DefaultDialer.Dial(ws+"?access_token="+tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &rawSocket{t: t, name: name, conn: conn}
	done := make(chan struct{})
	go c.read(done)
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	c.send(map[string]string{"t": "sub", "topic": "public.items"})
	waitUntil(t, name+" subscribed", 30*time.Second, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.cursor != ""
	})
	return c
}

func (c *rawSocket) send(v any) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.conn.WriteJSON(v)
}

func (c *rawSocket) read(done chan struct{}) {
	defer close(done)
	for {
		var f struct {
			T       string          `json:"t"`
			Topic   string          `json:"topic"`
			Cursor  string          `json:"cursor"`
			End     bool            `json:"end"`
			Change  json.RawMessage `json:"change"`
			Code    string          `json:"code"`
			Message string          `json:"message"`
		}
		if err := c.conn.ReadJSON(&f); err != nil {
			c.mu.Lock()
			if !strings.Contains(err.Error(), "use of closed network connection") {
				c.bad = append(c.bad, fmt.Sprintf("the socket ended: %v", err))
			}
			c.mu.Unlock()
			return
		}
		c.mu.Lock()
		switch f.T {
		case "subscribed", "position":
			if f.Cursor != "" && (f.T == "position" || c.cursor == "") {
				c.cursor = f.Cursor
			}
		case "change":
			var env struct {
				Seq int64 `json:"seq"`
			}
			if err := json.Unmarshal(f.Change, &env); err != nil || env.Seq <= 0 {
				c.bad = append(c.bad, fmt.Sprintf("an unreadable change %s", f.Change))
				break
			}
			if n := len(c.seqs); n > 0 && env.Seq <= c.seqs[n-1] {
				c.bad = append(c.bad, fmt.Sprintf("seq %d delivered after %d (a duplicate or out of order)", env.Seq, c.seqs[n-1]))
				break
			}
			c.seqs = append(c.seqs, env.Seq)
			if f.End {
				c.cursor, c.ended = f.Cursor, len(c.seqs)
			}
		case "replay-gap":
			c.gaps++
			c.seqs = c.seqs[:c.ended]
			cur := c.cursor
			if cur == "" {
				cur = f.Cursor
			}
			c.mu.Unlock()
			c.send(map[string]string{"t": "sub", "topic": "public.items", "cursor": cur})
			c.mu.Lock()
		case "resync":
			// Nothing here changes the journal's history.
			c.bad = append(c.bad, "an unexpected resync")
		case "error":
			c.bad = append(c.bad, fmt.Sprintf("error frame %s: %s", f.Code, f.Message))
		}
		c.mu.Unlock()
	}
}

func (c *rawSocket) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seqs)
}

func (c *rawSocket) gapCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gaps
}

func (c *rawSocket) last() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.seqs) == 0 {
		return 0
	}
	return c.seqs[len(c.seqs)-1]
}

// check compares what the socket delivered with want, the journal's seqs
// of its topic.
func (c *rawSocket) check(want []int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bad) > 0 {
		return fmt.Errorf("%s: %s", c.name, strings.Join(c.bad, "; "))
	}
	got := map[int64]bool{}
	for _, s := range c.seqs {
		got[s] = true
	}
	var missing []int64
	for _, s := range want {
		if !got[s] {
			missing = append(missing, s)
		}
		delete(got, s)
	}
	if len(missing) > 0 || len(got) > 0 {
		return fmt.Errorf("%s: %d changes delivered for %d journaled; missing %s; %d not in the journal", c.name, len(c.seqs), len(want), seqRanges(missing), len(got))
	}
	return nil
}

// seqRanges writes ascending seqs as ranges: "5-9 12 20-21".
func seqRanges(s []int64) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", s[i], s[j])
		} else {
			fmt.Fprintf(&b, "%d", s[i])
		}
		i = j + 1
	}
	return b.String()
}
