package replication

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
	"github.com/walcast/walcast/journal/journaltest"
)

var testSecret = []byte("replication-test-cursor-secret!!")

// fixture is a source database with a publication and a journal in it.
type fixture struct {
	t   *testing.T
	url string
	j   *journal.Journal
}

func newFixture(t *testing.T, setup ...string) *fixture {
	t.Helper()
	return newFixtureOn(t, pgtest.NewDatabase(t), setup...)
}

// newFixtureOn sets up the fixture in the database at url.
func newFixtureOn(t *testing.T, url string, setup ...string) *fixture {
	t.Helper()
	execSQL(t, url, append([]string{
		`CREATE TABLE items (id int PRIMARY KEY, val text, n int)`,
		`CREATE TABLE other (id int PRIMARY KEY, val text)`,
		`CREATE TABLE unpublished (id serial PRIMARY KEY, pad text)`,
		`CREATE PUBLICATION pub FOR TABLE items, other`,
	}, setup...)...)
	j, err := journal.Open(context.Background(), journal.Config{URL: url, CursorSecret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Close)
	return &fixture{t: t, url: url, j: j}
}

func (f *fixture) config() Config {
	return Config{
		DatabaseURL: f.url, Publication: "pub", Slot: "walcast", Standby: true,
		StandbyPoll: 100 * time.Millisecond, BackoffBase: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
		StatusInterval: time.Second,
		Logger:         slog.New(slog.NewTextHandler(testWriter{f.t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// running is a Replicator running in a goroutine the test owns.
type running struct {
	r      *Replicator
	cancel context.CancelFunc
	done   chan error
}

func (f *fixture) start(cfg Config) *running {
	f.t.Helper()
	r, err := New(cfg, f.j)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { run.done <- r.Run(ctx) }()
	f.t.Cleanup(func() { run.stop(f.t) })
	return run
}

// stop cancels the replicator and waits for Run to return.
func (run *running) stop(t *testing.T) error {
	t.Helper()
	run.cancel()
	select {
	case err, ok := <-run.done:
		if ok {
			close(run.done)
		}
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("replicator did not stop within 30s")
	}
	return nil
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// entries reads the whole journal in seq order.
func (f *fixture) entries() []journal.Entry {
	f.t.Helper()
	var all []journal.Entry
	q := journal.Query{FromOldest: true, AllTenants: true, Limit: journal.MaxLimit}
	for {
		res, err := f.j.Changes(context.Background(), q)
		if err != nil {
			f.t.Fatal(err)
		}
		if res.ResyncRequired {
			f.t.Fatalf("unexpected resync reading the journal: %s", res.Reason)
		}
		all = append(all, res.Changes...)
		if len(res.Changes) == 0 {
			return all
		}
		q = journal.Query{Cursor: res.Cursor, AllTenants: true, Limit: journal.MaxLimit}
	}
}

// changeID names a change for the validator: op, entity and key (or, for a
// truncate, the transaction's xid-free marker).
func changeID(e journal.Entry) string {
	var env decoder.Envelope
	if err := json.Unmarshal(e.Envelope, &env); err != nil {
		return "bad envelope: " + err.Error()
	}
	switch env.Op {
	case decoder.OpTruncate:
		return "truncate:" + env.Entity
	case decoder.OpInsert, decoder.OpUpdate:
		return fmt.Sprintf("%s:%s:%s:%s", env.Op, env.Entity, env.Key["id"], env.After["val"])
	}
	return fmt.Sprintf("%s:%s:%s", env.Op, env.Entity, env.Key["id"])
}

func validate(t *testing.T, f *fixture, committed []string) {
	t.Helper()
	v := journaltest.New()
	v.Commit(committed...)
	for _, e := range f.entries() {
		v.Observe(journaltest.Item{ID: changeID(e), Seq: e.Seq, Entity: e.Entity, EntitySeq: e.EntitySeq})
	}
	if err := v.Check(); err != nil {
		t.Fatal(err)
	}
}

// workload commits a mix of changes and returns their ids in commit order.
type workload struct {
	conn *pgx.Conn
	ids  []string
	next int
}

func newWorkload(t *testing.T, url string) *workload {
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return &workload{conn: conn}
}

func (w *workload) exec(t *testing.T, ids []string, sqls ...string) {
	t.Helper()
	w.tx(t, true, sqls...)
	w.ids = append(w.ids, ids...)
}

// rollback runs sqls in a transaction and rolls it back.
func (w *workload) rollback(t *testing.T, sqls ...string) {
	t.Helper()
	w.tx(t, false, sqls...)
}

// tx runs sqls in one transaction, then commits or rolls it back.
func (w *workload) tx(t *testing.T, commit bool, sqls ...string) {
	t.Helper()
	ctx := context.Background()
	tx, err := w.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sqls {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	end := tx.Rollback
	if commit {
		end = tx.Commit
	}
	if err := end(ctx); err != nil {
		t.Fatal(err)
	}
}

// mixed commits inserts, an update, a delete and a rolled-back transaction.
func (w *workload) mixed(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		id := w.next
		w.next += 2
		w.exec(t, []string{
			fmt.Sprintf("insert:public.items:%d:\"a%d\"", id, id),
			fmt.Sprintf("insert:public.items:%d:\"b%d\"", id+1, id+1),
			fmt.Sprintf("update:public.items:%d:\"c%d\"", id, id),
		},
			fmt.Sprintf("INSERT INTO items VALUES (%d, 'a%d', 1), (%d, 'b%d', 2)", id, id, id+1, id+1),
			fmt.Sprintf("UPDATE items SET val = 'c%d' WHERE id = %d", id, id))
		w.exec(t, []string{fmt.Sprintf("delete:public.items:%d", id+1)}, fmt.Sprintf("DELETE FROM items WHERE id = %d", id+1))
		ctx := context.Background()
		tx, err := w.conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO other VALUES (-1, 'rolled back')"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRunJournalsMixedWorkloadExactlyOnce(t *testing.T) {
	f := newFixture(t)
	// A small decoding budget makes the large transaction below stream in
	// pieces (proto v2 streaming) rather than arrive whole.
	execSQL(t, f.url, `ALTER SYSTEM SET logical_decoding_work_mem = '64kB'`, `SELECT pg_reload_conf()`)
	t.Cleanup(func() { execSQL(t, f.url, `ALTER SYSTEM RESET logical_decoding_work_mem`, `SELECT pg_reload_conf()`) })
	run := f.start(f.config())
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })

	w := newWorkload(t, f.url)
	w.mixed(t, 20)
	// A large transaction, streamed by Postgres before its commit.
	var big []string
	for i := 0; i < 3000; i++ {
		big = append(big, fmt.Sprintf("insert:public.other:%d:\"%s\"", i, strings.Repeat("x", 50)))
	}
	w.exec(t, big, `INSERT INTO other SELECT g, repeat('x', 50) FROM generate_series(0, 2999) g`)
	w.exec(t, []string{"truncate:public.other"}, `TRUNCATE other`)
	w.mixed(t, 5)

	waitFor(t, "all changes journaled", 30*time.Second, func() bool { return len(f.entries()) >= len(w.ids) })
	validate(t, f, w.ids)

	// The slot has confirmed exactly what the journal holds, no more.
	waitFor(t, "slot confirmation", 10*time.Second, func() bool {
		wm, _ := f.j.Watermark(context.Background())
		return slotConfirmed(t, f.url) == wm
	})
	// And the big transaction really arrived in streamed pieces.
	waitFor(t, "streamed transaction statistics", 10*time.Second, func() bool {
		var n int64
		pgtest.MustQueryRow(t, f.url, `SELECT coalesce(sum(stream_txns), 0) FROM pg_stat_replication_slots WHERE slot_name = 'walcast'`, nil, &n)
		return n > 0
	})
	if err := run.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func slotConfirmed(t *testing.T, url string) decoder.LSN {
	t.Helper()
	return queryLSN(t, url, `SELECT coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = 'walcast'`)
}

// queryLSN runs a query returning one LSN as text.
func queryLSN(t testing.TB, url, sql string) decoder.LSN {
	t.Helper()
	var s string
	pgtest.MustQueryRow(t, url, sql, nil, &s)
	l, err := decoder.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestConfirmedNeverAheadOfWatermark samples the slot while a workload and
// churn on an unpublished table run: confirmed_flush_lsn never exceeds the
// journal watermark, and it advances through the unpublished churn.
func TestConfirmedNeverAheadOfWatermark(t *testing.T) {
	f := newFixture(t)
	run := f.start(f.config())
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var violations []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			// Read the confirmation first: the watermark only grows, so a
			// confirmation read before it can never legitimately exceed it.
			c := slotConfirmed(t, f.url)
			wm, err := f.j.Watermark(context.Background())
			if err == nil && c > wm {
				violations = append(violations, fmt.Sprintf("confirmed %s > watermark %s", c, wm))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	w := newWorkload(t, f.url)
	w.mixed(t, 30)
	waitFor(t, "journaled", 30*time.Second, func() bool { return len(f.entries()) >= len(w.ids) })

	before := slotConfirmed(t, f.url)
	// About 50 MB of WAL on a table the publication does not include.
	for i := 0; i < 24; i++ {
		execSQL(t, f.url, `INSERT INTO unpublished (pad) SELECT repeat('p', 1000) FROM generate_series(1, 2000)`)
	}
	end := queryLSN(t, f.url, `SELECT pg_current_wal_lsn()::text`)
	waitFor(t, "slot to advance through unpublished churn", 30*time.Second, func() bool {
		return slotConfirmed(t, f.url) >= end-1<<20
	})
	cancel()
	wg.Wait()
	if len(violations) > 0 {
		t.Fatalf("slot ran ahead of the journal %d times, first: %s", len(violations), violations[0])
	}
	if after := slotConfirmed(t, f.url); after <= before {
		t.Fatalf("slot did not advance: %s -> %s", before, after)
	}
	validate(t, f, w.ids)
}
