package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/internal/pgtest"
)

// TestSIGTERMWithHungJournalTimeout hangs the journal under the active
// instance (another session holds the meta row, so its append waits): its
// /readyz must report the stuck writer, SIGTERM must end it within
// --shutdown-timeout (plus the abort grace) although the batch in flight
// never commits, and once the journal recovers the standby takes over and
// journals the change exactly once.
func TestSIGTERMWithHungJournalTimeout(t *testing.T) {
	url := pgtest.NewDatabase(t)
	setupSource(t, url)
	// lock_timeout is half of --journal-timeout (15 s) and the stuck report
	// comes at a fifth (6 s): the append is still waiting when SIGTERM comes.
	a := startWalcast(t, runArgs(url, "--journal-timeout", "30s", "--shutdown-timeout", "3s")...)
	waitUntil(t, "a active", 30*time.Second, func() bool { return strings.HasPrefix(a.readyz(), "active") })
	b := startWalcast(t, runArgs(url)...)
	waitUntil(t, "b standby", 30*time.Second, func() bool { return strings.HasPrefix(b.readyz(), "standby") })

	ctx := context.Background()
	locker, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT * FROM walcast.meta FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	execSQL(t, url, `INSERT INTO items VALUES (1, 'during the hang')`)
	waitUntil(t, "a's /readyz to report the stuck writer", 15*time.Second, func() bool {
		return strings.Contains(a.readyz(), "journal writer is stuck")
	})
	t.Logf("a /readyz: %s", a.readyz())

	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	signalled := time.Now()
	code := a.exitCode(t, 15*time.Second)
	took := time.Since(signalled)
	t.Logf("a exited %d, %s after SIGTERM", code, took.Round(time.Millisecond))
	if took > 3*time.Second+abortGrace+2*time.Second {
		t.Fatalf("a took %s to exit, bound %s", took, 3*time.Second+abortGrace)
	}
	if !strings.Contains(a.log(), "breaking its connections") {
		t.Fatal("a did not log that it broke the journal's connections")
	}

	// The journal recovers; the standby takes over and journals the change.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "b to take over", 30*time.Second, func() bool { return strings.HasPrefix(b.readyz(), "active") })
	validateJournal(t, url, []string{"insert:public.items:1"})
}
