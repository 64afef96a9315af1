package replication

import (
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
)

// TestSnapshotChunkInvisibleCommitReread: the chunk's SELECT saw a
// transaction in progress. If the stream committed it before the chunk's
// low watermark, the SELECT may lack its change and the window never saw
// it, so the chunk must be read again; if it committed inside the window,
// or has not committed by the high watermark, the chunk is journaled.
func TestSnapshotChunkInvisibleCommitReread(t *testing.T) {
	enc := decoder.NewRowEncoder("public", "t", []decoder.ColumnInfo{{Name: "id", TypeOID: 23, Key: true}}, "")
	cases := []struct {
		name        string
		beforeLow   []uint32 // committed before the low watermark, changing public.t
		other       []uint32 // committed before the low watermark, changing another table only
		inWindow    []uint32 // committed between the watermarks
		flood       int      // then as many more commits in the window (the ring forgets what came before)
		invisible   []uint32 // in progress for the SELECT
		wantJournal bool
	}{
		{"nothing in progress", []uint32{7}, nil, nil, 0, nil, true},
		{"in progress, committed in the window", []uint32{7}, nil, []uint32{9}, 0, []uint32{9}, true},
		{"in progress, still running at the high watermark", []uint32{7}, nil, nil, 0, []uint32{11}, true},
		{"committed before the low watermark but invisible", []uint32{7, 8}, nil, []uint32{9}, 0, []uint32{8, 9}, false},
		{"committed before the low watermark, invisible, another table", []uint32{7}, []uint32{8}, nil, 0, []uint32{8}, true},
		{"committed before the low watermark, invisible, then out of the ring", []uint32{7, 8}, nil, nil, recentXids + 10, []uint32{8}, false},
		{"still running after a flood of commits in the window", []uint32{7}, nil, nil, recentXids + 10, []uint32{3}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &Replicator{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			s := newSnapshotter(r, 1)
			w := &snapWindows{s: s}
			for _, x := range tc.beforeLow {
				w.remember(x, touched{ents: [2]string{"public.other", "public.t"}, k: 2})
			}
			for _, x := range tc.other {
				w.remember(x, touched{ents: [2]string{"public.other"}, k: 1})
			}
			win := &window{token: "tok", entity: "public.t", key: []string{"id"}, changed: map[string]struct{}{}, since: w.seq}
			w.open = []*window{win}
			for _, x := range tc.inWindow {
				w.remember(x, touched{many: true})
			}
			for i := range tc.flood {
				w.remember(uint32(100000+i), touched{ents: [2]string{"public.other"}, k: 1})
			}
			c := &chunk{token: "tok", id: 1, entity: "public.t", enc: enc, first: true, base: true, n: 1, done: make(chan struct{}),
				rows: [][][]byte{{[]byte("1")}, {[]byte("2")}}, invisible: tc.invisible}
			c.keys = [][]byte{enc.Values(nil, c.rows[0], []int{0}), enc.Values(nil, c.rows[1], []int{0})}
			s.register(c)
			high := decoder.NewTransaction(20, 0x100, 0x101, time.Now(), nil)
			out := w.high(high, "tok")
			<-c.done
			if got := out != nil && c.ok; got != tc.wantJournal {
				t.Fatalf("chunk journaled = %v (ok %v), want %v", out != nil, c.ok, tc.wantJournal)
			}
			if tc.wantJournal && (c.kept != 2 || out.Len() != 3) {
				t.Fatalf("kept %d rows, transaction of %d entries; want 2 reads and a begin marker", c.kept, out.Len())
			}
			if !tc.wantJournal && r.snapRereads.Load() != 1 {
				t.Fatalf("rereads = %d", r.snapRereads.Load())
			}
		})
	}
}

// TestSnapWindowsRecentBounded: the ring of recent xids forgets the oldest
// once full, and counts an xid seen twice (wraparound) until both leave.
func TestSnapWindowsRecentBounded(t *testing.T) {
	w := &snapWindows{}
	w.remember(5, touched{})
	for i := range recentXids - 1 {
		w.remember(uint32(1000+i), touched{})
	}
	if w.recent[5].n != 1 || len(w.ring) != recentXids {
		t.Fatalf("full ring: recent[5]=%d, len %d", w.recent[5].n, len(w.ring))
	}
	w.remember(5, touched{many: true}) // replaces the first 5
	if w.recent[5].n != 1 || !w.recent[5].many {
		t.Fatalf("after replacing the oldest 5 with a new one: %+v", w.recent[5])
	}
	w.remember(6, touched{}) // replaces 1000
	if _, in := w.recent[1000]; in || len(w.recent) != recentXids {
		t.Fatalf("oldest not forgotten: %d entries", len(w.recent))
	}
}

