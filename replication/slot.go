package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrSlotNotFound is in the chain of the error SlotStatus and DropSlot return
// when the slot does not exist in the server.
var ErrSlotNotFound = errors.New("replication slot does not exist")

// SlotInfo is a replication slot as `walcast slot status` reports it. LSNs
// are in PostgreSQL's text form (e.g. "0/1A2B3C8"); sizes are bytes.
type SlotInfo struct {
	Slot      string `json:"slot"`
	Plugin    string `json:"plugin"`   // output plugin; empty for a physical slot
	SlotType  string `json:"slotType"` // "logical" or "physical"
	Database  string `json:"database"` // empty for a physical slot
	Temporary bool   `json:"temporary"`
	Active    bool   `json:"active"`
	// ActivePID is the server process streaming from the slot; 0 when the
	// slot is inactive.
	ActivePID int `json:"activePid,omitempty"`

	RestartLSN        string `json:"restartLsn"`        // oldest WAL the slot may still need
	ConfirmedFlushLSN string `json:"confirmedFlushLsn"` // what walcast has acknowledged (journaled)
	// ServerLSN is the server's current WAL position (its replay position
	// when it is a standby), the reference for the two sizes below.
	ServerLSN string `json:"serverLsn"`
	// LagBytes is ServerLSN minus ConfirmedFlushLSN: WAL written since
	// walcast last acknowledged. Writes to tables outside the publication
	// count too; an idle active walcast brings it back to about zero.
	LagBytes int64 `json:"lagBytes"`
	// RetainedBytes is ServerLSN minus RestartLSN: WAL the server keeps on
	// disk for this slot.
	RetainedBytes int64 `json:"retainedBytes"`

	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved or lost.
	WALStatus string `json:"walStatus"`
	// SafeWALSize is how many more bytes of WAL can be written before the
	// slot is in danger of losing WAL it needs; nil when
	// max_slot_wal_keep_size is -1 (unlimited).
	SafeWALSize *int64 `json:"safeWalSize"`
	// MaxSlotWALKeepSize is the server's setting, as it prints it ("-1"
	// for unlimited).
	MaxSlotWALKeepSize string `json:"maxSlotWalKeepSize"`

	// Holder is the session streaming from the slot, or, when the slot is
	// inactive, the session holding walcast's advisory lock for the slot
	// name (an instance between taking the lock and starting to stream).
	// Nil when neither exists.
	Holder *SlotHolder `json:"holder"`
}

// SlotHolder describes the database session holding a slot, as far as the
// connecting role may see it (other roles' sessions show only a pid unless
// it has pg_read_all_stats).
type SlotHolder struct {
	PID int `json:"pid"`
	// Via says how it holds the slot: "stream" (the slot's active pid) or
	// "lock" (walcast's advisory lock for the slot name).
	Via             string `json:"via"`
	ApplicationName string `json:"applicationName,omitempty"`
	// Walcast is true when the session is a walcast replication connection
	// (its application_name is walcast's) or holds walcast's lock.
	Walcast bool `json:"walcast"`
	// ClientAddr is host:port of the client, "local" for a unix socket,
	// empty when not visible.
	ClientAddr   string     `json:"clientAddr,omitempty"`
	BackendStart *time.Time `json:"backendStart,omitempty"`
	// ReplyTime is when the client last sent a status update
	// (pg_stat_replication.reply_time); nil when not streaming.
	ReplyTime *time.Time `json:"replyTime,omitempty"`
}

