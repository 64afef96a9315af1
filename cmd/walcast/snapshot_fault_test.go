package main

// Snapshot fault tests at the process level: `walcast run`
// killed with SIGKILL at random points of a snapshot, and a standby taking
// over a snapshot from a killed active instance. Both check the journal the
// way a consumer uses it: the table rebuilt from the journal's first entry
// equals the source.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

// snapWriters insert, update (the primary key too) and delete rows of table
// snap (id int PRIMARY KEY, val text, n int) in ids 1..maxID from several
// connections until stopped. Every insert and update writes a val token
// unique to the statement, so the journal's copies of each committed change
// can be counted.
type snapWriters struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex     // guards the following fields
	tokens  map[string]int // val token → committed inserts/updates that wrote it (0 or 1)
	deletes map[int64]int  // id → committed deletes
	err     error
}

func startSnapWriters(t *testing.T, url string, writers, maxID int, seed uint64) *snapWriters {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &snapWriters{cancel: cancel, tokens: map[string]int{}, deletes: map[int64]int{}}
	for n := 0; n < writers; n++ {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			defer conn.Close(context.Background())
			rng := rand.New(rand.NewPCG(seed, uint64(n)))
			for i := 0; ctx.Err() == nil; i++ {
				id := 1 + rng.IntN(maxID)
				tok := fmt.Sprintf("w%d-%d", n, i)
				var q string
				var args []any
				op := rng.IntN(4)
				switch op {
				case 0:
					q, args = `INSERT INTO snap VALUES ($1, $2, 1) ON CONFLICT (id) DO UPDATE SET val = $2`, []any{id, tok}
				case 1:
					q, args = `UPDATE snap SET val = $2, n = n + 1 WHERE id = $1`, []any{id, tok}
				case 2:
					// A primary key change, to a key before or after the
					// snapshot's position.
					to := 1 + rng.IntN(maxID)
					q, args = `UPDATE snap SET id = $3, val = $2 WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM snap WHERE id = $3)`, []any{id, tok, to}
				case 3:
					q, args = `DELETE FROM snap WHERE id = $1`, []any{id}
				}
				// Not under ctx: a statement cancelled by stop could commit
				// without being counted.
				tag, err := conn.Exec(context.Background(), q, args...)
				if err != nil {
					if strings.Contains(err.Error(), "duplicate key") {
						continue // two writers moved rows to the same key: rolled back
					}
					w.mu.Lock()
					w.err = fmt.Errorf("%s: %w", q, err)
					w.mu.Unlock()
					return
				}
				w.mu.Lock()
				switch {
				case op == 3:
					w.deletes[int64(id)] += int(tag.RowsAffected())
				case tag.RowsAffected() > 0:
					w.tokens[tok]++
				}
				w.mu.Unlock()
				time.Sleep(time.Millisecond) // leave the two cores some room for walcast
			}
		}()
	}
	t.Cleanup(w.stop)
	return w
}

// stop ends the writers and waits for them; safe to call twice.
func (w *snapWriters) stop() {
	w.cancel()
	w.wg.Wait()
}

// snapMarker is a snapshot-begin or snapshot-end entry.
type snapMarker struct {
	Seq      int64
	Op       decoder.Op
	Snapshot struct {
		ID        int64  `json:"id"`
		Table     string `json:"table"`
		Rows      int64  `json:"rows"`
		Cancelled bool   `json:"cancelled"`
	} `json:"snapshot"`
}

// tableJournal is what the journal holds of one table with an integer
// primary key id: the table rebuilt from the first entry (reads and changes
// in seq order, by id), its snapshot markers and reads, and its changes.
type tableJournal struct {
	rows     map[int64]map[string]any
	markers  []snapMarker
	reads    []int64 // ids of the read entries, in seq order
	readSeqs []int64
	tokens   map[string]int // val → insert/update entries carrying it
	deletes  map[int64]int  // id → delete entries
	entries  int
}

