package replication

// The snapshot nemesis: snapshots of a table while writers change its rows
// and a DDL driver changes the table itself. See TestSnapshotNemesis.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// TestSnapshotNemesis snapshots a table of each key shape while two writers
// insert, update (keys too) and delete rows around the table's key range —
// half of them, where the key order follows the row numbers, among the
// rows the snapshot reads next — and one connection applies random DDL
// every 100-300 ms: rewriting type changes (v int <-> bigint, s text <->
// varchar(200)), ADD COLUMN (a constant default, a volatile one that
// rewrites the table, none), DROP COLUMN, RENAME COLUMN, REPLICA IDENTITY
// changes, TRUNCATE (with or without rows inserted again in the same
// transaction), DROP TABLE and CREATE again (added to the publication and
// filled again in the same transaction), and for the partitioned shape
// DETACH and ATTACH of its middle partition. A DDL transaction may hold
// its locks for up to 150 ms after its statements, as a migration doing
// more work does. The key
// columns (and the replica identity index) are never altered; DDL changes
// only v, s and the other columns (c0 and c1, there from the table's
// creation, and those it adds), and never gives a column a name used
// before in the same table.
//
// Every DDL transaction also commits a transactional logical message
// (prefix walcast.nemesis, journaled as op "message") with its statements,
// the table's columns after it, and what it did that no stream can carry,
// so the journal itself says where, between the row changes and the reads,
// each DDL took effect.
//
// Once the DDL and the writes stop, the snapshot must reach a final status,
// and keep it (a status seen done or failed never changes, and a done
// snapshot has no error):
//
//   - failed: its error says "fix:" and does not blame --where (none was
//     given); a new snapshot with nothing running against the table must
//     then end done, and is the one checked below;
//   - done: checked below;
//   - anything else fails the test.
//
// The journal is then rebuilt from its first entry, as a consumer applying
// entries in seq order with no knowledge of the DDL does, keyed by columns
// every change of a row carries (the primary key; the replica identity
// index where that differs from it): read, insert and update put the row
// (an update whose "before" holds the key removes the old key first),
// delete removes the key, truncate empties the table. A row's value is its
// last entry's "after", as a whole. The test asserts:
//
//  1. Every insert and update, and every read of the checked snapshot,
//     carries exactly the columns the table had at its place in the
//     stream: a read journaled after an ADD, DROP or RENAME COLUMN that
//     did not see it is wrong, whenever its SELECT ran.
//  2. At the checked snapshot's snapshot-end, every row the journal holds
//     has every column the table had at that point. walcast journals no
//     schema change, so a row read before an ADD or RENAME COLUMN and not
//     changed since cannot be completed by a consumer: a snapshot that
//     ends done across such DDL must have read the row again after it (or
//     it must fail, with the fix). A column the table no longer has may
//     remain in a row (a consumer cannot be told it is gone).
//  3. After everything stopped, the journal holds exactly the table's keys,
//     and for each row every column it holds that the table also has is
//     equal to the table's value (values compared in printed form, as
//     tableValidator does).
//
// Three changes cannot be carried by any stream — logical decoding sends
// nothing for DROP TABLE, DETACH PARTITION or ATTACH PARTITION — so the
// rebuild applies them from the DDL's message, as a consumer told of them
// would: DROP TABLE empties the rebuilt table, DETACH removes the
// partition's key range. ATTACH adds the partition's rows (as of the
// ATTACH) only when it comes after the checked snapshot's snapshot-end;
// before it, rows that appear without an event are the snapshot's to read.
// DDL after the snapshot-end is otherwise not the snapshot's concern: item
// 2 is checked at the snapshot-end, and item 3 compares only the columns
// both sides have.
//
// Each shape runs with one chunk size (1, 7 or 4096) chosen from the seed,
// with --snapshot-max-rows-per-second set so the snapshot lasts about as
// long as the DDL runs. WALCAST_NEMESIS_SEED fixes the seed (the test logs
// the one it used); WALCAST_NEMESIS_RUNS=N runs N rounds per shape, each on
// a fresh database, rotating the chunk size.
func TestSnapshotNemesis(t *testing.T) {
	seed := time.Now().UnixNano() % 1_000_000_000
	if s := os.Getenv("WALCAST_NEMESIS_SEED"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("WALCAST_NEMESIS_SEED=%q: %v", s, err)
		}
		seed = n
	}
	runs := 1
	if s := os.Getenv("WALCAST_NEMESIS_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("WALCAST_NEMESIS_RUNS=%q: want a positive number of rounds per shape", s)
		}
		runs = n
	}
	t.Logf("WALCAST_NEMESIS_SEED=%d WALCAST_NEMESIS_RUNS=%d", seed, runs)
	chunks := []int{1, 7, 4096}
	for i, sh := range nemesisShapes() {
		t.Run(sh.name, func(t *testing.T) {
			for r := range runs {
				runSeed := seed + int64(i)*1_000_003 + int64(r)*7_919
				chunk := chunks[int((seed%3+int64(i)+int64(r))%3)]
				t.Run(fmt.Sprintf("round%d-chunk%d", r, chunk), func(t *testing.T) {
					t.Logf("reproduce with WALCAST_NEMESIS_SEED=%d (shape %s, round %d, chunk size %d, seed of this round %d)", seed, sh.name, r, chunk, runSeed)
					runNemesis(t, sh, chunk, runSeed)
				})
			}
		})
	}
}

