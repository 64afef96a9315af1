package replication

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/internal/pgtest"
)

func mustSlotStatus(t *testing.T, url, slot string) SlotInfo {
	t.Helper()
	info, err := SlotStatus(context.Background(), url, slot)
	if err != nil {
		t.Fatalf("slot status %s: %v", slot, err)
	}
	return info
}

func TestSlotStatusInactiveWithLag(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url,
		`CREATE TABLE t (id int PRIMARY KEY, v text)`,
		`CREATE PUBLICATION p FOR TABLE t`,
		`SELECT pg_create_logical_replication_slot('walcast', 'pgoutput')`,
	)
	before := mustSlotStatus(t, url, "walcast")
	if before.Plugin != "pgoutput" || before.SlotType != "logical" || before.Database != dbName(t, url) ||
		before.Temporary || before.Active || before.ActivePID != 0 || before.Holder != nil {
		t.Fatalf("fresh slot: %+v", before)
	}
	if before.WALStatus != "reserved" || before.SafeWALSize != nil || before.MaxSlotWALKeepSize != "-1" {
		t.Fatalf("fresh slot WAL state: %+v", before)
	}
	if before.RestartLSN == "" || before.ConfirmedFlushLSN == "" || before.ServerLSN == "" {
		t.Fatalf("fresh slot positions: %+v", before)
	}

	execSQL(t, url, `INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 2000) g`)
	after := mustSlotStatus(t, url, "walcast")
	if after.ConfirmedFlushLSN != before.ConfirmedFlushLSN {
		t.Fatalf("confirmed_flush_lsn moved without a consumer: %s → %s", before.ConfirmedFlushLSN, after.ConfirmedFlushLSN)
	}
	// 2000 rows of ~130 bytes each are well over 200 kB of WAL.
	if after.LagBytes < before.LagBytes+200_000 || after.RetainedBytes < after.LagBytes {
		t.Fatalf("lag after writes: before %d, after %d bytes (retained %d)", before.LagBytes, after.LagBytes, after.RetainedBytes)
	}
	var serverLag int64
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(context.Background(), `SELECT pg_wal_lsn_diff($1::text::pg_lsn, confirmed_flush_lsn)::bigint
		FROM pg_replication_slots WHERE slot_name = 'walcast'`, after.ServerLSN).Scan(&serverLag); err != nil {
		t.Fatal(err)
	}
	if serverLag != after.LagBytes {
		t.Fatalf("lag %d bytes, but server LSN %s minus confirmed_flush_lsn is %d", after.LagBytes, after.ServerLSN, serverLag)
	}

	var text strings.Builder
	if err := after.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"slot walcast (logical, pgoutput) in database " + after.Database,
		"confirmed_flush_lsn  " + after.ConfirmedFlushLSN, strconv.FormatInt(after.LagBytes, 10) + " bytes",
		"wal_status           reserved", "safe_wal_size        unlimited", "active               no", "held by              nobody"} {
		if !strings.Contains(text.String(), want) {
			t.Fatalf("text lacks %q:\n%s", want, text.String())
		}
	}
}

// TestSlotStatusSafeWALSize uses a private server with a bounded
// max_slot_wal_keep_size, where safe_wal_size is reported and shrinks as WAL
// is written.
func TestSlotStatusSafeWALSize(t *testing.T) {
	c := pgtest.Start(t, pgtest.Options{Settings: map[string]string{"max_slot_wal_keep_size": "64MB"}})
	url := c.NewDatabase(t)
	execSQL(t, url, `CREATE TABLE t (id int PRIMARY KEY)`,
		`SELECT pg_create_logical_replication_slot('bounded', 'pgoutput')`)
	before := mustSlotStatus(t, url, "bounded")
	// The server counts from the start of the segment the slot needs, so
	// it may allow up to one 16 MB segment more than the setting.
	if before.SafeWALSize == nil || *before.SafeWALSize <= 0 || *before.SafeWALSize > (64+16)<<20 || before.MaxSlotWALKeepSize != "64MB" {
		t.Fatalf("bounded slot: safe_wal_size %v, setting %q", *before.SafeWALSize, before.MaxSlotWALKeepSize)
	}
	execSQL(t, url, `INSERT INTO t SELECT generate_series(1, 5000)`)
	after := mustSlotStatus(t, url, "bounded")
	if after.SafeWALSize == nil || *after.SafeWALSize >= *before.SafeWALSize {
		t.Fatalf("safe_wal_size did not shrink after writes: %d → %v", *before.SafeWALSize, after.SafeWALSize)
	}
	var text strings.Builder
	_ = after.WriteText(&text)
	if !strings.Contains(text.String(), "max_slot_wal_keep_size = 64MB") {
		t.Fatalf("text:\n%s", text.String())
	}
}

