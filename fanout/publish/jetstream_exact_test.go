package publish

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/decoder"
)

// freezePublished makes every later save of the published position fail,
// as a journal that cannot be written would, until the returned thaw.
func freezePublished(t *testing.T, url string) (thaw func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	for _, s := range []string{
		`CREATE FUNCTION public.refuse_published() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'the published position cannot be saved'; END $$`,
		`CREATE TRIGGER refuse BEFORE UPDATE ON walcast.published FOR EACH ROW EXECUTE FUNCTION public.refuse_published()`,
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		t.Helper()
		if _, err := conn.Exec(ctx, `DROP TRIGGER refuse ON walcast.published`); err != nil {
			t.Fatal(err)
		}
	}
}

// jsStream opens the named stream on the fixture's server.
func (f *pubFixture) jsStream(name string) jetstream.Stream {
	f.t.Helper()
	js, err := jetstream.New(f.connect())
	if err != nil {
		f.t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), name)
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

// streamLast is the stream's last sequence.
func streamLast(t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// unsavedEntries journals 100 entries, publishes them and saves their
// position, then journals 200 more, which the stream stores while the
// journal saves none of their positions (the process stopped, or the
// journal could not be written, between the two), and stops the
// publisher. It returns the stream and its last message.
func unsavedEntries(t *testing.T) (*pubFixture, jetstream.Stream, storedMsg) {
	f := newPubFixture(t)
	ctx := context.Background()
	for i := 1; i <= 100; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	p := New(Config{JetStream: &JetStreamConfig{Stream: "WALCAST"}, BatchSize: 50}, f.j, f.connect())
	stop := runFor(t, p)
	waitUntil(t, "100 stored and saved", 20*time.Second, func() bool {
		saved, err := f.j.Published(ctx)
		return err == nil && saved == 100
	})
	s := f.jsStream("WALCAST")

	thaw := freezePublished(t, f.url)
	for i := 101; i <= 300; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	waitUntil(t, "entries stored past the saved position", 30*time.Second, func() bool { return streamLast(t, s) > 100 })
	stop()
	// Every message the publisher sent lands (they are chained, each sent
	// once): the stream then holds what it will.
	sent := p.Stats().Messages
	waitUntil(t, "every message sent stored", 30*time.Second, func() bool { return streamLast(t, s) == sent })
	thaw()
	if saved, err := f.j.Published(ctx); err != nil || saved != 100 {
		t.Fatalf("saved position %d (%v), want the 100 saved before the journal refused", saved, err)
	}
	held := storedMsgs(t, s)
	lastHeld := held[len(held)-1]
	checkContinues(t, held, f.j.IDHex(), 1, lastHeld.seq)
	for i := 301; i <= 350; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	return f, s, lastHeld
}

// publishAll runs a new publisher until every entry up to 350 is
// published, and stops it, which settles what is in flight: the stream
// then holds all it will.
func publishAll(t *testing.T, f *pubFixture) {
	t.Helper()
	p := New(Config{JetStream: &JetStreamConfig{Stream: "WALCAST"}, BatchSize: 50, Logger: slog.New(slog.NewTextHandler(logWriter{t}, nil))}, f.j, f.connect())
	stop := runFor(t, p)
	waitUntil(t, "350 published", 30*time.Second, func() bool { return p.Stats().Published == 350 })
	stop()
}

// TestJetStreamEmptiedStreamAfterAnUnsavedBatch: the stream stored
// entries whose position the journal never saved, and was then emptied,
// so no message tells where it ended. The next run continues exactly
// after the last entry the stream stored: each journal entry is stored
// once, at consecutive stream sequences, with its message id.
func TestJetStreamEmptiedStreamAfterAnUnsavedBatch(t *testing.T) {
	f, s, lastHeld := unsavedEntries(t)
	if err := s.Purge(context.Background()); err != nil {
		t.Fatal(err)
	}
	publishAll(t, f)
	after := storedMsgs(t, s)
	if len(after) == 0 || after[0].stream != lastHeld.stream+1 {
		t.Fatalf("after the purge the stream starts at %v, want stream sequence %d", after, lastHeld.stream+1)
	}
	checkContinues(t, after, f.j.IDHex(), lastHeld.seq+1, 350)
}

// TestJetStreamFrontRemovedAfterAnUnsavedBatch: the same, but the stream
// keeps its last messages: the last one tells where it ended.
func TestJetStreamFrontRemovedAfterAnUnsavedBatch(t *testing.T) {
	f, s, lastHeld := unsavedEntries(t)
	if err := s.Purge(context.Background(), jetstream.WithPurgeKeep(10)); err != nil {
		t.Fatal(err)
	}
	publishAll(t, f)
	after := storedMsgs(t, s)
	if len(after) == 0 || after[0].stream != lastHeld.stream-9 {
		t.Fatalf("after the purge the stream starts at %v, want stream sequence %d", after, lastHeld.stream-9)
	}
	checkContinues(t, after, f.j.IDHex(), lastHeld.seq-9, 350)
}

// TestJetStreamRecreatedStreamAfterAnUnsavedBatch: the stream that stored
// the unsaved entries is deleted; the one walcast creates in its place
// holds every entry after the saved position, once: the old stream's
// sequence counts nothing in it.
func TestJetStreamRecreatedStreamAfterAnUnsavedBatch(t *testing.T) {
	f, s, _ := unsavedEntries(t)
	js, err := jetstream.New(f.connect())
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(context.Background(), "WALCAST"); err != nil {
		t.Fatal(err)
	}
	publishAll(t, f)
	s = f.jsStream("WALCAST")
	after := storedMsgs(t, s)
	if len(after) == 0 || after[0].stream != 1 {
		t.Fatalf("the new stream starts at %v, want stream sequence 1", after)
	}
	checkContinues(t, after, f.j.IDHex(), 101, 350)
}

// TestJetStreamEmptiedStreamNotCountable: an emptied stream whose last
// sequence cannot count entries after the saved position — it ends before
// the saved stream position (restored from an older backup), or past
// every entry the journal has (purged to a sequence) — stops the
// publisher with ErrStreamMismatch, publishing nothing.
func TestJetStreamEmptiedStreamNotCountable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		empty func(t *testing.T, f *pubFixture, s jetstream.Stream, last storedMsg)
	}{
		{"before the saved position", func(t *testing.T, f *pubFixture, s jetstream.Stream, last storedMsg) {
			ctx := context.Background()
			if err := s.Purge(ctx); err != nil {
				t.Fatal(err)
			}
			saved, err := f.j.PublishedStream(ctx)
			if err != nil || saved.Stream == "" {
				t.Fatalf("saved stream position %+v (%v)", saved, err)
			}
			saved.StreamSeq = last.stream + 5
			if err := f.j.SetPublishedStream(ctx, saved); err != nil {
				t.Fatal(err)
			}
		}},
		{"purged to a sequence", func(t *testing.T, f *pubFixture, s jetstream.Stream, last storedMsg) {
			if err := s.Purge(context.Background(), jetstream.WithPurgeSequence(last.stream+1000)); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, s, last := unsavedEntries(t)
			tc.empty(t, f, s, last)
			p := New(Config{JetStream: &JetStreamConfig{Stream: "WALCAST"}, BatchSize: 50}, f.j, f.connect())
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := p.Run(ctx)
			if !errors.Is(err, ErrStreamMismatch) || !strings.Contains(err.Error(), "fix:") {
				t.Fatalf("Run: %v, want ErrStreamMismatch with a fix", err)
			}
			t.Log(err)
			if msgs := storedMsgs(t, s); len(msgs) != 0 {
				t.Fatalf("the stream holds %v, want nothing published", msgs)
			}
		})
	}
}
