package publish

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
)

// storedMsg is one message of a stream: its stream sequence, the journal
// seq it carries and its Nats-Msg-Id.
type storedMsg struct {
	stream uint64
	seq    int64
	id     string
}

// storedMsgs reads every message the stream holds, in stream order.
func storedMsgs(t *testing.T, s jetstream.Stream) []storedMsg {
	t.Helper()
	ctx := context.Background()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []storedMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("stream sequence %d: %v", seq, err)
		}
		n, _ := strconv.ParseInt(m.Header.Get(bus.HeaderSeq), 10, 64)
		out = append(out, storedMsg{m.Sequence, n, m.Header.Get(bus.HeaderMsgID)})
	}
	return out
}

// checkContinues fails unless msgs are the journal entries first, first+1,
// … up to last, each once, at consecutive stream sequences, with their
// message ids.
func checkContinues(t *testing.T, msgs []storedMsg, journalID string, first, last int64) {
	t.Helper()
	if int64(len(msgs)) != last-first+1 {
		t.Fatalf("the stream holds %d messages, want entries %d to %d once each: %v", len(msgs), first, last, msgs)
	}
	for i, m := range msgs {
		want := first + int64(i)
		if m.seq != want || m.id != journalID+":0000000000000000:"+strconv.FormatInt(want, 10) || m.stream != msgs[0].stream+uint64(i) {
			t.Fatalf("stream sequence %d holds seq %d (%s), want seq %d: duplicated or missing entries: %v", m.stream, m.seq, m.id, want, msgs)
		}
	}
}

// runFor runs p until the returned stop, which waits for Run to return.
func runFor(t *testing.T, p *Publisher) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}

// TestJetStreamRunAgainReconciles: the same publisher, run again (as on
// every activation of `walcast run`), reconciles with the stream's last
// message first, whatever it remembers from its last run. Between the runs
// the journal's saved position fell behind what the stream holds (a stop
// with batches in flight, a crash) and the stream's duplicate window
// passed (shortened here, so the test need not wait two minutes): the
// second run must continue after the stream's last entry, not store the
// entries after the saved position again.
func TestJetStreamRunAgainReconciles(t *testing.T) {
	f := newPubFixture(t)
	for i := 1; i <= 100; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	log := slog.New(slog.NewTextHandler(logWriter{t}, nil))
	p := New(Config{JetStream: &JetStreamConfig{Stream: "WALCAST"}, BatchSize: 20, Logger: log}, f.j, f.connect())
	stop := runFor(t, p)
	waitUntil(t, "100 stored", 20*time.Second, func() bool { return p.Stats().Published == 100 })
	stop()

	js, err := jetstream.New(f.connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := js.Stream(ctx, "WALCAST")
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Duplicates = 500 * time.Millisecond
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "UPDATE walcast.published SET seq = 10"); err != nil {
		t.Fatal(err)
	}
	for i := 101; i <= 120; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	time.Sleep(time.Second) // past the duplicate window

	stop = runFor(t, p)
	waitUntil(t, "120 stored", 20*time.Second, func() bool { return p.Stats().Published == 120 })
	time.Sleep(100 * time.Millisecond) // anything extra would be stored now
	stop()
	checkContinues(t, storedMsgs(t, s), f.j.IDHex(), 1, 120)
}

// TestJetStreamStopSavesWhatTheStreamHolds: a publisher stopped while
// catching up, with batches in flight, saves the position the stream holds
// (it waits for their acknowledgements), so that when the stream is then
// emptied (purged, or every message aged out) the next run, with nothing
// in the stream to reconcile with, continues exactly after the stream's
// last entry: no entry stored again, none skipped.
func TestJetStreamStopSavesWhatTheStreamHolds(t *testing.T) {
	f := newPubFixture(t)
	var cs []decoder.Change
	for i := 1; i <= 3000; i++ {
		cs = append(cs, change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	f.appendTx(cs...)
	p := New(Config{JetStream: &JetStreamConfig{Stream: "WALCAST"}, BatchSize: 10}, f.j, f.connect())
	stop := runFor(t, p)
	waitUntil(t, "publishing under way", 30*time.Second, func() bool { return p.Stats().Published >= 500 })
	stop()

	js, err := jetstream.New(f.connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := js.Stream(ctx, "WALCAST")
	if err != nil {
		t.Fatal(err)
	}
	held := storedMsgs(t, s)
	if len(held) == 0 {
		t.Fatal("the stream holds nothing")
	}
	lastHeld := held[len(held)-1]
	checkContinues(t, held, f.j.IDHex(), 1, lastHeld.seq)
	if saved, err := f.j.Published(ctx); err != nil || saved != lastHeld.seq {
		t.Fatalf("saved position %d (%v) at the stop, but the stream holds up to seq %d", saved, err, lastHeld.seq)
	}

	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 3001; i <= 3010; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	stop = runFor(t, p)
	waitUntil(t, "every entry stored", 30*time.Second, func() bool { return p.Stats().Published == 3010 })
	time.Sleep(100 * time.Millisecond)
	stop()
	after := storedMsgs(t, s)
	if len(after) == 0 || after[0].stream != lastHeld.stream+1 {
		t.Fatalf("after the purge the stream starts at sequence %v, want %d", after, lastHeld.stream+1)
	}
	checkContinues(t, after, f.j.IDHex(), lastHeld.seq+1, 3010)
}
