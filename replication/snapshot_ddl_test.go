package replication

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// startSnapshot requests a snapshot of public.<table> and waits until it
// has journaled at least chunks chunks.
func startSnapshot(t *testing.T, f *fixture, table string, chunkSize int, chunks int64) int64 {
	t.Helper()
	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: table, ChunkSize: chunkSize})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, fmt.Sprintf("%d chunks of snapshot %d", chunks, id), 60*time.Second, func() bool {
		s, err := f.j.SnapshotByID(context.Background(), id)
		return err == nil && s.Chunks >= chunks
	})
	return id
}

// endOf returns the snapshot-end of snapshot id in es, and how many there are.
func endOf(t *testing.T, es []journal.Entry, id int64) (end snapshotEnd, found int) {
	t.Helper()
	for _, e := range es {
		if e.Op != decoder.OpSnapshotEnd {
			continue
		}
		var m snapshotEnd
		if err := json.Unmarshal(e.Envelope, &m); err != nil {
			t.Fatal(err)
		}
		if m.Snapshot.ID == id {
			end = m
			found++
		}
	}
	return end, found
}

// TestSnapshotRewritingAlterMidway: an ALTER TABLE that rewrites the table
// (a column's type changed) while the table is snapshotted in small chunks.
// Rewritten tuples are invisible to a snapshot taken before the rewrite
// committed, so a chunk whose snapshot came first read an empty table and
// ended the snapshot, without the rest of the rows. The chunk's lock is
// taken before its snapshot: the table rebuilt from the journal equals the
// source, and the snapshot-end counts every read.
func TestSnapshotRewritingAlterMidway(t *testing.T) {
	const rows = 3000
	f := newFixture(t,
		`CREATE TABLE rw (id int PRIMARY KEY, v int, note text)`,
		fmt.Sprintf(`INSERT INTO rw SELECT g, g * 3, 'n' || g FROM generate_series(1, %d) g`, rows),
		`ALTER PUBLICATION pub ADD TABLE rw`)
	run := f.start(f.config())
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	id := startSnapshot(t, f, "rw", 20, 3)
	// Each rewrite takes ACCESS EXCLUSIVE and rewrites every row; the
	// snapshot's chunks go on around them.
	for _, typ := range []string{"bigint", "numeric", "int"} {
		execSQL(t, f.url, `ALTER TABLE rw ALTER COLUMN v TYPE `+typ)
		time.Sleep(50 * time.Millisecond)
	}
	s := waitSnapshot(t, f, id, 120*time.Second)
	if s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	es := caughtUp(t, f, "after-rewrite")
	v := tableValidator{entity: "public.rw", key: []string{"id"}}
	got, _, reads := v.rebuild(t, es)
	v.compare(t, got, v.source(t, f.url, "rw", ""))
	// A type change is a change of shape: the snapshot may start over, so
	// there can be more reads than rows, and the end counts them all.
	if end, n := endOf(t, es, id); n != 1 || end.Snapshot.Rows != int64(reads) || reads < rows {
		t.Fatalf("%d snapshot-ends, the last counting %d rows; %d reads; want one end counting the reads, at least %d", n, end.Snapshot.Rows, reads, rows)
	}
}