// nemesisTable is the table every shape creates, in schema public.
const (
	nemesisTable   = "nem"
	nemesisEntity  = "public.nem"
	nemesisPrefix  = "walcast.nemesis"
	nemesisRunTime = 4 * time.Second // how long the writers and the DDL driver run
)

// nemesisShape is a table shape: its key, how rows are numbered, and the
// replica identities the DDL driver may switch between.
type nemesisShape struct {
	name string
	// create returns the statements that create an empty public.nem of rows
	// rows: the key columns, then v int, s text and the first two added
	// columns (c0 and c1, int), there before the snapshot starts.
	create func(rows int) []string
	ident  string   // the replica identity it is created with
	idents []string // those the DDL driver may set (none: it sets none)
	key    []string // the rebuild's key: columns every change of a row carries
	// Row number @ (an integer): cols are the columns INSERT gives besides v
	// and s, vals their values, pred selects the row, and each of moves is
	// a SET clause that gives a row row number @'s key.
	cols, vals, pred string
	moves            []string
	partitioned      bool // PARTITION BY RANGE (id) in three partitions; nem_p1 is the middle one
	// near gives the row numbers the row of chunk key k may have (the
	// snapshot's position, as journaled), and the step between the numbers
	// of rows next in key order; nil when the key order does not follow
	// the numbers.
	near func(k []string) (ns []int, step int)
}

// nearInt: the chunk key is the row number (or the key's column col is).
func nearInt(col int) func([]string) ([]int, int) {
	return func(k []string) ([]int, int) {
		if len(k) <= col {
			return nil, 0
		}
		n, err := strconv.Atoi(k[col])
		if err != nil {
			return nil, 0
		}
		return []int{n}, 1
	}
}

// at replaces @ in tmpl with n.
func at(tmpl string, n string) string { return strings.ReplaceAll(tmpl, "@", "("+n+")") }

// partRange is the key range of the partitioned shape's middle partition.
func partRange(rows int) (lo, hi int) {
	m := max(2, rows/3)
	return m, 2 * m
}

func nemesisShapes() []nemesisShape {
	plain := func(def string, more ...string) func(int) []string {
		return func(int) []string {
			return append([]string{"CREATE TABLE nem (" + def + ", v int, s text, c0 int, c1 int)"}, more...)
		}
	}
	pkIdents := []string{"DEFAULT", "FULL", "USING INDEX nem_pkey"}
	textKey := `chr(65 + (@ * 7) % 26 + 32 * (@ % 2)) || lpad((@)::text, 6, '0')` // mixed case: "C" order differs from a linguistic one
	return []nemesisShape{
		{name: "int-pk", create: plain("id int PRIMARY KEY"), ident: "DEFAULT", idents: pkIdents, key: []string{"id"},
			cols: "id", vals: "@", pred: "id = @", moves: []string{"id = @"}, near: nearInt(0)},
		{name: "text-collate-c-pk", create: plain(`k text COLLATE "C" PRIMARY KEY`), ident: "DEFAULT", idents: pkIdents, key: []string{"k"},
			cols: "k", vals: textKey, pred: "k = " + textKey, moves: []string{"k = " + textKey}},
		{name: "uuid-pk", create: plain("id uuid PRIMARY KEY"), ident: "DEFAULT", idents: pkIdents, key: []string{"id"},
			cols: "id", vals: "md5('k' || @)::uuid", pred: "id = md5('k' || @)::uuid", moves: []string{"id = md5('k' || @)::uuid"}},
		{name: "composite-pk", create: plain("org text, id int, PRIMARY KEY (org, id)"), ident: "DEFAULT", idents: pkIdents, key: []string{"org", "id"},
			cols: "org, id", vals: "'o' || (@ % 5), @", pred: "(org, id) = ('o' || (@ % 5), @)", moves: []string{"(org, id) = ('o' || (@ % 5), @)", "id = @"},
			near: func(k []string) ([]int, int) { ns, _ := nearInt(1)(k); return ns, 5 }},
		// The primary key is id, the replica identity the unique index on u:
		// deletes and key changes carry u only, so u is the rebuild's key
		// (and must be the snapshot's chunk key).
		{name: "replica-identity-index", create: plain("id int PRIMARY KEY, u int NOT NULL", "CREATE UNIQUE INDEX nem_u ON nem (u)"),
			ident: "USING INDEX nem_u", idents: []string{"USING INDEX nem_u", "FULL"}, key: []string{"u"},
			cols: "id, u", vals: "@, @ * 3", pred: "id = @", moves: []string{"id = @", "u = @ * 3 + 1"},
			near: func(k []string) ([]int, int) { // the chunk key is id or u
				ns, _ := nearInt(0)(k)
				if len(ns) == 1 {
					ns = append(ns, ns[0]/3)
				}
				return ns, 1
			}},
		{name: "replica-identity-full", create: plain("id int PRIMARY KEY"), ident: "FULL", idents: pkIdents, key: []string{"id"},
			cols: "id", vals: "@", pred: "id = @", moves: []string{"id = @"}, near: nearInt(0)},
		{name: "partitioned", partitioned: true, key: []string{"id"}, cols: "id", vals: "@", pred: "id = @", moves: []string{"id = @"}, near: nearInt(0),
			create: func(rows int) []string {
				lo, hi := partRange(rows)
				return []string{
					`CREATE TABLE nem (id int, v int, s text, c0 int, c1 int, PRIMARY KEY (id)) PARTITION BY RANGE (id)`,
					fmt.Sprintf(`CREATE TABLE nem_p0 PARTITION OF nem FOR VALUES FROM (MINVALUE) TO (%d)`, lo),
					fmt.Sprintf(`CREATE TABLE nem_p1 PARTITION OF nem FOR VALUES FROM (%d) TO (%d)`, lo, hi),
					fmt.Sprintf(`CREATE TABLE nem_p2 PARTITION OF nem FOR VALUES FROM (%d) TO (MAXVALUE)`, hi),
				}
			}},
	}
}

