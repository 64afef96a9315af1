package sync

import (
	"context"
	"sync"
)

// slots is a counting semaphore of max slots that allocates nothing until
// someone has to wait: every socket holds two (catch-up pages, snapshots),
// and a channel of tokens each would cost an idle socket 96 bytes apiece.
// The zero value with max set is ready; max 0 means one.
type slots struct {
	mu    sync.Mutex // guards the following fields
	max   int
	held  int
	freed chan struct{} // closed by the next release; nil while nobody waits
}

// acquire takes a slot, waiting while all are held. It reports false, with
// nothing taken, when ctx ends first.
func (sl *slots) acquire(ctx context.Context) bool {
	for {
		sl.mu.Lock()
		if sl.held < max(1, sl.max) {
			sl.held++
			sl.mu.Unlock()
			return true
		}
		if sl.freed == nil {
			sl.freed = make(chan struct{})
		}
		freed := sl.freed
		sl.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return false
		}
	}
}

// release gives back a slot taken by acquire and wakes the waiters (they
// compete for it again).
func (sl *slots) release() {
	sl.mu.Lock()
	sl.held--
	if sl.freed != nil {
		close(sl.freed)
		sl.freed = nil
	}
	sl.mu.Unlock()
}

// signal is a one-shot event whose channel is made only when someone waits
// before it fires (a socket's "read loop returned" is waited for only
// when the node closes the socket). The zero value is ready.
type signal struct {
	mu    sync.Mutex // guards the following fields
	fired bool
	ch    chan struct{}
}

// closedChan is what wait returns once the signal has fired.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// fire fires the signal; later calls do nothing.
func (sg *signal) fire() {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	if sg.fired {
		return
	}
	sg.fired = true
	if sg.ch != nil {
		close(sg.ch)
	}
}

// wait returns a channel closed when the signal fires.
func (sg *signal) wait() <-chan struct{} {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	if sg.fired {
		return closedChan
	}
	if sg.ch == nil {
		sg.ch = make(chan struct{})
	}
	return sg.ch
}
