package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
)

// TestSyncStateTail: `walcast sync --database-url` serves a table's rows and
// then its changes; `walcast tail --socket --snapshot` prints the rows (op
// "read"), then the changes, each once, and says on standard error where
// the snapshot ends and the cursor to resume from. Without the snapshot
// claim the node refuses, and tail exits 1 saying why.
func TestSyncStateTail(t *testing.T) {
	url, wsURL, token := startStateSync(t)

	refused := startWalcast(t, "tail", "--socket", wsURL, "--token", token(false), "--topic", "public.items", "--snapshot")
	if code := refused.exitCode(t, 60*time.Second); code != exitFailed || !strings.Contains(refused.log(), "forbidden") {
		t.Fatalf("tail --snapshot without the claim: exit %d\n%s", code, refused.log())
	}

	tail := startWalcast(t, "tail", "--socket", wsURL, "--token", token(true), "--topic", "public.items", "--snapshot")
	// Writes while the snapshot is read: the journal's watermark passes
	// the snapshot's WAL position only on later commits (docs/sync.md).
	for i := 0; !strings.Contains(tail.log(), "complete"); i++ {
		if i == 300 {
			t.Fatalf("no snapshot-end after 30 s\n%s", tail.log())
		}
		execSQL(t, url, fmt.Sprintf(`INSERT INTO items VALUES (%d, 'during')`, 1000+i))
		time.Sleep(100 * time.Millisecond)
	}
	execSQL(t, url, `INSERT INTO items SELECT g, 'after' FROM generate_series(2000, 2004) g`, `DELETE FROM items WHERE id = 7`)
	waitUntil(t, "the later changes printed", 30*time.Second, func() bool {
		return strings.Contains(tail.log(), `"op":"delete"`)
	})
	// Replay the printed lines as a client would: rows, then changes.
	state := map[string]bool{}
	var sawEnd, sawBegin bool
	for _, line := range strings.Split(tail.log(), "\n") {
		switch {
		case strings.Contains(line, "walcast tail: snapshot") && strings.Contains(line, "about"):
			sawBegin = true
		case strings.Contains(line, "walcast tail: snapshot") && strings.Contains(line, "resume with --from-cursor"):
			sawEnd = true
		case strings.HasPrefix(line, `{"`):
			var env struct {
				Op  string                     `json:"op"`
				Key map[string]json.RawMessage `json:"key"`
				Msg string                     `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &env) != nil || env.Op == "" {
				continue // a log line of the process
			}
			id := string(env.Key["id"])
			switch env.Op {
			case "read":
				if sawEnd {
					t.Fatalf("a row after snapshot-end: %s", line)
				}
				fallthrough
			case "insert":
				if state[id] {
					t.Fatalf("row %s printed twice (%s)", id, line)
				}
				state[id] = true
			case "delete":
				delete(state, id)
			}
		}
	}
	if !sawBegin || !sawEnd {
		t.Fatalf("begin %v end %v\n%s", sawBegin, sawEnd, tail.log())
	}
	var ids string
	pgtest.MustQueryRow(t, url, `SELECT string_agg(id::text, ',' ORDER BY id) FROM items`, nil, &ids)
	want := strings.Split(ids, ",")
	if len(state) != len(want) {
		t.Fatalf("tail's state has %d rows, the table %d", len(state), len(want))
	}
	for _, id := range want {
		if !state[id] {
			t.Fatalf("row %s of the table missing from tail's output", id)
		}
	}
}

// startStateSync starts walcast run (journal in the source database) and
// walcast sync --database-url over 50 rows of public.items; it returns the
// database, the socket URL and a token maker.
func startStateSync(t *testing.T) (string, string, func(snapshot bool) string) {
	url := pgtest.NewDatabase(t)
	setupSource(t, url)
	execSQL(t, url, `INSERT INTO items SELECT g, 'seed' FROM generate_series(1, 50) g`)
	ns := natstest.Start(t)
	run := startWalcast(t, runArgs(url, "--nats-url", ns.URL())...)
	waitUntil(t, "run active", 30*time.Second, func() bool { return strings.HasPrefix(run.readyz(), "active") })
	_, wsURL := startSync(t, "--nats-url", ns.URL(), "--journal-url", url, "--database-url", url)
	token := func(snapshot bool) string {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "e2e", "topics": []string{"public.items"},
			"snapshot": snapshot, "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(syncJWTSecret))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	return url, wsURL, token
}

// TestSyncStateIdleSource: on a source where nothing is written, a
// snapshot still ends at once: the node asks the replicator how far the
// journal covers (the watermark of a journal in the source database
// advances only every 32 KiB of WAL while idle).
func TestSyncStateIdleSource(t *testing.T) {
	_, wsURL, token := startStateSync(t)
	time.Sleep(2 * time.Second) // the slot's start-up writes are behind us
	tail := startWalcast(t, "tail", "--socket", wsURL, "--token", token(true), "--topic", "public.items", "--snapshot")
	waitUntil(t, "the snapshot's end on an idle source", 30*time.Second, func() bool {
		return strings.Contains(tail.log(), "complete: 50 rows")
	})
}
