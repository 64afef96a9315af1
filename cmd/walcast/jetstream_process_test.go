package main

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
)

// TestJetStreamKill9 kills `walcast run --jetstream-stream` with SIGKILL in
// 20 rounds under write load, each at a random moment 50 to 350 ms after it
// became active (it publishes a batch every few milliseconds then; the
// preflight checks are skipped to keep rounds short): the stream ends holding every journal entry
// exactly once, in seq order — by the stream's own order, not by the
// duplicate window (the publisher chains every message on its
// predecessor's id and reconciles with the stream's last message).
func TestJetStreamKill9(t *testing.T) {
	url := pgtest.NewDatabase(t)
	j := setupSource(t, url)
	ns := natstest.Start(t)
	args := runArgs(url, "--nats-url", ns.URL(), "--jetstream-stream", "WALCAST", "--jetstream-duplicate-window", "1m", "--skip-preflight")
	var w *writer
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 17))
	const rounds = 20
	for round := 0; round < rounds; round++ {
		p := startWalcast(t, args...)
		waitUntil(t, "active", 30*time.Second, func() bool { return strings.HasPrefix(p.readyz(), "active") })
		if w == nil {
			w = startWriter(t, url)
		}
		time.Sleep(time.Duration(50+rng.IntN(300)) * time.Millisecond)
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-p.done
	}
	p := startWalcast(t, args...)
	waitUntil(t, "active", 30*time.Second, func() bool { return strings.HasPrefix(p.readyz(), "active") })
	committed := w.finish()
	validateJournal(t, url, committed)
	entries := journalItems(t, url)
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := js.Stream(ctx, "WALCAST")
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "every journal entry in the stream", 60*time.Second, func() bool {
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs >= uint64(len(entries))
	})
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(len(entries)) {
		t.Fatalf("the stream holds %d messages for %d journal entries", info.State.Msgs, len(entries))
	}
	for i := uint64(0); i < info.State.Msgs; i++ {
		m, err := s.GetMsg(ctx, info.State.FirstSeq+i)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Header.Get("Walcast-Seq"); got != strconv.FormatInt(entries[i].Seq, 10) {
			t.Fatalf("stream message %d holds journal seq %s, want %d", i+1, got, entries[i].Seq)
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.exitCode(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	_ = j
	t.Logf("%d entries stored exactly once in order across %d kill -9 rounds", len(entries), rounds)
}

// TestJetStreamMismatchRefusedAtStart: walcast run refuses an existing
// stream it cannot use, at start, with exit 2 and the fix.
func TestJetStreamMismatchRefusedAtStart(t *testing.T) {
	url := pgtest.NewDatabase(t)
	setupSource(t, url)
	ns := natstest.Start(t)
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "WALCAST", Subjects: []string{"walcast.>"}}); err != nil {
		t.Fatal(err)
	}
	p := startWalcast(t, runArgs(url, "--nats-url", ns.URL(), "--jetstream-stream", "WALCAST")...)
	if code := p.exitCode(t, 30*time.Second); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if l := p.log(); !strings.Contains(l, "does not match") || !strings.Contains(l, "nats stream edit WALCAST") {
		t.Fatalf("no mismatch error with the fix in the log:\n%s", l)
	}
}
