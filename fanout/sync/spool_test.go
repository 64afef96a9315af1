package sync

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/replication"
)

// sourceSession is one of the node's snapshot sessions on the source, as
// pg_stat_activity shows it.
type sourceSession struct {
	pid   uint32
	state string
	inTx  bool // xact_start is set: a transaction is open
	locks int  // locks it holds on public.docs
}

// sourceSessions lists the node's snapshot sessions (application_name
// 'walcast sync (snapshots)') and the locks each holds on public.docs.
func sourceSessions(t *testing.T, src string) []sourceSession {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT a.pid, coalesce(a.state, ''), a.xact_start IS NOT NULL,
			(SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.relation = 'public.docs'::regclass)
		FROM pg_stat_activity a WHERE a.datname = current_database() AND a.application_name = 'walcast sync (snapshots)'
		ORDER BY a.pid`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []sourceSession
	for rows.Next() {
		var s sourceSession
		var locks int64
		if err := rows.Scan(&s.pid, &s.state, &s.inTx, &locks); err != nil {
			t.Fatal(err)
		}
		s.locks = int(locks)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitLong polls cond for up to limit.
func waitLong(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// slowReader reads a socket at about bytesPerSec, counting row frames,
// until the socket closes.
type slowReader struct {
	rows  atomic.Int64
	bytes atomic.Int64
	ends  atomic.Int64 // snapshot-end frames
	done  chan struct{}
}

func readSlowly(c *websocket.Conn, bytesPerSec int) *slowReader {
	r := &slowReader{done: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(r.done)
		for {
			_, b, err := c.ReadMessage()
			if err != nil {
				return
			}
			total := r.bytes.Add(int64(len(b)))
			switch {
			case strings.HasPrefix(string(b), `{"t":"row"`):
				r.rows.Add(1)
			case strings.HasPrefix(string(b), `{"t":"snapshot-end"`):
				r.ends.Add(1)
			}
			if due := start.Add(time.Duration(total) * time.Second / time.Duration(bytesPerSec)); time.Until(due) > 0 {
				time.Sleep(time.Until(due))
			}
		}
	}()
	return r
}

// spoolToken signs a token of subject for topics, with the snapshot claim.
func spoolToken(t testing.TB, subject, tenant string, topics ...string) string {
	t.Helper()
	c := Claims{Topics: topics, Tenant: tenant, Snapshot: true, RegisteredClaims: jwt.RegisteredClaims{
		Subject: subject, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(syncJWTSecret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// dialAs opens a socket that the node charges to client address addr
// (X-Forwarded-For from a trusted proxy), with a small receive buffer
// when rcvBuf is set.
func dialAs(t *testing.T, env *stateEnv, tok, addr string, rcvBuf int) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	if rcvBuf > 0 {
		d.NetDialContext = func(ctx context.Context, network, a string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, a)
			if err == nil {
				_ = c.(*net.TCPConn).SetReadBuffer(rcvBuf)
			}
			return c, err
		}
	}
	h := http.Header{}
	if addr != "" {
		h.Set("X-Forwarded-For", addr)
	}
	c, resp, err := d.Dial(env.wsURL(tok), h)
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestSnapshotSpoolReleasesTheSource: a client reads a snapshot of a
// 1,000,000-row table (spoolTestRows) at 1 KB/s. The node reads the rows into its spool at
// the database's pace and commits: while the client is still at its first
// rows, none of the node's sessions on the source is in a transaction or
// holds a lock on the table. A migration (ALTER TABLE … ADD COLUMN, an
// ACCESS EXCLUSIVE lock) then completes at once, and the client still
// gets its rows.
func TestSnapshotSpoolReleasesTheSource(t *testing.T) {
	const total = spoolTestRows
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) {
		c.sndBuf = 4096
		// A client at 1 KB/s takes minutes for one write batch and falls
		// minutes behind: the node's write timeout and --max-lag would
		// close it. Lifted here, so the client keeps reading throughout.
		c.WriteTimeout, c.MaxLag = time.Hour, -1
		c.State.ReadTimeout = 5 * time.Minute // a slow machine still reads it: the property is what follows the read
	},
		fmt.Sprintf(`INSERT INTO docs SELECT g, 'a', 'v' FROM generate_series(1, %d) g`, total),
		`ANALYZE docs`)
	c := dialAs(t, env, stateToken(t, "a", true), "", 4096)
	if err := c.WriteJSON(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true}); err != nil {
		t.Fatal(err)
	}
	r := readSlowly(c, 1024)
	waitLong(t, 5*time.Minute, "the rows to be spooled", func() bool {
		s := env.node.Stats()
		return s.SnapshotReads == 1 && s.SpoolBytes > 0 && s.SnapshotsRunning == 0
	})
	s := env.node.Stats()
	sessions := sourceSessions(t, env.src)
	t.Logf("spooled %d bytes from %d source read; client read %d rows (%d bytes) of %d; source sessions %+v",
		s.SpoolBytes, s.SnapshotReads, r.rows.Load(), r.bytes.Load(), total, sessions)
	if got := r.rows.Load(); got >= total/10 {
		t.Fatalf("the client read %d rows already; the check needs a client still reading", got)
	}
	for _, ss := range sessions {
		if ss.inTx || ss.state == "active" || ss.state == "idle in transaction" || ss.locks > 0 {
			t.Errorf("source session %d is %q (in a transaction: %v, %d locks on public.docs) while a client reads its snapshot; want idle, no transaction, no lock",
				ss.pid, ss.state, ss.inTx, ss.locks)
		}
	}

	// The application's migration is not held up by the reading client.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, env.src)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	start := time.Now()
	if _, err := conn.Exec(ctx, `ALTER TABLE docs ADD COLUMN extra int`); err != nil {
		t.Fatalf("ALTER TABLE during a client's snapshot: %v after %s (the snapshot holds the table)", err, time.Since(start))
	}
	t.Logf("ALTER TABLE docs ADD COLUMN took %s while the client had read %d rows", time.Since(start).Round(time.Millisecond), r.rows.Load())
	before := r.rows.Load()
	waitLong(t, 30*time.Second, "the client to read on", func() bool { return r.rows.Load() > before })
	if r.ends.Load() != 0 {
		t.Fatalf("the snapshot ended after %d rows of %d", r.rows.Load(), total)
	}
}

// TestSnapshotSharedRead: 1,000 concurrent GET /v1/snapshot of the same
// table and scope are served from a handful of source reads, and every
// one gets the table's rows and a snapshot-end.
func TestSnapshotSharedRead(t *testing.T) {
	const clients = 1000
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) {
		c.State.PerClient = 2 * clients
		c.State.Rate = 0
		c.ChangesRate, c.ChangesConcurrency = 0, 0
	}, `INSERT INTO docs SELECT g, 'a', 'v' || g FROM generate_series(1, 2000) g`)
	tok := stateToken(t, "a", true)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}, Timeout: 2 * time.Minute}
	var wg gosync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	rowsSeen := make([]int, clients)
	start := make(chan struct{})
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := func() error {
				req, _ := http.NewRequest("GET", env.srv.URL+"/v1/snapshot?topic=public.docs", nil)
				req.Header.Set("Authorization", "Bearer "+tok)
				resp, err := hc.Do(req)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("status %s", resp.Status)
				}
				sc := bufio.NewScanner(resp.Body)
				sc.Buffer(make([]byte, 64<<10), 1<<20)
				last := ""
				for sc.Scan() {
					last = sc.Text()
					if strings.HasPrefix(last, `{"t":"row"`) {
						rowsSeen[i]++
					}
				}
				if !strings.HasPrefix(last, `{"t":"snapshot-end"`) {
					return fmt.Errorf("last line %q", last)
				}
				return sc.Err()
			}()
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
		}()
	}
	close(start)
	wg.Wait()
	s := env.node.Stats()
	t.Logf("%d snapshots: %d source reads, %d served from another's read, outcomes %v", clients, s.SnapshotReads, s.SnapshotsShared, s.Snapshots)
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d snapshots failed, the first: %v", n, clients, firstErr.Load())
	}
	want := len(tableState(t, env.src, "a"))
	for i, n := range rowsSeen {
		if n != want {
			t.Fatalf("snapshot %d had %d rows, the table %d", i, n, want)
		}
	}
	if s.SnapshotReads > 5 {
		t.Errorf("%d identical snapshots read the source %d times; want a handful (they share reads)", clients, s.SnapshotReads)
	}
	if s.SnapshotReads+s.SnapshotsShared != clients {
		t.Errorf("%d reads + %d shared, want %d snapshots in all", s.SnapshotReads, s.SnapshotsShared, clients)
	}
}

// TestSnapshotFairShare: a client (one subject, one address) that does
// not read holds snapshots of three large tables on three sockets; it has
// --snapshots-per-client (1) in progress and the rest wait. Another
// client's snapshot of a small table, asked for afterwards, completes
// promptly.
func TestSnapshotFairShare(t *testing.T) {
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) {
		c.sndBuf = 4096
		c.WriteTimeout, c.MaxLag = time.Hour, -1 // the slow client is not closed for not reading
		c.State.MaxConcurrent, c.State.PerClient = 2, 1
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}
	},
		`CREATE TABLE big1 (id int PRIMARY KEY, tenant text, val text)`,
		`CREATE TABLE big2 (id int PRIMARY KEY, tenant text, val text)`,
		`CREATE TABLE big3 (id int PRIMARY KEY, tenant text, val text)`,
		`ALTER PUBLICATION pub ADD TABLE big1, big2, big3`,
		`INSERT INTO big1 SELECT g, NULL, repeat('x', 50) FROM generate_series(1, 100000) g`,
		`INSERT INTO big2 SELECT * FROM big1`,
		`INSERT INTO big3 SELECT * FROM big1`)
	slowTok := spoolToken(t, "slow", "", "public.big1", "public.big2", "public.big3")
	for _, tbl := range []string{"public.big1", "public.big2", "public.big3"} {
		c := dialAs(t, env, slowTok, "10.0.0.1", 4096)
		if err := c.WriteJSON(map[string]any{"t": "sub", "topic": tbl, "snapshot": true}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the slow client's first snapshot under way and its others waiting", func() bool {
		s := env.node.Stats()
		return s.SnapshotReads >= 1 && s.SnapshotsQueued == 2
	})
	other := dialAs(t, env, spoolToken(t, "other", "a", "public.docs"), "10.0.0.2", 0)
	start := time.Now()
	if err := other.WriteJSON(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true}); err != nil {
		t.Fatal(err)
	}
	_ = other.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		var f inFrame
		if err := other.ReadJSON(&f); err != nil {
			t.Fatalf("the other client's snapshot did not end within 10 s while the slow client holds its share: %v (stats %+v)", err, env.node.Stats())
		}
		if f.T == "error" {
			t.Fatalf("the other client's snapshot: %s %s", f.Code, f.Message)
		}
		if f.T == "snapshot-end" {
			break
		}
	}
	s := env.node.Stats()
	t.Logf("the other client's snapshot took %s; the slow client's snapshots: %d queued, reads %d", time.Since(start).Round(time.Millisecond), s.SnapshotsQueued, s.SnapshotReads)
	if s.SnapshotsQueued != 2 {
		t.Errorf("%d snapshots waiting; want the slow client's two beyond --snapshots-per-client", s.SnapshotsQueued)
	}
}

// spoolFrame is what the memory and catch-up tests read of a frame.
type spoolFrame struct {
	T      string          `json:"t"`
	Code   string          `json:"code"`
	Cursor string          `json:"cursor"`
	Change json.RawMessage `json:"change"`
}
