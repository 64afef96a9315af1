package replication

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcast/walcast/decoder"
)

// sessionSettings are fixed on the replication session because pgoutput sends
// values in their text form, which depends on them (DESIGN §4.7).
var sessionSettings = map[string]string{
	"TimeZone":           "UTC",
	"DateStyle":          "ISO",
	"IntervalStyle":      "iso_8601",
	"extra_float_digits": "3",
	"bytea_output":       "hex",
}

// connectReplication opens a logical replication connection
// (replication=database) to dsn. On such a connection the walsender also
// runs plain SQL, which is how walcast takes its advisory lock on the very
// session that streams.
func connectReplication(ctx context.Context, dsn string) (*pgconn.PgConn, error) {
	cfg, err := ParseConnConfig(dsn)
	if err != nil {
		return nil, ClassifyConnectError("source database (replication connection)", err)
	}
	pc := cfg.Config.Copy()
	for k, v := range sessionSettings {
		pc.RuntimeParams[k] = v
	}
	pc.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, ClassifyConnectError("source database (replication connection)", err)
	}
	return conn, nil
}

// SystemInfo identifies the server a stream comes from (IDENTIFY_SYSTEM).
type SystemInfo struct {
	SystemID string
	Timeline int32
	XLogPos  decoder.LSN
	DBName   string
}

func identifySystem(ctx context.Context, conn *pgconn.PgConn) (SystemInfo, error) {
	r, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return SystemInfo{}, fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	return SystemInfo{SystemID: r.SystemID, Timeline: r.Timeline, XLogPos: decoder.LSN(r.XLogPos), DBName: r.DBName}, nil
}

// lockKey derives the advisory lock key guarding a slot: every walcast
// instance streaming from the same slot name in the same database contends
// for it.
func lockKey(slot string) int64 {
	h := fnv.New64a()
	h.Write([]byte("walcast.slot:"))
	h.Write([]byte(slot))
	return int64(h.Sum64())
}

// tryLock takes the session advisory lock for slot on conn without waiting.
// The lock lives as long as conn's session.
func tryLock(ctx context.Context, conn *pgconn.PgConn, slot string) (bool, error) {
	res, err := conn.Exec(ctx, "SELECT pg_try_advisory_lock("+strconv.FormatInt(lockKey(slot), 10)+")").ReadAll()
	if err != nil {
		return false, fmt.Errorf("take advisory lock: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return false, errors.New("take advisory lock: unexpected result")
	}
	return string(res[0].Rows[0][0]) == "t", nil
}

// slotState is a replication slot as pg_replication_slots shows it.
type slotState struct {
	Exists         bool
	Plugin         string
	SlotType       string
	Database       string
	WalStatus      string
	ConfirmedFlush decoder.LSN
	ActivePID      int
}

// ValidateSlotName applies PostgreSQL's rule for slot names: 1–63 characters
// of lower-case letters, digits and underscores. Valid names need no quoting.
func ValidateSlotName(name string) error {
	if name == "" || len(name) > 63 {
		return fmt.Errorf("slot name %q must be 1 to 63 characters", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return fmt.Errorf("slot name %q may contain only lower-case letters, digits and underscores", name)
		}
	}
	return nil
}

// readSlot reads slot's state over conn (any session kind). slot must have
// passed ValidateSlotName.
func readSlot(ctx context.Context, conn *pgconn.PgConn, slot string) (slotState, error) {
	q := `SELECT coalesce(plugin, ''), slot_type, coalesce(database, ''), coalesce(wal_status, ''),
		coalesce(confirmed_flush_lsn::text, '0/0'), coalesce(active_pid, 0)
		FROM pg_replication_slots WHERE slot_name = '` + slot + `'`
	res, err := conn.Exec(ctx, q).ReadAll()
	if err != nil {
		return slotState{}, fmt.Errorf("read slot %s: %w", slot, err)
	}
	if len(res) != 1 || len(res[0].Rows) == 0 {
		return slotState{}, nil
	}
	row := res[0].Rows[0]
	s := slotState{Exists: true, Plugin: string(row[0]), SlotType: string(row[1]), Database: string(row[2]), WalStatus: string(row[3])}
	if s.ConfirmedFlush, err = decoder.ParseLSN(string(row[4])); err != nil {
		return slotState{}, err
	}
	s.ActivePID, _ = strconv.Atoi(string(row[5]))
	return s, nil
}

// createSlot creates a logical slot using pgoutput and returns the LSN from
// which it decodes (its consistent point).
func createSlot(ctx context.Context, conn *pgconn.PgConn, slot string) (decoder.LSN, error) {
	r, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication})
	if err != nil {
		return 0, fmt.Errorf("create slot %s: %w", slot, err)
	}
	lsn, err := decoder.ParseLSN(r.ConsistentPoint)
	if err != nil {
		return 0, fmt.Errorf("create slot %s: %w", slot, err)
	}
	return lsn, nil
}

// pluginArgs are the pgoutput options of START_REPLICATION (DESIGN §4.3).
func pluginArgs(publication string) []string {
	// publication_names is parsed as a list of identifiers inside a string
	// literal: double-quote the name for the list, then escape it for the
	// literal.
	ident := `"` + strings.ReplaceAll(publication, `"`, `""`) + `"`
	return []string{
		"proto_version '2'",
		"publication_names '" + strings.ReplaceAll(ident, "'", "''") + "'",
		"messages 'true'",
		"streaming 'on'",
	}
}
