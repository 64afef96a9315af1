package pgtest

import (
	"context"
	"os"
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
