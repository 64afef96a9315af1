package sync

import (
	"testing"

	"github.com/walcast/walcast/journal"
)

// A snapshot's catch-up starts where every earlier entry is visible in the
// source snapshot: snapshotLookback before H0, or before the first entry of
// a transaction the snapshot does not see — in its xip list, or at or past
// its xmax — even when it lies further back (a commit journaled long before
// it became visible, as one waiting for a synchronous standby is).
func TestCatchUpStart(t *testing.T) {
	e := newSyncEnv(t)
	rows := make([]row, 0, 100)
	var held int64 // the seq of the transaction still in progress at the snapshot
	var heldXid uint64
	for tx := range 30 {
		rows = rows[:0]
		for i := range 100 {
			rows = append(rows, ins(orders, tx*100+i))
		}
		es := e.appendRows(rows...)
		if tx == 3 {
			held = es[0].Seq
			e.mu.Lock()
			heldXid = uint64(e.xid)
			e.mu.Unlock()
		}
	}
	h0 := int64(3000)
	if h0-held < snapshotLookback {
		t.Fatalf("the held transaction is only %d entries before H0", h0-held)
	}
	ctx := syncCtx(t)
	for _, tc := range []struct {
		name string
		xip  []uint64
		xmax uint64
		want int64
	}{
		{"nothing in progress", nil, 5<<32 | 1000, h0 - snapshotLookback},
		{"in progress but not journaled", []uint64{5<<32 | 900}, 5<<32 | 1000, h0 - snapshotLookback},
		// The 64-bit xid of the snapshot matches the 32-bit one journaled.
		{"in progress and journaled long before H0", []uint64{5<<32 | heldXid, 5<<32 | 900}, 5<<32 | 1000, held - 1},
		// Committed and journaled, not yet visible, and past xmax (one past
		// the newest completed transaction): in no xip list.
		{"past xmax, journaled long before H0", nil, 5<<32 | heldXid, held - 1},
		// xmax just before a 32-bit wraparound: the journaled xids (small
		// numbers, after it modulo 2^32) are all past it.
		{"journaled xids past an xmax across a wraparound", nil, 4<<32 | (1<<32 - 10), 0},
	} {
		snap := pgSnapshot{xmin: 1, xmax: tc.xmax, xip: map[uint64]struct{}{}}
		for _, x := range tc.xip {
			snap.xip[x] = struct{}{}
		}
		got, err := catchUpStart(ctx, e.j, h0, snap)
		if err != nil || got != tc.want {
			t.Errorf("%s: start %d (%v), want %d", tc.name, got, err, tc.want)
		}
	}
	// A resync entry (a slot recreated, a new epoch) bounds the look-back:
	// what lies before it is another history.
	res, err := e.j.AppendResync(ctx, e.gen, journal.Resync{Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		e.appendRows(ins(orders, 10000+i))
	}
	snap := pgSnapshot{xmin: 1, xmax: 5<<32 | 1, xip: map[uint64]struct{}{}} // every journaled xid past xmax
	if got, err := catchUpStart(ctx, e.j, res.LastSeq+5, snap); err != nil || got != res.LastSeq {
		t.Errorf("after a resync entry at %d: start %d (%v), want %d", res.LastSeq, got, err, res.LastSeq)
	}
}