// TestTouchedBy: the entities a transaction changed, two at most before it
// counts as many.
func TestTouchedBy(t *testing.T) {
	ch := func(e string) decoder.Change {
		return decoder.Change{Entity: e, Op: decoder.OpInsert, Body: []byte(`{}`)}
	}
	tx := func(cs ...decoder.Change) *decoder.Transaction {
		return decoder.NewTransaction(1, 1, 2, time.Now(), cs)
	}
	if got := touchedBy(tx(ch("a"), ch("a"), ch("b"), ch("a"))); !got.has("a") || !got.has("b") || got.has("c") || got.many {
		t.Fatalf("two tables: %+v", got)
	}
	if got := touchedBy(tx(ch("a"), ch("b"), ch("c"))); !got.many || !got.has("z") {
		t.Fatalf("three tables: %+v", got)
	}
	if got := touchedBy(tx()); got.has("a") {
		t.Fatalf("no change: %+v", got)
	}
}

// TestSnapshotPipelineRejectsAfterAFailedChunk: chunks reach the loop in
// order; once one cannot be journaled, the ones after it are rejected too
// (their reads start after rows the journal lacks) until the worker sends
// the failed chunk again as a new base; row counts continue from the
// journaled ones.
func TestSnapshotPipelineRejectsAfterAFailedChunk(t *testing.T) {
	enc := decoder.NewRowEncoder("public", "t", []decoder.ColumnInfo{{Name: "id", TypeOID: 23, Key: true}}, "")
	r := &Replicator{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	s := newSnapshotter(r, 1)
	w := &snapWindows{s: s}
	w.remember(8, touched{many: true}) // committed before every window
	send := func(n int64, base bool, rowsBefore int64, invisible ...uint32) *chunk {
		t.Helper()
		tok := "tok" + strconv.FormatInt(n, 10)
		w.open = append(w.open, &window{token: tok, entity: "public.t", key: []string{"id"}, changed: map[string]struct{}{}, since: w.seq})
		c := &chunk{token: tok, id: 1, entity: "public.t", enc: enc, first: n == 1, base: base, rowsBefore: rowsBefore, n: n,
			done: make(chan struct{}), rows: [][][]byte{{[]byte(strconv.FormatInt(n*10, 10))}}, invisible: invisible}
		c.keys = [][]byte{enc.Values(nil, c.rows[0], []int{0})}
		s.register(c)
		w.high(decoder.NewTransaction(uint32(100+n), 0x100, 0x101, time.Now(), nil), tok)
		<-c.done
		return c
	}
	if c := send(1, true, 0); !c.ok {
		t.Fatal("chunk 1 not journaled")
	}
	if c := send(2, false, 0, 8); c.ok { // may lack xid 8's change
		t.Fatal("chunk 2 journaled though an invisible transaction committed before its window")
	}
	if c := send(3, false, 0); c.ok {
		t.Fatal("chunk 3 journaled after the failed chunk 2")
	}
	if c := send(2, true, 1); !c.ok || w.rows[1] != 2 {
		t.Fatalf("chunk 2 sent again: ok %v, rows %d", c.ok, w.rows[1])
	}
	if c := send(3, false, 0); !c.ok || w.rows[1] != 3 || w.expect[1] != 4 {
		t.Fatalf("chunk 3 after the retry: ok %v, rows %d, expect %d", c.ok, w.rows[1], w.expect[1])
	}
}

// TestSnapshotChunkEveryRowChanged: a chunk whose every row changed in its
// window journals nothing — an empty transaction the loop leaves out, with
// its progress — and says so, so the worker never waits for the journal to
// record that progress.
func TestSnapshotChunkEveryRowChanged(t *testing.T) {
	enc := decoder.NewRowEncoder("public", "t", []decoder.ColumnInfo{{Name: "id", TypeOID: 23, Key: true}}, "")
	r := &Replicator{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	s := newSnapshotter(r, 1)
	w := &snapWindows{s: s}
	for n, changed := range []bool{false, true} {
		tok := "tok" + strconv.Itoa(n)
		win := &window{token: tok, entity: "public.t", key: []string{"id"}, changed: map[string]struct{}{}, since: w.seq}
		w.open = []*window{win}
		c := &chunk{token: tok, id: 1, entity: "public.t", enc: enc, first: n == 0, base: n == 0, n: int64(n + 1), done: make(chan struct{}),
			rows: [][][]byte{{[]byte("5")}}}
		c.keys = [][]byte{enc.Values(nil, c.rows[0], []int{0})}
		if changed {
			win.changed[string(c.keys[0])] = struct{}{}
		}
		s.register(c)
		out := w.high(decoder.NewTransaction(uint32(30+n), 0x100, 0x101, time.Now(), nil), tok)
		<-c.done
		if !c.ok || c.empty != changed || (out.Len() == 0) != changed {
			t.Fatalf("chunk %d (row changed in the window: %v): ok %v, empty %v, %d entries", n+1, changed, c.ok, c.empty, out.Len())
		}
	}
}
