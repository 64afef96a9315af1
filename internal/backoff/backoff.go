// Package backoff computes jittered exponential retry delays and waits them
// out, with an injectable clock so tests need no sleeps.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Clock is the time source a Backoff waits on.
type Clock interface {
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Backoff produces delays for attempt 1, 2, 3, …: attempt n waits a random
// duration in [d/2, d] where d = min(Base·2^(n-1), Max) ("equal jitter"), so
// a fleet of retrying processes spreads out while no retry comes sooner than
// half the nominal delay. The zero value is not usable; use New.
//
// A Backoff is owned by one goroutine.
type Backoff struct {
	Base, Max time.Duration
	clock     Clock
	rand      func() float64
	attempt   int
}

// New returns a Backoff starting at base and capped at max, on the real clock.
func New(base, max time.Duration) *Backoff {
	return &Backoff{Base: base, Max: max, clock: realClock{}, rand: rand.Float64}
}

// WithClock replaces the clock and random source, for tests. rand must return
// values in [0, 1).
func (b *Backoff) WithClock(c Clock, rand func() float64) *Backoff {
	b.clock, b.rand = c, rand
	return b
}

// Attempt is the number of the attempt the next Wait precedes; 0 before the
// first failure.
func (b *Backoff) Attempt() int { return b.attempt }

// Next counts a failure and returns the delay before the next attempt.
func (b *Backoff) Next() time.Duration {
	b.attempt++
	d := b.Base
	for i := 1; i < b.attempt && d < b.Max; i++ {
		d *= 2
	}
	if d > b.Max {
		d = b.Max
	}
	half := d / 2
	return half + time.Duration(b.rand()*float64(d-half))
}

// Wait counts a failure and waits the next delay, returning early with
// ctx.Err() when ctx is done. It returns the delay it waited (or meant to).
func (b *Backoff) Wait(ctx context.Context) (time.Duration, error) {
	d := b.Next()
	select {
	case <-ctx.Done():
		return d, ctx.Err()
	case <-b.clock.After(d):
		return d, nil
	}
}

// Reset starts over after a success: the next failure is attempt 1 again.
func (b *Backoff) Reset() { b.attempt = 0 }
