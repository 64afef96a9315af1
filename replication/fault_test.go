package replication

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

// walsenderPID returns the pid streaming from the slot, or 0.
func walsenderPID(t *testing.T, url string) int {
	t.Helper()
	var pid int
	pgtest.MustQueryRow(t, url, `SELECT coalesce(max(active_pid), 0) FROM pg_replication_slots WHERE slot_name = 'walcast'`, nil, &pid)
	return pid
}

func TestStandbyTakesOverAndStandbyFalseExits(t *testing.T) {
	f := newFixture(t)
	a := f.start(f.config())
	waitFor(t, "a active", 10*time.Second, func() bool { return a.r.State().Role == RoleActive })
	b := f.start(f.config())
	waitFor(t, "b standby", 10*time.Second, func() bool { return b.r.State().Role == RoleStandby })

	cfg := f.config()
	cfg.Standby = false
	c, err := New(cfg, f.j)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, ErrSlotHeld) {
		t.Fatalf("--standby=false with the slot held: %v, want ErrSlotHeld", err)
	}

	w := newWorkload(t, f.url)
	w.mixed(t, 10)
	waitFor(t, "journaled by a", 20*time.Second, func() bool { return len(f.entries()) >= len(w.ids) })
	genA := a.r.State().Generation

	stopped := time.Now()
	if err := a.stop(t); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to take over", 5*time.Second, func() bool { return b.r.State().Role == RoleActive })
	t.Logf("standby took over %s after the active one stopped", time.Since(stopped).Round(time.Millisecond))
	if g := b.r.State().Generation; g <= genA {
		t.Fatalf("takeover did not bump the fencing generation: %d -> %d", genA, g)
	}
	w.mixed(t, 10)
	waitFor(t, "journaled by b", 20*time.Second, func() bool { return len(f.entries()) >= len(w.ids) })
	validate(t, f, w.ids)
}

// TestTerminatedWalsenderRecovers kills the walsender ten times under load.
// The replicator reconnects, Postgres resends what was not acknowledged, and
// the journal still holds every change exactly once.
func TestTerminatedWalsenderRecovers(t *testing.T) {
	f := newFixture(t)
	run := f.start(f.config())
	waitFor(t, "active", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	c := pgtest.Shared(t)
	w := newWorkload(t, f.url)
	for round := 0; round < 10; round++ {
		w.mixed(t, 5)
		var pid int
		waitFor(t, "walsender", 10*time.Second, func() bool { pid = walsenderPID(t, f.url); return pid != 0 })
		if err := c.TerminateBackend(context.Background(), pid); err != nil {
			t.Fatal(err)
		}
		w.mixed(t, 5)
	}
	waitFor(t, "all journaled", 30*time.Second, func() bool { return len(f.entries()) >= len(w.ids) })
	validate(t, f, w.ids)
	if n := run.r.Stats().Reconnects.Load(); n < 10 {
		t.Fatalf("%d reconnects for 10 terminations", n)
	}
}

// TestPostgresRestartMidLoad restarts the server fast and immediate while a
// writer commits; every committed change is journaled once.
func TestPostgresRestartMidLoad(t *testing.T) {
	c := pgtest.Start(t, pgtest.Options{})
	f := newFixtureOn(t, c.NewDatabase(t))
	url, j := f.url, f.j
	run := f.start(f.config())
	waitFor(t, "active", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })

	var ids []string
	next := 0
	commit := func(n int) {
		for i := 0; i < n; i++ {
			conn, err := pgx.Connect(context.Background(), url)
			if err != nil {
				continue // the server is restarting; try again
			}
			_, err = conn.Exec(context.Background(), fmt.Sprintf("INSERT INTO items VALUES (%d, 'v%d', 0)", next, next))
			conn.Close(context.Background())
			if err == nil {
				ids = append(ids, fmt.Sprintf("insert:public.items:%d:\"v%d\"", next, next))
				next++
			}
		}
	}
	for _, mode := range []string{"fast", "immediate", "fast"} {
		commit(30)
		if err := c.Restart(mode); err != nil {
			t.Fatal(err)
		}
		commit(30)
	}
	waitFor(t, "all journaled", 60*time.Second, func() bool {
		e, err := j.Changes(context.Background(), journal.Query{FromOldest: true, AllTenants: true, Limit: journal.MaxLimit})
		return err == nil && len(e.Changes) >= len(ids)
	})
	validate(t, f, ids)
}

// TestJournalStallKeepsSessionAlive holds the journal's meta row locked for
// three times wal_sender_timeout: appends wait, but status updates keep the
// replication session alive, and everything lands once the lock goes.
func TestJournalStallKeepsSessionAlive(t *testing.T) {
	c := pgtest.Start(t, pgtest.Options{Settings: map[string]string{"wal_sender_timeout": "2s"}})
	f := newFixtureOn(t, c.NewDatabase(t))
	url := f.url
	cfg := f.config()
	cfg.QueueMaxChanges = 50 // the loop must also stop reading while stalled
	run := f.start(cfg)
	waitFor(t, "active", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	pidBefore := walsenderPID(t, url)

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
	if _, err := tx.Exec(ctx, `SELECT * FROM walcast.meta FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	w := newWorkload(t, url)
	w.mixed(t, 40)
	time.Sleep(6 * time.Second) // 3 × wal_sender_timeout
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "all journaled after the stall", 30*time.Second, func() bool { return len(f.entries()) >= len(w.ids) })
	validate(t, f, w.ids)
	if n := run.r.Stats().Reconnects.Load(); n != 0 {
		t.Fatalf("the stall cost %d reconnects (replication timeout)", n)
	}
	if pid := walsenderPID(t, url); pid != pidBefore {
		t.Fatalf("walsender changed from %d to %d during the stall", pidBefore, pid)
	}
}