func TestSlotStatusMissingAndInvalid(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url, `SELECT pg_create_logical_replication_slot('present_slot', 'pgoutput')`)
	for _, op := range []func() error{
		func() error { _, err := SlotStatus(context.Background(), url, "absent"); return err },
		func() error { return DropSlot(context.Background(), url, "absent") },
	} {
		err := op()
		if !errors.Is(err, ErrSlotNotFound) || CodeOf(err) != CodeSlotLost {
			t.Fatalf("missing slot: %v (code %s)", err, CodeOf(err))
		}
		var e *Error
		if !errors.As(err, &e) || !strings.Contains(e.Fix, "present_slot") || !strings.Contains(err.Error(), `"absent"`) {
			t.Fatalf("the error should name the slot and list the existing ones: %v", err)
		}
	}
	if _, err := SlotStatus(context.Background(), url, "Bad-Name"); CodeOf(err) != CodeConfig {
		t.Fatalf("invalid slot name: %v", err)
	}
	if _, err := SlotStatus(context.Background(), "postgres://u:pw@127.0.0.1:1/x?sslmode=disable&connect_timeout=5", "walcast"); CodeOf(err) != CodeUnreachable {
		t.Fatalf("unreachable server: %v", err)
	}
}

// streamFrom holds slot the way walcast run does: a replication connection
// (application_name walcast) that took walcast's lock and streams.
func streamFrom(t *testing.T, url, slot, publication string) (pid int, stop func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := connectReplication(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := tryLock(ctx, conn, slot); err != nil || !ok {
		t.Fatalf("lock: %v %v", ok, err)
	}
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: pluginArgs(publication)}); err != nil {
		t.Fatal(err)
	}
	pid = int(conn.PID())
	closed := false
	stop = func() {
		if !closed {
			closed = true
			_ = conn.Close(ctx)
		}
	}
	t.Cleanup(stop)
	return pid, stop
}

func TestDropSlotRefusesAnActiveSlotThenDrops(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url,
		`CREATE TABLE t (id int PRIMARY KEY)`,
		`CREATE PUBLICATION p FOR TABLE t`,
		`SELECT pg_create_logical_replication_slot('held', 'pgoutput')`,
	)
	pid, stop := streamFrom(t, url, "held", "p")
	waitFor(t, "the slot to become active", 10*time.Second, func() bool {
		info, err := SlotStatus(context.Background(), url, "held")
		return err == nil && info.Active
	})
	info := mustSlotStatus(t, url, "held")
	h := info.Holder
	if info.ActivePID != pid || h == nil || h.PID != pid || h.Via != "stream" || !h.Walcast || h.ApplicationName != "walcast" ||
		!strings.HasPrefix(h.ClientAddr, "127.0.0.1:") || h.BackendStart == nil {
		t.Fatalf("active slot: %+v holder %+v (streaming pid %d)", info, h, pid)
	}
	var text strings.Builder
	_ = info.WriteText(&text)
	if !strings.Contains(text.String(), "active               yes, pid "+strconv.Itoa(pid)) ||
		!strings.Contains(text.String(), "pid "+strconv.Itoa(pid)+", walcast") {
		t.Fatalf("text:\n%s", text.String())
	}

	err := DropSlot(context.Background(), url, "held")
	if !errors.Is(err, ErrSlotHeld) || CodeOf(err) != CodeSlotHeld ||
		!strings.Contains(err.Error(), "pid "+strconv.Itoa(pid)+" (walcast from 127.0.0.1:") || !strings.Contains(err.Error(), "stop every `walcast run`") {
		t.Fatalf("drop of an active slot: %v", err)
	}
	mustSlotStatus(t, url, "held") // still there

	stop()
	waitFor(t, "the slot to become inactive", 10*time.Second, func() bool {
		info, err := SlotStatus(context.Background(), url, "held")
		return err == nil && !info.Active && info.Holder == nil
	})
	if err := DropSlot(context.Background(), url, "held"); err != nil {
		t.Fatalf("drop of an inactive slot: %v", err)
	}
	if _, err := SlotStatus(context.Background(), url, "held"); !errors.Is(err, ErrSlotNotFound) {
		t.Fatalf("after drop: %v", err)
	}
	// The drop released walcast's lock, so an instance can take the name.
	conn, err := connectReplication(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if ok, err := tryLock(context.Background(), conn, "held"); err != nil || !ok {
		t.Fatalf("lock after drop: %v %v", ok, err)
	}
}

