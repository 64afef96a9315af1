package decoder

import (
	"fmt"
	"reflect"
	"sync"
	"testing"
)

// TestCountersByEntityAndOp decodes inserts, updates, deletes, a truncate
// and messages on two tables (and a journal table, which is dropped)
// while another goroutine reads the counters, as a metrics callback does.
func TestCountersByEntityAndOp(t *testing.T) {
	counts := NewCounters()
	f := newFeeder(t, Config{Counters: counts, SkipRelations: map[uint32]bool{3: true}})
	if f.d.Counters() != counts {
		t.Fatal("Counters() is not Config.Counters")
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			counts.Each(func(string, Op, uint64) {})
		}
	}()
	f.feed(
		relationMsg(false, 0, 1, "public", "a", 'd', col{"id", 23, true}),
		relationMsg(false, 0, 2, "public", "b", 'd', col{"id", 23, true}),
		relationMsg(false, 0, 3, "walcast", "entries", 'd', col{"id", 23, true}),
		beginMsg(10, 0x2000),
		insertMsg(false, 0, 1, "1"), insertMsg(false, 0, 1, "2"), insertMsg(false, 0, 2, "1"),
		updateMsg(false, 0, 1, 0, nil, "1"),
		deleteMsg(false, 0, 2, 'K', "1"),
		insertMsg(false, 0, 3, "9"),
		truncateMsg(false, 0, 0, 1, 2, 3),
		messageMsg(false, 0, true, 0x1100, "walcast.audit", `{}`),
		messageMsg(false, 0, true, 0x1110, "other.prefix", `{}`),
		commitMsg(0x2000, 0x2010),
		messageMsg(false, 0, false, 0x2020, "walcast.audit", `{}`),
	)
	close(stop)
	wg.Wait()

	type k struct {
		e  string
		op Op
	}
	got := map[k]uint64{}
	counts.Each(func(e string, op Op, n uint64) { got[k{e, op}] = n })
	want := map[k]uint64{
		{"public.a", OpInsert}: 2, {"public.a", OpUpdate}: 1, {"public.a", OpTruncate}: 1,
		{"public.b", OpInsert}: 1, {"public.b", OpDelete}: 1, {"public.b", OpTruncate}: 1,
		{"walcast.audit", OpMessage}: 2,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("counts = %v, want %v", got, want)
	}
	if n := counts.Get("public.a", OpInsert); n != 2 {
		t.Fatalf("Get(public.a, insert) = %d", n)
	}

	// CountChanges groups a committed transaction's changes the same way.
	txs := f.d.Committed(nil)
	if len(txs) != 2 {
		t.Fatalf("%d transactions committed, want 2", len(txs))
	}
	journaled := NewCounters()
	for _, tx := range txs {
		if !tx.CountChanges(func(e string, op Op, n int) { journaled.Add(e, op, uint64(n)) }) {
			t.Fatal("CountChanges refused an in-memory transaction")
		}
		tx.Close()
	}
	got = map[k]uint64{}
	journaled.Each(func(e string, op Op, n uint64) { got[k{e, op}] = n })
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("CountChanges: %v, want %v", got, want)
	}
}

// TestCountersSpilled: a streamed transaction spilled to disk, with an
// aborted subtransaction, is counted at decode time (aborted changes
// included), and CountChanges reports what it delivers without reading its
// spill file.
func TestCountersSpilled(t *testing.T) {
	f := newFeeder(t, Config{MemoryBudget: 1})
	f.feed(
		streamStartMsg(100, true),
		relationMsg(true, 100, 1, "public", "a", 'd', col{"id", 23, true}),
		relationMsg(true, 100, 2, "public", "b", 'd', col{"id", 23, true}),
		insertMsg(true, 100, 1, "1"), insertMsg(true, 100, 1, "2"), insertMsg(true, 100, 2, "1"),
		insertMsg(true, 101, 1, "3"), deleteMsg(true, 101, 2, 'K', "1"),
		streamStopMsg(),
		streamAbortMsg(100, 101),
		streamStartMsg(100, false),
		insertMsg(true, 100, 1, "4"), updateMsg(true, 100, 2, 0, nil, "1"),
		streamStopMsg(),
		streamCommitMsg(100, 0x3000, 0x3010),
	)
	if f.d.Stats().Spilled != 1 {
		t.Fatalf("not spilled: %+v", f.d.Stats())
	}
	if n := f.d.Counters().Get("public.a", OpInsert); n != 4 {
		t.Fatalf("decoded inserts = %d, want 4 (the aborted one included)", n)
	}
	txs := f.d.Committed(nil)
	if len(txs) != 1 || txs[0].Len() != 5 {
		t.Fatalf("committed %d transactions", len(txs))
	}
	tx := txs[0]
	// Close first: the spill file is gone, so counting cannot read it.
	if err := tx.Close(); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	if !tx.CountChanges(func(e string, op Op, n int) { got[e+" "+string(op)] += n }) {
		t.Fatal("CountChanges refused a spilled transaction")
	}
	want := map[string]int{"public.a insert": 3, "public.b insert": 1, "public.b update": 1}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("CountChanges = %v, want %v", got, want)
	}
}

// TestCountersSpilledTooManyGroups: a spilled streamed transaction with a
// subtransaction per row keeps no per-group counts: CountChanges refuses it.
func TestCountersSpilledTooManyGroups(t *testing.T) {
	f := newFeeder(t, Config{MemoryBudget: 1})
	f.feed(streamStartMsg(100, true), relationMsg(true, 100, 1, "public", "a", 'd', col{"id", 23, true}))
	for i := 0; i <= maxSpillKeys; i++ {
		f.feed(insertMsg(true, uint32(1000+i), 1, fmt.Sprint(i)))
	}
	f.feed(streamStopMsg(), streamCommitMsg(100, 0x90000, 0x90010))
	txs := f.d.Committed(nil)
	if len(txs) != 1 || txs[0].Len() != maxSpillKeys+1 {
		t.Fatalf("committed %d transactions", len(txs))
	}
	if txs[0].CountChanges(func(string, Op, int) { t.Fatal("counted") }) {
		t.Fatal("CountChanges counted a transaction with too many groups")
	}
	txs[0].Close()
}

// TestCountersBoundMessages: message prefixes past MaxMessageEntities are
// counted under OtherEntity.
func TestCountersBoundMessages(t *testing.T) {
	f := newFeeder(t, Config{})
	for i := 0; i < MaxMessageEntities+3; i++ {
		f.feed(messageMsg(false, 0, false, f.lsn, fmt.Sprintf("walcast.p%d", i), `1`))
	}
	f.take()
	entities := 0
	var other uint64
	f.d.Counters().Each(func(e string, op Op, n uint64) {
		entities++
		if e == OtherEntity {
			other = n
		}
	})
	if entities != MaxMessageEntities+1 || other != 3 {
		t.Fatalf("%d entities, %d under %s; want %d and 3", entities, other, OtherEntity, MaxMessageEntities+1)
	}
}

// TestCountersOpIndex: the decoder counts by its internal op number, which
// must be the Op's slot in EntityCounters.
func TestCountersOpIndex(t *testing.T) {
	for i, op := range opNames {
		if opIndex(op) != i {
			t.Errorf("op %s: internal %d, counter slot %d", op, i, opIndex(op))
		}
	}
}
