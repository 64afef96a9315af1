package replication

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
)

// bigTx is an in-memory transaction of one change with a body of size bytes.
func bigTx(xid uint32, size int) *decoder.Transaction {
	body := append([]byte(`{"lsn":"0/1","op":"insert","after":{"pad":"`), bytes.Repeat([]byte("x"), size)...)
	body = append(body, `"}}`...)
	return decoder.NewTransaction(xid, 1, 2, time.Unix(0, 0), []decoder.Change{{LSN: 1, Entity: "public.t", Op: decoder.OpInsert, Body: body}})
}

// TestQueueByteBound: 2000 transactions of 50 KB pushed as the receive loop
// pushes them (never while full) through a slow writer: what the queue holds,
// queued or being journaled, never passes its byte bound by more than the
// one transaction admitted last; a batch never takes more than half of it.
// The change count bound (100000) would have let all 100 MB in.
func TestQueueByteBound(t *testing.T) {
	const bound = 4 << 20
	const n, size = 2000, 50 << 10
	q := newBoundedQueue(100000, bound)
	one := bigTx(0, size).MemBytes()

	var wg sync.WaitGroup
	wg.Add(1)
	var taken, maxBatch int
	var maxBatchBytes int64
	blocked := make(chan struct{}) // closed when the producer first finds the queue full
	go func() {
		defer wg.Done()
		<-blocked // a journal that is slow to start: the queue must fill
		for taken < n {
			batch, ok := q.take(1000, 20000, 0)
			if !ok {
				return
			}
			var b int64
			for _, it := range batch {
				b += it.bytes
			}
			maxBatch, maxBatchBytes = max(maxBatch, len(batch)), max(maxBatchBytes, b)
			time.Sleep(time.Millisecond) // the journal is slower than decoding
			for _, it := range batch {
				it.release()
			}
			taken += len(batch)
			q.done(len(batch))
		}
	}()
	var peak int64
	fulls := 0
	for i := 0; i < n; i++ {
		for q.full() {
			if fulls++; fulls == 1 {
				close(blocked)
			}
			select {
			case <-q.room():
			case <-time.After(10 * time.Millisecond):
			}
		}
		q.push([]*decoder.Transaction{bigTx(uint32(i), size)})
		peak = max(peak, q.queuedBytes())
	}
	if fulls == 0 {
		close(blocked)
	}
	wg.Wait()
	if peak > bound+one {
		t.Fatalf("queue held %d bytes, bound %d (+%d for the last admitted)", peak, bound, one)
	}
	if peak < bound || fulls == 0 {
		t.Fatalf("queue held at most %d bytes and was never full", peak)
	}
	if maxBatchBytes > bound/2 || maxBatch < 2 {
		t.Fatalf("a batch took %d transactions, %d bytes (bound %d)", maxBatch, maxBatchBytes, bound)
	}
	if !q.idle() || q.queuedBytes() != 0 || q.full() {
		t.Fatalf("queue not empty after the writer finished: %d bytes", q.queuedBytes())
	}
}

// TestQueueAdmitsHugeToEmpty: one transaction far larger than the bound is
// admitted to an empty queue and taken whole; while it is being journaled
// the queue stays full (its bytes are still in memory), and once it is done
// the next is admitted.
func TestQueueAdmitsHugeToEmpty(t *testing.T) {
	q := newBoundedQueue(100000, 1<<20)
	if q.full() {
		t.Fatal("empty queue full")
	}
	q.push([]*decoder.Transaction{bigTx(1, 8<<20)})
	if !q.full() {
		t.Fatal("queue holding 8 MiB under a 1 MiB bound not full")
	}
	batch, ok := q.take(1000, 20000, 0)
	if !ok || len(batch) != 1 || batch[0].tx.Xid != 1 {
		t.Fatalf("take: %d items, %v", len(batch), ok)
	}
	if !q.full() || q.idle() {
		t.Fatal("queue not full while its huge transaction is being journaled")
	}
	q.done(1)
	select {
	case <-q.room():
	default:
		t.Fatal("done did not signal room")
	}
	if q.full() || !q.idle() || q.queuedBytes() != 0 {
		t.Fatalf("after done: full %v, %d bytes", q.full(), q.queuedBytes())
	}
	q.push([]*decoder.Transaction{bigTx(2, 8<<20)})
	if batch, _ := q.take(1000, 20000, 0); len(batch) != 1 || batch[0].tx.Xid != 2 {
		t.Fatal("second huge transaction not taken")
	}
	q.done(1)
}

// TestQueueCloseRequeues: items taken into a batch when the queue closes
// go back for drain, and their bytes with them.
func TestQueueCloseRequeues(t *testing.T) {
	q := newBoundedQueue(100000, 1<<30)
	q.push([]*decoder.Transaction{bigTx(1, 1000), bigTx(2, 1000)})
	want := q.queuedBytes()
	q.close()
	if _, ok := q.take(1000, 20000, time.Second); ok {
		t.Fatal("take after close")
	}
	items := q.drain()
	if len(items) != 2 || q.queuedBytes() != 0 || want < 2000 {
		t.Fatalf("drained %d items; %d bytes left of %d", len(items), q.queuedBytes(), want)
	}
}

// TestQueueMaxBytesDefault: the byte bound defaults to a quarter of the
// memory budget, itself 64 MiB by default; the decoder gets a sixth.
func TestQueueMaxBytesDefault(t *testing.T) {
	var c Config
	c.setDefaults()
	if c.MemoryBudget != 64<<20 || c.QueueMaxBytes != 16<<20 || c.decoderBudget() != 64<<20/6 {
		t.Fatalf("budget %d, queue %d", c.MemoryBudget, c.QueueMaxBytes)
	}
	c = Config{MemoryBudget: 1 << 30}
	c.setDefaults()
	if c.QueueMaxBytes != 1<<28 {
		t.Fatalf("queue %d under a 1 GiB budget", c.QueueMaxBytes)
	}
}
