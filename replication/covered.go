package replication

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/walcast/walcast/decoder"
)

// ErrNotStreaming: Covered was asked of a replicator that holds no slot
// session (a standby, or one between sessions).
var ErrNotStreaming = errors.New("this replicator is not streaming the slot (standby or reconnecting)")

// coverage tracks how far the source's WAL is known to be journaled: every
// committed change of the publication before that position is in the
// journal. The watermark says so for the positions it has journaled; an
// idle session also learns it from a keepalive (the server's sent position)
// that arrives with nothing decoded but unjournaled — without writing
// anything, so it costs no WAL even when the journal lives in the source
// database (where the watermark itself advances only every ownWALSlack
// bytes while idle).
type coverage struct {
	lsn  atomic.Uint64 // the newest keepalive position seen while idle
	want atomic.Bool   // someone waits: ask the server for a keepalive

	mu   sync.Mutex
	wake func() // interrupts the session loop's receive; nil without a session
}

func (c *coverage) setWake(f func()) {
	c.mu.Lock()
	c.wake = f
	c.mu.Unlock()
}

// ask makes the session loop request a keepalive now. It reports false
// when there is no session.
func (c *coverage) ask() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wake == nil {
		return false
	}
	c.want.Store(true)
	c.wake()
	return true
}

func (c *coverage) advance(end decoder.LSN) {
	for {
		old := c.lsn.Load()
		if uint64(end) <= old || c.lsn.CompareAndSwap(old, uint64(end)) {
			return
		}
	}
}

// Covered returns a source WAL position up to which every committed change
// of the publication is journaled (and so readable from the journal once
// Covered returns), waiting until it reaches at or ctx ends. While it is
// short of at, the session is asked for a fresh keepalive every 100 ms; an
// idle source answers within a round trip. It returns what it knows, with
// ErrNotStreaming when no session is running (the caller should wait for
// journaled changes instead) or ctx's error when ctx ends first.
func (r *Replicator) Covered(ctx context.Context, at decoder.LSN) (decoder.LSN, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		got := decoder.LSN(max(r.watermark.Load(), r.cov.lsn.Load()))
		if got >= at {
			return got, nil
		}
		if !r.cov.ask() {
			return got, ErrNotStreaming
		}
		select {
		case <-ctx.Done():
			return decoder.LSN(max(r.watermark.Load(), r.cov.lsn.Load())), ctx.Err()
		case <-tick.C:
		}
	}
}
