package sync

import (
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/journal"
)

// Epochs (DESIGN §5; journal.EpochHex). Every position the node holds — a
// member's pos, the cursors it issues, a topic's entitySeq baseline — is a
// position in one epoch of the journal: n.epoch. A message or cursor of
// another epoch is never compared with them. When the journal's epoch
// changes (a restore or reset: seqs are assigned again), the node asks the
// journal, which is the authority, and if the journal has moved to another
// epoch every member is sent a resync at the new epoch's horizon and every
// baseline is dropped: nothing of the old history is taken for the new one.

// msgEpoch is the epoch a published message carries (Walcast-Epoch; a
// publisher older than epochs sends none, which is epoch 0).
func msgEpoch(msg *nats.Msg) (int64, bool) {
	h := msg.Header.Get(bus.HeaderEpoch)
	if h == "" {
		return 0, true
	}
	e, err := strconv.ParseUint(h, 16, 63)
	if err != nil || len(h) != 16 {
		return 0, false
	}
	return int64(e), true
}

// inEpoch reports whether e is the node's epoch; if not, it asks for a
// check of the journal's (the message or cursor may be the first sign of a
// reset, or a straggler of the old history).
func (n *Node) inEpoch(e int64) bool {
	if e == n.epoch.Load() {
		return true
	}
	n.pokeEpoch()
	return false
}

// pokeEpoch asks watchEpoch to read the journal's epoch.
func (n *Node) pokeEpoch() {
	select {
	case n.epochPoke <- struct{}{}:
	default:
	}
}

// epochCheckInterval spaces the journal reads a flood of foreign-epoch
// messages or cursors can cause.
const epochCheckInterval = time.Second

// watchEpoch reads the journal's epoch when poked, at most once per
// epochCheckInterval, and switches the node to it when it changed.
func (n *Node) watchEpoch() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.epochPoke:
		}
		st, err := n.j.State(n.ctx)
		switch {
		case err != nil && n.ctx.Err() != nil:
			return
		case err != nil:
			n.warnEvery("epoch", "cannot read the journal's epoch; retrying", "err", err)
			n.pokeEpoch()
		case st.Epoch != n.epoch.Load():
			n.switchEpoch(st.Epoch, st.Horizon)
		}
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(epochCheckInterval):
		}
	}
}

// switchEpoch moves the node to epoch e, whose horizon is h: every member
// gets a resync at h (its client refetches and continues from there), and
// every topic forgets its baselines, which belong to the old history.
func (n *Node) switchEpoch(e, h int64) {
	old := n.epoch.Swap(e)
	if old == e {
		return
	}
	n.horizon.Store(h)
	n.stats.epochChanges.Add(1)
	topics := n.topicList()
	members := 0
	for _, t := range topics {
		t.mu.Lock()
		t.baselined = false
		t.lastSeen = h
		enc := map[string]*frame{}
		for m := range t.members {
			if m.state == memberGone {
				continue
			}
			f := enc[m.q.Tenant]
			if f == nil {
				cur, _ := n.j.CursorAt(m.q, e, h)
				f = controlFrame("resync", m.topic, cur)
				enc[m.q.Tenant] = f
			}
			m.epoch = e
			m.resyncLocked(f, h)
			members++
		}
		t.mu.Unlock()
	}
	n.log.Warn("the journal's epoch changed (a restore or reset of its history); every client was told to resync",
		"from", journal.EpochHex(old), "to", journal.EpochHex(e), "horizon", h, "members", members)
}

// alignEpochLocked resyncs m when it was set up in an epoch the node has
// since left (a subscribe racing switchEpoch). t.mu is held.
func (n *Node) alignEpochLocked(m *member) {
	e := n.epoch.Load()
	if m.epoch == e || m.state == memberGone {
		return
	}
	h := n.horizon.Load()
	cur, _ := n.j.CursorAt(m.q, e, h)
	m.epoch = e
	m.resyncLocked(controlFrame("resync", m.topic, cur), h)
}
