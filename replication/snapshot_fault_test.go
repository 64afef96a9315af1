package replication

// Snapshot fault and table-shape tests: a TRUNCATE in the middle
// of a snapshot, REPLICA IDENTITY FULL, TOASTed values updated during their
// chunk's window, and a tenant column. Each rebuilds the table from the
// journal with tableValidator (snapshot_test.go) and compares it with the
// source.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

// churn runs writers that insert, update (the key too) and delete rows of
// table (id int PRIMARY KEY, val text, …) in ids 1..maxID until the returned
// stop is called; stop fails the test if a writer failed. insert is the
// INSERT statement of a new row, with $1 the id and $2 the val; set is what
// an ordinary update assigns besides val.
func churn(t *testing.T, url, table string, writers, maxID int, insert, set string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var werr error
	for n := 0; n < writers; n++ {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close(context.Background())
			rnd := rand.New(rand.NewSource(time.Now().UnixNano() + int64(n)))
			for i := 0; ctx.Err() == nil; i++ {
				id := 1 + rnd.Intn(maxID)
				val := fmt.Sprintf("w%d-%d", n, i)
				var q string
				args := []any{id, val}
				switch rnd.Intn(4) {
				case 0:
					q = insert + ` ON CONFLICT (id) DO UPDATE SET val = $2`
				case 1:
					q = `UPDATE ` + table + ` SET val = $2` + set + ` WHERE id = $1`
				case 2:
					q = `UPDATE ` + table + ` SET id = $3, val = $2 WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM ` + table + ` WHERE id = $3)`
					args = append(args, 1+rnd.Intn(maxID))
				case 3:
					q, args = `DELETE FROM `+table+` WHERE id = $1`, args[:1]
				}
				if _, err := conn.Exec(ctx, q, args...); err != nil && ctx.Err() == nil && !strings.Contains(err.Error(), "duplicate key") {
					mu.Lock()
					werr = fmt.Errorf("%s: %w", q, err)
					mu.Unlock()
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		wg.Wait()
		if werr != nil {
			t.Fatal(werr)
		}
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return stop
}

// snapshotEnd is the snapshot field of a snapshot-begin or -end envelope.
type snapshotEnd struct {
	Snapshot struct {
		ID        int64  `json:"id"`
		Table     string `json:"table"`
		Rows      int64  `json:"rows"`
		Cancelled bool   `json:"cancelled"`
		Failed    bool   `json:"failed"`
		Reason    string `json:"reason"`
	} `json:"snapshot"`
}

// checkMarkers asserts that entity's entries hold exactly one snapshot-begin
// and one snapshot-end of snapshot id, every read between them, and the end
// counting the reads; it returns the entries from the begin to the end.
func checkMarkers(t *testing.T, es []journal.Entry, entity string, id int64) []journal.Entry {
	t.Helper()
	begin, end, reads := -1, -1, 0
	for i, e := range es {
		if e.Entity != entity {
			continue
		}
		switch e.Op {
		case decoder.OpSnapshotBegin:
			if begin >= 0 {
				t.Fatalf("a second snapshot-begin: %s", e.Envelope)
			}
			begin = i
		case decoder.OpSnapshotEnd:
			if end >= 0 {
				t.Fatalf("a second snapshot-end: %s", e.Envelope)
			}
			end = i
		case decoder.OpRead:
			if begin < 0 || end >= 0 {
				t.Fatalf("a read outside the snapshot's markers: %s", e.Envelope)
			}
			reads++
		}
	}
	if begin < 0 || end < 0 {
		t.Fatalf("snapshot-begin at %d, snapshot-end at %d", begin, end)
	}
	var m snapshotEnd
	if err := json.Unmarshal(es[end].Envelope, &m); err != nil {
		t.Fatal(err)
	}
	if m.Snapshot.ID != id || m.Snapshot.Table != entity || m.Snapshot.Cancelled || m.Snapshot.Rows != int64(reads) {
		t.Fatalf("snapshot-end %s, want snapshot %d of %s counting its %d reads", es[end].Envelope, id, entity, reads)
	}
	return es[begin : end+1]
}

// testConn opens a connection closed when the test ends.
func testConn(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func intKey(t *testing.T, e journal.Entry, row map[string]json.RawMessage) int {
	t.Helper()
	n, err := strconv.Atoi(string(row["id"]))
	if err != nil {
		t.Fatalf("no integer id: %s", e.Envelope)
	}
	return n
}

// TestSnapshotTruncateMidway truncates the table in the middle of its
// snapshot (under writers) and fills it again in the same transaction. What
// a consumer sees, in seq order: snapshot-begin; reads of rows from before
// the TRUNCATE; the truncate entry (which empties the consumer's table); the
// new rows as inserts; then either
//   - at once the snapshot-end: the chunk in flight at the TRUNCATE read an
//     empty table (its REPEATABLE READ snapshot predates the TRUNCATE, which
//     is not MVCC-safe), so it was the last one; every row of the table
//     after the TRUNCATE came as an insert, so the consumer holds the table;
//   - or reads of new rows beyond the snapshot's position, going on in key
//     order (never starting over), then the snapshot-end.
//
// Either way no row from before the TRUNCATE is read after it (a chunk whose
// window held the TRUNCATE is dropped whole), snapshot-end's rows count the
// reads on both sides of it, and the table rebuilt from the journal equals
// the source.
func TestSnapshotTruncateMidway(t *testing.T) {
	const rows = 10000
	f := newFixture(t,
		`CREATE TABLE trunc (id int PRIMARY KEY, val text, n int)`,
		fmt.Sprintf(`INSERT INTO trunc SELECT g, 'pre' || g, 0 FROM generate_series(1, %d) g`, rows),
		`ALTER PUBLICATION pub ADD TABLE trunc`)
	run := f.start(f.config())
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	stop := churn(t, f.url, "trunc", 2, rows+500, `INSERT INTO trunc VALUES ($1, $2, 0)`, `, n = n + 1`)
	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "trunc", ChunkSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ten chunks", 30*time.Second, func() bool {
		s, err := f.j.SnapshotByID(context.Background(), id)
		return err == nil && s.Chunks >= 10
	})
	// The TRUNCATE and the new rows in one transaction: a chunk's SELECT
	// sees either the old rows or the new ones. (Were the table empty for a
	// chunk, that chunk would be the last: the snapshot would end, rightly,
	// with the new rows arriving as inserts.)
	err = pgx.BeginFunc(context.Background(), testConn(t, f.url), func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), `TRUNCATE trunc`); err != nil {
			return err
		}
		// The lock the TRUNCATE holds stops the snapshot's next SELECT.
		if s, err := f.j.SnapshotByID(context.Background(), id); err != nil || s.Status != journal.SnapshotRunning {
			return fmt.Errorf("the snapshot is %s at the TRUNCATE (%v); use a bigger table", s.Status, err)
		}
		_, err := tx.Exec(context.Background(), fmt.Sprintf(`INSERT INTO trunc SELECT g, 'post' || g, 0 FROM generate_series(1, %d) g`, rows))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if s := waitSnapshot(t, f, id, 60*time.Second); s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	stop()
	es := caughtUp(t, f, "after-trunc")
	v := tableValidator{entity: "public.trunc", key: []string{"id"}}
	got, _, reads := v.rebuild(t, es)
	v.compare(t, got, v.source(t, f.url, "trunc", ""))

	span := checkMarkers(t, es, "public.trunc", id)
	truncated := false
	var before, after []int // keys read before and after the truncate entry
	for _, e := range span {
		if e.Entity != "public.trunc" {
			continue
		}
		switch e.Op {
		case decoder.OpTruncate:
			if truncated {
				t.Fatalf("a second truncate entry: %s", e.Envelope)
			}
			truncated = true
		case decoder.OpRead:
			var env decoder.Envelope
			_ = json.Unmarshal(e.Envelope, &env)
			val := string(env.After["val"])
			k := intKey(t, e, env.After)
			if !truncated {
				if strings.HasPrefix(val, `"post`) {
					t.Fatalf("a row inserted after the TRUNCATE read before its entry: %s", e.Envelope)
				}
				before = append(before, k)
			} else {
				if strings.HasPrefix(val, `"pre`) {
					t.Fatalf("a row from before the TRUNCATE read after its entry (a deleted row brought back): %s", e.Envelope)
				}
				after = append(after, k)
			}
		}
	}
	if !truncated || len(before) == 0 || !slices.IsSorted(before) {
		t.Fatalf("truncate entry inside the snapshot: %v; %d reads before it (in key order: %v)", truncated, len(before), slices.IsSorted(before))
	}
	switch {
	case len(after) == 0:
		// The chunk whose window held the TRUNCATE found no rows: its
		// REPEATABLE READ snapshot predates the TRUNCATE, which is not
		// MVCC-safe (the new, empty table looks empty to older snapshots),
		// so it was the last chunk. Right: every row after the TRUNCATE
		// was inserted after it and reaches the consumer as an insert.
		t.Logf("the snapshot ended at the TRUNCATE: %d reads before it (ids %d..%d), none after; %d rows rebuilt",
			len(before), before[0], before[len(before)-1], len(got))
	case !slices.IsSorted(after) || after[0] <= before[len(before)-1]:
		t.Fatalf("reads after the TRUNCATE start at id %d, reads before it ended at %d: the snapshot must go on in key order, not start over",
			after[0], before[len(before)-1])
	default:
		t.Logf("the snapshot went on after the TRUNCATE: %d reads before it (ids %d..%d), %d after (ids %d..%d); %d rows rebuilt",
			len(before), before[0], before[len(before)-1], len(after), after[0], after[len(after)-1], len(got))
	}
	if reads != len(before)+len(after) {
		t.Fatalf("%d reads in all, %d inside the snapshot's markers", reads, len(before)+len(after))
	}
}

// TestSnapshotReplicaIdentityFull snapshots a table under REPLICA IDENTITY
// FULL while writers change it, keys included: the rebuilt table equals the
// source, and a read is shaped as an insert of the table is (its key holds
// every column, as under FULL).
func TestSnapshotReplicaIdentityFull(t *testing.T) {
	const rows = 5000
	f := newFixture(t,
		`CREATE TABLE full_ri (id int PRIMARY KEY, val text, n int)`,
		`ALTER TABLE full_ri REPLICA IDENTITY FULL`,
		fmt.Sprintf(`INSERT INTO full_ri SELECT g, 'v' || g, g %% 5 FROM generate_series(1, %d) g`, rows),
		`ALTER PUBLICATION pub ADD TABLE full_ri`)
	run := f.start(f.config())
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	stop := churn(t, f.url, "full_ri", 2, rows+500, `INSERT INTO full_ri VALUES ($1, $2, 0)`, `, n = n + 1`)
	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "full_ri", ChunkSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	if s := waitSnapshot(t, f, id, 60*time.Second); s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	stop()
	es := caughtUp(t, f, "after-full")
	v := tableValidator{entity: "public.full_ri", key: []string{"id"}}
	got, _, reads := v.rebuild(t, es)
	v.compare(t, got, v.source(t, f.url, "full_ri", ""))
	checkMarkers(t, es, "public.full_ri", id)
	var sawInsert, sawFullBefore bool
	for _, e := range es {
		if e.Entity != "public.full_ri" {
			continue
		}
		var env decoder.Envelope
		_ = json.Unmarshal(e.Envelope, &env)
		switch env.Op {
		case decoder.OpRead, decoder.OpInsert:
			sawInsert = sawInsert || env.Op == decoder.OpInsert
			if len(env.Key) != 3 || !jsonRowsEqual(env.Key, env.After) || env.Before != nil {
				t.Fatalf("%s under REPLICA IDENTITY FULL: want key = after (every column) and no before: %s", env.Op, e.Envelope)
			}
		case decoder.OpUpdate, decoder.OpDelete:
			if len(env.Before) == 3 {
				sawFullBefore = true
			}
		}
	}
	if !sawInsert || !sawFullBefore || reads < rows/2 {
		t.Fatalf("insert seen %v, full before seen %v, %d reads: the writers did not exercise the table", sawInsert, sawFullBefore, reads)
	}
}

func jsonRowsEqual(a, b map[string]json.RawMessage) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if string(b[k]) != string(v) {
			return false
		}
	}
	return true
}

