package journal

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/walcast/walcast/decoder"
)

// Query is a read of the journal (DESIGN §5).
type Query struct {
	// Cursor is where to continue: a cursor returned by an earlier read with
	// the same scope (Entities, Tenant, AllTenants). Empty means "start now":
	// no changes, and Result.Cursor at the current horizon — unless
	// FromOldest is set, which starts at the oldest retained entry instead
	// (or just after the newest resync entry, if that is later).
	Cursor     string
	FromOldest bool

	// Entities restricts the read to these entities ("schema.table"); empty
	// means all. Order and duplicates do not matter.
	Entities []string
	// Tenant scopes the read to one tenant: its rows and rows with no tenant.
	// Empty means unscoped: only rows with no tenant (fail closed). Rows whose
	// tenant could not be resolved reach neither.
	Tenant string
	// AllTenants reads every row regardless of tenant, including
	// tenant-unknown ones: for the publisher and operators' tools, never for
	// an end user's request. Tenant is ignored when it is set.
	AllTenants bool
	// View is a reader's own narrowing of the scope that the journal does
	// not apply: a filtered subscription's filter and column list, in a
	// canonical form. It binds cursors only (a cursor issued under one
	// View is refused under another, ErrCursorScope), so a position
	// counted under one filter is never resumed under another. Empty for
	// none, and a cursor issued without one keeps its meaning.
	View string

	// AtLeast is a seq the caller knows the journal holds (one it was
	// given live, or the journal server's horizon): a read made on a
	// standby (Config.ReadURL) that has not replayed it yet waits for the
	// standby, or is made on the journal's server (replica.go), so its
	// Result reaches at least AtLeast. 0: no such seq. Without a standby
	// it changes nothing.
	AtLeast int64

	// Limit bounds the number of changes returned; 0 means DefaultLimit and
	// values above MaxLimit are lowered to it.
	Limit int
	// MaxBytes bounds the envelope bytes returned (the entries' size
	// column): changes stop before the one that would start at or past it,
	// but the first change is always returned, so a read holds at most
	// MaxBytes plus one envelope. 0 means DefaultMaxBytes; values above
	// MaxMaxBytes are lowered to it. A read cut short by bytes reports More
	// with the cursor after its last change.
	MaxBytes int
}

// Read limits.
const (
	DefaultLimit    = 1000
	MaxLimit        = 10000
	DefaultMaxBytes = 4 << 20
	MaxMaxBytes     = 64 << 20
)

// byteBound is q's MaxBytes with the defaults applied.
func byteBound(n int) int {
	switch {
	case n <= 0:
		return DefaultMaxBytes
	case n > MaxMaxBytes:
		return MaxMaxBytes
	}
	return n
}

// Entry is one journaled change as read.
type Entry struct {
	Seq       int64
	Entity    string
	EntitySeq int64
	// Tenant is the row's tenant when HasTenant; HasTenant is false for a row
	// with no tenant (SQL NULL), so an empty-string tenant ("" with
	// HasTenant) stays distinct from none, as in the journal's column.
	Tenant        string
	HasTenant     bool
	TenantUnknown bool
	Op            decoder.Op
	LSN           decoder.LSN
	CommitLSN     decoder.LSN
	CommitTime    time.Time
	// Xid8 is the source transaction's 64-bit id (the envelope's "xid" is
	// its low 32 bits), 0 for an entry of no transaction, when HasXid8.
	// HasXid8 is false for an entry journaled before the journal recorded
	// full ids, and in what ReadAfter returns. Set by Changes and EntryAt.
	Xid8    uint64
	HasXid8 bool
	// Envelope is the complete envelope JSON (DESIGN §3), byte for byte as
	// stored and published. The caller owns it, except in what ReadAfter
	// returns: there it may be shared with other readers (the recent log,
	// recent.go) and must not be modified.
	Envelope []byte
	// Epoch is the epoch the entry was journaled in; set by ReadAfter (the
	// publisher's read, for message ids) and zero elsewhere.
	Epoch int64
	// TxnEnd, set by Changes, says the entry is the last of its source
	// transaction among the entries the query's scope (entities, tenant)
	// selects: no later entry of that scope shares its commit LSN. A
	// cursor right after such an entry is at a transaction boundary of
	// the scope.
	TxnEnd bool
}

// ResyncReason says why a read requires a resync.
type ResyncReason string

// Resync reasons.
const (
	ResyncPruned         ResyncReason = "pruned"          // cursor below the retained floor
	ResyncAhead          ResyncReason = "ahead"           // cursor beyond the horizon
	ResyncForeignJournal ResyncReason = "foreign-journal" // cursor from another journal (id mismatch)
	ResyncEntry          ResyncReason = "resync-entry"    // cursor from before a resync entry
	ResyncSecretRotated  ResyncReason = "secret-rotated"  // cursor signed with a previous secret
	ResyncEpoch          ResyncReason = "epoch"           // cursor from another epoch of this journal (a restore or reset since)
)