// createSQL creates the shape's table with its replica identity.
func (sh nemesisShape) createSQL(rows int) []string {
	out := sh.create(rows)
	if sh.ident != "" && sh.ident != "DEFAULT" {
		out = append(out, "ALTER TABLE nem REPLICA IDENTITY "+sh.ident)
	}
	return out
}

// fillSQL inserts rows 1..rows (valuing v from base), skipping the key range
// skipLo..skipHi-1 when skipHi > skipLo; c0 and c1 too when created is
// set (the table is as createSQL makes it).
func (sh nemesisShape) fillSQL(rows, base int, tag string, skipLo, skipHi int, created bool) string {
	cols, vals := "v, s", fmt.Sprintf("%d + g, '%s' || g", base, tag)
	if created {
		cols, vals = cols+", c0, c1", vals+", g % 13, g % 17"
	}
	q := fmt.Sprintf(`INSERT INTO nem (%s, %s) SELECT %s, %s FROM generate_series(1, %d) g`,
		sh.cols, cols, at(sh.vals, "g"), vals, rows)
	if skipHi > skipLo {
		q += fmt.Sprintf(` WHERE NOT (g >= %d AND g < %d)`, skipLo, skipHi)
	}
	return q + " ON CONFLICT DO NOTHING"
}

// nemesisSize is the table's rows and the row rate that makes a snapshot of
// it in chunks of chunk rows last about nemesisRunTime.
func nemesisSize(chunk int) (rows, rate int) {
	switch {
	case chunk == 1:
		rows = 400
	case chunk < 100:
		rows = 2000
	default:
		rows = 10000
	}
	return rows, int(float64(rows) / nemesisRunTime.Seconds())
}