// SlotStatus reads slot's state from the server at databaseURL. A missing
// slot is an *Error with CodeSlotLost wrapping ErrSlotNotFound; a failed
// connection is classified as by ClassifyConnectError.
func SlotStatus(ctx context.Context, databaseURL, slot string) (SlotInfo, error) {
	conn, err := connectAdmin(ctx, databaseURL, slot)
	if err != nil {
		return SlotInfo{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return slotInfo(ctx, conn, slot)
}

// DropSlot drops slot after checking that no one uses it. While it checks
// and drops, it holds walcast's advisory lock for the slot name, so no
// walcast instance (a standby about to take over) can start streaming from
// the slot in between. It refuses, with an *Error with CodeSlotHeld wrapping
// ErrSlotHeld, when the slot is active or the lock is held by another
// session; a missing slot is an *Error wrapping ErrSlotNotFound.
func DropSlot(ctx context.Context, databaseURL, slot string) error {
	conn, err := connectAdmin(ctx, databaseURL, slot)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, lockKey(slot)).Scan(&locked); err != nil {
		return &Error{Code: CodeInternal, Op: "drop slot " + slot + ": take walcast's lock for the slot", Err: err}
	}
	if locked {
		// Closing the session releases it too; unlock explicitly so a
		// standby can take over as soon as the slot is gone.
		defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lockKey(slot)) }()
	}
	info, err := slotInfo(ctx, conn, slot)
	if err != nil {
		return err
	}
	var current string
	if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&current); err != nil {
		return readError("drop slot "+slot, err)
	}
	if info.Database != "" && info.Database != current {
		// walcast's lock lives in the slot's database; from here it fences
		// nothing.
		return &Error{Code: CodeConfig, Op: "drop slot " + slot,
			Err: fmt.Errorf("slot %q belongs to database %q, not %q", slot, info.Database, current),
			Fix: "point --database-url at database " + strconv.Quote(info.Database)}
	}
	if info.Active || !locked {
		return heldError("drop slot "+slot, info)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: became active after the check
			return &Error{Code: CodeSlotHeld, Op: "drop slot " + slot, Err: fmt.Errorf("%w: %s", ErrSlotHeld, pgErr.Message),
				Fix: "stop the process streaming from the slot, then drop it again"}
		}
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return &Error{Code: CodePrivilege, Op: "drop slot " + slot, Err: err,
				Fix: "connect as a role with the REPLICATION attribute (or a superuser)"}
		}
		if errors.As(err, &pgErr) && pgErr.Code == "42704" {
			return notFoundError(ctx, conn, "drop slot "+slot, slot)
		}
		return &Error{Code: CodeInternal, Op: "drop slot " + slot, Err: err}
	}
	return nil
}

func connectAdmin(ctx context.Context, databaseURL, slot string) (*pgx.Conn, error) {
	if err := ValidateSlotName(slot); err != nil {
		return nil, &Error{Code: CodeConfig, Op: "check --slot", Err: err,
			Fix: "pass the slot's name with --slot (or WALCAST_SLOT); `walcast verify` and pg_replication_slots list it"}
	}
	cfg, err := ParseConnConfig(databaseURL)
	if err != nil {
		return nil, ClassifyConnectError("source database", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, ClassifyConnectError("source database", err)
	}
	return conn, nil
}

func slotInfo(ctx context.Context, conn *pgx.Conn, slot string) (SlotInfo, error) {
	op := "read slot " + slot
	info := SlotInfo{Slot: slot}
	var (
		plugin, database, walStatus, restart, confirmed *string
		activePID                                       *int32
		lag, retained                                   *int64
	)
	// A standby has no current WAL position of its own; what it has
	// replayed is the reference there.
	err := conn.QueryRow(ctx, `
		WITH pos AS (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn)
		SELECT s.plugin, s.slot_type, s.database, s.temporary, s.active, s.active_pid,
			s.restart_lsn::text, s.confirmed_flush_lsn::text, pos.lsn::text,
			pg_wal_lsn_diff(pos.lsn, s.confirmed_flush_lsn)::bigint,
			pg_wal_lsn_diff(pos.lsn, s.restart_lsn)::bigint,
			s.wal_status, s.safe_wal_size, current_setting('max_slot_wal_keep_size')
		FROM pg_replication_slots s, pos WHERE s.slot_name = $1`, slot).
		Scan(&plugin, &info.SlotType, &database, &info.Temporary, &info.Active, &activePID,
			&restart, &confirmed, &info.ServerLSN, &lag, &retained,
			&walStatus, &info.SafeWALSize, &info.MaxSlotWALKeepSize)
	if errors.Is(err, pgx.ErrNoRows) {
		return SlotInfo{}, notFoundError(ctx, conn, op, slot)
	}
	if err != nil {
		return SlotInfo{}, readError(op, err)
	}
	info.Plugin, info.Database, info.WALStatus = deref(plugin), deref(database), deref(walStatus)
	info.RestartLSN, info.ConfirmedFlushLSN = deref(restart), deref(confirmed)
	if lag != nil {
		info.LagBytes = max(*lag, 0)
	}
	if retained != nil {
		info.RetainedBytes = max(*retained, 0)
	}
	pid, via := 0, ""
	if activePID != nil {
		info.ActivePID = int(*activePID)
		pid, via = info.ActivePID, "stream"
	} else {
		// An instance holding the lock but not streaming yet (or between
		// sessions of a reconnect) is about to use the slot.
		k := uint64(lockKey(slot))
		err := conn.QueryRow(ctx, `SELECT pid FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND classid = $1 AND objid = $2
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND pid <> pg_backend_pid()`, uint32(k>>32), uint32(k)).Scan(&pid)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return SlotInfo{}, readError(op+": advisory lock", err)
		default:
			via = "lock"
		}
	}
	if pid != 0 {
		h, err := holder(ctx, conn, pid, via)
		if err != nil {
			return SlotInfo{}, readError(op+": holder", err)
		}
		info.Holder = &h
	}
	return info, nil
}

