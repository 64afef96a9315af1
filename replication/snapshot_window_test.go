package replication

import (
	"io"
	"log/slog"
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
		beforeLow   []uint32 // committed before the low watermark
		inWindow    []uint32 // committed between the watermarks
		invisible   []uint32 // in progress for the SELECT
		wantJournal bool
	}{
		{"nothing in progress", []uint32{7}, nil, nil, true},
		{"in progress, committed in the window", []uint32{7}, []uint32{9}, []uint32{9}, true},
		{"in progress, still running at the high watermark", []uint32{7}, nil, []uint32{11}, true},
		{"committed before the low watermark but invisible", []uint32{7, 8}, []uint32{9}, []uint32{8, 9}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &Replicator{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			s := newSnapshotter(r, 1)
			w := &snapWindows{s: s}
			for _, x := range tc.beforeLow {
				w.remember(x)
			}
			win := &window{token: "tok", entity: "public.t", key: []string{"id"}, changed: map[string]struct{}{}, committed: map[uint32]struct{}{}}
			w.open = []*window{win}
			for _, x := range tc.inWindow {
				win.committed[x] = struct{}{}
				w.remember(x)
			}
			c := &chunk{token: "tok", id: 1, entity: "public.t", enc: enc, first: true, n: 1, done: make(chan struct{}),
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
			if !tc.wantJournal && w.rereads != 1 {
				t.Fatalf("rereads = %d", w.rereads)
			}
		})
	}
}

// TestSnapWindowsRecentBounded: the ring of recent xids forgets the oldest
// once full, and counts an xid seen twice (wraparound) until both leave.
func TestSnapWindowsRecentBounded(t *testing.T) {
	w := &snapWindows{}
	w.remember(5)
	for i := range recentXids - 1 {
		w.remember(uint32(1000 + i))
	}
	if w.recent[5] != 1 || len(w.ring) != recentXids {
		t.Fatalf("full ring: recent[5]=%d, len %d", w.recent[5], len(w.ring))
	}
	w.remember(5) // replaces the first 5
	if w.recent[5] != 1 {
		t.Fatalf("after replacing the oldest 5 with a new one: %d", w.recent[5])
	}
	w.remember(6) // replaces 1000
	if w.recent[1000] != 0 || len(w.recent) != recentXids {
		t.Fatalf("oldest not forgotten: %d, %d entries", w.recent[1000], len(w.recent))
	}
}
