package sync

import (
	"math"
	"sync"
	"time"
)

// Clock is the time source of the sync node: idle eviction, drop windows
// and token buckets read it, so tests inject a clock they advance by hand.
type Clock interface {
	Now() time.Time
	// After behaves as time.After.
	After(d time.Duration) <-chan time.Time
}

type realSyncClock struct{}

func (realSyncClock) Now() time.Time                         { return time.Now() }
func (realSyncClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// DropWindowSpan is the sliding window over which a socket's dropped frames
// are counted (DESIGN §6).
const DropWindowSpan = 10 * time.Second

// DropWindow counts dropped frames in a sliding window: Add reports true
// when more than Max drops fall inside Span. It keeps the times of the last
// Max+1 drops only (allocated on the first drop), so a socket that never
// drops costs nothing and the same number of drops spread over a longer time
// never trips it. The zero Span means DropWindowSpan. Not safe for
// concurrent use; the socket's lock guards it.
type DropWindow struct {
	Max  int
	Span time.Duration

	ring []time.Time // the last len(ring) drop times, oldest at next
	n    int         // drops recorded, capped at len(ring)
	next int
}

// Add records a drop at now and reports whether the window now holds more
// than Max drops.
func (w *DropWindow) Add(now time.Time) bool {
	if w.Max < 0 {
		return false
	}
	span := w.Span
	if span <= 0 {
		span = DropWindowSpan
	}
	if w.ring == nil {
		w.ring = make([]time.Time, w.Max+1)
	}
	w.ring[w.next] = now
	w.next = (w.next + 1) % len(w.ring)
	if w.n < len(w.ring) {
		w.n++
	}
	if w.n < len(w.ring) {
		return false
	}
	// The ring is full: the oldest of the last Max+1 drops is at next.
	return now.Sub(w.ring[w.next]) < span
}

// tokenBucket is a token bucket on an injectable clock: rate tokens per
// second, at most burst. Safe for concurrent use.
type tokenBucket struct {
	rate  float64
	burst float64
	clock Clock

	mu     sync.Mutex // guards the following fields
	tokens float64
	last   time.Time
}

func newTokenBucket(rate float64, burst int, clock Clock) *tokenBucket {
	b := new(tokenBucket)
	b.init(rate, burst, clock)
	return b
}

// init sets up a bucket held by value (a socket embeds its own rather than
// allocate one more object per socket). Call it before any take.
func (b *tokenBucket) init(rate float64, burst int, clock Clock) {
	b.rate, b.burst, b.clock = rate, float64(burst), clock
	b.tokens, b.last = float64(burst), clock.Now()
}

// take takes one token. When none is left it reports false and how long
// until one will be.
func (b *tokenBucket) take() (bool, time.Duration) {
	if b == nil || b.rate <= 0 {
		return true, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = math.Min(b.burst, b.tokens+el*b.rate)
	}
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
	return false, wait
}