func holder(ctx context.Context, conn *pgx.Conn, pid int, via string) (SlotHolder, error) {
	h := SlotHolder{PID: pid, Via: via, Walcast: via == "lock"}
	var (
		app, addr         *string
		port              *int32
		started, replied  *time.Time
		unixSocket, found bool
	)
	err := conn.QueryRow(ctx, `SELECT a.application_name, host(a.client_addr), a.client_port,
			a.client_addr IS NULL AND a.client_port = -1, a.backend_start, r.reply_time
		FROM pg_stat_activity a LEFT JOIN pg_stat_replication r ON r.pid = a.pid
		WHERE a.pid = $1`, pid).Scan(&app, &addr, &port, &unixSocket, &started, &replied)
	switch {
	case errors.Is(err, pgx.ErrNoRows): // gone since the slot was read
	case err != nil:
		return SlotHolder{}, err
	default:
		found = true
	}
	if !found {
		return h, nil
	}
	h.ApplicationName = deref(app)
	if strings.HasPrefix(h.ApplicationName, "walcast") {
		h.Walcast = true
	}
	switch {
	case unixSocket:
		h.ClientAddr = "local"
	case addr != nil && port != nil:
		if strings.Contains(*addr, ":") {
			h.ClientAddr = "[" + *addr + "]:" + strconv.Itoa(int(*port))
		} else {
			h.ClientAddr = *addr + ":" + strconv.Itoa(int(*port))
		}
	}
	h.BackendStart, h.ReplyTime = started, replied
	return h, nil
}

// notFoundError says the slot is missing and lists the slots that do exist,
// which catches a mistyped --slot.
func notFoundError(ctx context.Context, conn *pgx.Conn, op, slot string) error {
	var names []string
	_ = conn.QueryRow(ctx, `SELECT coalesce(array_agg(slot_name::text ORDER BY slot_name), '{}') FROM pg_replication_slots`).Scan(&names)
	fix := "check --slot (or WALCAST_SLOT) and the database URL; `walcast run` creates its slot on first start"
	if len(names) == 0 {
		fix += "; this server has no replication slots"
	} else {
		fix += "; slots on this server: " + strings.Join(names, ", ")
	}
	return &Error{Code: CodeSlotLost, Op: op, Err: fmt.Errorf("%w: %q", ErrSlotNotFound, slot), Fix: fix}
}

