package publish

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/internal/natstest"
)

// ServeCovered answers a WAL position with what covered reports; it does
// not answer bodies that are not positions (empty, text, 10 KB, control
// bytes), a standby (ErrNotStreaming-like errors), or beyond its in-flight
// bound, and a flood of bad requests does not stop it answering good ones.
func TestServeCovered(t *testing.T) {
	ns := natstest.Start(t)
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var standby atomic.Bool
	block := make(chan struct{})
	sub, err := ServeCovered(nc, "walcast", func(ctx context.Context, at decoder.LSN) (decoder.LSN, error) {
		switch {
		case standby.Load():
			return 0, errors.New("not streaming")
		case at == 0xB10C:
			select {
			case <-block:
			case <-ctx.Done():
			}
			return 0, ctx.Err()
		}
		return at + 8, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ask := func(body string, wait time.Duration) (string, error) {
		m, err := nc.Request(bus.CoveredSubject("walcast"), []byte(body), wait)
		if err != nil {
			return "", err
		}
		return string(m.Data), nil
	}
	if got, err := ask("16/B374D848", 5*time.Second); err != nil || got != "16/B374D850" {
		t.Fatalf("a position: %q %v", got, err)
	}
	for _, bad := range []string{"", "soon", "1/2/3", strings.Repeat("1", 10<<10), "0/\x00\x1b", "-1/0"} {
		if got, err := ask(bad, 200*time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("%q answered: %q %v", bad, got, err)
		}
	}
	for range 10000 {
		_ = nc.Publish(bus.CoveredSubject("walcast"), []byte("garbage"))
	}
	// 16 requests that wait use every slot: the 17th is not answered, and
	// the ones that wait get what is known when their 2 s are up.
	results := make(chan error, coveredInFlight)
	for range coveredInFlight {
		go func() {
			got, err := ask("0/B10C", 5*time.Second)
			if err == nil && got != "0/0" {
				err = errors.New("answered " + got)
			}
			results <- err
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if got, err := ask("0/1", 500*time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("beyond the in-flight bound: %q %v", got, err)
	}
	for range coveredInFlight {
		if err := <-results; err != nil {
			t.Fatalf("a waiting request: %v", err)
		}
	}
	close(block)
	if got, err := ask("0/10", 5*time.Second); err != nil || got != "0/18" {
		t.Fatalf("after the flood: %q %v", got, err)
	}
	standby.Store(true)
	if got, err := ask("0/10", 500*time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("a standby answered %q %v", got, err)
	}
}
