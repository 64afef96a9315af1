package replication

import (
	"sync"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// queueItem is a committed transaction to journal, or (tx nil) a position
// to advance the watermark to.
type queueItem struct {
	tx      *decoder.Transaction
	snap    *journal.SnapshotProgress // journaled with tx (a snapshot chunk); nil for others
	advance decoder.LSN
	changes int
	bytes   int64     // tx.MemBytes(): what the item holds in memory
	at      time.Time // when it was queued (the writer's stage metrics)
}

func (it queueItem) release() {
	if it.tx != nil {
		_ = it.tx.Close() // removes a spill file; nothing to report
	}
}

// defaultMemoryBudget is Config.MemoryBudget's default.
const defaultMemoryBudget = 64 << 20

// MemoryOverhead is the constant of the memory promise: with QueueMaxBytes
// at its default, the resident memory of the replication pipeline —
// decoder, queue and journal writer — stays under Config.MemoryBudget +
// MemoryOverhead. It covers the Go runtime and binary, the spill files'
// buffers (256 KiB to write, 256 KiB plus the largest change to read), the
// decoder's pool of buffers (at most 8 MiB) and the journal's encoded batch
// (at most 1 MiB before it streams). BenchmarkMemoryPipeline measured at
// most MemoryBudget + 4 MiB (64 MiB budget: 42, 68 and 64 MiB peak for its
// three workloads; 256 MiB: 129, 168 and 165 MiB).
//
// For the whole walcast run process — the embedded NATS server, the
// publisher, the journal's recent log and the snapshot loop's ring of
// recent transactions beside the pipeline — the promise holds because the
// command also sets the Go runtime's soft memory limit to MemoryBudget:
// the runtime's memory then stays within the budget while what is live
// fits in it, and the binary's resident pages (about 28 MiB) fit in
// MemoryOverhead. Without that limit GOGC's headroom over those parts took
// the process to 100–138 MiB with the default budget
// (TestSnapshotMemoryBounded in cmd/walcast; 89–90 MiB with it).
const MemoryOverhead = 32 << 20

// How Config.MemoryBudget is shared. The Go heap peaks at about twice the
// memory in use (GOGC=100), and an in-memory transaction being assembled
// costs about 1.3 times the bytes the decoder counts (its buffers grow by
// copying), so the decoder is given a sixth of the budget in counted bytes
// and the queue a quarter: 2×(1.3/6 + 1/4) < 1.
const (
	decoderBudgetShare = 6 // decoder.Config.MemoryBudget = MemoryBudget / decoderBudgetShare
	queueBudgetShare   = 4 // QueueMaxBytes default = MemoryBudget / queueBudgetShare
)

// decoderBudget is the decoder's memory budget (decoder.Config.MemoryBudget)
// under the operator's c.MemoryBudget; see decoderBudgetShare.
func (c *Config) decoderBudget() int64 { return max(c.MemoryBudget/decoderBudgetShare, 1) }

// defaultQueueMaxBytes is the byte bound of a queue made by newQueue: what
// Config.setDefaults derives from the default memory budget.
const defaultQueueMaxBytes = defaultMemoryBudget / queueBudgetShare

// queue hands decoded transactions from the receive loop to the journal
// writer. It is bounded by the bytes of memory its transactions hold from
// the moment they are pushed until the writer marks them done — queued and
// being journaled alike — and by the number of changes queued (an empty
// queue admits any one transaction, whatever its size: a large one is in a
// spill file and holds next to nothing). It tracks what is in flight, so the
// loop can tell when nothing is buffered, queued or being written.
//
// A batch takes at most half the byte bound (and at least one item), so the
// loop can decode the next batch while one is being journaled.
type queue struct {
	max      int
	maxBytes int64

	mu       sync.Mutex // guards the following fields
	items    []queueItem
	changes  int           // changes in items
	bytes    int64         // bytes of items and of those in flight
	inflight []int64       // bytes of each item taken by the writer and not yet done, in take order
	closed   bool          // no more takes
	ready    chan struct{} // signalled (cap 1) when items are added or the queue closes
	roomCh   chan struct{} // signalled (cap 1) when items leave or are done
}

// newQueue returns a queue of at most maxChanges queued changes and
// defaultQueueMaxBytes bytes; see newBoundedQueue.
func newQueue(maxChanges int) *queue { return newBoundedQueue(maxChanges, defaultQueueMaxBytes) }

// newBoundedQueue returns a queue of at most maxChanges queued changes and
// maxBytes bytes of transactions queued or being journaled
// (Config.QueueMaxChanges and Config.QueueMaxBytes).
func newBoundedQueue(maxChanges int, maxBytes int64) *queue {
	if maxBytes <= 0 {
		maxBytes = defaultQueueMaxBytes
	}
	return &queue{max: maxChanges, maxBytes: maxBytes, ready: make(chan struct{}, 1), roomCh: make(chan struct{}, 1)}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// push appends committed transactions in commit order.
func (q *queue) push(txs []*decoder.Transaction) { q.pushWith(txs, nil) }

// pushWith is push with the snapshot progress records to journal with some
// of the transactions (nil: none).
func (q *queue) pushWith(txs []*decoder.Transaction, progress map[*decoder.Transaction]*journal.SnapshotProgress) {
	// MemBytes walks an in-memory transaction's changes: outside the lock.
	var sizes [16]int64
	sz := sizes[:0]
	for _, tx := range txs {
		sz = append(sz, tx.MemBytes())
	}
	now := time.Now()
	q.mu.Lock()
	for i, tx := range txs {
		q.items = append(q.items, queueItem{tx: tx, snap: progress[tx], changes: tx.Len(), bytes: sz[i], at: now})
		q.changes += tx.Len()
		q.bytes += sz[i]
	}
	q.mu.Unlock()
	signal(q.ready)
}

// pushAdvance queues a watermark-only advance to lsn.
func (q *queue) pushAdvance(lsn decoder.LSN) {
	q.mu.Lock()
	q.items = append(q.items, queueItem{advance: lsn, at: time.Now()})
	q.mu.Unlock()
	signal(q.ready)
}

// full reports whether the loop must stop reading: the queue holds at least
// max changes, or its transactions, queued or being journaled, hold at least
// maxBytes. An empty queue with nothing in flight is never full.
func (q *queue) full() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 && len(q.inflight) == 0 {
		return false
	}
	return q.bytes >= q.maxBytes || (q.changes >= q.max && len(q.items) > 0)
}

// queuedBytes is the bytes of transactions queued or being journaled.
func (q *queue) queuedBytes() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bytes
}