func heldError(op string, info SlotInfo) error {
	who := "another session"
	if info.Holder != nil {
		who = info.Holder.describe()
	}
	var what string
	if info.Active {
		what = fmt.Sprintf("slot %q is active: %s streams from it", info.Slot, who)
	} else {
		what = fmt.Sprintf("slot %q is held: %s holds walcast's lock for it and may start streaming any moment", info.Slot, who)
	}
	fix := "stop every `walcast run` using this slot first (standbys too, or one takes over), then drop it again"
	if h := info.Holder; h != nil && !h.Walcast {
		fix = fmt.Sprintf("stop the process streaming from the slot (SELECT pg_terminate_backend(%d); ends its session, but a client that reconnects takes the slot again), then drop it again", h.PID)
	}
	return &Error{Code: CodeSlotHeld, Op: op, Err: fmt.Errorf("%w: %s", ErrSlotHeld, what), Fix: fix}
}

// describe names the session for a person: "pid 123 (walcast from 10.0.0.5:51234)".
func (h *SlotHolder) describe() string {
	var parts []string
	switch {
	case h.Walcast:
		parts = append(parts, "walcast")
	case h.ApplicationName != "":
		parts = append(parts, strconv.Quote(h.ApplicationName))
	}
	if h.ClientAddr != "" {
		parts = append(parts, "from "+h.ClientAddr)
	}
	s := "pid " + strconv.Itoa(h.PID)
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, " ") + ")"
	}
	return s
}

func readError(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return &Error{Code: CodePrivilege, Op: op, Err: err, Fix: "connect as the walcast role or a superuser"}
	}
	return &Error{Code: CodeInternal, Op: op, Err: err}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// WriteText prints the slot's state for a person.
func (s SlotInfo) WriteText(w io.Writer) error {
	var b strings.Builder
	kind := s.SlotType
	if s.Plugin != "" {
		kind += ", " + s.Plugin
	}
	if s.Temporary {
		kind += ", temporary"
	}
	fmt.Fprintf(&b, "slot %s (%s)", s.Slot, kind)
	if s.Database != "" {
		fmt.Fprintf(&b, " in database %s", s.Database)
	}
	b.WriteString("\n")
	row := func(k, format string, args ...any) { fmt.Fprintf(&b, "  %-20s %s\n", k, fmt.Sprintf(format, args...)) }
	row("restart_lsn", "%s", orNone(s.RestartLSN))
	row("confirmed_flush_lsn", "%s", orNone(s.ConfirmedFlushLSN))
	row("server WAL position", "%s", s.ServerLSN)
	row("lag", "%s not yet acknowledged (%d bytes)", formatBytes(s.LagBytes), s.LagBytes)
	row("WAL retained", "%s (%d bytes)", formatBytes(s.RetainedBytes), s.RetainedBytes)
	ws := orNone(s.WALStatus)
	switch s.WALStatus {
	case "lost":
		ws += ": the server removed WAL the slot needed; changes were missed (walcast run --recreate-lost-slot resyncs)"
	case "unreserved":
		ws += ": WAL the slot needs will be removed at the next checkpoint unless it catches up"
	}
	row("wal_status", "%s", ws)
	if s.SafeWALSize != nil {
		row("safe_wal_size", "%s (%d bytes; max_slot_wal_keep_size = %s)", formatBytes(*s.SafeWALSize), *s.SafeWALSize, s.MaxSlotWALKeepSize)
	} else {
		row("safe_wal_size", "unlimited (max_slot_wal_keep_size = %s)", s.MaxSlotWALKeepSize)
	}
	if s.Active {
		row("active", "yes, pid %d", s.ActivePID)
	} else {
		row("active", "no")
	}
	if h := s.Holder; h != nil {
		desc := "pid " + strconv.Itoa(h.PID)
		if h.Via == "lock" {
			desc += " holds walcast's lock for this slot (not streaming yet)"
		}
		if h.Walcast {
			desc += ", walcast"
		}
		if h.ApplicationName != "" {
			desc += fmt.Sprintf(", application_name %q", h.ApplicationName)
		}
		if h.ClientAddr != "" {
			desc += ", from " + h.ClientAddr
		}
		if h.BackendStart != nil {
			desc += ", connected " + h.BackendStart.UTC().Format(time.RFC3339)
		}
		if h.ReplyTime != nil {
			desc += ", last status update " + h.ReplyTime.UTC().Format(time.RFC3339)
		}
		row("held by", "%s", desc)
	} else {
		row("held by", "nobody")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