// simpleConn connects with the simple protocol: DDL and DML built as text
// need no prepared statements, and no cached plan outlives a DDL.
func simpleConn(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	c, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func runNemesis(t *testing.T, sh nemesisShape, chunk int, seed int64) {
	rows, rate := nemesisSize(chunk)
	setup := sh.createSQL(rows)
	setup = append(setup, sh.fillSQL(rows, 0, "s", 0, 0, true),
		`ALTER PUBLICATION pub SET (publish_via_partition_root = true)`,
		`ALTER PUBLICATION pub ADD TABLE nem`)
	f := newFixture(t, setup...)
	cfg := f.config()
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg.SnapshotMaxRowsPerSecond = rate
	run := f.start(cfg)
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	cols0 := tableColumns(t, f.url)

	ctx := context.Background()
	id, err := f.j.RequestSnapshot(ctx, journal.SnapshotRequest{Schema: "public", Table: nemesisTable, ChunkSize: chunk})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the snapshot to start", 30*time.Second, func() bool {
		s, err := f.j.SnapshotByID(ctx, id)
		return err == nil && s.Status != journal.SnapshotPending
	})

	// The writers and the DDL driver, until nemesisRunTime has passed or
	// the snapshot is final.
	rnd := rand.New(rand.NewSource(seed))
	dctx, stopDrivers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stats := &dmlStats{errs: map[string]int{}}
	var pos atomic.Pointer[[]string] // the snapshot's last journaled key, for the writers
	for w := range 2 {
		conn := simpleConn(t, f.url)
		wseed := rnd.Int63()
		wg.Add(1)
		go func() {
			defer wg.Done()
			runDML(dctx, conn, sh, rows, chunk, &pos, rand.New(rand.NewSource(wseed)), w, stats)
		}()
	}
	ddl := &ddlDriver{sh: sh, rows: rows, rnd: rand.New(rand.NewSource(rnd.Int63())), conn: simpleConn(t, f.url), ident: sh.ident, began: time.Now(),
		extras: []string{"c0", "c1"}, nextCol: 2}
	if _, err := ddl.conn.Exec(ctx, `SET lock_timeout = '3s'`); err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		ddl.run(dctx)
	}()
	began := time.Now()
	var s journal.Snapshot
	firstFinal := "" // the first final status seen
	for time.Since(began) < nemesisRunTime {
		if s, err = f.j.SnapshotByID(ctx, id); err != nil {
			stopDrivers()
			wg.Wait()
			t.Fatal(err)
		}
		if s.LastKey != nil {
			k := slices.Clone(s.LastKey)
			pos.Store(&k)
		}
		if s.Status != journal.SnapshotRunning && s.Status != journal.SnapshotPending {
			firstFinal = s.Status + " (" + s.Error + ")"
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopDrivers()
	wg.Wait()
	drove := time.Since(began)
	s = waitSnapshot(t, f, id, 120*time.Second)
	if firstFinal == "" {
		firstFinal = s.Status + " (" + s.Error + ")"
	}
	// A final status is final, and only a failure has an error.
	if got := s.Status + " (" + s.Error + ")"; got != firstFinal {
		t.Errorf("snapshot %d was %s, then %s", id, firstFinal, got)
	}
	if s.Status == journal.SnapshotDone && s.Error != "" {
		t.Errorf("snapshot %d is done with an error: %q", id, s.Error)
	}

	applied, failed := ddl.summary()
	t.Logf("shape %s, chunk size %d, %d rows, seed %d: writers ran %s: %d statements (errors %v); DDL: %d applied, %d failed; snapshot %d %s after %d chunks, %d reads, error %q",
		sh.name, chunk, rows, seed, drove.Round(time.Millisecond), stats.ok, stats.errs, applied, failed, id, s.Status, s.Chunks, s.Rows, s.Error)
	for _, r := range ddl.log {
		if r.err != nil {
			t.Logf("  DDL #%d at %s (held %s): %s: ERROR %v", r.n, r.at.Round(time.Millisecond), r.hold, r.sql, r.err)
		} else {
			t.Logf("  DDL #%d at %s (held %s): %s", r.n, r.at.Round(time.Millisecond), r.hold, r.sql)
		}
	}
	if stats.fatal != nil {
		t.Fatalf("a writer failed: %v", stats.fatal)
	}
	if len(ddl.log) >= 3 && applied == 0 {
		t.Fatalf("the DDL driver applied none of its %d statements", len(ddl.log))
	}

	checked := id
	switch s.Status {
	case journal.SnapshotDone:
	case journal.SnapshotFailed:
		if !strings.Contains(s.Error, "fix:") {
			t.Errorf("snapshot %d failed without a fix: %q", id, s.Error)
		}
		if strings.Contains(s.Error, "--where") {
			t.Errorf("snapshot %d (asked for with no --where) failed blaming --where: %q", id, s.Error)
		}
		// Snapshot again, with nothing running against the table.
		checked, err = f.j.RequestSnapshot(ctx, journal.SnapshotRequest{Schema: "public", Table: nemesisTable, ChunkSize: chunk})
		if err != nil {
			t.Fatal(err)
		}
		again := waitSnapshot(t, f, checked, 120*time.Second)
		t.Logf("snapshot %d, asked for after the failure with no DDL running: %s after %d chunks, %d reads, error %q",
			checked, again.Status, again.Chunks, again.Rows, again.Error)
		if again.Status != journal.SnapshotDone {
			t.Fatalf("the new snapshot, with no DDL running, ended %s: %s", again.Status, again.Error)
		}
	default:
		t.Fatalf("snapshot %d ended %s (%s); want done, or failed with a fix", id, s.Status, s.Error)
	}

	es := caughtUp(t, f, fmt.Sprintf("after-nemesis-%d", seed))
	for _, sid := range []int64{id, checked} {
		if again, err := f.j.SnapshotByID(ctx, sid); err != nil || again.Status == journal.SnapshotRunning || again.Status == journal.SnapshotPending {
			t.Errorf("snapshot %d, once final, is now %s (%v)", sid, again.Status, err)
		}
	}
	v := tableValidator{entity: nemesisEntity, key: sh.key}
	src := v.source(t, f.url, nemesisTable, "")
	c := nemesisCheck{entity: nemesisEntity, key: sh.key, cols: cols0, snapshot: checked}
	problems, compared := c.check(es, src)
	t.Logf("checked snapshot %d: %d rows of the table compared with the journal (%d entries)", checked, compared, len(es))
	var report []string
	for _, kind := range problemKinds {
		if ps := problems[kind]; len(ps) > 0 {
			report = append(report, fmt.Sprintf("%d × %s, first:\n      %s", len(ps), kind, strings.Join(ps[:min(3, len(ps))], "\n      ")))
		}
	}
	if len(report) > 0 {
		t.Errorf("shape %s, chunk size %d, seed %d: the journal does not rebuild the table:\n  %s", sh.name, chunk, seed, strings.Join(report, "\n  "))
	}
}

// tableColumns lists nem's columns in attribute order.
func tableColumns(t *testing.T, url string) []string {
	t.Helper()
	conn := testConn(t, url)
	var cols []string
	if err := conn.QueryRow(context.Background(), `SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute
		WHERE attrelid = 'public.nem'::regclass AND attnum > 0 AND NOT attisdropped`).Scan(&cols); err != nil {
		t.Fatal(err)
	}
	return cols
}

// dmlStats counts the writers' statements. mu guards the following fields.
type dmlStats struct {
	mu    sync.Mutex
	ok    int
	errs  map[string]int // SQLSTATE → statements that failed with it (expected ones)
	fatal error          // the first unexpected failure
}

// dmlExpected are the failures a writer expects: a key taken (insert or key
// change), a key with no partition (the middle one detached), a deadlock
// between two key changes, and a serialization failure when a concurrent
// key change moved the row to another partition. Each statement runs alone,
// so a failed one changed nothing.
var dmlExpected = map[string]bool{"23505": true, "23514": true, "40P01": true, "40001": true}

// runDML inserts, updates (key changes too) and deletes rows numbered
// 1..rows+rows/5 until ctx ends; half of them, where the shape tells, among
// the rows the snapshot reads next (the three chunks after its position),
// where a change lands inside a chunk's window.
func runDML(ctx context.Context, conn *pgx.Conn, sh nemesisShape, rows, chunk int, pos *atomic.Pointer[[]string], rnd *rand.Rand, w int, st *dmlStats) {
	maxN := rows + rows/5
	pick := func() int {
		if k := pos.Load(); k != nil && sh.near != nil && rnd.Intn(2) == 0 {
			if ns, step := sh.near(*k); len(ns) > 0 {
				return max(1, ns[rnd.Intn(len(ns))]+step*rnd.Intn(3*chunk+1))
			}
		}
		return 1 + rnd.Intn(maxN)
	}
	for i := 0; ctx.Err() == nil; i++ {
		n := strconv.Itoa(pick())
		var q string
		switch rnd.Intn(6) {
		case 0, 1:
			q = fmt.Sprintf(`INSERT INTO nem (%s, v, s) VALUES (%s, %d, 'i%d-%d') ON CONFLICT DO NOTHING`, sh.cols, at(sh.vals, n), rnd.Intn(1000), w, i)
		case 2, 3:
			q = fmt.Sprintf(`UPDATE nem SET v = v + 1, s = 'u%d-%d' WHERE %s`, w, i, at(sh.pred, n))
		case 4:
			to := strconv.Itoa(pick())
			q = fmt.Sprintf(`UPDATE nem SET %s, s = 'm%d-%d' WHERE %s`, at(sh.moves[rnd.Intn(len(sh.moves))], to), w, i, at(sh.pred, n))
		case 5:
			q = `DELETE FROM nem WHERE ` + at(sh.pred, n)
		}
		_, err := conn.Exec(ctx, q)
		if ctx.Err() != nil {
			return
		}
		st.mu.Lock()
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			st.ok++
		case errors.As(err, &pgErr) && dmlExpected[pgErr.Code]:
			st.errs[pgErr.Code]++
		default:
			if st.fatal == nil {
				st.fatal = fmt.Errorf("%s: %w", q, err)
			}
			st.mu.Unlock()
			return
		}
		st.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
	}
}

