package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walcast/walcast/internal/pgtest"
)

// slotJSON is `walcast slot status --json`, decoded strictly so a renamed
// field fails the test.
type slotJSON struct {
	Slot               string `json:"slot"`
	Plugin             string `json:"plugin"`
	SlotType           string `json:"slotType"`
	Database           string `json:"database"`
	Temporary          bool   `json:"temporary"`
	Active             bool   `json:"active"`
	ActivePID          int    `json:"activePid"`
	RestartLSN         string `json:"restartLsn"`
	ConfirmedFlushLSN  string `json:"confirmedFlushLsn"`
	ServerLSN          string `json:"serverLsn"`
	LagBytes           int64  `json:"lagBytes"`
	RetainedBytes      int64  `json:"retainedBytes"`
	WALStatus          string `json:"walStatus"`
	SafeWALSize        *int64 `json:"safeWalSize"`
	MaxSlotWALKeepSize string `json:"maxSlotWalKeepSize"`
	Holder             *struct {
		PID             int    `json:"pid"`
		Via             string `json:"via"`
		ApplicationName string `json:"applicationName"`
		Walcast         bool   `json:"walcast"`
		ClientAddr      string `json:"clientAddr"`
		BackendStart    string `json:"backendStart"`
		ReplyTime       string `json:"replyTime"`
	} `json:"holder"`
}

func slotStatusJSON(t *testing.T, env map[string]string, args ...string) slotJSON {
	t.Helper()
	code, out, errOut := walcast(t, env, append([]string{"slot", "status", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("slot status: exit %d\n%s%s", code, out, errOut)
	}
	var s slotJSON
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		t.Fatalf("slot status JSON: %v\n%s", err, out)
	}
	return s
}

func TestSlotStatusAndDropInactive(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url, `CREATE TABLE items (id int PRIMARY KEY, val text)`, `CREATE PUBLICATION pub FOR TABLE items`,
		`SELECT pg_create_logical_replication_slot('cli_slot', 'pgoutput')`)
	// Flags from the environment.
	env := map[string]string{"WALCAST_DATABASE_URL": url, "WALCAST_SLOT": "cli_slot"}
	before := slotStatusJSON(t, env)
	if before.Slot != "cli_slot" || before.Plugin != "pgoutput" || before.SlotType != "logical" || before.Active ||
		before.Holder != nil || before.WALStatus != "reserved" || before.SafeWALSize != nil {
		t.Fatalf("fresh slot: %+v", before)
	}
	execSQL(t, url, `INSERT INTO items SELECT g, repeat('v', 200) FROM generate_series(1, 1000) g`)
	after := slotStatusJSON(t, env)
	if after.LagBytes < before.LagBytes+200_000 || after.ConfirmedFlushLSN != before.ConfirmedFlushLSN {
		t.Fatalf("lag after 1000 inserts nobody consumed: %d → %d bytes", before.LagBytes, after.LagBytes)
	}

	code, out, errOut := walcast(t, env, "slot", "status")
	if code != 0 || !strings.Contains(out, "slot cli_slot (logical, pgoutput)") || !strings.Contains(out, "lag ") ||
		!strings.Contains(out, "wal_status           reserved") || !strings.Contains(out, "held by              nobody") {
		t.Fatalf("text status: exit %d\n%s%s", code, out, errOut)
	}

	// drop without --yes: exit 2 with the reason, and nothing dropped —
	// also when WALCAST_YES is set: the confirmation is command-line only.
	envYes := map[string]string{"WALCAST_YES": "true"}
	for k, v := range env {
		envYes[k] = v
	}
	code, out, errOut = walcast(t, envYes, "slot", "drop")
	if code != 2 || !strings.Contains(errOut, "without --yes") || !strings.Contains(errOut, "--recreate-lost-slot") {
		t.Fatalf("drop without --yes: exit %d\n%s%s", code, out, errOut)
	}
	slotStatusJSON(t, env)

	code, out, errOut = walcast(t, env, "slot", "drop", "--yes")
	if code != 0 || !strings.Contains(out, "dropped replication slot cli_slot") {
		t.Fatalf("drop --yes: exit %d\n%s%s", code, out, errOut)
	}
	for _, args := range [][]string{{"slot", "status"}, {"slot", "drop", "--yes"}} {
		code, out, errOut = walcast(t, env, args...)
		if code != 1 || !strings.Contains(errOut, `replication slot does not exist: "cli_slot"`) {
			t.Fatalf("%v of a dropped slot: exit %d\n%s%s", args, code, out, errOut)
		}
	}
}

