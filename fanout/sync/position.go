package sync

import (
	"strconv"

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
// its subscriptions; once every subscription has handled those — every
// entry up to P that this node subscribes to — each live member has been
// given every entry of its scope up to P, and its position moves to P.
// Clients learn the new position as a `position` frame, sent after the
// `pong` of their next ping when it moved.

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
	if err := n.nc.Barrier(func() { n.advanceTo(epoch, seq) }); err != nil {
		n.warnEvery("position", "cannot set a NATS barrier for the publisher's position", "err", err)
	}
}

// advanceTo moves every live member of epoch e to at least seq: every entry
// up to seq has been handled by the member's topic (onPosition).
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
	moved := int64(0)
	for _, t := range topics {
		t.mu.Lock()
		for m := range t.members {
			if m.state == memberLive && m.epoch == e && m.pos < seq {
				m.pos = seq
				m.quiet = true
				moved++
			}
		}
		t.mu.Unlock()
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
		if m.quiet && m.state == memberLive {
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
