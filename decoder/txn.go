package decoder

import (
	"encoding/base64"
	"errors"
	"strconv"
	"time"
	"unicode/utf8"
)

const (
	opInsert uint8 = iota
	opUpdate
	opDelete
	opTruncate
	opMessage
	opQuarantine // never an index into EntityCounters: count with Add(OpQuarantine)
)

var opNames = [...]Op{opInsert: OpInsert, opUpdate: OpUpdate, opDelete: OpDelete, opTruncate: OpTruncate, opMessage: OpMessage, opQuarantine: OpQuarantine}

// rec is one buffered change. Its tail — the envelope from `,"entity":` to
// the closing brace — lives in the transaction's arena (or its spill file);
// the head with lsn, commitLsn, xid and commitTime is only known at commit.
type rec struct {
	lsn              LSN
	sub              uint32 // (sub)transaction xid that made the change, for subtransaction aborts
	op               uint8
	tstate           TenantState
	entity           string
	tenant           string
	tailOff, tailLen uint32 // in arena
	keyOff, keyLen   uint32 // of the key object, relative to the tail; keyLen 0: no key
}

// recOverhead approximates a rec's own memory, for the budget.
const recOverhead = 96

// txState is a transaction being assembled.
type txState struct {
	xid      uint32
	streamed bool
	arena    []byte
	recs     []rec
	mem      int64 // bytes counted against the budget
	n        int   // changes that will be delivered
	subN     map[uint32]int
	lastSub  uint32 // subN caches the count for lastSub in lastN
	lastN    int
	sp       *spillWriter        // non-nil once spilled: every change goes to the file
	aborted  map[uint32]struct{} // subtransactions aborted after the spill
	// spillN counts the changes in the spill file by subtransaction, entity
	// and op, so that CountChanges never reads the file; nil with spillOver
	// set once it outgrows maxSpillKeys.
	spillN    map[spillKey]int
	spillOver bool
}

// spillKey groups a spilled transaction's changes for CountChanges.
type spillKey struct {
	sub    uint32
	entity string
	op     uint8
}

// maxSpillKeys bounds spillN: a streamed transaction with more distinct
// (subtransaction, entity, op) groups (a savepoint per row, say) is counted
// in totals only, rather than holding a count per row in memory.
const maxSpillKeys = 4096

// countSpilled counts a change written to tx's spill file.
func (tx *txState) countSpilled(r *rec) {
	if tx.spillOver {
		return
	}
	k := spillKey{sub: r.sub, entity: r.entity, op: r.op}
	if tx.spillN == nil {
		tx.spillN = make(map[spillKey]int)
	}
	if _, ok := tx.spillN[k]; !ok && len(tx.spillN) >= maxSpillKeys {
		tx.spillN, tx.spillOver = nil, true
		return
	}
	tx.spillN[k]++
}

// spillCounts sums spillN by entity and op, leaving out aborted
// subtransactions, as the spill reader does.
func (tx *txState) spillCounts() []spillCount {
	sums := map[spillKey]int{}
	for k, n := range tx.spillN {
		if _, gone := tx.aborted[k.sub]; gone {
			continue
		}
		sums[spillKey{entity: k.entity, op: k.op}] += n
	}
	out := make([]spillCount, 0, len(sums))
	for k, n := range sums {
		out = append(out, spillCount{entity: k.entity, op: k.op, n: n})
	}
	return out
}

func (d *Decoder) newTx(xid uint32, streamed bool) *txState {
	var tx *txState
	if n := len(d.free); n > 0 {
		tx = d.free[n-1]
		d.free = d.free[:n-1]
	} else {
		tx = &txState{}
	}
	tx.xid, tx.streamed = xid, streamed
	return tx
}

// recycle returns tx's buffers to the pool, keeping modest ones only.
func (d *Decoder) recycle(tx *txState) {
	d.mem -= tx.mem
	arena, recs := tx.arena[:0], tx.recs[:0]
	if cap(arena) > 4<<20 {
		arena = nil
	}
	if cap(recs) > 64<<10 {
		recs = nil
	} else {
		clear(recs[:cap(recs)])
	}
	*tx = txState{arena: arena, recs: recs}
	if len(d.free) < 8 {
		d.free = append(d.free, tx)
	}
}

