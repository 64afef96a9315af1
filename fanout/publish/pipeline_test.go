package publish

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
)

// TestJetStreamFailureBetweenInFlightBatches: the stream refuses every
// message past its 150th (MaxMsgs with DiscardNew), in the middle of the
// second batch of 100 — by then the publisher has sent the third batch
// too, while the second's acknowledgements were outstanding. The published
// position must not pass what the stream holds, the publisher must drop the
// third batch's publishes and reconcile; once the limit is lifted the
// stream holds every entry once, in seq order.
func TestJetStreamFailureBetweenInFlightBatches(t *testing.T) {
	f := newPubFixture(t)
	const total = 600
	changes := make([]decoder.Change, total)
	for i := range changes {
		changes[i] = change(0, "public.orders", decoder.OpInsert, i+1, "", "")
	}
	f.appendTx(changes...) // journaled before the publisher starts: a catch-up of six batches
	nc := f.connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg := jetstream.StreamConfig{Name: "WALCAST", Subjects: streamSubjects("walcast"), Storage: jetstream.FileStorage,
		Duplicates: 2 * time.Minute, MaxMsgs: 150, Discard: jetstream.DiscardNew}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// The position is saved after every batch, so one saved too far stays
	// in the journal for the check below (SetPublished only moves forward).
	p := New(Config{JetStream: &JetStreamConfig{Stream: "WALCAST"}, BatchSize: 100, RecordInterval: time.Nanosecond}, f.j, f.connect())
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	var stopOnce sync.Once
	stop := func() (err error) { stopOnce.Do(func() { cancel(); err = <-done }); return err }
	t.Cleanup(func() { _ = stop() })
	// The start's reconcile and at least one after the refused batch.
	waitUntil(t, "a reconcile after the refusal", 30*time.Second, func() bool { return p.jsm.reconciles.Load() >= 2 })
	if got := streamSeqs(t, f.ns.URL(), "WALCAST"); len(got) != 150 {
		t.Fatalf("the stream holds %d messages, want its limit of 150", len(got))
	}
	if s := p.Stats(); s.Published > 150 || s.Messages < 300 {
		t.Fatalf("published position %d (want at most the 150 stored), %d messages sent (want the third batch's too)", s.Published, s.Messages)
	}
	if pos, err := f.j.Published(ctx); err != nil || pos > 150 {
		t.Fatalf("journal published position %d (%v): past the 150 the stream holds", pos, err)
	}
	cfg.MaxMsgs = -1
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "every entry stored", 60*time.Second, func() bool { return p.Stats().Published == total })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, streamSeqs(t, f.ns.URL(), "WALCAST"), total)
	if pos, err := f.j.Published(ctx); err != nil || pos != total {
		t.Fatalf("journal published position %d (%v), want %d", pos, err, total)
	}
}

// TestPublishReadAheadInOrder: a catch-up in many small batches, each read
// from the journal while the one before it is published, while more
// entries are journaled: core NATS delivers every entry once, in seq order.
func TestPublishReadAheadInOrder(t *testing.T) {
	f := newPubFixture(t)
	col := f.subscribe(f.connect())
	const first, later = 2000, 500
	changes := make([]decoder.Change, first)
	for i := range changes {
		changes[i] = change(0, "public.orders", decoder.OpInsert, i+1, "", "")
	}
	f.appendTx(changes...)
	pub := f.connect()
	p := New(Config{BatchSize: 37}, f.j, pub)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	for i := range later { // appended while the catch-up runs
		f.appendTx(change(0, "public.orders", decoder.OpInsert, first+i+1, "", ""))
	}
	waitUntil(t, "every entry published", 30*time.Second, func() bool { return p.Stats().Published == first+later })
	stop()
	// A last message on the publisher's connection: the subscriber gets
	// it after everything the publisher sent, so what came before it is
	// all there is.
	const end = "walcast.change.test.end._"
	if err := pub.Publish(end, nil); err != nil {
		t.Fatal(err)
	}
	var msgs []string
	waitUntil(t, "every entry received", 30*time.Second, func() bool {
		msgs = msgs[:0]
		for _, m := range col.snapshot() {
			if m.Subject == end {
				return true
			}
			msgs = append(msgs, m.Header.Get(bus.HeaderSeq))
		}
		return false
	})
	if len(msgs) != first+later {
		t.Fatalf("%d messages for %d entries", len(msgs), first+later)
	}
	for i, seq := range msgs {
		if seq != strconv.Itoa(i+1) {
			t.Fatalf("message %d holds seq %s: not every entry once, in order", i+1, seq)
		}
	}
}
