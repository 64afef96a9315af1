package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

type fakeClock struct{ waited []time.Duration }

func (f *fakeClock) After(d time.Duration) <-chan time.Time {
	f.waited = append(f.waited, d)
	ch := make(chan time.Time, 1)
	ch <- time.Time{}
	return ch
}

func TestDelaysGrowWithinJitterAndCap(t *testing.T) {
	for _, r := range []float64{0, 0.5, 0.999999} {
		b := New(100*time.Millisecond, time.Second).WithClock(&fakeClock{}, func() float64 { return r })
		nominal := []time.Duration{100, 200, 400, 800, 1000, 1000}
		for i, n := range nominal {
			n *= time.Millisecond
			d := b.Next()
			if d < n/2 || d > n {
				t.Fatalf("rand=%v attempt %d: delay %v outside [%v, %v]", r, i+1, d, n/2, n)
			}
			if b.Attempt() != i+1 {
				t.Fatalf("attempt = %d, want %d", b.Attempt(), i+1)
			}
		}
	}
}

func TestResetAndWait(t *testing.T) {
	clk := &fakeClock{}
	b := New(10*time.Millisecond, 80*time.Millisecond).WithClock(clk, func() float64 { return 0.999999 })
	for i := 0; i < 3; i++ {
		if _, err := b.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	b.Reset()
	if _, err := b.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(clk.waited) != 4 || clk.waited[2] <= clk.waited[1] || clk.waited[3] > 10*time.Millisecond {
		t.Fatalf("waited %v: want growth, then a reset to the base", clk.waited)
	}
}

func TestWaitStopsOnCancel(t *testing.T) {
	b := New(time.Hour, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}
