package journal

import (
	"context"
	"fmt"
)

// FirstSeqInvisible returns the lowest seq in (from, to] of an entry whose
// source transaction a snapshot with in-progress list xip and xmax (32-bit,
// as envelopes carry xids) does not see: an xid of xip, or one at or past
// xmax (within 2^31 of it, modulo 2^32: the wraparound limit keeps the
// transactions of a journal's recent entries within it), and whether there
// is one; and the lowest position a read may start from (the retained
// floor, or the newest resync entry: what lies before it is another
// history). It reads the seq range through the primary key and never an
// envelope. A sync node uses it to start a state snapshot's catch-up before
// the first entry of a transaction its source snapshot could not see yet
// (docs/sync.md, "State, then changes").
func (j *Journal) FirstSeqInvisible(ctx context.Context, from, to int64, xip []uint32, xmax uint32) (first int64, found bool, readFrom int64, err error) {
	ids := make([]int64, len(xip))
	for i, x := range xip {
		ids[i] = int64(x)
	}
	var min *int64
	err = j.queryRow(ctx, `SELECT (SELECT min(seq) FROM `+j.sql.entries+` WHERE seq > $1 AND seq <= $2
		AND (xid = ANY($3) OR ((xid - $4) % 4294967296 + 4294967296) % 4294967296 < 2147483648)),
		(SELECT greatest(r.floor - 1, m.resync_seq) FROM `+j.sql.meta+` m, `+j.sql.retention+` r)`,
		[]any{from, to, ids, int64(xmax)}, &min, &readFrom)
	if err != nil {
		return 0, false, 0, opErr("journal.FirstSeqInvisible", fmt.Errorf("seqs %d to %d: %w", from+1, to, err), "")
	}
	if min == nil {
		return 0, false, readFrom, nil
	}
	return *min, true, readFrom, nil
}
