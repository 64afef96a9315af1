package replication

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/walcast/walcast/decoder"
)

type entityOp struct {
	entity string
	op     decoder.Op
}

func countsOf(c *decoder.Counters) map[entityOp]uint64 {
	m := map[entityOp]uint64{}
	c.Each(func(e string, op decoder.Op, n uint64) { m[entityOp{e, op}] = n })
	return m
}

// TestChangeCountsByEntity: the changes decoded and journaled, by entity and
// op, match what the journal holds after inserts, updates and deletes on two
// tables, and every journal batch has one span carrying its totals.
func TestChangeCountsByEntity(t *testing.T) {
	f := newFixture(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	r, err := New(f.config(), f.j)
	if err != nil {
		t.Fatal(err)
	}
	r.SetTracerProvider(tp)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor(t, "active role", 10*time.Second, func() bool { return r.State().Role == RoleActive })

	w := newWorkload(t, f.url)
	w.mixed(t, 3)
	for i := 0; i < 4; i++ {
		w.exec(t, nil, fmt.Sprintf("INSERT INTO other VALUES (%d, 'x')", i))
	}
	w.exec(t, nil, "UPDATE other SET val = 'y' WHERE id < 3", "DELETE FROM other WHERE id = 0")
	want := map[entityOp]uint64{
		{"public.items", decoder.OpInsert}: 6, {"public.items", decoder.OpUpdate}: 3, {"public.items", decoder.OpDelete}: 3,
		{"public.other", decoder.OpInsert}: 4, {"public.other", decoder.OpUpdate}: 3, {"public.other", decoder.OpDelete}: 1,
	}
	waitFor(t, "all changes journaled", 30*time.Second, func() bool { return len(f.entries()) == 20 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}

	fromJournal := map[entityOp]uint64{}
	for _, e := range f.entries() {
		fromJournal[entityOp{e.Entity, e.Op}]++
	}
	if !reflect.DeepEqual(fromJournal, want) {
		t.Fatalf("journal holds %v, want %v", fromJournal, want)
	}
	decoded, journaled := r.ChangeCounts()
	if got := countsOf(decoded); !reflect.DeepEqual(got, want) {
		t.Errorf("decoded %v, want %v", got, want)
	}
	if got := countsOf(journaled); !reflect.DeepEqual(got, want) {
		t.Errorf("journaled %v, want %v", got, want)
	}

	spans := rec.Ended()
	var entries, withEntries int64
	for _, s := range spans {
		if s.Name() != spanJournalAppend {
			t.Errorf("span %q, want only %q", s.Name(), spanJournalAppend)
		}
		attrs := map[string]any{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.AsInterface()
		}
		for _, k := range []string{"walcast.transactions", "walcast.entries", "walcast.watermark", "walcast.generation"} {
			if _, ok := attrs[k]; !ok {
				t.Errorf("span %s lacks %s: %v", s.Name(), k, attrs)
			}
		}
		if n, _ := attrs["walcast.entries"].(int64); n > 0 {
			entries += n
			withEntries++
		}
		if g, _ := attrs["walcast.generation"].(int64); g != r.State().Generation {
			t.Errorf("span generation %v, want %d", attrs["walcast.generation"], r.State().Generation)
		}
	}
	if entries != 20 || withEntries == 0 || withEntries > int64(r.Stats().Batches.Load()) {
		t.Errorf("spans carry %d entries in %d batches; want 20 in at most %d", entries, withEntries, r.Stats().Batches.Load())
	}
}

// TestJournaledCountsSpilled: a transaction the decoder spilled to disk is
// counted by entity as decoded and as journaled.
func TestJournaledCountsSpilled(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.MemoryBudget = 1 // every transaction spills at its first change
	cfg.SpillDir = t.TempDir()
	run := f.start(cfg)
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	w := newWorkload(t, f.url)
	w.exec(t, nil, "INSERT INTO items VALUES (1, 'a', 1), (2, 'b', 2)")
	waitFor(t, "changes journaled", 30*time.Second, func() bool { return run.r.Stats().Changes.Load() == 2 })
	decoded, journaled := run.r.ChangeCounts()
	if n := decoded.Get("public.items", decoder.OpInsert); n != 2 {
		t.Errorf("decoded inserts = %d, want 2", n)
	}
	if got, want := countsOf(journaled), map[entityOp]uint64{{"public.items", decoder.OpInsert}: 2}; !reflect.DeepEqual(got, want) {
		t.Errorf("journaled by entity %v, want %v", got, want)
	}
}
