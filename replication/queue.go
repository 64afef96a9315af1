package replication

import (
	"context"
	"sync"
	"time"

	"github.com/walcast/walcast/decoder"
)

// queueItem is a committed transaction to journal, or (tx nil) a position
// to advance the watermark to.
type queueItem struct {
	tx      *decoder.Transaction
	advance decoder.LSN
	changes int
}

func (it queueItem) release() {
	if it.tx != nil {
		_ = it.tx.Close() // removes a spill file; nothing to report
	}
}

// queue hands decoded transactions from the receive loop to the journal
// writer. It is bounded by the number of changes it holds (an empty queue
// admits any one transaction) and tracks what is in flight, so the loop can
// tell when nothing is buffered, queued or being written.
type queue struct {
	max int

	mu       sync.Mutex // guards the following fields
	items    []queueItem
	changes  int           // changes in items
	inflight int           // items taken by the writer and not yet done
	closed   bool          // no more takes
	ready    chan struct{} // signalled (cap 1) when items are added or the queue closes
	roomCh   chan struct{} // signalled (cap 1) when items leave
}

func newQueue(maxChanges int) *queue {
	return &queue{max: maxChanges, ready: make(chan struct{}, 1), roomCh: make(chan struct{}, 1)}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// push appends committed transactions in commit order.
func (q *queue) push(txs []*decoder.Transaction) {
	q.mu.Lock()
	for _, tx := range txs {
		q.items = append(q.items, queueItem{tx: tx, changes: tx.Len()})
		q.changes += tx.Len()
	}
	q.mu.Unlock()
	signal(q.ready)
}

// pushAdvance queues a watermark-only advance to lsn.
func (q *queue) pushAdvance(lsn decoder.LSN) {
	q.mu.Lock()
	q.items = append(q.items, queueItem{advance: lsn})
	q.mu.Unlock()
	signal(q.ready)
}

// full reports whether the loop must stop reading: the queue holds at least
// max changes.
func (q *queue) full() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.changes >= q.max && len(q.items) > 0
}

// idle reports whether nothing is queued or being written.
func (q *queue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) == 0 && q.inflight == 0
}

// room is signalled when items leave the queue.
func (q *queue) room() <-chan struct{} { return q.roomCh }

// take waits for the first item, then gathers what is queued up to maxTxns
// items or maxChanges changes; when the queue runs empty it waits up to
// maxDelay after the first item for more (not at all when maxDelay is 0). It
// reports false once the queue is closed.
func (q *queue) take(maxTxns, maxChanges int, maxDelay time.Duration) ([]queueItem, bool) {
	var deadline <-chan time.Time
	var batch []queueItem
	changes := 0
	for {
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			// Items already taken into batch are handed back to be released.
			q.requeueFront(batch)
			return nil, false
		}
		for len(q.items) > 0 && len(batch) < maxTxns && (len(batch) == 0 || changes+q.items[0].changes <= maxChanges) {
			it := q.items[0]
			q.items[0] = queueItem{}
			q.items = q.items[1:]
			q.changes -= it.changes
			q.inflight++
			batch = append(batch, it)
			changes += it.changes
		}
		full := len(batch) >= maxTxns || changes >= maxChanges || (len(q.items) > 0 && len(batch) > 0)
		q.mu.Unlock()
		if len(batch) > 0 {
			signal(q.roomCh)
		}
		if full || (len(batch) > 0 && maxDelay <= 0) {
			return batch, true
		}
		if len(batch) > 0 && deadline == nil {
			t := time.NewTimer(maxDelay)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-q.ready:
		case <-deadline:
			return batch, true
		}
	}
}

// requeueFront returns taken items to the queue so drain releases them.
func (q *queue) requeueFront(items []queueItem) {
	if len(items) == 0 {
		return
	}
	q.mu.Lock()
	q.items = append(items, q.items...)
	q.inflight -= len(items)
	q.mu.Unlock()
}

// done marks n taken items as written (or failed).
func (q *queue) done(n int) {
	q.mu.Lock()
	q.inflight -= n
	q.mu.Unlock()
}

// close stops take; queued items stay for drain.
func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	signal(q.ready)
}

// drain removes and returns every queued item.
func (q *queue) drain() []queueItem {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items, q.changes = nil, 0
	return items
}

// waker lets the writer interrupt the loop's receive wait when a new
// watermark is ready to acknowledge. It cancels only the receive's context;
// the loop stays the connection's only writer.
type waker struct {
	mu      sync.Mutex // guards the following fields
	cancel  context.CancelFunc
	pending bool
}

// arm registers the cancel func of the receive about to start; if a wake
// came in between, it cancels at once.
func (w *waker) arm(cancel context.CancelFunc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending {
		w.pending = false
		cancel()
		return
	}
	w.cancel = cancel
}

func (w *waker) disarm() {
	w.mu.Lock()
	w.cancel = nil
	w.mu.Unlock()
}

func (w *waker) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		w.cancel()
		w.cancel = nil
		return
	}
	w.pending = true
}
