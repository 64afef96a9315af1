package replication

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// tableValidator rebuilds a table from the journal — read, insert, update
// and delete entries of its entity from the first entry, keyed by the chunk
// key columns — and compares it with the table's rows.
type tableValidator struct {
	entity string
	key    []string
}

func keyOf(row map[string]json.RawMessage, cols []string) (string, bool) {
	var parts []string
	for _, c := range cols {
		v, ok := row[c]
		if !ok {
			return "", false
		}
		parts = append(parts, string(v))
	}
	return strings.Join(parts, ","), true
}

// rebuild returns the table as the journal says, by key, and the snapshot
// markers and reads of the entity.
func (v tableValidator) rebuild(t *testing.T, es []journal.Entry) (map[string]map[string]any, []decoder.Envelope, int) {
	t.Helper()
	state := map[string]map[string]any{}
	var markers []decoder.Envelope
	reads := 0
	for _, e := range es {
		if e.Op == decoder.OpMessage && strings.Contains(string(e.Envelope), snapshotPrefix) {
			t.Fatalf("a snapshot watermark was journaled: %s", e.Envelope)
		}
		if e.Entity != v.entity {
			continue
		}
		var env decoder.Envelope
		if err := json.Unmarshal(e.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		put := func() {
			k, ok := keyOf(env.After, v.key)
			if !ok {
				t.Fatalf("entry without its key columns: %s", e.Envelope)
			}
			state[k] = normalize(env.After)
		}
		switch env.Op {
		case decoder.OpRead:
			reads++
			put()
		case decoder.OpInsert:
			put()
		case decoder.OpUpdate:
			if env.Before != nil {
				if k, ok := keyOf(env.Before, v.key); ok {
					delete(state, k)
				}
			}
			put()
		case decoder.OpDelete:
			k, _ := keyOf(env.Key, v.key)
			delete(state, k)
		case decoder.OpTruncate:
			clear(state)
		case decoder.OpSnapshotBegin, decoder.OpSnapshotEnd:
			markers = append(markers, env)
		}
	}
	return state, markers, reads
}

// source reads the table (or the rows matching where) as JSON rows by key.
func (v tableValidator) source(t *testing.T, url, table, where string) map[string]map[string]any {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	q := "SELECT row_to_json(t)::text FROM " + table + " t"
	if where != "" {
		q += " WHERE " + where
	}
	rows, err := conn.Query(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(s), &raw); err != nil {
			t.Fatal(err)
		}
		k, _ := keyOf(raw, v.key)
		out[k] = normalize(raw)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func (v tableValidator) compare(t *testing.T, got, want map[string]map[string]any) {
	t.Helper()
	var diffs []string
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("key %s missing from the journal (source %v)", k, w))
		case !reflect.DeepEqual(g, w):
			diffs = append(diffs, fmt.Sprintf("key %s: journal %v, source %v", k, g, w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("key %s in the journal but not in the source: %v", k, g))
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		t.Fatalf("rebuilt %s differs from the source in %d rows (journal %d rows, source %d), first: %s",
			v.entity, len(diffs), len(got), len(want), strings.Join(diffs[:min(5, len(diffs))], "; "))
	}
}

// waitSnapshot waits until snapshot id reaches a final status.
func waitSnapshot(t *testing.T, f *fixture, id int64, timeout time.Duration) journal.Snapshot {
	t.Helper()
	var s journal.Snapshot
	waitFor(t, fmt.Sprintf("snapshot %d to finish", id), timeout, func() bool {
		var err error
		s, err = f.j.SnapshotByID(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return s.Status != journal.SnapshotPending && s.Status != journal.SnapshotRunning
	})
	return s
}

// caughtUp commits a sentinel row and waits until the journal holds it, so
// every change committed before is journaled.
func caughtUp(t *testing.T, f *fixture, tag string) []journal.Entry {
	t.Helper()
	execSQL(t, f.url, fmt.Sprintf(`INSERT INTO other VALUES (%d, %s)`, rand.Int31(), pgxQuote(tag)))
	var es []journal.Entry
	waitFor(t, "sentinel "+tag, 30*time.Second, func() bool {
		es = f.entries()
		for _, e := range es {
			if e.Entity == "public.other" && strings.Contains(string(e.Envelope), tag) {
				return true
			}
		}
		return false
	})
	return es
}

// normalize makes a row comparable across walcast's value rules and
// row_to_json's: every value as its printed form (an int8 beyond 2^53 is a
// string in one and a number in the other).
func normalize(row map[string]json.RawMessage) map[string]any {
	out := map[string]any{}
	for c, raw := range row {
		d := json.NewDecoder(strings.NewReader(string(raw)))
		d.UseNumber()
		var x any
		_ = d.Decode(&x)
		out[c] = fmt.Sprint(x)
	}
	return out
}

func pgxQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// TestSnapshotUnderConcurrentWriters snapshots a 20k-row table in 250-row
// chunks while three writers insert, update (also the primary key) and
// delete rows of the same key range, and restarts the replicator in the
// middle: the table rebuilt from the journal equals the source, the
// snapshot has one begin and one end marker, and the end counts the reads.
func TestSnapshotUnderConcurrentWriters(t *testing.T) {
	const rows = 20000
	f := newFixture(t,
		`CREATE TABLE snap (id int PRIMARY KEY, val text, n int)`,
		fmt.Sprintf(`INSERT INTO snap SELECT g, 'v' || g, g %% 7 FROM generate_series(1, %d) g`, rows),
		`ALTER PUBLICATION pub ADD TABLE snap`)
	run := f.start(f.config())
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var werr error
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rnd := rand.New(rand.NewSource(seed))
			conn, err := pgx.Connect(context.Background(), f.url)
			if err != nil {
				mu.Lock()
				werr = err
				mu.Unlock()
				return
			}
			defer conn.Close(context.Background())
			for ctx.Err() == nil {
				id := 1 + rnd.Intn(rows+2000)
				var q string
				switch rnd.Intn(4) {
				case 0:
					q = fmt.Sprintf(`INSERT INTO snap VALUES (%d, 'ins%d', 1) ON CONFLICT (id) DO UPDATE SET val = 'ups%d'`, id, id, id)
				case 1:
					q = fmt.Sprintf(`UPDATE snap SET val = 'upd%d', n = n + 1 WHERE id = %d`, rnd.Int(), id)
				case 2:
					// A primary key change, to a key that may lie before or
					// after the snapshot's position.
					to := 1 + rnd.Intn(rows+2000)
					q = fmt.Sprintf(`UPDATE snap SET id = %d WHERE id = %d AND NOT EXISTS (SELECT 1 FROM snap WHERE id = %d)`, to, id, to)
				case 3:
					q = fmt.Sprintf(`DELETE FROM snap WHERE id = %d`, id)
				}
				if _, err := conn.Exec(context.Background(), q); err != nil && !strings.Contains(err.Error(), "duplicate key") {
					mu.Lock()
					werr = fmt.Errorf("%s: %w", q, err)
					mu.Unlock()
					return
				}
			}
		}(int64(w + 1))
	}
	t.Cleanup(func() { cancel(); wg.Wait() })

	began := time.Now()
	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "snap", ChunkSize: 250})
	if err != nil {
		t.Fatal(err)
	}
	// Restart the replicator once a few chunks are journaled.
	waitFor(t, "three chunks", 60*time.Second, func() bool {
		s, err := f.j.SnapshotByID(context.Background(), id)
		return err == nil && s.Chunks >= 3
	})
	if err := run.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mid, _ := f.j.SnapshotByID(context.Background(), id)
	if mid.Status != journal.SnapshotRunning || mid.LastKey == nil {
		t.Fatalf("after the stop the snapshot is %+v, want running with a last key", mid)
	}
	run = f.start(f.config())
	s := waitSnapshot(t, f, id, 120*time.Second)
	took := time.Since(began)
	cancel()
	wg.Wait()
	if werr != nil {
		t.Fatal(werr)
	}
	if s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	es := caughtUp(t, f, "after-snapshot")
	v := tableValidator{entity: "public.snap", key: []string{"id"}}
	got, markers, reads := v.rebuild(t, es)
	v.compare(t, got, v.source(t, f.url, "snap", ""))
	if len(markers) != 2 || markers[0].Op != decoder.OpSnapshotBegin || markers[1].Op != decoder.OpSnapshotEnd {
		t.Fatalf("markers %+v, want one begin and one end", markers)
	}
	var end struct {
		Snapshot struct {
			ID   int64 `json:"id"`
			Rows int64 `json:"rows"`
		} `json:"snapshot"`
	}
	for _, e := range es {
		if e.Op == decoder.OpSnapshotEnd {
			_ = json.Unmarshal(e.Envelope, &end)
		}
	}
	if end.Snapshot.ID != id || end.Snapshot.Rows != int64(reads) || s.Rows != int64(reads) {
		t.Fatalf("snapshot-end says %+v, status %d rows, journal holds %d reads", end, s.Rows, reads)
	}
	if reads < rows/2 {
		t.Fatalf("only %d reads of %d rows", reads, rows)
	}
	t.Logf("snapshot of %d rows: %d reads journaled in %d chunks, %s with three writers and a restart (%.0f rows/s)",
		rows, reads, s.Chunks, took.Round(time.Millisecond), float64(reads)/took.Seconds())
}

