package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/walcast/walcast/internal/pgtest"
)

// TestSnapshotCommands: start records a pending request, status lists it
// (text and JSON), cancel cancels a pending one at once and reports when
// nothing matched; bad flags are usage errors.
func TestSnapshotCommands(t *testing.T) {
	url := pgtest.NewDatabase(t)
	code, out, errOut := walcast(t, nil, "snapshot", "start", "--journal-url", url, "--table", "orders", "--where", "id > 10", "--chunk-size", "500")
	if code != 0 || !strings.Contains(out, "snapshot 1 of public.orders requested") {
		t.Fatalf("start: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = walcast(t, map[string]string{"WALCAST_JOURNAL_URL": url}, "snapshot", "status")
	if code != 0 || !strings.Contains(out, "public.orders") || !strings.Contains(out, "pending") || !strings.Contains(out, "where id > 10") {
		t.Fatalf("status: exit %d, %q", code, out)
	}
	code, out, _ = walcast(t, nil, "snapshot", "status", "--journal-url", url, "--json")
	var snaps []struct {
		ID        int64  `json:"id"`
		Schema    string `json:"schema"`
		Table     string `json:"table"`
		Status    string `json:"status"`
		ChunkSize int    `json:"chunkSize"`
		Where     string `json:"where"`
	}
	if err := json.Unmarshal([]byte(out), &snaps); code != 0 || err != nil || len(snaps) != 1 || snaps[0].ChunkSize != 500 || snaps[0].Table != "orders" {
		t.Fatalf("status --json: exit %d, %q (%v)", code, out, err)
	}
	code, out, _ = walcast(t, nil, "snapshot", "cancel", "--journal-url", url, "--table", "public.orders")
	if code != 0 || !strings.Contains(out, "snapshot 1 of public.orders: cancelled") {
		t.Fatalf("cancel: exit %d, %q", code, out)
	}
	code, _, errOut = walcast(t, nil, "snapshot", "cancel", "--journal-url", url, "--id", "1")
	if code != 1 || !strings.Contains(errOut, "no open snapshot matched") {
		t.Fatalf("second cancel: exit %d, %q", code, errOut)
	}
	code, out, _ = walcast(t, nil, "snapshot", "status", "--journal-url", url)
	if code != 0 || !strings.Contains(out, "no open snapshots") {
		t.Fatalf("status after cancel: exit %d, %q", code, out)
	}
	code, out, _ = walcast(t, nil, "snapshot", "status", "--journal-url", url, "--all")
	if code != 0 || !strings.Contains(out, "cancelled") {
		t.Fatalf("status --all: exit %d, %q", code, out)
	}
	for _, args := range [][]string{
		{"snapshot", "start", "--journal-url", url},
		{"snapshot", "start", "--journal-url", url, "--table", "t", "--chunk-size", "0"},
		{"snapshot", "start", "--table", "t"},
		{"snapshot", "cancel", "--journal-url", url},
		{"snapshot", "cancel", "--journal-url", url, "--id", "1", "--table", "t"},
		{"snapshot"},
	} {
		if code, _, errOut := walcast(t, map[string]string{}, args...); code != 2 || errOut == "" {
			t.Errorf("%v: exit %d, stderr %q; want a usage error", args, code, errOut)
		}
	}
}
