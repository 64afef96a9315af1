package sync

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/internal/natstest"
)

// TestLiveBurstReleases: the writers a burst holds back are released when
// the subscription has nothing pending, when there is no subscription, when
// the topic is gone (its pending messages will never be handled) and, with
// messages still pending, after at most maxBurstMessages messages — never
// later, and each socket once.
func TestLiveBurstReleases(t *testing.T) {
	s1, s2 := &socket{}, &socket{}
	var b liveBurst
	if got := b.endLocked(nil, false); got != nil {
		t.Fatalf("nothing held, %d released", len(got))
	}
	b.hold(s1)
	b.hold(s2)
	if got := b.endLocked(nil, false); len(got) != 2 || got[0] != s1 || got[1] != s2 {
		t.Fatalf("without a subscription: released %v", got)
	}

	// A subscription with messages pending: its handler blocks on the first.
	ns := natstest.Start(t)
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	block, entered := make(chan struct{}), make(chan struct{}, 1)
	sub, err := nc.Subscribe("burst", func(*nats.Msg) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-block
	})
	if err != nil {
		t.Fatal(err)
	}
	defer close(block)
	for i := 0; i < 3; i++ {
		if err := nc.Publish("burst", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	<-entered
	for {
		// nats.go counts the message being handled as pending.
		if n, _, _ := sub.Pending(); n >= 2 {
			break
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}

	b.hold(s1)
	if got := b.endLocked(sub, true); len(got) != 1 || got[0] != s1 {
		t.Fatalf("topic gone: released %v", got)
	}
	b.hold(s1)
	released := 0
	for i := 0; i < maxBurstMessages; i++ {
		released += len(b.endLocked(sub, false))
	}
	if released != 1 {
		t.Fatalf("with messages pending, %d releases over %d messages; want exactly 1", released, maxBurstMessages)
	}
}