// TestSnapshotCompositeKeyWhereAndRefusals: a composite primary key of text
// and int, a --where filter, a tenant column, and the refusal of a table
// with no key.
func TestSnapshotCompositeKeyWhereAndRefusals(t *testing.T) {
	f := newFixture(t,
		`CREATE TABLE comp (org text, id int, val jsonb, big int8, PRIMARY KEY (org, id))`,
		`INSERT INTO comp SELECT 'org' || (g % 5), g, jsonb_build_object('g', g), 9007199254740993 + g FROM generate_series(1, 3000) g`,
		`CREATE TABLE nokey (a int, b text)`,
		`INSERT INTO nokey VALUES (1, 'x')`,
		`ALTER PUBLICATION pub ADD TABLE comp, nokey`)
	cfg := f.config()
	cfg.TenantColumn = "org"
	run := f.start(cfg)
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })

	const where = `id % 3 <> 0 AND org <> 'org4'`
	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "comp", Where: where, ChunkSize: 250})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "nokey"})
	if err != nil {
		t.Fatal(err)
	}
	if s := waitSnapshot(t, f, id, 60*time.Second); s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	s := waitSnapshot(t, f, bad, 30*time.Second)
	if s.Status != journal.SnapshotFailed || !strings.Contains(s.Error, "primary key") || !strings.Contains(s.Error, "fix:") {
		t.Fatalf("snapshot of a table without a key: %s %q, want failed with the fix", s.Status, s.Error)
	}
	es := caughtUp(t, f, "after-comp")
	v := tableValidator{entity: "public.comp", key: []string{"org", "id"}}
	got, markers, reads := v.rebuild(t, es)
	v.compare(t, got, v.source(t, f.url, "comp", where))
	if len(markers) != 2 || reads != 1600 {
		t.Fatalf("%d markers and %d reads, want 2 and 1600", len(markers), reads)
	}
	for _, e := range es {
		if e.Op == decoder.OpRead {
			var env decoder.Envelope
			_ = json.Unmarshal(e.Envelope, &env)
			if !e.HasTenant || e.Tenant != env.Tenant || string(env.Key["org"]) != `"`+e.Tenant+`"` || len(env.Key) != 2 {
				t.Fatalf("read entry tenant %q (%v), envelope %s", e.Tenant, e.HasTenant, e.Envelope)
			}
			if b := string(env.After["big"]); !strings.HasPrefix(b, `"`) {
				t.Fatalf("int8 beyond 2^53 not a string: %s", e.Envelope)
			}
			break
		}
	}
}

