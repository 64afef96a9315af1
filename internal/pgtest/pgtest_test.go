package pgtest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

func TestNewDatabaseIsLogicalAndIsolated(t *testing.T) {
	ctx := context.Background()
	a, b := NewDatabase(t), NewDatabase(t)
	if a == b {
		t.Fatalf("two databases share a URL: %s", a)
	}
	conn, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var level string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		t.Fatalf("wal_level = %q, want logical", level)
	}
	// A slot in the database must not stop its cleanup.
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('s1', 'pgoutput')"); err != nil {
		t.Fatal(err)
	}
}

func TestRestartAndTerminate(t *testing.T) {
	ctx := context.Background()
	c := Start(t, Options{WalLevel: "replica", Settings: map[string]string{"max_replication_slots": "3"}})
	for _, mode := range []string{"fast", "immediate"} {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS k(v int); INSERT INTO k VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		if err := c.Restart(mode); err != nil {
			t.Fatalf("restart %s: %v", mode, err)
		}
		if err := conn.Ping(ctx); err == nil {
			t.Fatalf("connection survived a %s restart", mode)
		}
		conn.Close(ctx)
	}
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	var level, slots string
	if err := conn.QueryRow(ctx, "SELECT count(*), current_setting('wal_level'), current_setting('max_replication_slots') FROM k").Scan(&n, &level, &slots); err != nil {
		t.Fatal(err)
	}
	if n != 2 || level != "replica" || slots != "3" {
		t.Fatalf("after restarts: rows=%d wal_level=%s max_replication_slots=%s", n, level, slots)
	}

	victim, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close(ctx)
	pid := int(victim.PgConn().PID())
	if err := c.TerminateBackend(ctx, pid); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := victim.Ping(pctx); err == nil {
		t.Fatal("terminated backend still answers")
	}
}

// SetNextXid moves a cluster's xid counter, with rows written before it,
// across 2^31 and a 32-bit wraparound (a new epoch): the rows stay visible,
// VACUUM finds nothing amiss, and transactions get the xids asked for.
func TestSetNextXid(t *testing.T) {
	ctx := context.Background()
	const below = 1<<32 - 30 // epoch 0, 30 xids before its end
	c := Start(t, Options{NextXid: below})
	url := c.NewDatabase(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	xid := func() uint64 {
		t.Helper()
		var x uint64
		if err := conn.QueryRow(ctx, "SELECT pg_current_xact_id()::text::int8").Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t (x int8 PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for range 40 { // each in a transaction of its own: past 2^32
		var x uint64
		if err := conn.QueryRow(ctx, "INSERT INTO t SELECT pg_current_xact_id()::text::int8 RETURNING x").Scan(&x); err != nil {
			t.Fatal(err)
		}
		got = append(got, x)
	}
	if got[0] < below || got[0] >= 1<<32 || got[len(got)-1] < 1<<32 {
		t.Fatalf("xids %v: want them to start at %d and pass 2^32", got, uint64(below))
	}
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("xids %v are not increasing", got)
		}
	}
	conn.Close(ctx)

	// Further, past 2^31 of a later epoch: the rows written before remain.
	const far = 5<<32 | 1<<31 + 7
	if err := c.SetNextXid(far); err != nil {
		t.Fatal(err)
	}
	conn, err = pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if x := xid(); x < far || x > far+100 {
		t.Fatalf("xid after the move: %d, want %d or a little more", x, uint64(far))
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != len(got) {
		t.Fatalf("rows after the move: %d (%v), want %d", n, err, len(got))
	}
	for _, sql := range []string{"INSERT INTO t VALUES (1)", "VACUUM FREEZE t"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s after the move: %v", sql, err)
		}
	}
	if err := c.SetNextXid(2); err == nil {
		t.Fatal("SetNextXid accepted xid 2, a special transaction id")
	}
}

// A standby replays the primary's writes, refuses its own, and holds still
// while its replay is paused until it is resumed.
func TestStandbyReplaysAndPauses(t *testing.T) {
	ctx := context.Background()
	p := Start(t, Options{})
	url := p.NewDatabase(t)
	MustExec(t, url, "CREATE TABLE k (v int)", "INSERT INTO k VALUES (1)")
	s := p.StartStandby(t)
	surl := s.URL(url[strings.LastIndex(url, "/")+1 : strings.Index(url, "?")])
	count := func() int {
		t.Helper()
		var n int
		MustQueryRow(t, surl, "SELECT count(*) FROM k", nil, &n)
		return n
	}
	if n := count(); n != 1 {
		t.Fatalf("standby rows after start: %d, want 1", n)
	}
	if err := s.Exec(ctx, "postgres", "CREATE TABLE w (v int)"); err == nil {
		t.Fatal("the standby accepted a write")
	}
	if err := s.PauseReplay(ctx); err != nil {
		t.Fatal(err)
	}
	MustExec(t, url, "INSERT INTO k VALUES (2)")
	time.Sleep(200 * time.Millisecond)
	if n := count(); n != 1 {
		t.Fatalf("standby rows while paused: %d, want 1", n)
	}
	if err := s.ResumeReplay(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.CatchUp(ctx, p); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 2 {
		t.Fatalf("standby rows after resume: %d, want 2", n)
	}
	if lsn, err := s.ReplayLSN(ctx); err != nil || lsn == "" {
		t.Fatalf("ReplayLSN: %q %v", lsn, err)
	}
	if _, err := p.ReplayLSN(ctx); err == nil {
		t.Fatal("ReplayLSN on the primary did not fail")
	}
}
