package replication

import (
	"strconv"

	"github.com/walcast/walcast/decoder"
)

// transactionQuarantined logs a transaction the decoder replaced by
// quarantine entries (decoder.Config.OnTransactionQuarantine): what
// happened, where, and what the operator can do. It runs on the stream
// loop, once per such transaction.
func (r *Replicator) transactionQuarantined(q decoder.TransactionQuarantine) {
	tables := q.Entities
	if len(tables) > 20 {
		tables = tables[:20]
	}
	attrs := []any{"xid", q.Xid, "first_lsn", q.FirstLSN.String(), "commit_lsn", q.CommitLSN.String(), "end_lsn", q.EndLSN.String(),
		"bytes", q.Bytes, "changes", q.Changes, "tables", tables, "tables_not_named", len(q.Entities) - len(tables), "more_tables", q.More}
	switch q.Reason {
	case decoder.ReasonSpillFailed:
		r.log.Error("a transaction could not be spilled to disk; it is journaled as one quarantine entry per table it touched so the stream goes on, and consumers must refetch those tables",
			append(attrs, "cause", q.Cause, "spill_dir", q.SpillDir,
				"fix", "give --spill-dir (WALCAST_SPILL_DIR) a writable directory with at least "+strconv.FormatInt(q.Bytes, 10)+
					" bytes free for transactions of this size, or lower --max-transaction-bytes below the free space so such transactions are quarantined before the disk fills")...)
	default:
		r.log.Error("a transaction passed --max-transaction-bytes; it is journaled as one quarantine entry per table it touched so the stream goes on, and consumers must refetch those tables",
			append(attrs, "limit", q.Limit,
				"fix", "refetch the listed tables from the source; to carry transactions this large, raise --max-transaction-bytes (WALCAST_MAX_TRANSACTION_BYTES) to at least "+
					strconv.FormatInt(q.Bytes, 10)+" and give --spill-dir as much free space, or split such writes into smaller transactions")...)
	}
}
