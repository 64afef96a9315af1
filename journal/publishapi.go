package journal

import (
	"context"
	"encoding/hex"

	"github.com/jackc/pgx/v5"
)

// IDHex is the journal id as 32 lower-case hex digits, as used in NATS
// message ids (<journal id>:<epoch>:<seq>).
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
	Epoch   int64 // the journal's current epoch
	// EpochSeq is the first seq of the current epoch: a reader whose
	// position is at or past it but who last read in another epoch holds
	// a position of a history the journal no longer has, and reads again
	// from EpochSeq-1.
	EpochSeq int64
}

// ReadAfter returns up to limit entries with seq > after (limit defaults to
// DefaultLimit and is capped at MaxLimit), at most DefaultMaxBytes of
// envelopes (ReadAfterBytes). When after is below Floor-1 the entries
// between were pruned; the read starts at the floor.
func (j *Journal) ReadAfter(ctx context.Context, after int64, limit int) (Log, error) {
	return j.ReadAfterBytes(ctx, after, limit, 0)
}

// ReadAfterBytes is ReadAfter bounded by envelope bytes too: entries stop
// before the one whose predecessors in the read reach maxBytes, but the
// first entry is always returned, so a read holds at most maxBytes plus one
// envelope. maxBytes 0 means DefaultMaxBytes; above MaxMaxBytes it is
// lowered to it.
//
// Entries this process's own appends just committed are returned from
// memory, without a query (recent.go); their envelopes are shared and
// must not be modified.
func (j *Journal) ReadAfterBytes(ctx context.Context, after int64, limit, maxBytes int) (Log, error) {
	const op = "journal.ReadAfter"
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	maxBytes = byteBound(maxBytes)
	if limit <= 0 {
		limit = DefaultLimit
	}
	if limit > MaxLimit {
		limit = MaxLimit
	}
	// What this process's own appends just committed is in memory
	// (recent.go); anything else is read from the journal.
	if l, ok := j.recent.read(after, limit, maxBytes); ok {
		return l, nil
	}
	version := j.recent.state()
	conn, err := j.pool.acquire(ctx)
	if err != nil {
		return Log{}, opErr(op, err, "")
	}
	defer j.pool.release(conn)
	var out Log
	// One statement, one snapshot: the bounds and the entries agree even
	// while retention prunes.
	err = queryInOrder(ctx, conn, `SELECT b.horizon, b.floor, b.epoch, b.epoch_seq, e.seq, e.entity, e.entity_seq, e.tenant, e.tenant_unknown,
			e.op, e.lsn, e.commit_lsn, e.commit_time, e.envelope
		FROM (SELECT m.next_seq - 1 AS horizon, r.floor, m.epoch,
				coalesce((SELECT first_seq FROM `+j.sql.epochs+` WHERE epoch = m.epoch), 1) AS epoch_seq
			FROM `+j.sql.meta+` m, `+j.sql.retention+` r LIMIT 1) b
		LEFT JOIN LATERAL (
			SELECT * FROM (
				SELECT e.*, sum(e.size) OVER (ORDER BY e.chunk_end, e.chunk_i) - e.size AS before_bytes
				FROM `+j.entriesIn("$1::bigint", "least(b.horizon, $1::bigint + $2::bigint)", readColumns...)+` e
			) e WHERE e.before_bytes < $3
		) e ON true
		ORDER BY e.chunk_end, e.chunk_i`, []any{after, limit, maxBytes}, func(rows pgx.Rows) error {
		var c entryCols
		if err := rows.Scan(append([]any{&out.Horizon, &out.Floor, &out.Epoch, &out.EpochSeq}, c.dest()...)...); err != nil {
			return err
		}
		if e, ok := c.entry(); ok {
			e.Epoch = out.Epoch
			out.Entries = append(out.Entries, e)
		}
		return nil
	})
	if err != nil {
		return Log{}, opErr(op, err, "")
	}
	if len(out.Entries) > 0 && out.Entries[0].Seq < out.EpochSeq {
		// Entries from before the current epoch began (a publisher
		// catching up across a reset): each keeps the epoch it was
		// journaled in, so its message id is the one it always had.
		if err := j.assignEpochs(ctx, conn, out.Entries, out.EpochSeq); err != nil {
			return Log{}, opErr(op, err, "")
		}
	}
	j.recent.observe(version, out)
	return out, nil
}

// assignEpochs sets the Epoch of the entries below epochSeq (the current
// epoch's first seq) from the epochs table.
func (j *Journal) assignEpochs(ctx context.Context, q querier, entries []Entry, epochSeq int64) error {
	rows, err := q.Query(ctx, "SELECT epoch, first_seq FROM "+j.sql.epochs+" WHERE first_seq < $1 ORDER BY first_seq", epochSeq)
	if err != nil {
		return err
	}
	type span struct{ epoch, first int64 }
	var spans []span
	var sp span
	if _, err := pgx.ForEachRow(rows, []any{&sp.epoch, &sp.first}, func() error { spans = append(spans, sp); return nil }); err != nil {
		return err
	}
	for i := range entries {
		e := &entries[i]
		if e.Seq >= epochSeq {
			break
		}
		e.Epoch = 0
		for _, s := range spans {
			if s.first <= e.Seq {
				e.Epoch = s.epoch
			}
		}
	}
	return nil
}
