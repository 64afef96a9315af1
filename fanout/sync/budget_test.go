package sync

import (
	"context"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// TestSyncCatchUpPagesBoundedByBytes: a replay of 40 rows of 50 KB reads
// pages of at most MaxBufferedBytes/4 (plus one envelope) instead of one
// page of 1,000 frames outside the queue, and still delivers every row in
// order.
func TestSyncCatchUpPagesBoundedByBytes(t *testing.T) {
	e := newSyncEnv(t, func(c *Config) { c.MaxBufferedBytes = 512 << 10 })
	var rows []row
	for i := range 40 {
		rows = append(rows, row{entity: orders, op: decoder.OpInsert, id: i, pad: 50 << 10})
	}
	es := e.commit(rows...)
	cur, _ := e.j.CursorAt(journal.Query{Entities: []string{orders}}, 0, es[0].Seq-1)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c.sub(orders, cur)
	c.expect("subscribed")
	got := seqsOf(c.expectChanges(len(es)))
	for i := range got {
		if got[i] != es[i].Seq {
			t.Fatalf("replayed %v", got)
		}
	}
	pages := e.node.reads.queries.Load()
	// 40 × ~50 KB at 128 KB a page: at least 10 pages.
	if pages < 10 {
		t.Fatalf("%d journal reads for 2 MB of replay: pages not bounded by bytes", pages)
	}
	if b := e.node.catchUpPageBytes(); b != 128<<10 {
		t.Fatalf("page bytes %d", b)
	}
}

// TestSyncCatchUpReadCanceledWhenClientLeaves: a journal read whose only
// waiter disconnects is canceled (before, it ran to completion on the
// node's context, and the waiters count was unused).
func TestSyncCatchUpReadCanceledWhenClientLeaves(t *testing.T) {
	e := newSyncEnv(t)
	es := e.commit(ins(orders, 1))
	started, canceled := blockReads(e)
	cur, _ := e.j.CursorAt(journal.Query{Entities: []string{orders}}, 0, es[0].Seq-1)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c.sub(orders, cur)
	c.expect("subscribed")
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("catch-up read did not start")
	}
	_ = c.c.Close()
	select {
	case <-canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the read went on after its only client left")
	}
	waitFor(t, "canceled counted", func() bool { return e.node.reads.canceled.Load() == 1 })
	e.node.reads.testHook.Store(nil)
	// A new client of the same place reads afresh.
	c2 := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c2.sub(orders, cur)
	c2.expect("subscribed")
	if f := c2.expect("change"); f.env.Seq != es[0].Seq {
		t.Fatalf("got %d", f.env.Seq)
	}
}

// blockReads makes the node's next journal read wait for its context:
// started receives when it begins, canceled is closed when the context ends
// it (one read: a second would close canceled again).
func blockReads(e *syncEnv) (started, canceled chan struct{}) {
	started, canceled = make(chan struct{}, 1), make(chan struct{})
	hook := func(ctx context.Context) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		close(canceled)
	}
	e.node.reads.testHook.Store(&hook)
	return started, canceled
}
