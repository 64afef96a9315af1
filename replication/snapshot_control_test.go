package replication

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// allSnapshots lists every snapshot request, oldest first.
func allSnapshots(t *testing.T, f *fixture) []journal.Snapshot {
	t.Helper()
	ss, err := f.j.Snapshots(context.Background(), false, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for i, j := 0, len(ss)-1; i < j; i, j = i+1, j-1 {
		ss[i], ss[j] = ss[j], ss[i]
	}
	return ss
}

// waitAllDone waits until n snapshots exist and every one is done.
func waitAllDone(t *testing.T, f *fixture, n int) []journal.Snapshot {
	t.Helper()
	var ss []journal.Snapshot
	waitFor(t, "every snapshot done", 60*time.Second, func() bool {
		ss = allSnapshots(t, f)
		if len(ss) != n {
			return false
		}
		for _, s := range ss {
			if s.Status != journal.SnapshotDone {
				return false
			}
		}
		return true
	})
	return ss
}

// TestSnapshotInitial: --snapshot initial on a fresh journal snapshots every
// published table (two at once, as SnapshotParallel says), recorded with the
// bootstrap, and a restart asks for none again. Each table rebuilt from the
// journal equals the source.
func TestSnapshotInitial(t *testing.T) {
	f := newFixture(t,
		`INSERT INTO items SELECT g, 'v' || g, g FROM generate_series(1, 3000) g`,
		`INSERT INTO other SELECT g, 'o' || g FROM generate_series(1, 2000) g`)
	cfg := f.config()
	cfg.SnapshotInitial, cfg.SnapshotParallel, cfg.SnapshotChunkSize = true, 2, 500
	run := f.start(cfg)
	ss := waitAllDone(t, f, 2)
	if ss[0].Entity() != "public.items" || ss[1].Entity() != "public.other" || ss[0].ChunkSize != 500 {
		t.Fatalf("snapshots %+v", ss)
	}
	if tables, recorded, err := f.j.PublishedTables(context.Background()); err != nil || !recorded || len(tables) != 2 {
		t.Fatalf("recorded publication tables %v %v %v", tables, recorded, err)
	}
	execSQL(t, f.url, `UPDATE items SET val = 'after' WHERE id <= 10`, `DELETE FROM other WHERE id > 1990`)
	es := caughtUp(t, f, "after-initial")
	for _, tc := range []struct{ entity, table string }{{"public.items", "items"}, {"public.other", "other"}} {
		v := tableValidator{entity: tc.entity, key: []string{"id"}}
		got, markers, _ := v.rebuild(t, es)
		v.compare(t, got, v.source(t, f.url, tc.table, ""))
		if len(markers) != 2 {
			t.Fatalf("%s: %d markers", tc.entity, len(markers))
		}
	}
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	run = f.start(cfg)
	waitFor(t, "active again", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
	time.Sleep(200 * time.Millisecond) // a request the restart made would be visible by now
	if n := len(allSnapshots(t, f)); n != 2 {
		t.Fatalf("after a restart %d snapshot requests, want the 2 of the first start", n)
	}
}

// TestSnapshotNewTables: with --snapshot-new-tables a table that joins the
// publication while walcast runs is snapshotted; the tables it started with
// are not.
func TestSnapshotNewTables(t *testing.T) {
	f := newFixture(t, `INSERT INTO items VALUES (1, 'old', 1)`)
	cfg := f.config()
	cfg.SnapshotNewTables = true
	run := f.start(cfg)
	waitFor(t, "active", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
	execSQL(t, f.url,
		`CREATE TABLE late (id bigint PRIMARY KEY, doc jsonb)`,
		`INSERT INTO late SELECT g, jsonb_build_object('g', g) FROM generate_series(1, 1500) g`,
		`ALTER PUBLICATION pub ADD TABLE late`)
	ss := waitAllDone(t, f, 1)
	if ss[0].Entity() != "public.late" {
		t.Fatalf("snapshotted %s, want only the new table", ss[0].Entity())
	}
	es := caughtUp(t, f, "after-late")
	v := tableValidator{entity: "public.late", key: []string{"id"}}
	got, _, reads := v.rebuild(t, es)
	v.compare(t, got, v.source(t, f.url, "late", ""))
	if reads != 1500 {
		t.Fatalf("%d reads, want 1500", reads)
	}
	tables, _, err := f.j.PublishedTables(context.Background())
	if err != nil || len(tables) != 3 {
		t.Fatalf("recorded tables %v %v", tables, err)
	}
	// A table leaving the publication is forgotten, and one joining again
	// is new again.
	execSQL(t, f.url, `ALTER PUBLICATION pub DROP TABLE late`)
	waitFor(t, "the table forgotten", 30*time.Second, func() bool {
		tables, _, err := f.j.PublishedTables(context.Background())
		return err == nil && len(tables) == 2
	})
	execSQL(t, f.url, `ALTER PUBLICATION pub ADD TABLE late`)
	waitAllDone(t, f, 2)
}

// TestResnapshotAfterResync: the resync of --recreate-lost-slot journals a
// snapshot request of every published table in its own transaction.
func TestResnapshotAfterResync(t *testing.T) {
	f := newFixture(t, `INSERT INTO items SELECT g, 'v', g FROM generate_series(1, 100) g`)
	cfg := f.config()
	run := f.start(cfg)
	waitFor(t, "active", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	execSQL(t, f.url, `SELECT pg_drop_replication_slot('walcast')`)
	cfg.RecreateLostSlot, cfg.ResnapshotAfterResync = true, true
	run = f.start(cfg)
	ss := waitAllDone(t, f, 2)
	if ss[0].Entity() != "public.items" || ss[1].Entity() != "public.other" {
		t.Fatalf("snapshots %+v", ss)
	}
	if n := countOp(t, f.url, string(decoder.OpResync)); n != 1 {
		t.Fatalf("%d resync entries, want 1", n)
	}
	// The journal read from the resync on (FromOldest starts after the
	// newest resync entry) rebuilds the table by itself.
	es := caughtUp(t, f, "after-resync")
	v := tableValidator{entity: "public.items", key: []string{"id"}}
	got, markers, reads := v.rebuild(t, es)
	v.compare(t, got, v.source(t, f.url, "items", ""))
	if len(markers) != 2 || reads != 100 {
		t.Fatalf("%d markers, %d reads after the resync", len(markers), reads)
	}
	_ = run
}

// TestRowLimiterSpacesReservations: each reservation of n rows moves the
// next start by n/rate; a zero rate never waits.
func TestRowLimiterSpacesReservations(t *testing.T) {
	l := &rowLimiter{rate: 1000}
	ctx := context.Background()
	if err := l.wait(ctx, 100); err != nil { // the first reservation starts now
		t.Fatal(err)
	}
	first := l.next
	_ = (&rowLimiter{}).wait(ctx, 1<<30) // no rate: returns at once
	ctx2, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.wait(ctx2, 5000); err == nil || !strings.Contains(err.Error(), "canceled") {
		t.Fatalf("a reservation behind another with a canceled context: %v", err)
	}
	if d := l.next.Sub(first); d != 5*time.Second {
		t.Fatalf("5000 rows at 1000/s moved the next start by %s, want 5s", d)
	}
}

// TestSnapshotNewTablesPublicationRecreated: a publication dropped and
// created again with the same tables is not a publication of new tables.
// While it is missing the check fails (nothing is recorded); once it is
// back, its tables are the ones the journal knew, and none is snapshotted.
func TestSnapshotNewTablesPublicationRecreated(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.SnapshotNewTables = true
	r, err := New(cfg, f.j)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	gen, err := f.j.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := newSnapshotter(r, gen)
	conn, err := s.connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := s.checkPublication(ctx, conn); err != nil {
		t.Fatal(err)
	}
	execSQL(t, f.url, `DROP PUBLICATION pub`)
	if err := s.checkPublication(ctx, conn); err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "fix:") {
		t.Fatalf("check of a dropped publication: %v, want an error saying it does not exist, with the fix", err)
	}
	if tables, _, err := f.j.PublishedTables(ctx); err != nil || len(tables) != 2 {
		t.Fatalf("recorded tables while the publication is missing: %v %v, want the two it had", tables, err)
	}
	execSQL(t, f.url, `CREATE PUBLICATION pub FOR TABLE items, other`)
	if err := s.checkPublication(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if ss := allSnapshots(t, f); len(ss) != 0 {
		t.Fatalf("%d snapshots requested after the publication came back with the same tables", len(ss))
	}
}
