package publish

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
)

// TestJetStreamEmptiedStreamInsideTheDuplicateWindow: the stream stored
// entries past the journal's saved position, which has no stream position
// with it (saved by core NATS mode, or by an older walcast), and was then
// emptied, all within its duplicate window. The next run continues after
// the saved position: the entries the stream stored before come back as
// duplicates of their message ids and are stored nothing, so the stream's
// sequence does not move for them. The publisher must count them as
// published and go on with the entries after them promptly — not stall
// until the duplicate window (ten minutes here) has passed — and store
// every later entry once, right after the stream's last sequence.
//
// The same when the saved position carries the stream's last sequence
// (saved at the reconcile of an earlier run that stopped straight after):
// it counts the entries after it from there, and the stream acknowledges
// them as duplicates while the publisher expects it to store them.
func TestJetStreamEmptiedStreamInsideTheDuplicateWindow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		saved int64 // the lagging saved position; the stream stored up to 100
		pair  bool  // saved with the stream's last sequence
	}{
		{"within a batch", 90, false},
		{"across batches", 10, false},
		{"saved with the stream position", 60, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newPubFixture(t)
			ctx := context.Background()
			for i := 1; i <= 100; i++ {
				f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
			}
			config := func() Config {
				return Config{JetStream: &JetStreamConfig{Stream: "WALCAST", DuplicateWindow: 10 * time.Minute}, BatchSize: 50,
					Logger: slog.New(slog.NewTextHandler(logWriter{t}, nil))}
			}
			p := New(config(), f.j, f.connect())
			stop := runFor(t, p)
			waitUntil(t, "100 stored", 20*time.Second, func() bool { return p.Stats().Published == 100 })
			stop()
			s := f.jsStream("WALCAST")
			held := storedMsgs(t, s)
			checkContinues(t, held, f.j.IDHex(), 1, 100)

			conn, err := pgx.Connect(ctx, f.url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			stream, streamSeq := "", uint64(0)
			if tc.pair {
				info, err := s.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				stream, streamSeq = streamIdentity(info), info.State.LastSeq
			}
			if _, err := conn.Exec(ctx, "UPDATE walcast.published SET seq = $1, epoch = 0, stream = $2, stream_seq = $3", tc.saved, stream, int64(streamSeq)); err != nil {
				t.Fatal(err)
			}
			if err := s.Purge(ctx); err != nil {
				t.Fatal(err)
			}
			for i := 101; i <= 150; i++ {
				f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
			}

			p = New(config(), f.j, f.connect())
			stop = runFor(t, p)
			waitUntil(t, "every entry published, well within the duplicate window", 60*time.Second, func() bool { return p.Stats().Published == 150 })
			time.Sleep(100 * time.Millisecond) // anything extra would be stored now
			stop()
			after := storedMsgs(t, s)
			if len(after) == 0 || after[0].stream != held[len(held)-1].stream+1 {
				t.Fatalf("after the purge the stream starts at %v, want stream sequence %d", after, held[len(held)-1].stream+1)
			}
			checkContinues(t, after, f.j.IDHex(), 101, 150)
			if saved, err := f.j.Published(ctx); err != nil || saved != 150 {
				t.Fatalf("saved position %d (%v), want 150", saved, err)
			}
		})
	}
}
