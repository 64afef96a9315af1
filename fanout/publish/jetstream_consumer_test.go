package publish

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
)

// TestJetStreamDurableConsumer is docs/nats.md's recipe for a service that
// consumes the stream walcast stores: a durable pull consumer with explicit
// acks. The consumer stops half way (what it fetched but did not ack is
// delivered again), a new process with the same durable name resumes, and
// a second consumer replays the stream from a sequence. Together they see
// every entry; the service dedupes by Walcast-Seq.
func TestJetStreamDurableConsumer(t *testing.T) {
	f := newPubFixture(t)
	for i := 1; i <= 200; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	p, _ := f.startJS(JetStreamConfig{Stream: "WALCAST"})
	waitUntil(t, "200 stored", 20*time.Second, func() bool { return p.Stats().Published == 200 })
	ctx := context.Background()

	consume := func(stopAfter int, ackLast bool) []int64 {
		t.Helper()
		nc, err := nats.Connect(f.ns.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		c, err := js.CreateOrUpdateConsumer(ctx, "WALCAST", jetstream.ConsumerConfig{
			Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second,
			FilterSubject: "walcast.change.public.orders.>", DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			t.Fatal(err)
		}
		var seqs []int64
		for len(seqs) < stopAfter {
			batch, err := c.Fetch(50, jetstream.FetchMaxWait(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for m := range batch.Messages() {
				n++
				s, _ := strconv.ParseInt(m.Headers().Get(bus.HeaderSeq), 10, 64)
				seqs = append(seqs, s)
				if len(seqs) == stopAfter && !ackLast {
					break // fetched, not acked: the server delivers it again
				}
				if err := m.Ack(); err != nil {
					t.Fatal(err)
				}
			}
			if n == 0 {
				break
			}
		}
		return seqs
	}
	first := consume(120, false)
	time.Sleep(1200 * time.Millisecond) // past AckWait: the unacked one is due again
	second := consume(81, true)
	seen := map[int64]int{}
	for _, s := range append(first, second...) {
		seen[s]++
	}
	for s := int64(1); s <= 200; s++ {
		if seen[s] == 0 {
			t.Fatalf("entry %d never consumed", s)
		}
	}
	if seen[first[len(first)-1]] != 2 {
		t.Fatalf("the fetched but unacked entry %d was consumed %d times, want 2 (at least once)", first[len(first)-1], seen[first[len(first)-1]])
	}

	// Replay from a stream sequence with an ordered consumer.
	nc, err := nats.Connect(f.ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	oc, err := js.OrderedConsumer(ctx, "WALCAST", jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 151})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := oc.Fetch(100, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var replay []int64
	for m := range batch.Messages() {
		s, _ := strconv.ParseInt(m.Headers().Get(bus.HeaderSeq), 10, 64)
		replay = append(replay, s)
	}
	if len(replay) != 50 || replay[0] != 151 || replay[49] != 200 {
		t.Fatalf("replay from stream sequence 151: %d entries, %v…", len(replay), replay[:min(3, len(replay))])
	}
}
