package sync

import "time"

// lagSweepEvery is how often sockets' lag is checked for MaxLag: a quarter
// of it, between 100 ms and 5 s.
func (n *Node) lagSweepEvery() time.Duration {
	if n.cfg.MaxLag <= 0 {
		return 5 * time.Second
	}
	return min(5*time.Second, max(100*time.Millisecond, n.cfg.MaxLag/4))
}

// sweepLag closes with 1013 backpressure every socket whose client has
// been behind for longer than MaxLag (socket.lagLocked: the oldest frame it
// is owed, or a replay-gap it has been owed since the queue last drained),
// and forgets per-client budgets at rest. A client that cannot keep up is
// told so within MaxLag plus a sweep, plus up to WriteTimeout for the write
// in progress.
func (n *Node) sweepLag() {
	defer n.wg.Done()
	every := n.lagSweepEvery()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.cfg.Clock.After(every):
		}
		now := n.cfg.Clock.Now()
		n.limits.prune(now)
		if n.cfg.MaxLag < 0 {
			continue
		}
		n.mu.Lock()
		socks := make([]*socket, 0, len(n.sockets))
		for s := range n.sockets {
			socks = append(socks, s)
		}
		n.mu.Unlock()
		for _, s := range socks {
			s.mu.Lock()
			if !s.closing && s.lagLocked(now.UnixNano()) > n.cfg.MaxLag {
				s.n.stats.lagCloses.Add(1)
				s.closeLocked(CloseBackpressure, "backpressure", "backpressure")
			}
			s.mu.Unlock()
		}
	}
}