// TestSnapshotColumnDDLMidway: columns added (with a volatile default, a
// rewrite), renamed and dropped while the table is snapshotted. The rows
// read before such a change are in the old shape, so the snapshot starts
// over from the first key in the chunk that notices it: it ends done, and
// the table rebuilt from the journal equals the source, every column of
// every row included.
func TestSnapshotColumnDDLMidway(t *testing.T) {
	const rows = 2000
	f := newFixture(t,
		`CREATE TABLE cd (id int PRIMARY KEY, a text, b int, c text)`,
		fmt.Sprintf(`INSERT INTO cd SELECT g, 'a' || g, g, 'c' || g FROM generate_series(1, %d) g`, rows),
		`ALTER PUBLICATION pub ADD TABLE cd`)
	cfg := f.config()
	cfg.SnapshotMaxRowsPerSecond = 1000 // a pass takes two seconds: the DDL lands mid-snapshot
	run := f.start(cfg)
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	id := startSnapshot(t, f, "cd", 10, 2)
	for _, ddl := range []string{
		`ALTER TABLE cd ADD COLUMN r float8 DEFAULT random()`,
		`ALTER TABLE cd RENAME COLUMN a TO a2`,
		`ALTER TABLE cd DROP COLUMN c`,
		`ALTER TABLE cd ADD COLUMN d int DEFAULT 7`,
	} {
		time.Sleep(150 * time.Millisecond)
		execSQL(t, f.url, ddl)
	}
	s := waitSnapshot(t, f, id, 120*time.Second)
	if s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	es := caughtUp(t, f, "after-column-ddl")
	v := tableValidator{entity: "public.cd", key: []string{"id"}}
	got, _, reads := v.rebuild(t, es)
	// Columns dropped since a row was journaled stay in what the journal
	// holds of it (nothing says they were dropped); the rest is exact.
	for _, row := range got {
		delete(row, "c")
		delete(row, "a")
	}
	v.compare(t, got, v.source(t, f.url, "cd", ""))
	if end, n := endOf(t, es, id); n != 1 || end.Snapshot.Rows != int64(reads) || reads <= rows {
		t.Fatalf("%d snapshot-ends, the last counting %d rows; %d reads of %d rows; want one end counting the reads, and the table read more than once", n, end.Snapshot.Rows, reads, rows)
	}
}

// TestSnapshotReplicaIdentityIndex: a table with a primary key and
// REPLICA IDENTITY USING INDEX on another unique index. Deletes carry only
// the identity index's columns, so the chunks are keyed on it: a row
// deleted (or whose key moved) inside a chunk's window is matched, and no
// deleted row comes back.
func TestSnapshotReplicaIdentityIndex(t *testing.T) {
	const rows = 6000
	f := newFixture(t,
		`CREATE TABLE ri (id int PRIMARY KEY, u int NOT NULL, v text)`,
		`CREATE UNIQUE INDEX ri_u ON ri (u)`,
		`ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_u`,
		fmt.Sprintf(`INSERT INTO ri SELECT g, %d - g, 'v' || g FROM generate_series(1, %d) g`, rows+1, rows),
		`ALTER PUBLICATION pub ADD TABLE ri`)
	run := f.start(f.config())
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for w := range 3 {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rnd := rand.New(rand.NewSource(seed))
			conn, err := pgx.Connect(context.Background(), f.url)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(context.Background())
			for ctx.Err() == nil {
				u := 1 + rnd.Intn(rows)
				var q string
				switch rnd.Intn(3) {
				case 0:
					q = fmt.Sprintf(`DELETE FROM ri WHERE u = %d`, u)
				case 1: // the primary key moves; the identity stays
					q = fmt.Sprintf(`UPDATE ri SET id = id + %d WHERE u = %d`, 1000000*(1+rnd.Intn(9)), u)
				case 2:
					q = fmt.Sprintf(`UPDATE ri SET v = 'w%d' WHERE u = %d`, rnd.Int(), u)
				}
				if _, err := conn.Exec(context.Background(), q); err != nil && !strings.Contains(err.Error(), "duplicate key") {
					errs <- fmt.Errorf("%s: %w", q, err)
					return
				}
			}
		}(int64(w + 11))
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "ri", ChunkSize: 25})
	if err != nil {
		t.Fatal(err)
	}
	s := waitSnapshot(t, f, id, 180*time.Second)
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	checkRebuilt(t, f, "ri", "u")
}

// TestSnapshotCollatedKey: a key column declared with a collation other
// than its type's default ("C"), in chunks smaller than the table: every
// chunk after the first casts the last key back, and the snapshot reads
// every row in the column's own order.
func TestSnapshotCollatedKey(t *testing.T) {
	f := newFixture(t,
		`CREATE TABLE coll (k text COLLATE "C" PRIMARY KEY, v int)`,
		`INSERT INTO coll SELECT chr(65 + g % 26) || chr(97 + g % 26) || g, g FROM generate_series(1, 500) g`,
		`ALTER PUBLICATION pub ADD TABLE coll`)
	run := f.start(f.config())
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "coll", ChunkSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	s := waitSnapshot(t, f, id, 60*time.Second)
	if s.Status != journal.SnapshotDone || s.Rows != 500 {
		t.Fatalf("snapshot ended %s with %d rows: %s", s.Status, s.Rows, s.Error)
	}
	checkRebuilt(t, f, "coll", "k")
}

