package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/client"
	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal/journaltest"
)

const syncJWTSecret = "sync-e2e-jwt-secret-0123456789abcdef"

// TestSyncEndToEnd: SQL writes → walcast run → NATS → walcast sync → Go
// client. Every committed change arrives once, in commit order; a second
// client that joins late with a cursor replays what it missed and then
// follows live.
func TestSyncEndToEnd(t *testing.T) {
	url := pgtest.NewDatabase(t)
	setupSource(t, url)
	ns := natstest.Start(t)
	run := startWalcast(t, runArgs(url, "--nats-url", ns.URL())...)
	waitUntil(t, "run active", 30*time.Second, func() bool { return strings.HasPrefix(run.readyz(), "active") })
	_, wsURL := startSync(t, "--nats-url", ns.URL(), "--journal-url", url)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tok, c := subscribeItems(t, ctx, wsURL, "e2e")
	start := c.Cursor("public.items")

	w := startWriter(t, url)
	time.Sleep(time.Second)
	committed := w.finish()
	if len(committed) == 0 {
		t.Fatal("the writer committed nothing")
	}
	expectCommitted(t, ctx, c, committed)

	// A late client replays from the first client's starting cursor.
	late, err := client.Dial(ctx, wsURL, client.Options{Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if err := late.Subscribe("public.items", start); err != nil {
		t.Fatal(err)
	}
	expectCommitted(t, ctx, late, committed)

	// walcast tail --socket prints the same changes as JSON lines.
	tail := startWalcast(t, "tail", "--socket", wsURL, "--token", tok, "--topic", "public.items",
		"--from-cursor", start, "--count", strconv.Itoa(len(committed)))
	if code := tail.exitCode(t, 60*time.Second); code != 0 {
		t.Fatalf("tail --socket: exit %d\n%s", code, tail.log())
	}
	if n := strings.Count(tail.log(), `{"seq":`); n != len(committed) {
		t.Fatalf("tail --socket printed %d envelopes, want %d\n%s", n, len(committed), tail.log())
	}
}

func TestSyncUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sync"}, "--nats-url is required"},
		{[]string{"sync", "--nats-url", "nats://127.0.0.1:1"}, "--journal-url is required"},
		{[]string{"sync", "--nats-url", "nats://127.0.0.1:1", "--journal-url", "postgres://x"}, "--cursor-secret is required"},
		{[]string{"sync", "--nats-url", "nats://127.0.0.1:1", "--journal-url", "postgres://x", "--cursor-secret", "0123456789abcdef0123"}, "--jwt-secret or --jwt-public-key-file is required"},
		{[]string{"sync", "--nats-url", "nats://127.0.0.1:1", "--journal-url", "postgres://x", "--cursor-secret", "0123456789abcdef0123",
			"--jwt-secret", "a", "--jwt-public-key-file", "b"}, "not both"},
		{[]string{"sync", "--nats-url", "nats://127.0.0.1:1", "--journal-url", "postgres://x", "--cursor-secret", "0123456789abcdef0123",
			"--jwt-secret", syncJWTSecret, "--journal-read-max-wait", "-1s"}, "--journal-read-max-wait must not be negative"},
	} {
		code, _, stderr := walcast(t, nil, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Fatalf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
	// Environment variables set the flags.
	code, _, stderr := walcast(t, map[string]string{"WALCAST_NATS_URL": "nats://127.0.0.1:1"}, "sync")
	if code != exitUsage || !strings.Contains(stderr, "--journal-url is required") {
		t.Fatalf("env: exit %d %q", code, stderr)
	}
}

// startSync starts `walcast sync` with args (its NATS and databases) on
// loopback addresses, the test's secrets and JSON logs, and waits until it
// is ready; it returns the process and its socket URL.
func startSync(t *testing.T, args ...string) (*proc, string) {
	t.Helper()
	sync := startWalcast(t, append([]string{"sync", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
		"--jwt-secret", syncJWTSecret, "--cursor-secret", string(cursorSecret), "--log-format", "json"}, args...)...)
	listenRe := regexp.MustCompile(`"listen":"(ws://[^"]+)"`)
	var wsURL string
	waitUntil(t, "sync listening", 30*time.Second, func() bool {
		m := listenRe.FindStringSubmatch(sync.log())
		if m != nil {
			wsURL = m[1]
		}
		return m != nil && strings.HasPrefix(sync.readyz(), "ready")
	})
	return sync, wsURL
}

// subscribeItems dials the sync node at wsURL with a token for
// public.items of subject sub, subscribes from the horizon and waits until
// the subscription holds a cursor; it returns the token and the client.
func subscribeItems(t *testing.T, ctx context.Context, wsURL, sub string) (string, *client.Client) {
	t.Helper()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": sub, "topics": []string{"public.items"}, "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(syncJWTSecret))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(ctx, wsURL, client.Options{Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Subscribe("public.items", ""); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "subscribed", 30*time.Second, func() bool { return c.Cursor("public.items") != "" })
	return tok, c
}

// expectCommitted reads len(committed) changes from c and fails unless
// they are the committed ones, each once, in order (journaltest).
func expectCommitted(t *testing.T, ctx context.Context, c *client.Client, committed []string) {
	t.Helper()
	v := journaltest.New()
	v.Commit(committed...)
	for n := 0; n < len(committed); n++ {
		ev, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("after %d of %d changes: %v", n, len(committed), err)
		}
		if ev.Type != client.EventChange {
			t.Fatalf("after %d of %d changes: event %+v", n, len(committed), ev)
		}
		var env decoder.Envelope
		if err := json.Unmarshal(ev.Change, &env); err != nil {
			t.Fatal(err)
		}
		v.Observe(journaltest.Item{Seq: env.Seq, Entity: env.Entity, EntitySeq: env.EntitySeq,
			ID: fmt.Sprintf("%s:%s:%s", env.Op, env.Entity, env.Key["id"])})
	}
	if err := v.Check(); err != nil {
		t.Fatal(err)
	}
}