// TestSnapshotToastUnchanged snapshots a table whose big column is stored
// out of line (8 KB values) and, twice, commits an UPDATE inside a chunk's
// window: a transaction locks the table while the snapshot's SELECT of a
// chunk waits for the lock (its low watermark is already in the WAL and its
// REPEATABLE READ snapshot taken), updates the small column of the rows
// around the snapshot's position, rewriting big only where id % 10 = 0,
// and commits; the SELECT then reads the rows as they were and the chunk's
// rows are dropped. The README's limit says what a consumer gets: a dropped
// row's state comes from its update, and an update that left a TOASTed
// value alone carries that column in "unchanged", not in "after". So:
//   - exactly two chunks' rows (2 × 50 consecutive ids) have no read; every
//     other row of the table is read with big in full;
//   - every update that did not rewrite big lists it in "unchanged" and
//     leaves it out of "after" (never null);
//   - rebuilt with unchanged columns kept from the row's previous entry,
//     every row equals the source, except the dropped rows whose big was not
//     rewritten: there big is unknown (absent, never null) and the other
//     columns are right.
func TestSnapshotToastUnchanged(t *testing.T) {
	const rows, chunk = 1000, 50
	f := newFixture(t,
		`CREATE TABLE toast (id int PRIMARY KEY, big text, n int)`,
		`ALTER TABLE toast ALTER COLUMN big SET STORAGE EXTERNAL`,
		fmt.Sprintf(`INSERT INTO toast SELECT g, (SELECT string_agg(md5(g::text || '-' || i), '') FROM generate_series(1, 256) i), 0 FROM generate_series(1, %d) g`, rows),
		`ALTER PUBLICATION pub ADD TABLE toast`)
	var external int
	pgtest.MustQueryRow(t, f.url, `SELECT count(*) FROM toast WHERE pg_column_size(big) >= 8192`, nil, &external)
	if external != rows {
		t.Fatalf("%d of %d values stored uncompressed out of line", external, rows)
	}
	run := f.start(f.config())
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	// Two rounds: the first holds the lock before the snapshot is asked
	// for, so its first chunk waits; the second takes it at once after the
	// first commits, before the stream has passed the first chunk's high
	// watermark, so the second chunk waits.
	ctx := context.Background()
	locker := testConn(t, f.url)
	var id int64
	for round := 0; round < 2; round++ {
		err := pgx.BeginFunc(ctx, locker, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `LOCK TABLE toast IN ACCESS EXCLUSIVE MODE`); err != nil {
				return err
			}
			if round == 0 {
				var err error
				if id, err = f.j.RequestSnapshot(ctx, journal.SnapshotRequest{Schema: "public", Table: "toast", ChunkSize: chunk}); err != nil {
					return err
				}
			}
			waitFor(t, "the snapshot's SELECT to wait for the lock", 10*time.Second, func() bool {
				if s, err := f.j.SnapshotByID(ctx, id); err == nil && s.Status != journal.SnapshotRunning && s.Status != journal.SnapshotPending {
					t.Fatalf("the snapshot is %s (%d chunks) before round %d; use a bigger table", s.Status, s.Chunks, round)
				}
				var waiting int
				pgtest.MustQueryRow(t, f.url, `SELECT count(*) FROM pg_locks WHERE relation = 'toast'::regclass AND NOT granted`, nil, &waiting)
				return waiting > 0
			})
			// The waiting chunk starts after the last journaled chunk's
			// key, or after the chunk before it (whose journal commit may
			// be in flight).
			s, err := f.j.SnapshotByID(ctx, id)
			if err != nil {
				return err
			}
			from := 0
			if len(s.LastKey) == 1 {
				from, _ = strconv.Atoi(s.LastKey[0])
			}
			_, err = tx.Exec(ctx, `UPDATE toast SET n = n + 1, big = CASE WHEN id % 10 = 0 THEN repeat(md5(random()::text), 256) ELSE big END
				WHERE id > $1::int - $2::int AND id <= $1::int + 4 * $2::int`, from, chunk)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	s := waitSnapshot(t, f, id, 60*time.Second)
	if s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	es := caughtUp(t, f, "after-toast")
	checkMarkers(t, es, "public.toast", id)
	v := tableValidator{entity: "public.toast", key: []string{"id"}}
	src := v.source(t, f.url, "toast", "")

	// Rebuild, keeping unchanged columns from the row's previous state.
	state := map[string]map[string]any{}
	read := map[string]bool{}
	unchangedUpdates := 0
	for _, e := range es {
		if e.Entity != "public.toast" {
			continue
		}
		var env decoder.Envelope
		if err := json.Unmarshal(e.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		k, _ := keyOf(env.Key, v.key)
		switch env.Op {
		case decoder.OpRead:
			if _, ok := env.After["big"]; !ok || len(env.Unchanged) > 0 {
				t.Fatalf("a read without its TOASTed value: %s", e.Envelope)
			}
			read[k] = true
			state[k] = normalize(env.After)
		case decoder.OpUpdate:
			big, has := env.After["big"]
			switch {
			case !has && !slices.Equal(env.Unchanged, []string{"big"}):
				t.Fatalf("an update without big that does not list it as unchanged: %s", e.Envelope)
			case has && (string(big) == "null" || len(env.Unchanged) > 0):
				t.Fatalf("an update with big null, or sent and unchanged: %s", e.Envelope)
			case !has:
				unchangedUpdates++
			}
			row := normalize(env.After)
			if prev, ok := state[k]; ok && !has {
				if b, ok := prev["big"]; ok {
					row["big"] = b
				}
			}
			state[k] = row
		case decoder.OpSnapshotBegin, decoder.OpSnapshotEnd:
		default:
			t.Fatalf("unexpected entry: %s", e.Envelope)
		}
	}
	var unread []int
	unknown := 0
	for k, want := range src {
		got, ok := state[k]
		if !ok {
			t.Fatalf("id %s missing from the journal", k)
		}
		n, _ := strconv.Atoi(k)
		if !read[k] {
			unread = append(unread, n)
		}
		if _, has := got["big"]; !has {
			if read[k] || n%10 == 0 {
				t.Fatalf("id %s: big unknown though the journal has it (read %v)", k, read[k])
			}
			unknown++
			delete(want, "big")
		} else if !read[k] && n%10 != 0 {
			t.Fatalf("id %s: dropped from its chunk and its big never rewritten, yet the journal has a value for it", k)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("id %s: journal %.200v, source %.200v", k, got, want)
		}
	}
	if len(state) != len(src) {
		t.Fatalf("journal rebuilds %d rows, source has %d", len(state), len(src))
	}
	// Two whole chunks: ids 50(k-1)+1 .. 50k for two k.
	slices.Sort(unread)
	blocks := map[int]int{}
	for _, n := range unread {
		blocks[(n-1)/chunk]++
	}
	whole := len(blocks) == 2
	for _, c := range blocks {
		whole = whole && c == chunk
	}
	if !whole || unknown != 2*chunk*9/10 {
		t.Fatalf("%d rows without a read (%v), %d with big unknown; want two whole chunks (%d rows), %d unknown",
			len(unread), unread, unknown, 2*chunk, 2*chunk*9/10)
	}
	t.Logf("%d rows, %d read, %d dropped from two chunks (ids from %d and to %d), %d of them with big unknown; %d updates left big unchanged",
		len(src), len(read), len(unread), unread[0], unread[len(unread)-1], unknown, unchangedUpdates)
}

// scopedEntries reads entity's entries as a reader scoped to tenant ("" is
// an unscoped reader: rows with no tenant only).
func scopedEntries(t *testing.T, f *fixture, entity, tenant string) []journal.Entry {
	t.Helper()
	var all []journal.Entry
	q := journal.Query{FromOldest: true, Entities: []string{entity}, Tenant: tenant, Limit: journal.MaxLimit}
	for {
		res, err := f.j.Changes(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		if res.ResyncRequired {
			t.Fatalf("resync reading the journal: %s", res.Reason)
		}
		all = append(all, res.Changes...)
		if len(res.Changes) == 0 && !res.More {
			return all
		}
		q = journal.Query{Cursor: res.Cursor, Entities: []string{entity}, Tenant: tenant, Limit: journal.MaxLimit}
	}
}

// TestSnapshotTenantColumn snapshots a table with a tenant column under
// writers (tenants never change, keys do): reads carry the row's tenant as
// inserts do, the markers none; a reader scoped to a tenant rebuilds exactly
// that tenant's rows of the source and sees both markers; a reader with no
// tenant sees the markers and no row.
func TestSnapshotTenantColumn(t *testing.T) {
	const rows = 6000
	f := newFixture(t,
		`CREATE TABLE ten (id int PRIMARY KEY, org text NOT NULL, val text)`,
		fmt.Sprintf(`INSERT INTO ten SELECT g, 'org' || (g %% 3), 'v' || g FROM generate_series(1, %d) g`, rows),
		`ALTER PUBLICATION pub ADD TABLE ten`)
	cfg := f.config()
	cfg.TenantColumn = "org"
	run := f.start(cfg)
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	stop := churn(t, f.url, "ten", 2, rows+500, `INSERT INTO ten VALUES ($1, 'org' || ($1::int % 3), $2)`, "")
	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "ten", ChunkSize: 200})
	if err != nil {
		t.Fatal(err)
	}
	if s := waitSnapshot(t, f, id, 60*time.Second); s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	stop()
	es := caughtUp(t, f, "after-ten")
	v := tableValidator{entity: "public.ten", key: []string{"id"}}
	got, _, _ := v.rebuild(t, es)
	v.compare(t, got, v.source(t, f.url, "ten", ""))
	checkMarkers(t, es, "public.ten", id)
	for _, e := range es {
		if e.Entity != "public.ten" {
			continue
		}
		var env decoder.Envelope
		_ = json.Unmarshal(e.Envelope, &env)
		switch e.Op {
		case decoder.OpRead, decoder.OpInsert:
			if !e.HasTenant || `"`+e.Tenant+`"` != string(env.After["org"]) || env.Tenant != e.Tenant {
				t.Fatalf("%s entry with tenant %q (%v): %s", e.Op, e.Tenant, e.HasTenant, e.Envelope)
			}
		case decoder.OpSnapshotBegin, decoder.OpSnapshotEnd:
			if e.HasTenant || e.TenantUnknown || env.Tenant != "" {
				t.Fatalf("a marker with a tenant: %s", e.Envelope)
			}
		}
	}
	for _, tenant := range []string{"org0", "org1", "org2"} {
		scoped := scopedEntries(t, f, "public.ten", tenant)
		got, markers, reads := v.rebuild(t, scoped)
		v.compare(t, got, v.source(t, f.url, "ten", "org = "+pgxQuote(tenant)))
		if len(markers) != 2 || reads == 0 {
			t.Fatalf("tenant %s: %d markers and %d reads", tenant, len(markers), reads)
		}
	}
	none := scopedEntries(t, f, "public.ten", "")
	if got, markers, reads := v.rebuild(t, none); len(got) != 0 || reads != 0 || len(markers) != 2 {
		t.Fatalf("a reader with no tenant: %d rows, %d reads, %d markers; want only the two markers", len(got), reads, len(markers))
	}
}
