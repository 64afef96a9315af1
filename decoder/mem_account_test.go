package decoder

import (
	"errors"
	"strings"
	"testing"
)

// checkAccounting checks that what the decoder counts against its budget is
// what its open transactions hold: every in-memory transaction's arena
// length plus its recs' overhead and tenants, summed in d.mem.
func checkAccounting(t *testing.T, d *Decoder) {
	t.Helper()
	var sum int64
	check := func(tx *txState) {
		if tx == nil {
			return
		}
		want := int64(0)
		if tx.sp == nil {
			want = int64(len(tx.arena))
			for _, r := range tx.recs {
				want += recBytes(&r)
			}
		}
		if tx.mem != want {
			t.Fatalf("transaction %d counts %d bytes, holds %d", tx.xid, tx.mem, want)
		}
		sum += tx.mem
	}
	check(d.cur)
	for _, tx := range d.streams {
		check(tx)
	}
	if d.mem != sum {
		t.Fatalf("decoder counts %d bytes, its transactions %d", d.mem, sum)
	}
}

// TestSubAbortReleasesMemory: the changes of an aborted subtransaction of a
// streamed transaction leave memory, not only the count: after the abort the
// arena holds only the surviving changes, so a second subtransaction of the
// same size fits in the budget without a spill and without the arena ever
// holding more than the budget.
func TestSubAbortReleasesMemory(t *testing.T) {
	const budget = 64 << 10
	f := newFeeder(t, Config{MemoryBudget: budget})
	pad := strings.Repeat("x", 400)
	rows := func(sub uint32, from, n int) {
		for i := from; i < from+n; i++ {
			f.feed(insertMsg(true, sub, 1, utoa(uint32(i)), pad))
		}
	}
	f.feed(streamStartMsg(10, true), relationMsg(true, 10, 1, "public", "t", 'd', col{"id", 23, true}, col{"pad", 25, false}))
	rows(10, 1, 10)
	rows(11, 100, 80) // about 60% of the budget
	f.feed(streamStopMsg())
	tx := f.d.streams[10]
	before := len(tx.arena)
	checkAccounting(t, f.d)
	f.feed(streamAbortMsg(10, 11))
	checkAccounting(t, f.d)
	if len(tx.arena) > before/5 || len(tx.recs) != 10 {
		t.Fatalf("after the abort the arena holds %d of %d bytes, %d recs", len(tx.arena), before, len(tx.recs))
	}
	f.feed(streamStartMsg(10, false))
	rows(12, 200, 80)
	f.feed(streamStopMsg())
	checkAccounting(t, f.d)
	if st := f.d.Stats(); st.Spilled != 0 || len(tx.arena) > budget || st.BufferedHigh > budget {
		t.Fatalf("arena %d bytes, %+v, budget %d", len(tx.arena), st, budget)
	}
	f.feed(streamCommitMsg(10, 0x9000, 0x9010))
	got := f.take()
	if len(got) != 1 || len(got[0]) != 90 || !strings.Contains(got[0][9], `"id":10,`) || !strings.Contains(got[0][10], `"id":200,`) {
		t.Fatalf("%d txs: %d changes", len(got), len(got[0]))
	}
}

// TestSubAbortSmallKeepsCounting: aborting a subtransaction that holds less
// than half the arena leaves its bytes in the arena (compacting every time
// would be quadratic in savepoints), and they stay counted against the
// budget until a later compaction or spill; what is delivered is unchanged.
func TestSubAbortSmallKeepsCounting(t *testing.T) {
	f := newFeeder(t, Config{MemoryBudget: 1 << 20})
	f.feed(streamStartMsg(10, true), relationMsg(true, 10, 1, "public", "t", 'd', col{"id", 23, true}))
	for i := 1; i <= 400; i++ {
		sub := uint32(10)
		if i%4 == 0 {
			sub = 1000 + uint32(i) // every fourth row in a savepoint rolled back
		}
		f.feed(insertMsg(true, sub, 1, utoa(uint32(i))))
		if sub != 10 {
			f.feed(streamStopMsg(), streamAbortMsg(10, sub))
			checkAccounting(t, f.d)
			f.feed(streamStartMsg(10, false))
		}
	}
	f.feed(streamStopMsg(), streamCommitMsg(10, 0x9000, 0x9010))
	got := f.take()
	if len(got) != 1 || len(got[0]) != 300 || !strings.Contains(got[0][299], `"id":399}`) {
		t.Fatalf("%d changes, last %s", len(got[0]), got[0][len(got[0])-1])
	}
	if f.d.mem != 0 {
		t.Fatalf("%d bytes counted after commit", f.d.mem)
	}
}