// TestDropSlotRefusesWhileLockHeld: an instance that holds walcast's lock but
// is not streaming yet (between lock and START_REPLICATION, or reconnecting)
// is about to use the slot; drop refuses and status names it.
func TestDropSlotRefusesWhileLockHeld(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url, `SELECT pg_create_logical_replication_slot('locked', 'pgoutput')`)
	ctx := context.Background()
	conn, err := connectReplication(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if ok, err := tryLock(ctx, conn, "locked"); err != nil || !ok {
		t.Fatalf("lock: %v %v", ok, err)
	}
	pid := int(conn.PID())
	info := mustSlotStatus(t, url, "locked")
	if info.Active || info.Holder == nil || info.Holder.PID != pid || info.Holder.Via != "lock" || !info.Holder.Walcast {
		t.Fatalf("lock holder: %+v %+v", info, info.Holder)
	}
	err = DropSlot(ctx, url, "locked")
	if !errors.Is(err, ErrSlotHeld) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(pid)) || !strings.Contains(err.Error(), "lock") {
		t.Fatalf("drop while the lock is held: %v", err)
	}
	mustSlotStatus(t, url, "locked")
	conn.Close(ctx)
	waitFor(t, "the lock to be released", 10*time.Second, func() bool {
		info, err := SlotStatus(ctx, url, "locked")
		return err == nil && info.Holder == nil
	})
	if err := DropSlot(ctx, url, "locked"); err != nil {
		t.Fatal(err)
	}
}

// TestDropSlotOtherHolderAndDatabase: a slot streamed by something other than
// walcast gets a fix that says how to end that session, and a slot of
// another database is not dropped from here (walcast's lock for it lives in
// its own database).
func TestDropSlotOtherHolderAndDatabase(t *testing.T) {
	url := pgtest.NewDatabase(t)
	other := pgtest.NewDatabase(t)
	execSQL(t, url, `CREATE TABLE t (id int PRIMARY KEY)`, `CREATE PUBLICATION p FOR TABLE t`,
		`SELECT pg_create_logical_replication_slot('foreign_consumer', 'pgoutput')`)

	err := DropSlot(context.Background(), other, "foreign_consumer")
	if CodeOf(err) != CodeConfig || !strings.Contains(err.Error(), "belongs to database") {
		t.Fatalf("drop from another database: %v", err)
	}

	pid, _ := streamFrom(t, url+"&application_name=consumer", "foreign_consumer", "p")
	waitFor(t, "the slot to become active", 10*time.Second, func() bool {
		info, err := SlotStatus(context.Background(), url, "foreign_consumer")
		return err == nil && info.Active
	})
	info := mustSlotStatus(t, other, "foreign_consumer") // slots are visible server-wide
	if info.Holder == nil || info.Holder.Walcast || info.Holder.ApplicationName != "consumer" {
		t.Fatalf("holder: %+v", info.Holder)
	}
	err = DropSlot(context.Background(), url, "foreign_consumer")
	if !errors.Is(err, ErrSlotHeld) || !strings.Contains(err.Error(), `pid `+strconv.Itoa(pid)+` ("consumer" from 127.0.0.1:`) ||
		!strings.Contains(err.Error(), "pg_terminate_backend("+strconv.Itoa(pid)+")") {
		t.Fatalf("drop of a slot another client streams from: %v", err)
	}
}
