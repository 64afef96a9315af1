package journal

import (
	"context"
	"fmt"
	"math"

	"github.com/walcast/walcast/decoder"
)

// FirstSeqInvisible returns the lowest seq in (from, to] of an entry whose
// source transaction a snapshot with in-progress list xip and xmax (64-bit
// xids, as pg_current_snapshot() gives them) does not see, and whether
// there is one; and the lowest position a read may start from (the
// retained floor, or the newest resync entry: what lies before it is
// another history). It reads the seq range through the primary key and
// never an envelope. A sync node uses it to start a state snapshot's
// catch-up before the first entry of a transaction its source snapshot
// could not see yet (docs/sync.md, "State, then changes").
//
// An entry with a full xid (xid8) is invisible when that xid is in xip or
// at or past xmax, exactly as pg_visible_in_snapshot decides for a
// committed transaction. An entry journaled before full xids were recorded
// (xid8 NULL) has only the 32 bits of its envelope; it counts as invisible
// when they equal the low 32 bits of an xid in xip, or lie in the 2^31
// xids from xmax on, modulo 2^32: right while its transaction is less than
// 2^31 xids older than xmax, the rule before xid8 existed.
//
// With a standby (Config.ReadURL) it reads there once the standby has
// replayed seq to (waiting or reading the journal's server otherwise, as
// Changes does): a range the standby holds only in part would hide its
// newest entries.
func (j *Journal) FirstSeqInvisible(ctx context.Context, from, to int64, xip []uint64, xmax uint64) (first int64, found bool, readFrom int64, err error) {
	full := make([]int64, 0, len(xip))
	low := make([]int64, 0, len(xip))
	for _, x := range xip {
		if x <= math.MaxInt64 {
			full = append(full, int64(x))
		}
		low = append(low, int64(uint32(x)))
	}
	top := int64(math.MaxInt64)
	if xmax <= math.MaxInt64 {
		top = int64(xmax)
	}
	type hit struct {
		min      *int64
		readFrom int64
	}
	f, err := readAt(ctx, j, to, -1, func(ctx context.Context, p *connPool) (hit, int64, int64, error) {
		var f hit
		var horizon int64
		err := j.queryRowOn(ctx, p, `SELECT (SELECT next_seq - 1 FROM `+j.sql.meta+`), (SELECT min(seq) FROM `+j.entriesIn("greatest($1::bigint, (SELECT floor - 1 FROM "+j.sql.retention+"))", "$2::bigint", "xid", "xid8")+` e
		WHERE CASE WHEN xid8 IS NOT NULL THEN xid8 = ANY($3) OR xid8 >= $4
			ELSE xid = ANY($5) OR ((xid - $6) % 4294967296 + 4294967296) % 4294967296 < 2147483648 END),
		(SELECT greatest(r.floor - 1, m.resync_seq) FROM `+j.sql.meta+` m, `+j.sql.retention+` r)`,
			[]any{from, to, full, top, low, int64(uint32(xmax))}, &horizon, &f.min, &f.readFrom)
		return f, horizon, 0, err
	})
	if err != nil {
		return 0, false, 0, opErr("journal.FirstSeqInvisible", fmt.Errorf("seqs %d to %d: %w", from+1, to, err), "")
	}
	if f.min == nil {
		return 0, false, f.readFrom, nil
	}
	return *f.min, true, f.readFrom, nil
}

// FirstSeqAfterLSN returns the lowest seq in (from, to] of an entry whose
// commit LSN (the end of its transaction's commit record) is past lsn,
// and whether there is one; and, as FirstSeqInvisible, the lowest
// position a read may start from. It reads the commit LSNs through the
// primary key and never an envelope. A sync node whose snapshot source is
// a hot standby uses it: a standby's snapshot sees exactly the
// transactions whose commit records it had replayed, so the first entry
// past the replay position is where its catch-up starts (fanout/sync
// xids.go). With a standby journal (Config.ReadURL) it reads there once
// that has replayed seq to.
func (j *Journal) FirstSeqAfterLSN(ctx context.Context, from, to int64, lsn decoder.LSN) (first int64, found bool, readFrom int64, err error) {
	type res struct {
		min      *int64
		readFrom int64
	}
	r, err := readAt(ctx, j, to, -1, func(ctx context.Context, p *connPool) (res, int64, int64, error) {
		var r res
		var horizon int64
		err := j.queryRowOn(ctx, p, `SELECT (SELECT next_seq - 1 FROM `+j.sql.meta+`),
			(SELECT min(seq) FROM `+j.entriesIn("greatest($1::bigint, (SELECT floor - 1 FROM "+j.sql.retention+"))", "$2::bigint", "commit_lsn")+` e
				WHERE commit_lsn > $3),
			(SELECT greatest(r.floor - 1, m.resync_seq) FROM `+j.sql.meta+` m, `+j.sql.retention+` r)`,
			[]any{from, to, int64(lsn)}, &horizon, &r.min, &r.readFrom)
		return r, horizon, 0, err
	})
	if err != nil {
		return 0, false, 0, opErr("journal.FirstSeqAfterLSN", fmt.Errorf("seqs %d to %d: %w", from+1, to, err), "")
	}
	if r.min == nil {
		return 0, false, r.readFrom, nil
	}
	return *r.min, true, r.readFrom, nil
}
