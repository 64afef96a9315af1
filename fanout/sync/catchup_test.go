package sync

import (
	"testing"
)

// A snapshot's catch-up starts where every earlier entry is visible in the
// source snapshot: at H0 when nothing was in progress, and otherwise before
// the first entry of a transaction of the snapshot's xip list even when it
// lies more than snapshotLookback entries before H0 (a commit journaled long
// before it became visible, as one waiting for a synchronous standby is).
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
		want int64
	}{
		{"nothing in progress", nil, h0},
		{"in progress but not journaled", []uint64{1 << 20}, h0 - snapshotLookback},
		// The 64-bit xid of the snapshot matches the 32-bit one journaled.
		{"in progress and journaled long before H0", []uint64{5<<32 | heldXid, 1 << 20}, held - 1},
	} {
		snap := pgSnapshot{xmin: 1, xmax: 1 << 40, xip: map[uint64]struct{}{}}
		for _, x := range tc.xip {
			snap.xip[x] = struct{}{}
		}
		got, err := catchUpStart(ctx, e.j, h0, snap)
		if err != nil || got != tc.want {
			t.Errorf("%s: start %d (%v), want %d", tc.name, got, err, tc.want)
		}
	}
}