// Result is the answer to a read.
type Result struct {
	// Changes are the entries after the cursor, in seq order, at most Limit.
	Changes []Entry
	// Cursor continues the read: after the last change returned or, when
	// fewer than Limit matched, after the last entry scanned (the horizon,
	// or the end of the bounded scan window of a filtered read), so a
	// filtered reader keeps up with the log even when nothing matches.
	// Unchanged when ResyncRequired.
	Cursor string
	// More says entries exist beyond Cursor: read again at once rather than
	// Wait. (A filtered read can return no changes and More.)
	More bool
	// ResyncRequired: the reader's position is lost (Reason says why); its
	// state must be refetched and the read resumed from ResyncCursor, which
	// is at the current horizon. Changes is empty.
	ResyncRequired bool
	Reason         ResyncReason
	ResyncCursor   string
	// Horizon is the newest seq in the journal at the time of the read.
	Horizon int64
	// Epoch is the journal's epoch at the time of the read: that of Cursor
	// and ResyncCursor.
	Epoch int64
	// Watermark is the journal's watermark at the time of the read: every
	// source transaction that committed at or before it is journaled at
	// or below Horizon.
	Watermark decoder.LSN
}

// Changes reads the journal as DESIGN §5 describes.
//
// Resync detection runs on the unfiltered log, in the same snapshot as the
// read: a cursor at position p needs a resync when p is below floor-1, above
// the horizon, or below the newest resync entry; or when the cursor was
// issued by another journal, in another epoch of this one, or signed with a
// previous secret. Entity and
// tenant filters play no part in it. A malformed or forged cursor fails with
// ErrCursorTampered, one presented with a different scope with
// ErrCursorScope; neither is ever served.
func (j *Journal) Changes(ctx context.Context, q Query) (Result, error) {
	const op = "journal.Changes"
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	if len(j.secrets) == 0 {
		return Result{}, opErr(op, ErrNoCursorSecret, "set --cursor-secret")
	}
	sc := newScope(q)
	sh := sc.hash()
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	if limit > MaxLimit {
		limit = MaxLimit
	}

	var start *int64 // nil: start now or at the oldest
	var reason ResyncReason
	epoch := int64(-1) // the cursor's; -1 without one
	if q.Cursor != "" {
		c, idx, ok := decodeCursor(q.Cursor, j.secrets)
		if !ok {
			return Result{}, opErr(op, ErrCursorTampered, "the client must drop this cursor and start again without one")
		}
		switch {
		case c.scope != sh:
			return Result{}, opErr(op, ErrCursorScope, "present a cursor with the topics and tenant it was issued for")
		case c.journal != j.id && j.rejectForeign:
			return Result{}, opErr(op, ErrForeignJournal, "the cursor belongs to another journal; start again without a cursor")
		case c.journal != j.id:
			reason = ResyncForeignJournal
		case idx > 0:
			reason = ResyncSecretRotated
		default:
			p := c.position
			start = &p
			epoch = c.epoch
		}
	}

	// On a standby: a cursor's own position must be replayed (else the
	// standby would call it ahead), and its epoch must be the standby's
	// (else only the journal's server can say whether it is current).
	need, wantEpoch := q.AtLeast, int64(-1)
	if start != nil {
		need, wantEpoch = max(need, *start), epoch
	}
	rows, err := readAt(ctx, j, need, wantEpoch, func(ctx context.Context, p *connPool) (readRows, int64, int64, error) {
		rows, err := j.readEntries(ctx, p, sc, start, epoch, q.FromOldest && q.Cursor == "", limit, byteBound(q.MaxBytes))
		return rows, rows.horizon, rows.epoch, err
	})
	if err != nil {
		return Result{}, opErr(op, err, "")
	}
	res := Result{Horizon: rows.horizon, Epoch: rows.epoch, Watermark: decoder.LSN(rows.watermark)}
	if reason == "" && start != nil {
		p := *start
		switch {
		case epoch != rows.epoch:
			// Checked first: a position of another epoch says nothing
			// about this history (readEntries read no entry for it).
			reason = ResyncEpoch
		case p > rows.horizon:
			reason = ResyncAhead
		case p < rows.floor-1:
			reason = ResyncPruned
		case p < rows.resyncSeq:
			reason = ResyncEntry
		}
	}
	if reason != "" {
		res.ResyncRequired = true
		res.Reason = reason
		res.Cursor = q.Cursor
		res.ResyncCursor = j.cursorAt(rows.epoch, rows.horizon, sh)
		return res, nil
	}
	res.Changes = rows.entries
	if err := j.markTxnEnds(ctx, sc, &rows); err != nil {
		return Result{}, opErr(op, err, "")
	}
	// Every entry in (start, min(start+window, horizon)] was scanned in the
	// read's snapshot; with fewer than limit matches the cursor moves to the
	// end of that range, so a filtered reader keeps up with the log.
	pos := min(rows.start+rows.window, rows.horizon)
	if len(rows.entries) == limit || rows.cut {
		pos = rows.entries[len(rows.entries)-1].Seq
	}
	res.Cursor = j.cursorAt(rows.epoch, pos, sh)
	res.More = pos < rows.horizon
	return res, nil
}