// readTableJournal reads every entry of entity from the journal's first one,
// checking seq and entitySeq as it goes.
func readTableJournal(t *testing.T, j *journal.Journal, entity string) tableJournal {
	t.Helper()
	tj := tableJournal{rows: map[int64]map[string]any{}, tokens: map[string]int{}, deletes: map[int64]int{}}
	id := func(row map[string]json.RawMessage, e journal.Entry) int64 {
		n, err := strconv.ParseInt(string(row["id"]), 10, 64)
		if err != nil {
			t.Fatalf("entry without an integer id: %s", e.Envelope)
		}
		return n
	}
	q := journal.Query{FromOldest: true, Entities: []string{entity}, AllTenants: true, Limit: journal.MaxLimit}
	var lastSeq, lastEntitySeq int64
	for {
		res, err := j.Changes(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		if res.ResyncRequired {
			t.Fatalf("resync reading the journal: %s", res.Reason)
		}
		if len(res.Changes) == 0 && !res.More {
			return tj
		}
		for _, e := range res.Changes {
			if e.Seq <= lastSeq || (lastEntitySeq > 0 && e.EntitySeq != lastEntitySeq+1) {
				t.Fatalf("seq %d (entitySeq %d) follows seq %d (entitySeq %d)", e.Seq, e.EntitySeq, lastSeq, lastEntitySeq)
			}
			lastSeq, lastEntitySeq = e.Seq, e.EntitySeq
			tj.entries++
			var env decoder.Envelope
			if err := json.Unmarshal(e.Envelope, &env); err != nil {
				t.Fatal(err)
			}
			switch env.Op {
			case decoder.OpRead:
				k := id(env.After, e)
				tj.reads = append(tj.reads, k)
				tj.readSeqs = append(tj.readSeqs, e.Seq)
				tj.rows[k] = jsonRow(env.After)
			case decoder.OpInsert, decoder.OpUpdate:
				if env.Before != nil {
					delete(tj.rows, id(env.Before, e))
				}
				tj.rows[id(env.After, e)] = jsonRow(env.After)
				var val string
				_ = json.Unmarshal(env.After["val"], &val)
				tj.tokens[val]++
			case decoder.OpDelete:
				k := id(env.Key, e)
				delete(tj.rows, k)
				tj.deletes[k]++
			case decoder.OpTruncate:
				clear(tj.rows)
			case decoder.OpSnapshotBegin, decoder.OpSnapshotEnd:
				var m snapMarker
				if err := json.Unmarshal(e.Envelope, &m); err != nil {
					t.Fatal(err)
				}
				m.Seq, m.Op = e.Seq, env.Op
				tj.markers = append(tj.markers, m)
			default:
				t.Fatalf("unexpected entry on %s: %s", entity, e.Envelope)
			}
		}
		q = journal.Query{Cursor: res.Cursor, Entities: []string{entity}, AllTenants: true, Limit: journal.MaxLimit}
	}
}

// jsonRow makes a row comparable with row_to_json's: every value as its
// printed form.
func jsonRow(row map[string]json.RawMessage) map[string]any {
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

// sourceRows reads table (with an integer id) as SELECT * sees it.
func sourceRows(t *testing.T, url, table string) map[int64]map[string]any {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT id, row_to_json(t)::text FROM "+table+" t")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]map[string]any{}
	var id int64
	var s string
	_, err = pgx.ForEachRow(rows, []any{&id, &s}, func() error {
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(s), &raw); err != nil {
			return err
		}
		out[id] = jsonRow(raw)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkSnapshotJournal asserts what a consumer relies on after snapshot id
// of table snap finished (status done), the writers stopped and the journal
// caught up:
//
//   - the table rebuilt from the journal equals SELECT * of the source;
//   - exactly one snapshot-begin and one snapshot-end, the begin before every
//     read and the end after every read, the end's rows equal to the reads
//     (and to the status's rows);
//   - the reads' ids strictly increase in seq order: no row is read twice,
//     kills or not. A chunk's reads and its progress are journaled in one
//     transaction, so a chunk cut off by a kill was never journaled and is
//     read again in full, and a chunk that was journaled is never read
//     again; keyset pagination only moves forward;
//   - every committed insert and update is journaled exactly once (by its
//     val token), none that was not committed, and every id's deletes
//     exactly as often as they were committed.
func checkSnapshotJournal(t *testing.T, url string, j *journal.Journal, w *snapWriters, id int64) tableJournal {
	t.Helper()
	w.stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		t.Fatal(w.err)
	}
	// Catch up: a sentinel committed after the writers stopped is journaled
	// after all of their changes.
	execSQL(t, url, `INSERT INTO items VALUES (-1, 'sentinel')`)
	waitUntil(t, "the sentinel journaled", 60*time.Second, func() bool {
		var n int
		pgtest.MustQueryRow(t, url, `SELECT count(*) FROM walcast.entries WHERE entity = 'public.items'`, nil, &n)
		return n > 0
	})
	tj := readTableJournal(t, j, "public.snap")
	compareRows(t, tj.rows, sourceRows(t, url, "snap"))

	s, err := j.SnapshotByID(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if len(tj.markers) != 2 || tj.markers[0].Op != decoder.OpSnapshotBegin || tj.markers[1].Op != decoder.OpSnapshotEnd {
		t.Fatalf("markers %+v, want one snapshot-begin and one snapshot-end", tj.markers)
	}
	begin, end := tj.markers[0], tj.markers[1]
	if begin.Snapshot.ID != id || end.Snapshot.ID != id || end.Snapshot.Table != "public.snap" || end.Snapshot.Cancelled {
		t.Fatalf("markers %+v, want snapshot %d of public.snap, not cancelled", tj.markers, id)
	}
	if len(tj.reads) == 0 || tj.readSeqs[0] < begin.Seq || tj.readSeqs[len(tj.readSeqs)-1] > end.Seq {
		t.Fatalf("%d reads, not all between the begin (seq %d) and the end (seq %d)", len(tj.reads), begin.Seq, end.Seq)
	}
	if end.Snapshot.Rows != int64(len(tj.reads)) || s.Rows != int64(len(tj.reads)) {
		t.Fatalf("snapshot-end counts %d rows, the status %d, the journal holds %d reads", end.Snapshot.Rows, s.Rows, len(tj.reads))
	}
	for i := 1; i < len(tj.reads); i++ {
		if tj.reads[i] <= tj.reads[i-1] {
			t.Fatalf("read of id %d (seq %d) after the read of id %d (seq %d): a row read twice or out of key order",
				tj.reads[i], tj.readSeqs[i], tj.reads[i-1], tj.readSeqs[i-1])
		}
	}

	var bad []string
	for tok, n := range w.tokens {
		if tj.tokens[tok] != n {
			bad = append(bad, fmt.Sprintf("change %s committed %d times, journaled %d times", tok, n, tj.tokens[tok]))
		}
	}
	for tok, n := range tj.tokens {
		if _, ok := w.tokens[tok]; !ok {
			bad = append(bad, fmt.Sprintf("change %s journaled %d times, never committed", tok, n))
		}
	}
	for k, n := range w.deletes {
		if tj.deletes[k] != n {
			bad = append(bad, fmt.Sprintf("id %d deleted %d times, %d delete entries", k, n, tj.deletes[k]))
		}
	}
	for k, n := range tj.deletes {
		if _, ok := w.deletes[k]; !ok {
			bad = append(bad, fmt.Sprintf("id %d: %d delete entries, never deleted", k, n))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		t.Fatalf("%d changes not journaled exactly once, first: %s", len(bad), strings.Join(bad[:min(5, len(bad))], "; "))
	}
	return tj
}

func compareRows(t *testing.T, got, want map[int64]map[string]any) {
	t.Helper()
	var diffs []string
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("id %d missing from the journal (source %v)", k, w))
		case !reflect.DeepEqual(g, w):
			diffs = append(diffs, fmt.Sprintf("id %d: journal %v, source %v", k, g, w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("id %d in the journal but not in the source: %v", k, g))
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		t.Fatalf("the table rebuilt from the journal differs from the source in %d rows (journal %d rows, source %d), first: %s",
			len(diffs), len(got), len(want), strings.Join(diffs[:min(5, len(diffs))], "; "))
	}
}

// setupSnapSource creates table snap with rows 1..rows before any slot
// exists (so only a snapshot can deliver them), in publication pub with
// items.
func setupSnapSource(t *testing.T, url string, rows int) *journal.Journal {
	t.Helper()
	j := setupSource(t, url)
	execSQL(t, url, `CREATE TABLE snap (id int PRIMARY KEY, val text, n int)`,
		fmt.Sprintf(`INSERT INTO snap SELECT g, 'v' || g, g %% 7 FROM generate_series(1, %d) g`, rows),
		`ALTER PUBLICATION pub ADD TABLE snap`)
	return j
}

func requestSnapshot(t *testing.T, url string, chunk int) int64 {
	t.Helper()
	code, out, errOut := walcast(t, nil, "snapshot", "start", "--journal-url", url, "--table", "public.snap", "--chunk-size", strconv.Itoa(chunk))
	if code != 0 {
		t.Fatalf("snapshot start: exit %d, %s%s", code, out, errOut)
	}
	var id int64
	if _, err := fmt.Sscanf(out, "snapshot %d of", &id); err != nil {
		t.Fatalf("snapshot start printed %q: %v", out, err)
	}
	return id
}

func snapshotNow(t *testing.T, j *journal.Journal, id int64) journal.Snapshot {
	t.Helper()
	s, err := j.SnapshotByID(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSnapshotKill9 kills `walcast run` with SIGKILL ten times during a
// snapshot of a 40k-row table in 100-row chunks, at a random moment after
// each restart has journaled a chunk (the first time possibly before any),
// while three writers insert, update (keys included) and delete rows of
// the same key range. The snapshot resumes each time from its last
// journaled chunk and ends; checkSnapshotJournal lists what must hold.
func TestSnapshotKill9(t *testing.T) {
	const rows, chunk = 40000, 100
	url := pgtest.NewDatabase(t)
	j := setupSnapSource(t, url, rows)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 13))
	var w *snapWriters
	var id int64
	var prev journal.Snapshot
	var kills []string
	for round := 0; round < 10; round++ {
		p := startWalcast(t, runArgs(url)...)
		waitUntil(t, "active", 30*time.Second, func() bool { return strings.HasPrefix(p.readyz(), "active") })
		if w == nil {
			// Once the slot exists: changes before it are not streamed.
			w = startSnapWriters(t, url, 3, rows+2000, seed)
			id = requestSnapshot(t, url, chunk)
		}
		waitUntil(t, fmt.Sprintf("round %d: the snapshot to progress", round), 30*time.Second, func() bool {
			s := snapshotNow(t, j, id)
			if round == 0 {
				return s.Status == journal.SnapshotRunning
			}
			return s.Chunks > prev.Chunks
		})
		time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-p.done
		s := snapshotNow(t, j, id)
		if s.Status != journal.SnapshotRunning {
			t.Fatalf("round %d: the snapshot is %s (%d of %d chunks) before the tenth kill; use a bigger table", round, s.Status, s.Chunks, rows/chunk)
		}
		if s.Chunks < prev.Chunks || s.Rows < prev.Rows {
			t.Fatalf("round %d: progress went back from %+v to %+v", round, prev, s)
		}
		kills = append(kills, strconv.FormatInt(s.Chunks, 10))
		prev = s
	}
	p := startWalcast(t, runArgs(url)...)
	waitUntil(t, "the snapshot to finish", 60*time.Second, func() bool {
		return snapshotNow(t, j, id).Status != journal.SnapshotRunning
	})
	if s := snapshotNow(t, j, id); s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	waitUntil(t, "the last run to log that it resumed the snapshot", 10*time.Second, func() bool {
		return strings.Contains(p.log(), `"msg":"snapshot resumed"`)
	})
	tj := checkSnapshotJournal(t, url, j, w, id)
	s := snapshotNow(t, j, id)
	t.Logf("10 kills with %s chunks journaled; %d reads in %d chunks, %d entries of public.snap, %d rows at the end",
		strings.Join(kills, ", "), len(tj.reads), s.Chunks, tj.entries, len(tj.rows))
}

// TestSnapshotStandbyTakeover runs two `walcast run` for one slot and kills
// the active one with SIGKILL in the middle of a snapshot, under the same
// writers: the standby takes over, resumes the snapshot from the journaled
// progress and finishes it, and checkSnapshotJournal holds.
func TestSnapshotStandbyTakeover(t *testing.T) {
	const rows, chunk = 20000, 250
	url := pgtest.NewDatabase(t)
	j := setupSnapSource(t, url, rows)
	a := startWalcast(t, runArgs(url)...)
	waitUntil(t, "a active", 30*time.Second, func() bool { return strings.HasPrefix(a.readyz(), "active") })
	b := startWalcast(t, runArgs(url)...)
	waitUntil(t, "b standby", 30*time.Second, func() bool { return strings.HasPrefix(b.readyz(), "standby") })
	w := startSnapWriters(t, url, 3, rows+2000, uint64(time.Now().UnixNano()))
	id := requestSnapshot(t, url, chunk)
	waitUntil(t, "five chunks", 30*time.Second, func() bool { return snapshotNow(t, j, id).Chunks >= 5 })
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	<-a.done
	mid := snapshotNow(t, j, id)
	if mid.Status != journal.SnapshotRunning {
		t.Fatalf("the snapshot is %s at the kill; use a bigger table", mid.Status)
	}
	waitUntil(t, "b to take over", 30*time.Second, func() bool { return strings.HasPrefix(b.readyz(), "active") })
	t.Logf("standby took over %s after the kill, at chunk %d of %d", time.Since(killed).Round(time.Millisecond), mid.Chunks, rows/chunk)
	waitUntil(t, "the snapshot to finish", 60*time.Second, func() bool {
		return snapshotNow(t, j, id).Status != journal.SnapshotRunning
	})
	s := snapshotNow(t, j, id)
	if s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	waitUntil(t, "the standby to log that it resumed and finished the snapshot", 10*time.Second, func() bool {
		l := b.log()
		return strings.Contains(l, `"msg":"snapshot resumed"`) && strings.Contains(l, `"msg":"snapshot finished"`)
	})
	if s.Chunks <= mid.Chunks {
		t.Fatalf("the standby journaled no chunk: %d at the kill, %d at the end", mid.Chunks, s.Chunks)
	}
	tj := checkSnapshotJournal(t, url, j, w, id)
	t.Logf("%d reads in %d chunks (%d by the standby)", len(tj.reads), s.Chunks, s.Chunks-mid.Chunks)
}
