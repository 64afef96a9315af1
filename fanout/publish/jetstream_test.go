package publish

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
)

// startJS runs a JetStream-mode publisher until the returned stop.
func (f *pubFixture) startJS(cfg JetStreamConfig) (*Publisher, func() error) {
	f.t.Helper()
	p := New(Config{JetStream: &cfg, BatchSize: 100}, f.j, f.connect())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	var err error
	stop := func() error { once.Do(func() { cancel(); err = <-done }); return err }
	f.t.Cleanup(func() { _ = stop() })
	return p, stop
}

// streamSeqs reads every message of the stream and returns the journal
// seqs in stream order.
func streamSeqs(t *testing.T, url, name string) []int64 {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var s jetstream.Stream
	var info *jetstream.StreamInfo
	for try := 0; ; try++ { // a cluster may be electing a leader
		if s, err = js.Stream(ctx, name); err == nil {
			if info, err = s.Info(ctx); err == nil {
				break
			}
		}
		if try == 20 {
			t.Fatalf("stream %s: %v", name, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	var out []int64
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		var m *jetstream.RawStreamMsg
		for try := 0; ; try++ { // a cluster may be electing a leader
			if m, err = s.GetMsg(ctx, seq); err == nil || try == 20 {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("stream sequence %d: %v", seq, err)
		}
		n, _ := strconv.ParseInt(m.Header.Get(bus.HeaderSeq), 10, 64)
		out = append(out, n)
	}
	return out
}

func checkExactlyOnce(t *testing.T, got []int64, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("the stream holds %d messages for %d entries: %v", len(got), n, got)
	}
	for i, s := range got {
		if s != int64(i+1) {
			t.Fatalf("stream message %d holds seq %d: not every entry once in order", i+1, s)
		}
	}
}

// TestJetStreamExactlyOnceWithoutTheDedupWindow: a publisher whose
// journal position is behind what the stream stores (acknowledged, never
// recorded: a crash between the two, however long ago) does not publish
// those entries again — it reconciles with the stream's last message — so
// the stream holds each entry once whatever its duplicate window.
func TestJetStreamExactlyOnceWithoutTheDedupWindow(t *testing.T) {
	f := newPubFixture(t)
	for i := 1; i <= 250; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	p, stop := f.startJS(JetStreamConfig{Stream: "WALCAST"})
	waitUntil(t, "250 stored", 20*time.Second, func() bool { return p.Stats().Published == 250 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	sent := p.Stats().Messages
	// The journal forgets the publisher's position.
	conn, err := pgx.Connect(context.Background(), f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "UPDATE walcast.published SET seq = 10"); err != nil {
		t.Fatal(err)
	}
	for i := 251; i <= 300; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	p2, stop2 := f.startJS(JetStreamConfig{Stream: "WALCAST"})
	waitUntil(t, "300 stored", 20*time.Second, func() bool { return p2.Stats().Published == 300 })
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
	if m := p2.Stats().Messages; m != 50 {
		t.Fatalf("the restarted publisher sent %d messages, want only the 50 new entries (the first run sent %d)", m, sent)
	}
	checkExactlyOnce(t, streamSeqs(t, f.ns.URL(), "WALCAST"), 300)
	if pos, _ := f.j.Published(context.Background()); pos != 300 {
		t.Fatalf("journal published position %d, want 300", pos)
	}
}

// TestJetStreamSurvivesServerRestarts: the NATS server restarts twice while
// entries are journaled and published; the stream ends with each once, in
// order.
func TestJetStreamSurvivesServerRestarts(t *testing.T) {
	f := newPubFixture(t)
	p, _ := f.startJS(JetStreamConfig{Stream: "WALCAST"})
	n := 0
	for round := range 3 {
		for range 200 {
			n++
			f.appendTx(change(0, "public.orders", decoder.OpInsert, n, "", ""))
		}
		if round < 2 {
			time.Sleep(50 * time.Millisecond)
			f.ns.Restart(t)
		}
	}
	waitUntil(t, "every entry stored", 60*time.Second, func() bool { return p.Stats().Published == int64(n) })
	checkExactlyOnce(t, streamSeqs(t, f.ns.URL(), "WALCAST"), n)
}

// TestJetStreamMismatchedStreamRefused: an existing stream walcast cannot
// use stops the publisher at once with what differs and the fix.
func TestJetStreamMismatchedStreamRefused(t *testing.T) {
	cases := []struct {
		name string
		cfg  jetstream.StreamConfig
		want string
	}{
		{"all subjects", jetstream.StreamConfig{Subjects: []string{"walcast.>"}, Duplicates: time.Hour}, `also holds "walcast.>"`},
		{"short window", jetstream.StreamConfig{Subjects: streamSubjects("walcast"), Duplicates: 10 * time.Second}, "duplicate window is 10s"},
		{"memory", jetstream.StreamConfig{Subjects: streamSubjects("walcast"), Duplicates: time.Hour, Storage: jetstream.MemoryStorage}, "not on file storage"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newPubFixture(t)
			nc := f.connect()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			tc.cfg.Name = "WALCAST"
			if _, err := js.CreateStream(context.Background(), tc.cfg); err != nil {
				t.Fatal(err)
			}
			f.appendTx(change(0, "public.orders", decoder.OpInsert, 1, "", ""))
			p := New(Config{JetStream: &JetStreamConfig{Stream: "WALCAST"}}, f.j, f.connect())
			done := make(chan error, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { done <- p.Run(ctx) }()
			var err2 error
			select {
			case err2 = <-done: // Run stops by itself
			case <-time.After(20 * time.Second):
				t.Fatal("Run kept going with a mismatched stream")
			}
			if !errors.Is(err2, ErrStreamMismatch) || !strings.Contains(err2.Error(), tc.want) || !strings.Contains(err2.Error(), "fix: nats stream edit") {
				t.Fatalf("Run returned %v, want a stream mismatch naming %q with the fix", err2, tc.want)
			}
			if p.Stats().Messages != 0 {
				t.Fatal("published to a mismatched stream")
			}
		})
	}
}
