package sync

import (
	"context"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
)

// askCovered asks the active `walcast run`, over NATS, whether the journal
// holds every change committed before at (bus.CoveredSubject). It reports
// false when no replicator answers within 3 s (none running, a version
// without the responder, NATS down) or the answer is short of at; the
// caller then waits for the journal, as it would without asking.
func (n *Node) askCovered(ctx context.Context, at decoder.LSN) bool {
	b, _ := at.MarshalText()
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	m, err := n.nc.RequestWithContext(rctx, bus.CoveredSubject(n.cfg.SubjectPrefix), b)
	if err != nil {
		return false
	}
	var got decoder.LSN
	return got.UnmarshalText(m.Data) == nil && got >= at
}
