package journal

import (
	"context"
	"fmt"
)

// FirstSeqOfXids returns the lowest seq in (from, to] of an entry journaled
// for one of the source transactions xids (32-bit, as envelopes carry
// them), and whether there is one. It reads the seq range through the
// primary key and never an envelope. A sync node uses it to start a state
// snapshot's catch-up before the first entry of a transaction its source
// snapshot could not see yet (docs/sync.md, "State, then changes").
func (j *Journal) FirstSeqOfXids(ctx context.Context, from, to int64, xids []uint32) (int64, bool, error) {
	if len(xids) == 0 || to <= from {
		return 0, false, nil
	}
	ids := make([]int64, len(xids))
	for i, x := range xids {
		ids[i] = int64(x)
	}
	var first *int64
	err := j.queryRow(ctx, "SELECT min(seq) FROM "+j.sql.entries+" WHERE seq > $1 AND seq <= $2 AND xid = ANY($3)",
		[]any{from, to, ids}, &first)
	if err != nil {
		return 0, false, opErr("journal.FirstSeqOfXids", fmt.Errorf("seqs %d to %d: %w", from+1, to, err), "")
	}
	if first == nil {
		return 0, false, nil
	}
	return *first, true, nil
}