// ddlRecord is one DDL transaction the driver ran.
type ddlRecord struct {
	n    int
	at   time.Duration // since the driver started
	sql  string
	hold time.Duration // how long it held its locks after its statements
	err  error
}

// ddlDriver applies random DDL to nem, one transaction at a time. Its
// fields are owned by run.
type ddlDriver struct {
	sh    nemesisShape
	rows  int
	rnd   *rand.Rand
	conn  *pgx.Conn
	began time.Time

	extras   []string // added columns the table has now (c0 and c1 from its creation)
	nextCol  int      // the next added or renamed column is c<nextCol>; never a name used before
	vBig     bool     // v is bigint
	sVarchar bool     // s is varchar(200)
	detached bool     // nem_p1 is detached (partitioned shape)
	ident    string   // the replica identity now

	log []ddlRecord
}

func (d *ddlDriver) summary() (applied, failed int) {
	for _, r := range d.log {
		if r.err != nil {
			failed++
		} else {
			applied++
		}
	}
	return applied, failed
}

// marker is what each DDL transaction commits besides its statements; the
// columns are read in the transaction, after the DDL.
const ddlMarkerSQL = `SELECT pg_logical_emit_message(true, 'walcast.nemesis', json_build_object(
	'n', %d, 'ddl', %s,
	'cols', (SELECT json_agg(attname ORDER BY attnum) FROM pg_attribute WHERE attrelid = 'public.nem'::regclass AND attnum > 0 AND NOT attisdropped),
	'reset', %t, 'detachLo', %d, 'detachHi', %d,
	'attach', %s)::text)`

