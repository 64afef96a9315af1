package sync

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/fanout/bus"
)

// Positions (DESIGN §6). A member's position is the seq of the last entry of
// its scope it has been given; a live member of a quiet topic (a tenant that
// rarely changes, a table nobody writes) receives nothing, so without help
// its position — and the cursor its client holds — would stay where its
// last change was, and after a reconnect, a deploy or a NATS outage it
// would re-read from far back or, past retention, resync though it missed
// nothing.
//
// The publisher publishes its position P on bus.PositionSubject after the
// entries up to P, on the same connection. When the node receives it, it
// sets a barrier (nats.go Barrier) behind every message already queued for
// its subscriptions; once every subscription has handled those, it reads
// the journal's horizon and each topic's newest entitySeq. A topic that has
// received every change of its entity the journal holds has given each of
// its live members every entry of its scope up to P, and their positions
// move to P. Clients learn the new position as a `position` frame, sent
// after the `pong` of their next ping when it moved.
//
// A topic that has not is behind the journal: its changes are still on the
// way (a publisher catching up), or one was lost on the way — core NATS
// delivers at most once: a route between cluster servers that breaks, a
// server restarting, a subscription over its pending limits. Its members
// keep their positions (a position past a lost entry would skip it for
// good, and tell the client so). When, at a later position past the
// horizon read the first time, the topic still has received nothing more,
// the changes were lost: the topic is repaired from the journal, as on a
// gap — which otherwise only the entity's next change would reveal.

// onPosition handles a publisher position message.
func (n *Node) onPosition(msg *nats.Msg) {
	seq, err := strconv.ParseInt(msg.Header.Get(bus.HeaderSeq), 10, 64)
	if err != nil || seq < 0 {
		n.warnEvery("position", "publisher position message without a valid Walcast-Seq ignored", "subject", msg.Subject)
		return
	}
	epoch, ok := msgEpoch(msg)
	if !ok || !n.inEpoch(epoch) {
		return
	}
	if err := n.nc.Barrier(func() { n.queuePosition(epoch, seq) }); err != nil {
		n.warnEvery("position", "cannot set a NATS barrier for the publisher's position", "err", err)
	}
}

// queuePosition hands a position to followPositions, replacing one not yet
// taken (the newer covers it). It never blocks the NATS callback.
func (n *Node) queuePosition(epoch, seq int64) {
	for {
		select {
		case n.positions <- [2]int64{epoch, seq}:
			return
		default:
		}
		select {
		case <-n.positions:
		default:
		}
	}
}

// followPositions applies publisher positions, one at a time, off the NATS
// callbacks (advanceTo reads the journal).
func (n *Node) followPositions() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case p := <-n.positions:
			n.advanceTo(p[0], p[1])
		}
	}
}

// lostCheck is a topic's shortfall seen at one publisher position: the
// newest entitySeq it had received and the journal's horizon then.
type lostCheck struct {
	set     bool
	eseq    int64
	horizon int64
}

// advanceTo moves the live members of epoch e to at least seq, in each
// topic that has received every change of its entity the journal holds,
// and repairs the topics that are still short of the journal after the
// publisher has passed what it held at the previous position (see above).
// It reads the journal, so it runs on followPositions, off the NATS
// callbacks.
func (n *Node) advanceTo(e, seq int64) {
	if n.epoch.Load() != e {
		return
	}
	if n.horizonKnown.Load() {
		// Never past what the journal holds: a position message is only
		// as good as its publisher (the journal's NOTIFY reaches this
		// node before the publisher has even read those entries).
		seq = min(seq, n.horizon.Load())
	}
	topics := n.topicList()
	if len(topics) == 0 {
		return
	}
	entities := make([]string, len(topics))
	for i, t := range topics {
		entities[i] = t.entity
	}
	ctx, cancel := context.WithTimeout(n.ctx, 10*time.Second)
	horizon, je, last, err := n.j.EntityProgress(ctx, e, entities)
	cancel()
	if err != nil {
		n.warnEvery("position", "cannot read the journal to apply the publisher's position; positions stay", "err", err)
		return
	}
	if je != e || n.epoch.Load() != e {
		return
	}
	// What EntityProgress read is true up to its horizon, which on a
	// standby journal (--journal-read-url) may lag the publisher: a topic
	// that has every change the standby holds has every change up to that
	// horizon, not necessarily up to seq.
	seq = min(seq, horizon)
	moved := int64(0)
	for _, t := range topics {
		released := false
		t.mu.Lock()
		switch jl := last[t.entity]; {
		case !t.baselined:
		case t.lastEntitySeq >= jl:
			t.lost = lostCheck{}
			var enc liveFrames
			for m := range t.members {
				if m.state != memberLive || m.epoch != e {
					continue
				}
				if m.held != nil && m.held.seq <= horizon {
					// Everything of the entity up to the horizon just
					// read arrived, and a horizon is a transaction
					// boundary: the held change ends its transaction.
					if enc.n == nil {
						enc = liveFrames{n: n, topic: t.entity}
					}
					m.releaseLocked(&enc, true)
					released = true
				}
				if m.state == memberLive && m.held == nil && !m.mid && m.pos < seq {
					m.pos, m.bound = seq, seq
					m.quiet = true
					moved++
				}
			}
		case t.lost.set && t.lost.eseq == t.lastEntitySeq && seq >= t.lost.horizon:
			// The publisher has published everything the journal held
			// at the previous position, and none of this entity's
			// changes among it arrived: lost.
			t.lost = lostCheck{}
			t.lastEntitySeq = jl
			t.repairLocked("lost")
			n.stats.inc(&n.stats.repairs, "lost")
		case !t.lost.set || t.lost.eseq != t.lastEntitySeq:
			t.lost = lostCheck{set: true, eseq: t.lastEntitySeq, horizon: horizon}
		}
		t.mu.Unlock()
		if released {
			// Released off the topic's NATS callback: no message's end
			// starts the writers the frames were queued for.
			t.endBurst(nil)
		}
	}
	n.stats.positionsMoved.Add(moved)
}

// sendPositions queues a `position` frame for each of the socket's topics
// whose position moved without a frame telling the client (advanceTo). A
// position frame is an offer: it is sent only when the queue has room, and
// a socket that is behind gets it on a later ping. Called on the socket's
// reading goroutine (it owns s.members).
func (s *socket) sendPositions() {
	for _, m := range s.members {
		t := m.t
		if t == nil {
			continue
		}
		t.mu.Lock()
		if m.quiet && m.state == memberLive && !m.mid && m.held == nil {
			cur, err := s.n.j.CursorAt(m.q, m.epoch, m.pos)
			if err == nil && s.offer(controlFrame("position", m.topic, cur)) {
				m.quiet = false
			}
		}
		t.mu.Unlock()
	}
}

// offer queues f only if it fits within MaxBufferedBytes; it never drops
// or closes.
func (s *socket) offer(f *frame) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing || s.conn == nil || (s.queued > 0 && s.queued+f.size > s.n.cfg.MaxBufferedBytes) {
		return false
	}
	s.pushLocked(f)
	return true
}