// HorizonCursor returns a cursor at the current horizon for the query's
// scope: what a reader that starts live (having just subscribed to NATS)
// resumes from.
func (j *Journal) HorizonCursor(ctx context.Context, q Query) (string, error) {
	q.Cursor, q.FromOldest, q.Limit = "", false, 1
	res, err := j.Changes(ctx, q)
	if err != nil {
		return "", err
	}
	return res.Cursor, nil
}

func (j *Journal) cursorAt(epoch, pos int64, scopeHash [16]byte) string {
	return encodeCursor(cursor{journal: j.id, epoch: epoch, position: pos, scope: scopeHash}, j.secrets[0])
}

type readRows struct {
	horizon, floor, resyncSeq int64
	watermark                 int64
	epoch                     int64
	start                     int64 // position the read started after
	window                    int64 // entries (start, start+window] were scanned
	entries                   []Entry
	next                      []pgtype.Int8 // next[i]: commit_lsn of the next matching entry in the window after entries[i]
	cut                       bool          // more matching entries were left out by the byte bound
}

// markTxnEnds sets TxnEnd on the entries read: an entry ends its
// transaction in the scope when the next entry of the scope belongs to
// another transaction, or when no entry of the scope follows it up to the
// horizon (always a transaction boundary). Only the last entry can lack a
// next one within the scanned window; when the window stopped short of
// the horizon, TxnRest looks at the rest of its transaction — on the
// journal's server even when the read was a standby's: a transaction is
// whole on both, so the answer is the same.
func (j *Journal) markTxnEnds(ctx context.Context, sc scope, rows *readRows) error {
	for i := range rows.entries {
		e := &rows.entries[i]
		if nx := rows.next[i]; nx.Valid {
			e.TxnEnd = decoder.LSN(nx.Int64) != e.CommitLSN
			continue
		}
		end := rows.start + rows.window
		if end >= rows.horizon {
			e.TxnEnd = true
			continue
		}
		rest, err := j.TxnRest(ctx, end, e.CommitLSN)
		if err != nil {
			return err
		}
		e.TxnEnd = true
		for k := range rest {
			if sc.sees(k) {
				e.TxnEnd = false
				break
			}
		}
	}
	return nil
}

// scanWindow bounds how many entries one read scans: seq is contiguous, so
// an unfiltered read of limit entries touches exactly limit rows, and a
// filtered one at most this many, whatever the distance to the horizon. (The
// entries table has no index by entity: it would cost every append more than
// it saves these reads.)
func scanWindow(limit int) int64 { return int64(limit) + 20000 }