// idle reports whether nothing is queued or being written.
func (q *queue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) == 0 && len(q.inflight) == 0
}

// room is signalled when items leave the queue or are done.
func (q *queue) room() <-chan struct{} { return q.roomCh }

// take waits for the first item, then gathers what is queued up to maxTxns
// items, maxChanges changes or half the queue's byte bound; when the queue
// runs empty it waits up to maxDelay after the first item for more (not at
// all when maxDelay is 0). It reports false once the queue is closed.
func (q *queue) take(maxTxns, maxChanges int, maxDelay time.Duration) ([]queueItem, bool) {
	var deadline <-chan time.Time
	var batch []queueItem
	changes := 0
	var bytes int64
	maxBatchBytes := q.maxBytes / 2
	for {
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			// Items already taken into batch are handed back to be released.
			q.requeueFront(batch)
			return nil, false
		}
		for len(q.items) > 0 && len(batch) < maxTxns && (len(batch) == 0 ||
			(changes+q.items[0].changes <= maxChanges && bytes+q.items[0].bytes <= maxBatchBytes)) {
			it := q.items[0]
			q.items[0] = queueItem{}
			q.items = q.items[1:]
			q.changes -= it.changes
			q.inflight = append(q.inflight, it.bytes)
			batch = append(batch, it)
			changes += it.changes
			bytes += it.bytes
		}
		full := len(batch) >= maxTxns || changes >= maxChanges || bytes >= maxBatchBytes || (len(q.items) > 0 && len(batch) > 0)
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

// requeueFront returns the items of the batch take is building to the
// queue so drain releases them.
func (q *queue) requeueFront(items []queueItem) {
	if len(items) == 0 {
		return
	}
	q.mu.Lock()
	q.items = append(items, q.items...)
	q.inflight = q.inflight[:len(q.inflight)-len(items)]
	for _, it := range items {
		q.changes += it.changes
	}
	q.mu.Unlock()
}

// done marks the n oldest taken items as written (or failed): their bytes
// leave the bound. The writer releases them before.
func (q *queue) done(n int) {
	q.mu.Lock()
	n = min(n, len(q.inflight))
	for _, b := range q.inflight[:n] {
		q.bytes -= b
	}
	q.inflight = append(q.inflight[:0], q.inflight[n:]...)
	q.mu.Unlock()
	signal(q.roomCh)
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
	q.bytes = 0
	for _, b := range q.inflight {
		q.bytes += b
	}
	return items
}

// waker lets the writer interrupt the loop's receive wait when a new
// watermark is ready to acknowledge: wake marks it pending and calls
// interrupt, which ends a blocked receive (it moves the socket's read
// deadline to now); the loop takes the mark before each receive, so a wake
// that lands before the loop sets its own deadline is not lost. The loop
// stays the connection's only writer.
type waker struct {
	mu        sync.Mutex // guards the following fields
	interrupt func()
	pending   bool
}

// setInterrupt installs (or, with nil, removes) what wake calls.
func (w *waker) setInterrupt(f func()) {
	w.mu.Lock()
	w.interrupt = f
	w.mu.Unlock()
}

// take reports whether a wake came since the last take, and clears it.
func (w *waker) take() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.pending
	w.pending = false
	return p
}

func (w *waker) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending = true
	if w.interrupt != nil {
		w.interrupt()
	}
}