func TestSlotUsageErrors(t *testing.T) {
	url := pgtest.NewDatabase(t)
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"slot"}, 2, "status or drop"},
		{[]string{"slot", "status"}, 2, "--database-url is required"},
		{[]string{"slot", "drop", "--yes"}, 2, "--database-url is required"},
		{[]string{"slot", "status", "--database-url", url, "--slot", "No-Such"}, 2, "lower-case letters"},
		{[]string{"slot", "status", "--database-url", "postgres://u:s3cret@127.0.0.1:1/x?sslmode=disable"}, 2, "check that PostgreSQL is running"},
		{[]string{"slot", "status", "--database-url", url}, 1, "does not exist"},
	}
	for _, tc := range cases {
		code, out, errOut := walcast(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) || strings.Contains(out+errOut, "s3cret") {
			t.Fatalf("%v: exit %d (want %d), want %q in:\n%s%s", tc.args, code, tc.code, tc.want, out, errOut)
		}
	}
}

// TestSlotDropRefusesWhileWalcastRuns holds the slot with a real `walcast
// run` process: status names it, drop refuses with its pid, and after it
// stops the drop goes through.
func TestSlotDropRefusesWhileWalcastRuns(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url, `CREATE TABLE items (id int PRIMARY KEY, val text)`, `CREATE PUBLICATION pub FOR TABLE items`)
	p := startWalcast(t, runArgs(url, "--slot", "cli_held")...)
	waitUntil(t, "walcast run to be active", 30*time.Second, func() bool {
		return strings.HasPrefix(p.readyz(), "active")
	})
	args := []string{"--database-url", url, "--slot", "cli_held"}
	var s slotJSON
	waitUntil(t, "the slot to be streamed from", 10*time.Second, func() bool {
		s = slotStatusJSON(t, nil, args...)
		return s.Active
	})
	h := s.Holder
	if h == nil || h.PID != s.ActivePID || h.Via != "stream" || !h.Walcast || h.ApplicationName != "walcast" ||
		!strings.HasPrefix(h.ClientAddr, "127.0.0.1:") || h.BackendStart == "" {
		t.Fatalf("holder of a slot walcast run streams from: %+v %+v", s, h)
	}
	// Idle and active: walcast confirms keepalive positions, so the lag
	// returns to (about) zero.
	waitUntil(t, "the lag of an idle active slot to fall under 1 MB", 20*time.Second, func() bool {
		return slotStatusJSON(t, nil, args...).LagBytes < 1<<20
	})

	code, out, errOut := walcast(t, nil, append([]string{"slot", "drop", "--yes"}, args...)...)
	if code != 1 || !strings.Contains(errOut, "pid "+strconv.Itoa(s.ActivePID)+" (walcast from 127.0.0.1:") ||
		!strings.Contains(errOut, "stop every `walcast run`") {
		t.Fatalf("drop of an active slot: exit %d\n%s%s", code, out, errOut)
	}
	slotStatusJSON(t, nil, args...) // still there

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.exitCode(t, 30*time.Second); code != 0 {
		t.Fatalf("walcast run exit %d after SIGTERM", code)
	}
	waitUntil(t, "the slot to be released", 10*time.Second, func() bool {
		s := slotStatusJSON(t, nil, args...)
		return !s.Active && s.Holder == nil
	})
	code, out, errOut = walcast(t, nil, append([]string{"slot", "drop", "--yes"}, args...)...)
	if code != 0 {
		t.Fatalf("drop after walcast stopped: exit %d\n%s%s", code, out, errOut)
	}
}