// TestSnapshotTableChangedUnderIt: a snapshot cannot go on in the order it
// began when the table's chunk key changes (here its replica identity) or
// the table is dropped: it ends failed with the reason and the fix, the
// stream carries a snapshot-end that says so (every begin has an end), and
// a new snapshot of the table as it is now is exact.
func TestSnapshotTableChangedUnderIt(t *testing.T) {
	f := newFixture(t,
		`CREATE TABLE ch (id int PRIMARY KEY, u int NOT NULL UNIQUE, v text)`,
		`INSERT INTO ch SELECT g, -g, 'v' || g FROM generate_series(1, 2000) g`,
		`CREATE TABLE gone (id int PRIMARY KEY)`,
		`INSERT INTO gone SELECT generate_series(1, 2000)`,
		`CREATE TABLE parted (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)`,
		`CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (1) TO (100000)`,
		`INSERT INTO parted SELECT g, 'v' || g FROM generate_series(1, 2000) g`,
		`CREATE TABLE parted_0 (id int PRIMARY KEY, v text)`,
		`INSERT INTO parted_0 SELECT -g, 'early' FROM generate_series(1, 50) g`,
		`ALTER PUBLICATION pub SET (publish_via_partition_root = true)`,
		`ALTER PUBLICATION pub ADD TABLE ch, gone, parted`)
	run := f.start(f.config())
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })

	id := startSnapshot(t, f, "ch", 5, 2)
	execSQL(t, f.url, `ALTER TABLE ch REPLICA IDENTITY USING INDEX ch_u_key`)
	s := waitSnapshot(t, f, id, 60*time.Second)
	if s.Status != journal.SnapshotFailed || !strings.Contains(s.Error, "chunk key") || !strings.Contains(s.Error, "fix:") {
		t.Fatalf("snapshot after the identity changed: %s %q, want failed, naming the chunk key, with the fix", s.Status, s.Error)
	}
	gid := startSnapshot(t, f, "gone", 5, 2)
	execSQL(t, f.url, `ALTER PUBLICATION pub DROP TABLE gone`, `DROP TABLE gone`)
	g := waitSnapshot(t, f, gid, 60*time.Second)
	if g.Status != journal.SnapshotFailed || !strings.Contains(g.Error, "fix:") {
		t.Fatalf("snapshot of a dropped table: %s %q, want failed with the fix", g.Status, g.Error)
	}
	// A partition attached mid-snapshot holds rows before the snapshot's
	// position, which no change brings.
	pid := startSnapshot(t, f, "parted", 5, 2)
	execSQL(t, f.url, `ALTER TABLE parted ATTACH PARTITION parted_0 FOR VALUES FROM (-100000) TO (1)`)
	p := waitSnapshot(t, f, pid, 60*time.Second)
	if p.Status != journal.SnapshotFailed || !strings.Contains(p.Error, "partitions") || !strings.Contains(p.Error, "fix:") {
		t.Fatalf("snapshot of a table that gained a partition: %s %q, want failed with the fix", p.Status, p.Error)
	}
	es := caughtUp(t, f, "after-changed")
	for _, sid := range []int64{id, gid, pid} {
		end, n := endOf(t, es, sid)
		if n != 1 || !end.Snapshot.Failed || !strings.Contains(end.Snapshot.Reason, "fix:") {
			t.Fatalf("snapshot %d: %d snapshot-ends, the last %+v; want one that says it failed, with the fix", sid, n, end)
		}
	}
	// Snapshotted again with nothing running against them, the tables are
	// exact (the new reads are upserts over what the failed ones read).
	for _, table := range []struct{ name, key string }{{"ch", "u"}, {"parted", "id"}} {
		again, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: table.name, ChunkSize: 100})
		if err != nil {
			t.Fatal(err)
		}
		if s := waitSnapshot(t, f, again, 60*time.Second); s.Status != journal.SnapshotDone {
			t.Fatalf("new snapshot of %s ended %s: %s", table.name, s.Status, s.Error)
		}
		checkRebuilt(t, f, table.name, table.key)
	}
}