// add appends a change whose tail the caller has just appended to tx.arena.
func (d *Decoder) add(tx *txState, r rec) error {
	r = d.guard(tx, r)
	d.stats.Changes++
	tx.n++
	if tx.streamed {
		if r.sub != tx.lastSub {
			if tx.lastN > 0 {
				if tx.subN == nil {
					tx.subN = make(map[uint32]int)
				}
				tx.subN[tx.lastSub] += tx.lastN
			}
			tx.lastSub, tx.lastN = r.sub, 0
		}
		tx.lastN++
	}
	if tx.sp != nil {
		tx.countSpilled(&r)
		err := tx.sp.write(&r, tx.arena[r.tailOff:r.tailOff+r.tailLen])
		tx.arena = tx.arena[:r.tailOff]
		return err
	}
	tx.recs = append(tx.recs, r)
	sz := int64(r.tailLen) + int64(len(r.tenant)) + recOverhead
	tx.mem += sz
	d.mem += sz
	if d.mem > d.stats.BufferedHigh {
		d.stats.BufferedHigh = d.mem
	}
	for d.mem > d.cfg.MemoryBudget {
		moved, err := d.spillLargest()
		if err != nil || !moved {
			return err
		}
	}
	return nil
}

// spillLargest moves the in-memory transaction with the most bytes to a
// spill file. It reports false when there is nothing to move.
func (d *Decoder) spillLargest() (bool, error) {
	var big *txState
	consider := func(tx *txState) {
		if tx != nil && tx.sp == nil && (big == nil || tx.mem > big.mem) {
			big = tx
		}
	}
	consider(d.cur)
	for _, tx := range d.streams {
		consider(tx)
	}
	if big == nil || big.mem == 0 {
		return false, nil
	}
	sp, err := newSpillWriter(d.cfg.SpillDir)
	if err != nil {
		return false, err
	}
	for i := range big.recs {
		r := &big.recs[i]
		if err := sp.write(r, big.arena[r.tailOff:r.tailOff+r.tailLen]); err != nil {
			_ = sp.discard()
			big.spillN, big.spillOver = nil, false
			return false, err
		}
		big.countSpilled(r)
	}
	big.sp = sp
	d.mem -= big.mem
	big.mem = 0
	clear(big.recs)
	big.recs = big.recs[:0]
	big.arena = big.arena[:0]
	d.stats.Spilled++
	return true, nil
}

func (tx *txState) flushSub() {
	if tx.lastN > 0 {
		if tx.subN == nil {
			tx.subN = make(map[uint32]int)
		}
		tx.subN[tx.lastSub] += tx.lastN
		tx.lastN = 0
	}
}

// abortSub discards the changes of subtransaction sub of streamed tx.
func (d *Decoder) abortSub(tx *txState, sub uint32) {
	tx.flushSub()
	n := tx.subN[sub]
	delete(tx.subN, sub)
	if n == 0 {
		return
	}
	tx.n -= n
	if tx.sp != nil {
		if tx.aborted == nil {
			tx.aborted = make(map[uint32]struct{})
		}
		tx.aborted[sub] = struct{}{}
		return
	}
	keep := tx.recs[:0]
	var freed int64
	for _, r := range tx.recs {
		if r.sub == sub {
			freed += int64(r.tailLen) + int64(len(r.tenant)) + recOverhead
			continue
		}
		keep = append(keep, r)
	}
	clear(tx.recs[len(keep):])
	tx.recs = keep
	tx.mem -= freed
	d.mem -= freed
}

// drop discards a partial transaction and its spill file.
func (d *Decoder) drop(tx *txState) error {
	var err error
	if tx.sp != nil {
		err = tx.sp.discard()
	}
	d.recycle(tx)
	return err
}