// TestSpillReleasesBuffers: once a transaction is spilled, the arena and
// recs that held it in memory are released, not kept uncounted for the rest
// of the transaction.
func TestSpillReleasesBuffers(t *testing.T) {
	f := newFeeder(t, Config{MemoryBudget: 2 << 20})
	f.feed(streamStartMsg(10, true), relationMsg(true, 10, 1, "public", "t", 'd', col{"id", 23, true}, col{"pad", 25, false}))
	pad := strings.Repeat("x", 1000)
	for i := 1; f.d.Stats().Spilled == 0; i++ {
		f.feed(insertMsg(true, 10, 1, utoa(uint32(i)), pad))
	}
	f.feed(insertMsg(true, 10, 1, "0", pad))
	tx := f.d.streams[10]
	if cap(tx.arena) > spillArenaKeep || cap(tx.recs) != 0 || f.d.mem != 0 {
		t.Fatalf("spilled transaction keeps a %d-byte arena, %d recs, %d bytes counted", cap(tx.arena), cap(tx.recs), f.d.mem)
	}
	// One big change passes through the arena; its buffer is not kept.
	f.feed(insertMsg(true, 10, 1, "-1", strings.Repeat("y", 1<<20)))
	if cap(tx.arena) > spillArenaKeep {
		t.Fatalf("arena of %d bytes kept after a big change", cap(tx.arena))
	}
	checkAccounting(t, f.d)
}

// TestArenaNeverPastMaxArena: whatever the budget, a transaction's arena
// never grows past maxArena (plus the one change that crosses it): it is
// spilled first, so rec's 32-bit offsets cannot wrap. maxArena is lowered
// to 16 KiB for the test.
func TestArenaNeverPastMaxArena(t *testing.T) {
	defer func(v int) { maxArena = v }(maxArena)
	maxArena = 16 << 10
	f := newFeeder(t, Config{MemoryBudget: 1 << 40})
	f.feed(beginMsg(5, 0x1F00), relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 20, true}, col{"pad", 25, false}))
	pad := strings.Repeat("z", 200)
	for i := 0; i < 1000; i++ {
		f.feed(insertMsg(false, 0, 1, utoa(uint32(i)), pad))
		if n := len(f.d.cur.arena); n > maxArena {
			t.Fatalf("arena of %d bytes after change %d", n, i)
		}
	}
	f.feed(commitMsg(0x1F00, 0x2000))
	got := f.take()
	if len(got) != 1 || len(got[0]) != 1000 || f.d.Stats().Spilled != 1 || !strings.Contains(got[0][999], `"key":{"id":999}`) {
		t.Fatalf("%d txs, spilled %d", len(got), f.d.Stats().Spilled)
	}
}

// TestChangeTooLargeRefused: a change whose recorded tail length disagrees
// with the arena — what a tail of 4 GiB or more looks like in rec's 32-bit
// fields — is refused with ErrChangeTooLarge, never buffered with a wrapped
// length. (No test can build 4 GiB of change; this feeds add the wrapped
// rec the decoder would build.)
func TestChangeTooLargeRefused(t *testing.T) {
	f := newFeeder(t, Config{})
	f.feed(beginMsg(5, 0x1F00))
	tx := f.d.cur
	tail := `,"entity":"public.t","op":"insert"}`
	tx.arena = append(tx.arena, tail...)
	err := f.d.add(tx, rec{lsn: 0x2000, entity: "public.t", tailLen: uint32(len(tail) - 8)})
	if !errors.Is(err, ErrChangeTooLarge) || len(tx.arena) != 0 || len(tx.recs) != 0 {
		t.Fatalf("err %v, arena %d bytes, %d recs", err, len(tx.arena), len(tx.recs))
	}
}

// TestMemBytes: an in-memory transaction reports at least its bodies'
// bytes; a spilled one, whatever its size, about a kilobyte.
func TestMemBytes(t *testing.T) {
	for _, budget := range []int64{1 << 30, 1} {
		f := newFeeder(t, Config{MemoryBudget: budget})
		f.feed(beginMsg(5, 0x1F00), relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 20, true}, col{"pad", 25, false}))
		for i := 0; i < 1000; i++ {
			f.feed(insertMsg(false, 0, 1, utoa(uint32(i)), strings.Repeat("m", 1000)))
		}
		f.feed(commitMsg(0x1F00, 0x2000))
		tx := f.d.Committed(nil)[0]
		var body int64
		for it := tx.Changes(); it.Next(); {
			body += int64(len(it.Change().Body))
		}
		got := tx.MemBytes()
		switch spilled := tx.spill != nil; {
		case spilled && got > 4<<10:
			t.Fatalf("spilled transaction of %d body bytes reports %d", body, got)
		case !spilled && (got < body || got > body+1000*200):
			t.Fatalf("in-memory transaction of %d body bytes reports %d", body, got)
		case spilled != (budget == 1):
			t.Fatalf("budget %d: spilled %v", budget, spilled)
		}
		tx.Close()
	}
}
