package journal

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
)

// This file holds what a sync node needs beyond Changes: issuing the cursor
// of a given position in a scope (one per delivered change), checking a
// client's cursor without reading, reading one entry by seq (an oversize
// envelope published without its row data) and an entity's newest
// entitySeq (the baseline of gap detection).

// CursorAt returns the cursor at position pos (the seq of the last entry the
// reader has been given) of the given epoch for q's scope (Entities, Tenant,
// AllTenants; the other fields are ignored). It reads nothing: the caller
// vouches that every entry of the scope up to pos in that epoch's history
// has been handed to the reader.
func (j *Journal) CursorAt(q Query, epoch, pos int64) (string, error) {
	if len(j.secrets) == 0 {
		return "", opErr("journal.CursorAt", ErrNoCursorSecret, "set --cursor-secret")
	}
	if pos < 0 {
		pos = 0
	}
	return j.cursorAt(max(epoch, 0), pos, newScope(q).hash()), nil
}

// CheckCursor validates q.Cursor for q's scope as Changes does, without
// reading: it returns the cursor's position and epoch, or a resync reason
// when the cursor is authentic but cannot be served from its position
// (signed with a previous secret, or issued by another journal). Whether
// the epoch is current is for the caller (or Changes) to say. A malformed or forged
// cursor fails with ErrCursorTampered, one of another scope with
// ErrCursorScope (and ErrForeignJournal under RejectForeignJournal). Whether
// the position is still retained is for Changes to say.
func (j *Journal) CheckCursor(q Query) (pos, epoch int64, resync ResyncReason, err error) {
	const op = "journal.CheckCursor"
	if len(j.secrets) == 0 {
		return 0, 0, "", opErr(op, ErrNoCursorSecret, "set --cursor-secret")
	}
	c, idx, ok := decodeCursor(q.Cursor, j.secrets)
	if !ok {
		return 0, 0, "", opErr(op, ErrCursorTampered, "the client must drop this cursor and start again without one")
	}
	switch {
	case c.scope != newScope(q).hash():
		return 0, 0, "", opErr(op, ErrCursorScope, "present a cursor with the topics and tenant it was issued for")
	case c.journal != j.id && j.rejectForeign:
		return 0, 0, "", opErr(op, ErrForeignJournal, "the cursor belongs to another journal; start again without a cursor")
	case c.journal != j.id:
		return 0, 0, ResyncForeignJournal, nil
	case idx > 0:
		return 0, 0, ResyncSecretRotated, nil
	}
	return c.position, c.epoch, "", nil
}

// Epoch returns the journal's current epoch and the seq of its first entry
// (the resync entry that started it; 1 for a journal's first epoch).
func (j *Journal) Epoch(ctx context.Context) (epoch, firstSeq int64, err error) {
	err = j.queryRow(ctx, "SELECT m.epoch, coalesce((SELECT first_seq FROM "+j.sql.epochs+" WHERE epoch = m.epoch), 1) FROM "+j.sql.meta+" m", nil, &epoch, &firstSeq)
	if err != nil {
		return 0, 0, opErr("journal.Epoch", err, "")
	}
	return epoch, firstSeq, nil
}

// ErrNoEntry: the entry asked for by seq is not retained (pruned, or never
// written).
var ErrNoEntry = errors.New("journal entry not retained")

// EntryAt reads the entry with the given seq, whatever its entity or tenant:
// the caller applies its own scope. It fails with ErrNoEntry when the entry
// is not retained. With a standby (Config.ReadURL) it reads there, and a
// seq the standby has not replayed yet is waited for or read on the
// journal's server: ErrNoEntry always means pruned or never written.
func (j *Journal) EntryAt(ctx context.Context, seq int64) (Entry, error) {
	const op = "journal.EntryAt"
	type found struct {
		e  Entry
		ok bool
	}
	f, err := readAt(ctx, j, seq, -1, func(ctx context.Context, p *connPool) (found, int64, int64, error) {
		var (
			f         found
			horizon   int64
			seqv      *int64
			tenant    *string
			opv       *string
			lsn, clsn *int64
			envelope  *string
			x8        *int64
			ct        *time.Time
			eseq      *int64
			entity    *string
			unknown   *bool
		)
		err := j.queryRowOn(ctx, p, `SELECT b.horizon, e.seq, e.entity, e.entity_seq, e.tenant, e.tenant_unknown, e.op, e.lsn, e.commit_lsn, e.commit_time, e.envelope, e.xid8
			FROM (SELECT next_seq - 1 AS horizon FROM `+j.sql.meta+`) b LEFT JOIN LATERAL (SELECT * FROM `+
			j.entriesIn("$1::bigint - 1", "$1::bigint", "entity", "entity_seq", "tenant", "tenant_unknown", "op", "lsn", "commit_lsn", "commit_time", "envelope", "xid8")+` e
			WHERE e.seq >= (SELECT floor FROM `+j.sql.retention+`)) e ON true`, []any{seq},
			&horizon, &seqv, &entity, &eseq, &tenant, &unknown, &opv, &lsn, &clsn, &ct, &envelope, &x8)
		if err != nil || seqv == nil {
			return f, horizon, 0, err
		}
		e := Entry{Seq: *seqv, Entity: *entity, EntitySeq: *eseq, TenantUnknown: *unknown, Op: decoder.Op(*opv),
			LSN: decoder.LSN(*lsn), CommitLSN: decoder.LSN(*clsn), CommitTime: *ct, Envelope: []byte(*envelope)}
		if tenant != nil {
			e.Tenant, e.HasTenant = *tenant, true
		}
		if x8 != nil {
			e.Xid8, e.HasXid8 = uint64(*x8), true
		}
		return found{e: e, ok: true}, horizon, 0, nil
	})
	if err != nil {
		return Entry{}, opErr(op, err, "")
	}
	if !f.ok {
		return Entry{}, opErr(op, ErrNoEntry, "")
	}
	return f.e, nil
}