// readEntries reads the bookkeeping and up to limit matching entries after
// the start position in one statement, hence one snapshot. With start nil it
// starts at the horizon, or with fromOldest at max(floor-1, resyncSeq). No
// entry is read when the start position needs a resync.
func (j *Journal) readEntries(ctx context.Context, pool *connPool, sc scope, start *int64, epoch int64, fromOldest bool, limit, maxBytes int) (readRows, error) {
	var filter strings.Builder
	args := []any{start, fromOldest, limit, scanWindow(limit), maxBytes, epoch}

	if len(sc.entities) > 0 {
		args = append(args, sc.entities)
		fmt.Fprintf(&filter, " AND e.entity = ANY($%d::text[])", len(args))
	}
	switch {
	case sc.allTenants:
	case sc.tenant != "":
		args = append(args, sc.tenant)
		fmt.Fprintf(&filter, " AND (e.tenant = $%d OR (e.tenant IS NULL AND NOT e.tenant_unknown))", len(args))
	default:
		filter.WriteString(" AND e.tenant IS NULL AND NOT e.tenant_unknown")
	}
	// The bookkeeping subquery is LIMIT 1 so the planner knows it is one row
	// (the singleton tables have no useful statistics). The entries are
	// walked in seq order on the primary key, at most window of them (the
	// inner LIMIT), and the walk stops as soon as limit of them matched the
	// filters (the outer LIMIT): no sort, and a bounded scan whatever the
	// filters match. The byte bound keeps the matching entries whose
	// preceding matches sum to less than maxBytes ($5), plus one more (the
	// first whose predecessors reach it: before_bytes >= $5) that only tells
	// the caller the read was cut; its row is dropped.
	sql := `SELECT b.horizon, b.floor, b.resync_seq, b.epoch, b.start, b.watermark,
		e.seq, e.entity, e.entity_seq, e.tenant, e.tenant_unknown, e.op, e.lsn, e.commit_lsn, e.commit_time, e.envelope, e.before_bytes, e.xid8, e.next_commit
	FROM (SELECT m.next_seq - 1 AS horizon, r.floor, m.resync_seq, m.epoch, m.watermark,
			coalesce($1::bigint, CASE WHEN $2::boolean THEN greatest(r.floor - 1, m.resync_seq) ELSE m.next_seq - 1 END) AS start
		FROM ` + j.sql.meta + ` m, ` + j.sql.retention + ` r LIMIT 1) b
	LEFT JOIN LATERAL (
		SELECT * FROM (
			SELECT e.*, sum(e.size) OVER w - e.size AS before_bytes,
				sum(e.size) OVER w - e.size - coalesce(lag(e.size) OVER w, 0) AS prev_before,
				lead(e.commit_lsn) OVER w AS next_commit
			FROM (
				SELECT * FROM ` + j.entriesIn("b.start", "b.start + $4::bigint", readColumnsXid8...) + ` e
				WHERE b.start >= b.floor - 1 AND b.start >= b.resync_seq AND b.start <= b.horizon
					AND ($1::bigint IS NULL OR $6::bigint = b.epoch)
				ORDER BY e.chunk_end, e.chunk_i
			) e
			WHERE true` + filter.String() + `
			WINDOW w AS (ORDER BY e.chunk_end, e.chunk_i)
		) e
		WHERE e.prev_before < $5
		ORDER BY e.chunk_end, e.chunk_i LIMIT $3 + 1
	) e ON true
	ORDER BY e.chunk_end, e.chunk_i`

	conn, err := pool.acquire(ctx)
	if err != nil {
		return readRows{}, err
	}
	defer pool.release(conn)
	out := readRows{window: scanWindow(limit)}
	err = queryInOrder(ctx, conn, sql, args, func(rows pgx.Rows) error {
		var c entryCols
		var before *int64
		var x8, next pgtype.Int8
		if err := rows.Scan(append(append([]any{&out.horizon, &out.floor, &out.resyncSeq, &out.epoch, &out.start, &out.watermark}, c.dest()...), &before, &x8, &next)...); err != nil {
			return err
		}
		e, ok := c.entry()
		e.Xid8, e.HasXid8 = uint64(x8.Int64), x8.Valid
		switch {
		case !ok:
		case *before >= int64(maxBytes) || len(out.entries) == limit:
			out.cut = true // one more matches beyond the bounds
		default:
			out.entries = append(out.entries, e)
			out.next = append(out.next, next)
		}
		return nil
	})
	if err != nil {
		return readRows{}, err
	}
	return out, nil
}

// entryCols is one entries row read through a LEFT JOIN, so every column may
// be NULL (no entry after the start). The selected columns must be, in
// order: seq, entity, entity_seq, tenant, tenant_unknown, op, lsn,
// commit_lsn, commit_time, envelope. The pgtype values scan without an
// allocation per column (pointers to pointers allocate one per row each),
// which was most of a read's client-side cost.
type entryCols struct {
	seq, entitySeq, lsn, commitLSN pgtype.Int8
	entity, tenant, op             pgtype.Text
	unknown                        pgtype.Bool
	commitTime                     pgtype.Timestamptz
	env                            []byte
}

func (c *entryCols) dest() []any {
	return []any{&c.seq, &c.entity, &c.entitySeq, &c.tenant, &c.unknown, &c.op, &c.lsn, &c.commitLSN, &c.commitTime, &c.env}
}

// entry converts the row; false for the LEFT JOIN's empty row.
func (c *entryCols) entry() (Entry, bool) {
	if !c.seq.Valid {
		return Entry{}, false
	}
	e := Entry{Seq: c.seq.Int64, Entity: c.entity.String, EntitySeq: c.entitySeq.Int64, TenantUnknown: c.unknown.Bool, Op: decoder.Op(c.op.String),
		LSN: decoder.LSN(c.lsn.Int64), CommitLSN: decoder.LSN(c.commitLSN.Int64), CommitTime: c.commitTime.Time, Envelope: c.env}
	if c.tenant.Valid {
		e.Tenant, e.HasTenant = c.tenant.String, true
	}
	return e, true
}
