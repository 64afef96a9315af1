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
// is one. It reads the seq range through the primary key and never an
// envelope. A sync node uses it to start a state snapshot's catch-up before
// the first entry of a transaction its source snapshot could not see yet
// (docs/sync.md, "State, then changes").
func (j *Journal) FirstSeqInvisible(ctx context.Context, from, to int64, xip []uint32, xmax uint32) (int64, bool, error) {
	if to <= from {
		return 0, false, nil
	}
	ids := make([]int64, len(xip))
	for i, x := range xip {
		ids[i] = int64(x)
	}
	var first *int64
	err := j.queryRow(ctx, "SELECT min(seq) FROM "+j.sql.entries+` WHERE seq > $1 AND seq <= $2
		AND (xid = ANY($3) OR ((xid - $4) % 4294967296 + 4294967296) % 4294967296 < 2147483648)`,
		[]any{from, to, ids, int64(xmax)}, &first)
	if err != nil {
		return 0, false, opErr("journal.FirstSeqInvisible", fmt.Errorf("seqs %d to %d: %w", from+1, to, err), "")
	}
	if first == nil {
		return 0, false, nil
	}
	return *first, true, nil
}