// nemesisMarker is the content of a DDL transaction's message.
type nemesisMarker struct {
	N        int                          `json:"n"`
	DDL      string                       `json:"ddl"`
	Cols     []string                     `json:"cols"`
	Reset    bool                         `json:"reset"`    // DROP TABLE: every row gone
	DetachLo int                          `json:"detachLo"` // DETACH: keys detachLo..detachHi-1 gone
	DetachHi int                          `json:"detachHi"`
	Attach   []map[string]json.RawMessage `json:"attach"` // ATTACH: the partition's rows
}

func (d *ddlDriver) run(ctx context.Context) {
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(100+d.rnd.Intn(200)) * time.Millisecond):
		}
		d.step(ctx)
	}
}

// also applies stmt to the detached partition too, so it can be attached
// again.
func (d *ddlDriver) also(stmt string) []string {
	out := []string{"ALTER TABLE nem " + stmt}
	if d.detached {
		out = append(out, "ALTER TABLE nem_p1 "+stmt)
	}
	return out
}

// step runs one random DDL transaction and records it.
func (d *ddlDriver) step(ctx context.Context) {
	var stmts []string
	var after func() // applied to the driver's state on success
	reset, detachLo, detachHi, attach := false, 0, 0, false
	var fill string // rows inserted in the same transaction, after the message
	lo, hi := partRange(d.rows)
	for stmts == nil {
		switch k := d.rnd.Intn(20); {
		case k < 4: // a rewriting type change of v
			typ := "bigint"
			if d.vBig {
				typ = "integer"
			}
			stmts, after = d.also("ALTER COLUMN v TYPE "+typ), func() { d.vBig = !d.vBig }
		case k < 5:
			typ := "varchar(200)"
			if d.sVarchar {
				typ = "text"
			}
			stmts, after = d.also("ALTER COLUMN s TYPE "+typ), func() { d.sVarchar = !d.sVarchar }
		case k < 8:
			name := fmt.Sprintf("c%d", d.nextCol)
			d.nextCol++
			def := []string{" DEFAULT 7", " DEFAULT (random() * 1000)::int", ""}[d.rnd.Intn(3)]
			stmts, after = d.also("ADD COLUMN "+name+" int"+def), func() { d.extras = append(d.extras, name) }
		case k < 10:
			if len(d.extras) == 0 {
				continue
			}
			i := d.rnd.Intn(len(d.extras))
			stmts, after = d.also("DROP COLUMN "+d.extras[i]), func() { d.extras = slices.Delete(d.extras, i, i+1) }
		case k < 12:
			if len(d.extras) == 0 {
				continue
			}
			i := d.rnd.Intn(len(d.extras))
			name := fmt.Sprintf("c%d", d.nextCol)
			d.nextCol++
			stmts, after = d.also("RENAME COLUMN "+d.extras[i]+" TO "+name), func() { d.extras[i] = name }
		case k < 14:
			var other []string
			for _, id := range d.sh.idents {
				if id != d.ident {
					other = append(other, id)
				}
			}
			if len(other) == 0 {
				continue
			}
			id := other[d.rnd.Intn(len(other))]
			stmts, after = []string{"ALTER TABLE nem REPLICA IDENTITY " + id}, func() { d.ident = id }
		case k < 15:
			stmts = []string{"TRUNCATE nem"}
			if d.rnd.Intn(3) > 0 {
				skipLo, skipHi := 0, 0
				if d.detached {
					skipLo, skipHi = lo, hi
				}
				fill = d.sh.fillSQL(d.rows, 200000, "t", skipLo, skipHi, false)
			}
		case k < 16:
			stmts = []string{"DROP TABLE nem"}
			if d.detached {
				stmts = append(stmts, "DROP TABLE nem_p1")
			}
			stmts = append(stmts, d.sh.createSQL(d.rows)...)
			stmts = append(stmts, "ALTER PUBLICATION pub ADD TABLE nem")
			reset = true
			fill = d.sh.fillSQL(d.rows, 100000, "r", 0, 0, true)
			after = func() {
				d.extras, d.vBig, d.sVarchar, d.detached, d.ident = []string{"c0", "c1"}, false, false, false, d.sh.ident
			}
		default:
			if !d.sh.partitioned {
				continue
			}
			if d.detached {
				stmts = []string{fmt.Sprintf("ALTER TABLE nem ATTACH PARTITION nem_p1 FOR VALUES FROM (%d) TO (%d)", lo, hi)}
				attach = true
			} else {
				stmts = []string{"ALTER TABLE nem DETACH PARTITION nem_p1"}
				detachLo, detachHi = lo, hi
			}
			after = func() { d.detached = !d.detached }
		}
	}
	rec := ddlRecord{n: len(d.log) + 1, at: time.Since(d.began), sql: strings.Join(stmts, "; ")}
	if fill != "" {
		rec.sql += "; then " + fill
	}
	if d.rnd.Intn(2) == 0 {
		rec.hold = time.Duration(d.rnd.Intn(150)) * time.Millisecond
	}
	attachSQL := "NULL::json"
	if attach {
		attachSQL = "(SELECT coalesce(json_agg(row_to_json(p)), '[]') FROM public.nem_p1 p)"
	}
	q := append([]string{"BEGIN"}, stmts...)
	q = append(q, fmt.Sprintf(ddlMarkerSQL, rec.n, pgxQuote(rec.sql), reset, detachLo, detachHi, attachSQL))
	if fill != "" {
		q = append(q, fill)
	}
	if rec.hold > 0 {
		q = append(q, fmt.Sprintf("SELECT pg_sleep(%f)", rec.hold.Seconds()))
	}
	q = append(q, "COMMIT")
	// Not cut short by ctx: a DDL transaction runs to its end.
	bg := context.WithoutCancel(ctx)
	for _, s := range q {
		if _, err := d.conn.Exec(bg, s); err != nil {
			rec.err = err
			_, _ = d.conn.Exec(bg, "ROLLBACK")
			break
		}
	}
	if rec.err == nil && after != nil {
		after()
	}
	d.log = append(d.log, rec)
}