// finish turns tx into a committed Transaction and queues it.
func (d *Decoder) finish(tx *txState, commitLSN, endLSN LSN, ts time.Time) error {
	out := &Transaction{Xid: tx.xid, CommitLSN: commitLSN, EndLSN: endLSN, CommitTime: ts, n: tx.n}
	head := appendHead(nil, tx.xid, endLSN, ts)
	if tx.sp != nil {
		if !tx.spillOver {
			out.spillCounts, out.spillCounted = tx.spillCounts(), true
		}
		src, err := tx.sp.finish(head, tx.aborted)
		tx.sp = nil
		d.recycle(tx)
		if err != nil {
			return err
		}
		out.spill = src
	} else {
		out.mem = materialize(tx, head)
		out.n = len(out.mem)
		d.recycle(tx)
	}
	d.stats.Committed++
	d.committed = append(d.committed, out)
	return nil
}

// appendHead appends the part of every body after the change's own LSN:
// `","commitLsn":"…","xid":…,"commitTime":"…"`.
func appendHead(b []byte, xid uint32, end LSN, ts time.Time) []byte {
	b = append(b, `","commitLsn":"`...)
	b = appendLSN(b, end)
	b = append(b, `","xid":`...)
	b = strconv.AppendUint(b, uint64(xid), 10)
	b = append(b, `,"commitTime":"`...)
	b = ts.UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z")
	return append(b, '"')
}

const lsnOpen = `{"lsn":"`

// appendBody appends a complete body and returns it with the offset of the
// tail in it.
func appendBody(b []byte, lsn LSN, head, tail []byte) ([]byte, int) {
	b = append(b, lsnOpen...)
	b = appendLSN(b, lsn)
	b = append(b, head...)
	off := len(b)
	return append(b, tail...), off
}

// materialize builds the changes of an in-memory transaction, with every
// body in one allocation.
func materialize(tx *txState, head []byte) []Change {
	if len(tx.recs) == 0 {
		return nil
	}
	size := 0
	for i := range tx.recs {
		size += len(lsnOpen) + 17 + len(head) + int(tx.recs[i].tailLen)
	}
	bodies := make([]byte, 0, size)
	out := make([]Change, len(tx.recs))
	for i := range tx.recs {
		r := &tx.recs[i]
		start := len(bodies)
		var off int
		bodies, off = appendBody(bodies, r.lsn, head, tx.arena[r.tailOff:r.tailOff+r.tailLen])
		c := &out[i]
		c.LSN, c.Entity, c.Op, c.Tenant, c.TenantState = r.lsn, r.entity, opNames[r.op], r.tenant, r.tstate
		c.Body = bodies[start:len(bodies):len(bodies)]
		if r.keyLen > 0 {
			k := off + int(r.keyOff)
			c.Key = bodies[k : k+int(r.keyLen) : k+int(r.keyLen)]
		}
	}
	return out
}

// appendLSN appends l as upper-case "X/X", as LSN.MarshalText does.
func appendLSN(b []byte, l LSN) []byte {
	const hexu = "0123456789ABCDEF"
	appendHex := func(b []byte, v uint32) []byte {
		var t [8]byte
		i := len(t)
		for {
			i--
			t[i] = hexu[v&0xf]
			v >>= 4
			if v == 0 {
				break
			}
		}
		return append(b, t[i:]...)
	}
	b = appendHex(b, uint32(l>>32))
	b = append(b, '/')
	return appendHex(b, uint32(l))
}

func base64StdAppend(dst, src []byte) []byte { return base64.StdEncoding.AppendEncode(dst, src) }

// jsonValid reports whether b may be embedded as JSON: one valid JSON value
// in valid UTF-8 (the journal's text column and every JSON reader refuse
// anything else; a message content in LATIN1 can parse as JSON).
func jsonValid(b []byte) bool { return len(b) > 0 && utf8.Valid(b) && validJSON(b) }

// errClosed is returned by iterating a transaction after Close.
var errClosed = errors.New("decoder: transaction used after Close")
