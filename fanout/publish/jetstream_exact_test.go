package publish

import (
	"context"
	"log/slog"
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

// TestJetStreamEmptiedStreamAfterAnUnsavedBatch: the stream acknowledged
// entries whose position the journal never saved (the process stopped, or
// the journal could not be written, between the two), and the stream was
// then emptied, so its last message cannot tell where it ended. The next
// run continues exactly after the last entry the stream stored: each
// journal entry is stored once, at consecutive stream sequences, with its
// message id.
func TestJetStreamEmptiedStreamAfterAnUnsavedBatch(t *testing.T) {
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

	// From here the stream stores what the publisher sends, and the
	// journal saves none of it.
	thaw := freezePublished(t, f.url)
	for i := 101; i <= 300; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	waitUntil(t, "300 stored", 30*time.Second, func() bool { return streamLast(t, s) == 300 })
	stop()
	thaw()
	if saved, err := f.j.Published(ctx); err != nil || saved != 100 {
		t.Fatalf("saved position %d (%v), want the 100 saved before the journal refused", saved, err)
	}
	checkContinues(t, storedMsgs(t, s), f.j.IDHex(), 1, 300)

	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 301; i <= 350; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	p2 := New(Config{JetStream: &JetStreamConfig{Stream: "WALCAST"}, BatchSize: 50, Logger: slog.New(slog.NewTextHandler(logWriter{t}, nil))}, f.j, f.connect())
	stop = runFor(t, p2)
	waitUntil(t, "350 published", 30*time.Second, func() bool { return p2.Stats().Published == 350 })
	stop() // settles what is in flight: the stream holds all it will
	after := storedMsgs(t, s)
	if len(after) == 0 || after[0].stream != 301 {
		t.Fatalf("after the purge the stream starts at %v, want stream sequence 301", after)
	}
	checkContinues(t, after, f.j.IDHex(), 301, 350)
}