// TestSnapshotWideRowsBoundedChunks: rows of 256 KB in a table snapshotted
// with the largest chunk size: a chunk stops at its byte bound (half the
// journal queue over every chunk in flight), so the snapshot takes many
// small chunks instead of holding the table in memory, and is exact.
func TestSnapshotWideRowsBoundedChunks(t *testing.T) {
	f := newFixture(t,
		`CREATE TABLE wide (id int PRIMARY KEY, pad text)`,
		`ALTER TABLE wide ALTER COLUMN pad SET STORAGE EXTERNAL`,
		`INSERT INTO wide SELECT g, repeat(md5(g::text), 8192) FROM generate_series(1, 120) g`,
		`ALTER PUBLICATION pub ADD TABLE wide`)
	cfg := f.config()
	cfg.QueueMaxBytes = 16 << 20
	run := f.start(cfg)
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "wide", ChunkSize: journal.MaxSnapshotChunkSize})
	if err != nil {
		t.Fatal(err)
	}
	s := waitSnapshot(t, f, id, 120*time.Second)
	if s.Status != journal.SnapshotDone || s.Rows != 120 {
		t.Fatalf("snapshot ended %s with %d rows: %s", s.Status, s.Rows, s.Error)
	}
	// 16 MiB / (2 × 3 chunks × 2 workers) ≈ 1.4 MB a chunk: five rows.
	if s.Chunks < 15 {
		t.Fatalf("%d rows of 256 KB in %d chunks; want chunks bounded in bytes", s.Rows, s.Chunks)
	}
	checkRebuilt(t, f, "wide", "id")
}

// TestSnapshotGivesWayToALock: while a customer's transaction holds the
// table's ACCESS EXCLUSIVE lock (as a long ALTER TABLE does), a chunk waits
// for its lock no longer than the snapshot session's lock_timeout and is
// read again later; the snapshot completes, exact, once the lock is gone.
func TestSnapshotGivesWayToALock(t *testing.T) {
	f := newFixture(t,
		`CREATE TABLE locked (id int PRIMARY KEY, v text)`,
		`INSERT INTO locked SELECT g, 'v' || g FROM generate_series(1, 1000) g`,
		`ALTER PUBLICATION pub ADD TABLE locked`)
	run := f.start(f.config())
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	id := startSnapshot(t, f, "locked", 10, 2)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `BEGIN; LOCK TABLE locked IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	// Waiting behind the lock, the snapshot session must not be one of the
	// lock's waiters for longer than its lock_timeout.
	watch, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(ctx)
	held := time.Now()
	var waitedLong bool
	for time.Since(held) < 3*snapshotLockTimeout {
		var n int
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE 'LOCK TABLE%locked%' AND now() - query_start > $1::interval`, fmt.Sprintf("%d ms", (snapshotLockTimeout+time.Second).Milliseconds())).Scan(&n); err != nil {
			t.Fatal(err)
		}
		waitedLong = waitedLong || n > 0
		time.Sleep(100 * time.Millisecond)
	}
	mid, _ := f.j.SnapshotByID(ctx, id)
	if _, err := conn.Exec(ctx, `INSERT INTO locked VALUES (5000, 'while locked'); COMMIT`); err != nil {
		t.Fatal(err)
	}
	if waitedLong {
		t.Fatalf("a snapshot chunk waited for its lock longer than %s", snapshotLockTimeout)
	}
	if mid.Status != journal.SnapshotRunning {
		t.Fatalf("while the table was locked the snapshot became %s: %s", mid.Status, mid.Error)
	}
	s := waitSnapshot(t, f, id, 120*time.Second)
	if s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	checkRebuilt(t, f, "locked", "id")
}

// checkRebuilt waits until the journal holds every change committed so far
// and asserts that public.<table>, rebuilt from it by key, equals the
// table; it returns the entries.
func checkRebuilt(t *testing.T, f *fixture, table string, key ...string) []journal.Entry {
	t.Helper()
	es := caughtUp(t, f, "after-"+table)
	v := tableValidator{entity: "public." + table, key: key}
	got, _, _ := v.rebuild(t, es)
	v.compare(t, got, v.source(t, f.url, table, ""))
	return es
}
