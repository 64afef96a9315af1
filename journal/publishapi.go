package journal

import (
	"context"
	"encoding/hex"
	"time"

	"github.com/walcast/walcast/decoder"
)

// IDHex is the journal id as 32 lower-case hex digits, as used in NATS
// message ids (<journal id>:<seq>).
func (j *Journal) IDHex() string { return hex.EncodeToString(j.id[:]) }

// Log is a raw read of the journal for its own consumers (the NATS publisher,
// `walcast tail`): entries in seq order whatever their entity or tenant,
// resync entries included, with the retained bounds. Unlike Changes it takes
// a plain seq rather than a cursor and never answers with a resync: the
// caller sees Floor and decides.
type Log struct {
	Entries []Entry
	Floor   int64 // oldest retained seq
	Horizon int64 // newest assigned seq
}

// ReadAfter returns up to limit entries with seq > after (limit defaults to
// DefaultLimit and is capped at MaxLimit). When after is below Floor-1 the
// entries between were pruned; the read starts at the floor.
func (j *Journal) ReadAfter(ctx context.Context, after int64, limit int) (Log, error) {
	const op = "journal.ReadAfter"
	if limit <= 0 {
		limit = DefaultLimit
	}
	if limit > MaxLimit {
		limit = MaxLimit
	}
	conn, err := j.pool.acquire(ctx)
	if err != nil {
		return Log{}, opErr(op, err, "")
	}
	defer j.pool.release(conn)
	var out Log
	if err := conn.QueryRow(ctx, `SELECT m.next_seq - 1, r.floor FROM `+j.sql.meta+` m, `+j.sql.retention+` r`).
		Scan(&out.Horizon, &out.Floor); err != nil {
		return Log{}, opErr(op, err, "")
	}
	rows, err := conn.Query(ctx, `SELECT seq, entity, entity_seq, tenant, tenant_unknown, op, lsn, commit_lsn, commit_time, envelope
		FROM `+j.sql.entries+` WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3`, after, out.Horizon, limit)
	if err != nil {
		return Log{}, opErr(op, err, "")
	}
	defer rows.Close()
	for rows.Next() {
		var (
			e         Entry
			tenant    *string
			opv       string
			lsn, clsn int64
			ct        time.Time
		)
		if err := rows.Scan(&e.Seq, &e.Entity, &e.EntitySeq, &tenant, &e.TenantUnknown, &opv, &lsn, &clsn, &ct, &e.Envelope); err != nil {
			return Log{}, opErr(op, err, "")
		}
		if tenant != nil {
			e.Tenant = *tenant
		}
		e.Op, e.LSN, e.CommitLSN, e.CommitTime = decoder.Op(opv), decoder.LSN(lsn), decoder.LSN(clsn), ct
		out.Entries = append(out.Entries, e)
	}
	if err := rows.Err(); err != nil {
		return Log{}, opErr(op, err, "")
	}
	return out, nil
}