// nemesisCheck rebuilds a table from the journal and checks it against the
// table; see TestSnapshotNemesis for what it asserts.
type nemesisCheck struct {
	entity   string
	key      []string // the rebuild's key columns
	cols     []string // the table's columns at the journal's first entry
	snapshot int64    // the snapshot whose snapshot-end the journal must be whole at
}

// nemesisRow is a row of the rebuilt table: its values (printed, as
// normalize gives them) and the entry that put it.
type nemesisRow struct {
	vals map[string]any
	seq  int64
	op   decoder.Op
}

func colSet(row map[string]json.RawMessage) []string {
	out := make([]string, 0, len(row))
	for c := range row {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// problemKinds are the kinds of problem check reports, in the order it
// reports them.
var problemKinds = []string{
	"read with other columns than the table had",             // item 1, reads
	"insert or update with other columns than the table had", // item 1, changes
	"row lacking a column at the snapshot-end",               // item 2
	"row missing from the journal",                           // item 3
	"row in the journal but not in the table",                // item 3
	"value differing from the table's",                       // item 3
	"malformed journal",
}

// check rebuilds the table from es and returns what is wrong, by kind
// (problemKinds), and how many of src's rows it compared.
func (c nemesisCheck) check(es []journal.Entry, src map[string]map[string]any) (problems map[string][]string, compared int) {
	problems = map[string][]string{}
	add := func(kind int, format string, args ...any) {
		problems[problemKinds[kind]] = append(problems[problemKinds[kind]], fmt.Sprintf(format, args...))
	}
	cols := slices.Sorted(slices.Values(c.cols))
	origin := map[string]string{} // column → the DDL that gave the table that column name
	// differ says how an entry's columns differ from the table's.
	differ := func(got []string) string {
		var out []string
		for _, col := range cols {
			if !slices.Contains(got, col) {
				out = append(out, fmt.Sprintf("lacks %s (from %s)", col, cmp.Or(origin[col], "the start")))
			}
		}
		for _, col := range got {
			if !slices.Contains(cols, col) {
				out = append(out, "has "+col+", which the table no longer has")
			}
		}
		return strings.Join(out, ", ")
	}
	state := map[string]nemesisRow{}
	inSnap, ended := false, false
	for _, e := range es {
		var env decoder.Envelope
		if err := json.Unmarshal(e.Envelope, &env); err != nil {
			add(6, "seq %d: envelope is not JSON: %v", e.Seq, err)
			continue
		}
		if env.Op == decoder.OpMessage && env.Prefix == nemesisPrefix {
			var m nemesisMarker
			if err := json.Unmarshal(env.Content, &m); err != nil {
				add(6, "seq %d: DDL message %s: %v", e.Seq, env.Content, err)
				continue
			}
			if m.Reset {
				clear(state)
			}
			if m.DetachHi > m.DetachLo {
				for k := range state {
					if n, err := strconv.Atoi(k); err == nil && n >= m.DetachLo && n < m.DetachHi {
						delete(state, k)
					}
				}
			}
			if m.Attach != nil && ended {
				for _, r := range m.Attach {
					if k, ok := keyOf(r, c.key); ok {
						state[k] = nemesisRow{vals: normalize(r), seq: e.Seq, op: "attach"}
					}
				}
			}
			ddl := fmt.Sprintf("DDL #%d at seq %d: %.160s", m.N, e.Seq, m.DDL)
			for _, col := range m.Cols {
				if m.Reset || !slices.Contains(cols, col) {
					origin[col] = ddl
				}
			}
			cols = slices.Sorted(slices.Values(m.Cols))
			continue
		}
		if e.Entity != c.entity {
			continue
		}
		switch env.Op {
		case decoder.OpRead, decoder.OpInsert, decoder.OpUpdate:
			if got := colSet(env.After); !slices.Equal(got, cols) {
				switch {
				case env.Op != decoder.OpRead:
					add(1, "seq %d: %s of key %s carries columns %v, the table had %v there: it %s", e.Seq, env.Op, keyText(env.After, c.key), got, cols, differ(got))
				case inSnap:
					add(0, "seq %d: read of key %s carries columns %v, the table had %v there: it %s", e.Seq, keyText(env.After, c.key), got, cols, differ(got))
				}
			}
			if env.Op == decoder.OpUpdate && env.Before != nil {
				if k, ok := keyOf(env.Before, c.key); ok {
					delete(state, k)
				}
			}
			k, ok := keyOf(env.After, c.key)
			if !ok {
				add(6, "seq %d: %s without the key columns %v: %s", e.Seq, env.Op, c.key, e.Envelope)
				continue
			}
			state[k] = nemesisRow{vals: normalize(env.After), seq: e.Seq, op: env.Op}
		case decoder.OpDelete:
			k, ok := keyOf(env.Key, c.key)
			if !ok {
				k, ok = keyOf(env.Before, c.key)
			}
			if !ok {
				add(6, "seq %d: delete without the key columns %v: %s", e.Seq, c.key, e.Envelope)
				continue
			}
			delete(state, k)
		case decoder.OpTruncate:
			clear(state)
		case decoder.OpSnapshotBegin, decoder.OpSnapshotEnd:
			var m snapshotEnd
			_ = json.Unmarshal(e.Envelope, &m)
			if m.Snapshot.ID != c.snapshot {
				continue
			}
			if env.Op == decoder.OpSnapshotBegin {
				inSnap = true
				continue
			}
			if ended {
				add(6, "seq %d: a second snapshot-end of snapshot %d", e.Seq, c.snapshot)
				continue
			}
			inSnap, ended = false, true
			var keys []string
			for k := range state {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				r := state[k]
				for _, col := range cols {
					if _, has := r.vals[col]; !has {
						add(2, "at the snapshot-end (seq %d), key %s lacks column %s (from %s); its last entry: seq %d, %s", e.Seq, k, col, cmp.Or(origin[col], "the start"), r.seq, r.op)
					}
				}
			}
		}
	}
	if !ended {
		add(6, "no snapshot-end of snapshot %d in the journal", c.snapshot)
	}
	keys := make([]string, 0, len(src))
	for k := range src {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		want := src[k]
		got, ok := state[k]
		if !ok {
			add(3, "key %s (table %v)", k, want)
			continue
		}
		compared++
		for _, col := range slices.Sorted(maps.Keys(want)) {
			if g, has := got.vals[col]; has && g != want[col] {
				add(5, "key %s column %s: journal %v (seq %d, %s), table %v", k, col, g, got.seq, got.op, want[col])
			}
		}
	}
	keys = keys[:0]
	for k := range state {
		if _, ok := src[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		got := state[k]
		add(4, "key %s (seq %d, %s: %v)", k, got.seq, got.op, got.vals)
	}
	return problems, compared
}

func keyText(row map[string]json.RawMessage, cols []string) string {
	k, ok := keyOf(row, cols)
	if !ok {
		return "(none)"
	}
	return k
}
