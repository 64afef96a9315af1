package decoder

import "unsafe"

// changeOverhead is what a Change holds besides its body and tenant: the
// struct itself (its entity string is shared with the relation cache) and
// the slack materialize may leave in the bodies' allocation (an LSN is
// sized at 17 bytes, most print shorter).
const changeOverhead = int64(unsafe.Sizeof(Change{})) + 8

// txOverhead approximates a Transaction's own memory.
const txOverhead = int64(unsafe.Sizeof(Transaction{})) + 64

// spilledTxBytes approximates what a spilled transaction holds in memory
// besides its counts: the open file, the commit head, its aborted
// subtransactions. Iterating it adds a reader of about 256 KiB plus its
// largest change, for as long as the iteration runs.
const spilledTxBytes = 1 << 10

// MemBytes reports the memory the transaction's changes hold, in bytes: for
// an in-memory transaction its bodies, tenants and per-change overhead; for
// one whose changes live in a spill file, about a kilobyte. It is what a queue of committed transactions
// waiting for the journal bounds itself by. It walks the changes of an
// in-memory transaction, so call it once per transaction.
func (tx *Transaction) MemBytes() int64 {
	if tx.spill != nil {
		return txOverhead + spilledTxBytes + int64(len(tx.spillCounts))*int64(unsafe.Sizeof(spillCount{}))
	}
	n := txOverhead
	for i := range tx.mem {
		c := &tx.mem[i]
		n += int64(len(c.Body)) + int64(len(c.Tenant)) + changeOverhead
	}
	return n
}