// LastEntitySeq returns the entitySeq of the entity's newest journaled
// change, 0 when it has none.
func (j *Journal) LastEntitySeq(ctx context.Context, entity string) (int64, error) {
	var n int64
	err := j.queryRow(ctx, "SELECT coalesce((SELECT last_seq FROM "+j.sql.entitySeqs+" WHERE entity = $1), 0)", []any{entity}, &n)
	if err != nil {
		return 0, opErr("journal.LastEntitySeq", err, "")
	}
	return n, nil
}

// EntityBaseline returns, read together on the journal's server (never a
// standby), the entitySeq of the entity's newest journaled change (0 when
// it has none) and the journal's horizon: what a sync node that has just
// subscribed to the entity's messages takes as its baseline, and the seq
// its readers must read up to, since changes published before the
// subscription never reach it.
func (j *Journal) EntityBaseline(ctx context.Context, entity string) (last, horizon int64, err error) {
	err = j.queryRow(ctx, "SELECT coalesce((SELECT last_seq FROM "+j.sql.entitySeqs+" WHERE entity = $1), 0), (SELECT next_seq - 1 FROM "+j.sql.meta+")",
		[]any{entity}, &last, &horizon)
	if err != nil {
		return 0, 0, opErr("journal.EntityBaseline", err, "")
	}
	return last, horizon, nil
}

// Entities returns the entities that have at least one journaled change and
// whose name is at most maxBytes long (0: any), at most limit of them (0:
// 100000), in name order: what a sync node accepts as topics under a "*"
// grant. It reads the per-entity bookkeeping only (one row per entity).
//
// With a standby (Config.ReadURL) it reads there: an entity whose first
// change the standby has not replayed yet is missing from the list until
// it has.
func (j *Journal) Entities(ctx context.Context, maxBytes, limit int) ([]string, error) {
	if maxBytes <= 0 {
		maxBytes = 1 << 30
	}
	if limit <= 0 {
		limit = 100000
	}
	out, err := readAt(ctx, j, 0, -1, func(ctx context.Context, p *connPool) ([]string, int64, int64, error) {
		ctx, cancel := j.callCtx(ctx)
		defer cancel()
		conn, err := p.acquire(ctx)
		if err != nil {
			return nil, 0, 0, err
		}
		defer p.release(conn)
		rows, err := conn.Query(ctx, "SELECT entity FROM "+j.sql.entitySeqs+" WHERE octet_length(entity) <= $1 ORDER BY entity LIMIT $2", maxBytes, limit)
		if err != nil {
			return nil, 0, 0, err
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		return out, 0, 0, err
	})
	if err != nil {
		return nil, opErr("journal.Entities", err, "")
	}
	return out, nil
}

// EntityProgress returns, read together, the journal's horizon and epoch
// and the entitySeq of the newest journaled change of each of entities
// (absent for one with none): what a sync node compares with the changes
// it has received to tell that none was lost on the way (fanout/sync
// position.go). epoch is the caller's: the answer is of another epoch
// only when the journal's server has moved on from it.
//
// With a standby (Config.ReadURL) it reads there, unless the standby is
// of another epoch than the caller's: the horizon and the entitySeqs are
// then an earlier moment's, consistent with each other, so a caller must
// take them as true up to the returned horizon only.
func (j *Journal) EntityProgress(ctx context.Context, epoch int64, entities []string) (horizon, readEpoch int64, last map[string]int64, err error) {
	type progress struct {
		horizon, epoch int64
		names          []string
		last           []int64
	}
	pr, err := readAt(ctx, j, 0, epoch, func(ctx context.Context, p *connPool) (progress, int64, int64, error) {
		var pr progress
		err := j.queryRowOn(ctx, p, "SELECT (SELECT next_seq - 1 FROM "+j.sql.meta+"), (SELECT epoch FROM "+j.sql.meta+"), coalesce(array_agg(entity), '{}'), coalesce(array_agg(last_seq), '{}') FROM "+
			j.sql.entitySeqs+" WHERE entity = ANY($1)", []any{entities}, &pr.horizon, &pr.epoch, &pr.names, &pr.last)
		return pr, pr.horizon, pr.epoch, err
	})
	if err != nil {
		return 0, 0, nil, opErr("journal.EntityProgress", err, "")
	}
	out := make(map[string]int64, len(pr.names))
	for i, e := range pr.names {
		out[e] = pr.last[i]
	}
	return pr.horizon, pr.epoch, out, nil
}