// TestSnapshotCancel: a running snapshot that is cancelled stops before its
// next chunk with a snapshot-end that says so, and its status is cancelled.
func TestSnapshotCancel(t *testing.T) {
	f := newFixture(t,
		`CREATE TABLE slow (id int PRIMARY KEY)`,
		`INSERT INTO slow SELECT generate_series(1, 5000)`,
		`ALTER PUBLICATION pub ADD TABLE slow`)
	run := f.start(f.config())
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "slow", ChunkSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two chunks", 30*time.Second, func() bool {
		s, err := f.j.SnapshotByID(context.Background(), id)
		return err == nil && s.Chunks >= 2
	})
	if cs, err := f.j.CancelSnapshots(context.Background(), id, "", ""); err != nil || len(cs) != 1 {
		t.Fatalf("cancel: %v %v", cs, err)
	}
	s := waitSnapshot(t, f, id, 30*time.Second)
	if s.Status != journal.SnapshotCancelled || s.Rows >= 5000 {
		t.Fatalf("after cancel: %+v", s)
	}
	es := caughtUp(t, f, "after-cancel")
	_, markers, reads := tableValidator{entity: "public.slow", key: []string{"id"}}.rebuild(t, es)
	var last string
	for _, e := range es {
		if e.Op == decoder.OpSnapshotEnd {
			last = string(e.Envelope)
		}
	}
	if len(markers) != 2 || !strings.Contains(last, `"cancelled":true`) || int64(reads) != s.Rows {
		t.Fatalf("%d markers, end %s, %d reads, status rows %d", len(markers), last, reads, s.Rows)
	}
}
