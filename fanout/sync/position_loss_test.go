package sync

import (
	"testing"
	"time"
)

// TestSyncPositionAfterALostMessage: core NATS delivers at most once — in a
// cluster a route can drop messages between the publisher's server and the
// node's (a server cut off or restarted) while a later position message
// arrives. The position must not move a member past the entry it never got
// (a cluster test once saw 254 changes skipped for good): the
// member keeps its position and no `position` frame tells the client it is
// past the entry; at a later position past the journal's horizon the topic
// is repaired from the journal and the client gets the lost entry, before
// any later change of the entity would have shown the gap.
func TestSyncPositionAfterALostMessage(t *testing.T) {
	e := newSyncEnv(t)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	c.sub(orders, "")
	c.expect("subscribed")
	e.topicLive(orders, 1)
	first := e.commit(ins(orders, 1))[0]
	if f := c.expect("change"); f.env.Seq != first.Seq {
		t.Fatalf("got %+v, want %d", f, first.Seq)
	}
	lost := e.appendRows(ins(orders, 2))[0] // journaled, never delivered
	waitFor(t, "the node's horizon", func() bool { return e.node.horizon.Load() >= lost.Seq })
	e.position(lost.Seq) // the publisher's position, after the lost entry
	waitFor(t, "the position handled", func() bool {
		e.node.mu.Lock()
		tp := e.node.topics[orders]
		e.node.mu.Unlock()
		tp.mu.Lock()
		defer tp.mu.Unlock()
		return tp.lost.set
	})
	// The position frame would follow the pong: the next frame must be
	// the lost change, once a second position past the horizon the first
	// one saw has shown it lost.
	c.send(map[string]string{"t": "ping"})
	c.expect("pong")
	e.position(lost.Seq)
	if f := c.read(); f.T != "change" || f.env.Seq != lost.Seq {
		t.Fatalf("got %+v, want the lost change %d (a position frame here skipped it)", f, lost.Seq)
	}
	if e.node.Stats().Repairs["lost"] != 1 {
		t.Fatalf("repairs %v, want one lost", e.node.Stats().Repairs)
	}
	next := e.commit(ins(orders, 3))[0]
	if f := c.expect("change"); f.env.Seq != next.Seq {
		t.Fatalf("got the change at %d, want %d", f.env.Seq, next.Seq)
	}
	// Caught up, the next position (past a change of another table) moves
	// the member again.
	other := e.commit(ins("public.other", 1))[0]
	waitFor(t, "the node's horizon", func() bool { return e.node.horizon.Load() >= other.Seq })
	moved := e.node.stats.positionsMoved.Load()
	e.position(other.Seq)
	waitFor(t, "the member moved", func() bool { return e.node.stats.positionsMoved.Load() > moved })
	c.send(map[string]string{"t": "ping"})
	c.expect("pong")
	if f := c.expect("position"); f.Topic != orders {
		t.Fatalf("position frame %+v", f)
	}
}
