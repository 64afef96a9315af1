package replication

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// runErr waits for Run to return on its own.
func (run *running) runErr(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-run.done:
		close(run.done) // for the cleanup's stop
		return err
	case <-time.After(within):
		t.Fatalf("Run did not return within %s (role %s)", within, run.r.State().Role)
	}
	return nil
}

func countOp(t *testing.T, url, op string) int {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM walcast.entries WHERE op = $1", op).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestResumeWatermarkAheadOfServer: a journal whose watermark lies beyond the
// source's WAL (another history, or a source restored from an older backup
// with the same system id and timeline) stops Run with a slot-lost error
// instead of streaming from a position that skips or waits; with
// RecreateLostSlot it resyncs.
func TestResumeWatermarkAheadOfServer(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	run := f.start(cfg)
	waitFor(t, "active", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	// 1 GiB past the server's WAL.
	execSQL(t, f.url, `UPDATE walcast.meta SET watermark = (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint + 1073741824`)
	ahead, err := f.j.Watermark(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	err = f.start(cfg).runErr(t, 20*time.Second)
	if CodeOf(err) != CodeSlotLost || !strings.Contains(err.Error(), "ahead of the source's current WAL position") {
		t.Fatalf("Run returned %v (code %s), want a %s error naming the watermark ahead of the server", err, CodeOf(err), CodeSlotLost)
	}
	t.Logf("refused: %v", err)
	if wm, _ := f.j.Watermark(context.Background()); wm != ahead {
		t.Fatalf("the refused start moved the watermark from %s to %s", ahead, wm)
	}

	cfg.RecreateLostSlot = true
	run = f.start(cfg)
	waitFor(t, "active after --recreate-lost-slot", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
	if n := countOp(t, f.url, string(decoder.OpResync)); n != 1 {
		t.Fatalf("%d resync entries, want 1", n)
	}
	if wm, _ := f.j.Watermark(context.Background()); wm >= ahead {
		t.Fatalf("watermark %s not reset below %s", wm, ahead)
	}
	execSQL(t, f.url, `INSERT INTO items VALUES (1, 'after resync', 1)`)
	waitFor(t, "the insert journaled", 20*time.Second, func() bool { return countOp(t, f.url, string(decoder.OpInsert)) == 1 })
}

// sourceOf reads the source's identity as IDENTIFY_SYSTEM reports it.
func sourceOf(t *testing.T, url string) journal.Source {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	s := journal.Source{Slot: "walcast"}
	if err := c.QueryRow(ctx, `SELECT (SELECT system_identifier::text FROM pg_control_system()), (SELECT timeline_id FROM pg_control_checkpoint())`).Scan(&s.SystemID, &s.Timeline); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestResumeSourceWithoutWatermark: the state an interrupted two-commit
// bootstrap left (source recorded, slot created, watermark 0, nothing
// journaled) is a first start, not a gap.
func TestResumeSourceWithoutWatermark(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	gen, err := f.j.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.j.SetSource(ctx, gen, sourceOf(t, f.url)); err != nil {
		t.Fatal(err)
	}
	execSQL(t, f.url, `SELECT pg_create_logical_replication_slot('walcast', 'pgoutput')`)

	run := f.start(f.config())
	waitFor(t, "active", 20*time.Second, func() bool {
		select {
		case err := <-run.done:
			close(run.done)
			t.Fatalf("Run stopped: %v", err)
		default:
		}
		return run.r.State().Role == RoleActive
	})
	if wm, _ := f.j.Watermark(ctx); wm == 0 {
		t.Fatal("no watermark after the start")
	}
	execSQL(t, f.url, `INSERT INTO items VALUES (1, 'a', 1)`)
	waitFor(t, "the insert journaled", 20*time.Second, func() bool { return countOp(t, f.url, string(decoder.OpInsert)) == 1 })
	if n := countOp(t, f.url, string(decoder.OpResync)); n != 0 {
		t.Fatalf("%d resync entries, want none", n)
	}
}

// TestResumeBootstrapIsOneCommit: when recording the starting watermark
// fails, the source is not recorded either (the old bootstrap committed the
// source first and could leave it alone).
func TestResumeBootstrapIsOneCommit(t *testing.T) {
	f := newFixture(t)
	execSQL(t, f.url, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'refused by test'; END$$`,
		`CREATE TRIGGER refuse_wm BEFORE UPDATE ON walcast.meta FOR EACH ROW WHEN (NEW.watermark <> OLD.watermark) EXECUTE FUNCTION refuse()`)
	run := f.start(f.config())
	waitFor(t, "a failed start", 20*time.Second, func() bool { return run.r.Stats().Reconnects.Load() > 0 })
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	st, err := f.j.State(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Source != (journal.Source{}) || st.Watermark != 0 {
		t.Fatalf("after a failed bootstrap the journal records source %+v with watermark %s", st.Source, st.Watermark)
	}
	execSQL(t, f.url, `DROP TRIGGER refuse_wm ON walcast.meta`)
	run = f.start(f.config())
	waitFor(t, "active", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
	if st, err = f.j.State(context.Background()); err != nil || st.Source != sourceOf(t, f.url) || st.Watermark == 0 {
		t.Fatalf("after the bootstrap: %+v %v", st, err)
	}
}
