package decoder

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
	"unsafe"
)

const (
	opInsert uint8 = iota
	opUpdate
	opDelete
	opTruncate
	opMessage
	opQuarantine
	opRead
	opSnapshotBegin
	opSnapshotEnd
)

var opNames = [...]Op{opInsert: OpInsert, opUpdate: OpUpdate, opDelete: OpDelete, opTruncate: OpTruncate, opMessage: OpMessage, opQuarantine: OpQuarantine,
	opRead: OpRead, opSnapshotBegin: OpSnapshotBegin, opSnapshotEnd: OpSnapshotEnd}

// rec is one buffered change. Its tail — the envelope from `,"entity":` to
// the closing brace — lives in the transaction's arena (or its spill file);
// the head with lsn, commitLsn, xid and commitTime is only known at commit.
//
// Offsets are 32-bit. They cannot wrap: add spills a transaction whose arena
// passes maxArena (1 GiB) whatever the memory budget, so a tail always
// starts below 1 GiB, and add refuses a tail whose recorded length
// disagrees with the arena (a single change of 4 GiB or more).
type rec struct {
	lsn              LSN
	sub              uint32 // (sub)transaction xid that made the change, for subtransaction aborts
	op               uint8
	tstate           TenantState
	oldState         TenantState // Change.OldTenantState
	tenanted         bool        // Change.Tenanted
	entity           string
	tenant           string
	oldTenant        string // Change.OldTenant; shares tenant's bytes when equal
	tailOff, tailLen uint32 // in arena
	keyOff, keyLen   uint32 // of the key object, relative to the tail; keyLen 0: no key
	oldKeyOff        uint32 // of Change.OldKey, relative to the tail; oldKeyLen 0: none
	oldKeyLen        uint32
}

// recOverhead approximates a rec's own memory, for the budget.
const recOverhead = 120

// recBytes is what r counts against the memory budget: its overhead and the
// tenant bytes it holds (an old tenant equal to the new one shares them).
func recBytes(r *rec) int64 {
	n := int64(len(r.tenant)) + recOverhead
	if r.oldTenant != r.tenant {
		n += int64(len(r.oldTenant))
	}
	return n
}

// maxArena bounds one transaction's arena, whatever the memory budget: past
// it the transaction is spilled, so that rec's 32-bit offsets never wrap.
// A variable so that tests can prove the bound without 2 GiB of memory.
var maxArena = 1 << 30

// spillArenaKeep is the arena capacity a spilled transaction keeps between
// changes (each change passes through the arena on its way to the file);
// a larger one, left by a big change, is released.
const spillArenaKeep = 256 << 10

// poolKeep bounds the buffer capacity the decoder keeps in its pool of
// finished transactions' states, in bytes; see recycle.
const poolKeep = 8 << 20

// txState is a transaction being assembled.
type txState struct {
	xid      uint32
	streamed bool
	arena    []byte
	recs     []rec
	mem      int64 // bytes counted against the budget: len(arena) + recMem
	recMem   int64 // recOverhead and tenant bytes of recs
	dead     int64 // arena bytes of aborted subtransactions' changes, until compact
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
	// controls are the contents of Config.ControlPrefix messages, in order.
	controls [][]byte

	// The bound (Config.MaxTransactionBytes). size is what its changes
	// take as spill records, from its first change on; while it is not cut
	// it is counted in Decoder.held. Once cutReason is set its changes are
	// no longer kept (only counted), and it commits as quarantine entries.
	size      int64
	cutReason string
	cutCause  error // the spill error, for ReasonSpillFailed
	firstLSN  LSN
	// touched lists the entities of its changes in first-change order, up
	// to maxTouched (touchedOver: there were more), for the entries of a
	// cut transaction; touchedIdx indexes it once it outgrows touchScan.
	touched     []touchedEntity
	touchedIdx  map[string]struct{}
	touchedOver bool
	lastEntity  string // the entity of the previous change, already in touched
}

// touchedEntity is an entity a transaction changed and its first change's LSN.
type touchedEntity struct {
	entity string
	first  LSN
}

const (
	// maxTouched bounds the entities a transaction's touched list names.
	// Tables are bounded by the catalog, but logical message prefixes are
	// not: one transaction can emit a message under each of a million.
	maxTouched = 1024
	// touchScan is how many entities touch finds by scanning the list
	// before it keeps a map: most transactions touch one to three.
	touchScan = 8
	// maxListedTables bounds the entity names each quarantine entry of a
	// cut transaction lists, so that an entry stays small.
	maxListedTables = 64
)

// touch records that tx changed entity at lsn. Consecutive changes of one
// entity, the common case, cost one string comparison.
func (tx *txState) touch(entity string, lsn LSN) {
	if len(tx.touched) > 0 && entity == tx.lastEntity {
		return
	}
	tx.lastEntity = entity
	if tx.touchedIdx != nil {
		if _, ok := tx.touchedIdx[entity]; ok {
			return
		}
	} else {
		for i := range tx.touched {
			if tx.touched[i].entity == entity {
				return
			}
		}
	}
	if len(tx.touched) >= maxTouched {
		tx.touchedOver = true
		return
	}
	tx.touched = append(tx.touched, touchedEntity{entity: entity, first: lsn})
	switch {
	case tx.touchedIdx != nil:
		tx.touchedIdx[entity] = struct{}{}
	case len(tx.touched) > touchScan:
		tx.touchedIdx = make(map[string]struct{}, 2*touchScan)
		for _, e := range tx.touched {
			tx.touchedIdx[e.entity] = struct{}{}
		}
	}
}

// spillRecordBytes is what r takes in a spill file, and what the bound
// counts for it whether it is spilled or held in memory.
func spillRecordBytes(r *rec) int64 {
	n := int64(spillHeader+len(r.entity)+len(r.tenant)) + int64(r.tailLen)
	if r.oldTenant != r.tenant {
		n += int64(len(r.oldTenant))
	}
	return n
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

// recycle returns tx's buffers to the pool, keeping modest ones only: none
// over 4 MiB (arena) or 64 Ki recs, and at most poolKeep bytes of capacity
// across the pool, so a burst of concurrent transactions leaves no large
// buffers behind outside the budget.
func (d *Decoder) recycle(tx *txState) {
	d.mem -= tx.mem
	if tx.cutReason == "" {
		d.held -= tx.size
	}
	arena, recs, touched := tx.arena[:0], tx.recs[:0], tx.touched[:0]
	if cap(arena) > 4<<20 {
		arena = nil
	}
	if cap(recs) > 64<<10 {
		recs = nil
	} else {
		clear(recs[:cap(recs)])
	}
	if cap(touched) > touchScan {
		touched = nil
	} else {
		clear(touched[:cap(touched)])
	}
	*tx = txState{arena: arena, recs: recs, touched: touched}
	if len(d.free) >= 8 {
		return
	}
	pooled := tx.bufBytes()
	for _, f := range d.free {
		pooled += f.bufBytes()
	}
	if pooled > poolKeep {
		tx.arena, tx.recs = nil, nil
	}
	d.free = append(d.free, tx)
}

// bufBytes is the capacity of tx's buffers, in bytes.
func (tx *txState) bufBytes() int {
	return cap(tx.arena) + cap(tx.recs)*int(unsafe.Sizeof(rec{}))
}

// tail returns r's tail in arena. Offsets are added as int: their uint32
// sum can wrap for a tail that ends past 4 GiB (see add).
func (r *rec) tail(arena []byte) []byte {
	off := int(r.tailOff)
	return arena[off : off+int(r.tailLen)]
}

// account sets tx.mem to what tx holds in memory and d.mem to match.
func (d *Decoder) account(tx *txState) {
	m := int64(len(tx.arena)) + tx.recMem
	d.mem += m - tx.mem
	tx.mem = m
}

// ErrChangeTooLarge is returned by Decode for a change whose envelope
// encodes to 4 GiB or more, which no spill record (and no journal entry)
// can hold; the guard is meant to replace such a change before it gets here.
var ErrChangeTooLarge = errors.New("decoder: change too large to buffer (4 GiB or more encoded)")

// add appends a change whose tail the caller has just appended to tx.arena:
// the tail is tx.arena[r.tailOff:], r.tailLen bytes long.
//
// It keeps the arena's offsets safe: r.tailOff is below maxArena because a
// transaction whose arena passes maxArena is spilled before the next change,
// and a tail whose 32-bit length disagrees with the arena is refused.
func (d *Decoder) add(tx *txState, r rec) error {
	r = d.guard(tx, r)
	if int64(r.tailOff)+int64(r.tailLen) != int64(len(tx.arena)) {
		n := int64(len(tx.arena)) - int64(r.tailOff)
		tx.arena = tx.arena[:r.tailOff]
		return fmt.Errorf("%w: %s at LSN %s encodes to %d bytes", ErrChangeTooLarge, r.entity, r.lsn, n)
	}
	d.stats.Changes++
	tx.n++
	if tx.firstLSN == 0 {
		tx.firstLSN = r.lsn
	}
	tx.touch(r.entity, r.lsn)
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
	// The bound is checked before the change is kept, so that neither
	// memory nor the spill directory ever holds more than it.
	sz := spillRecordBytes(&r)
	tx.size += sz
	if tx.cutReason == "" {
		d.held += sz
		for d.held > d.cfg.MaxTransactionBytes {
			big := d.largestHeld(tx)
			if big == nil {
				break
			}
			d.cut(big, ReasonTransactionTooLarge, nil)
		}
	}
	if tx.cutReason != "" {
		tx.arena = tx.arena[:0] // cut holds nothing: the change is only counted
		if cap(tx.arena) > spillArenaKeep {
			tx.arena = nil
		}
		return nil
	}
	if tx.sp != nil {
		tx.countSpilled(&r)
		err := tx.sp.write(&r, r.tail(tx.arena))
		tx.arena = tx.arena[:r.tailOff]
		if cap(tx.arena) > spillArenaKeep {
			tx.arena = nil // a big change passed through; do not keep its buffer
		}
		if err != nil {
			d.cut(tx, ReasonSpillFailed, err)
		}
		return nil
	}
	tx.recs = append(tx.recs, r)
	tx.recMem += recBytes(&r)
	d.account(tx)
	if d.mem > d.stats.BufferedHigh {
		d.stats.BufferedHigh = d.mem
	}
	if len(tx.arena) > maxArena {
		if err := d.spill(tx); err != nil {
			d.cut(tx, ReasonSpillFailed, err)
		}
	}
	for d.mem > d.cfg.MemoryBudget {
		big := d.largestInMemory()
		if big == nil {
			break
		}
		if err := d.spill(big); err != nil {
			d.cut(big, ReasonSpillFailed, err)
		}
	}
	return nil
}

// largestInMemory is the in-memory transaction with the most bytes, nil
// when none holds any.
func (d *Decoder) largestInMemory() *txState {
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
		return nil
	}
	return big
}

// largestHeld is the transaction, not yet cut, whose changes take the most
// bytes; tx, the one being added to, is considered even when it is a
// non-transactional message's (in neither d.cur nor d.streams).
func (d *Decoder) largestHeld(tx *txState) *txState {
	var big *txState
	consider := func(tx *txState) {
		if tx != nil && tx.cutReason == "" && tx.size > 0 && (big == nil || tx.size > big.size) {
			big = tx
		}
	}
	consider(tx)
	consider(d.cur)
	for _, s := range d.streams {
		consider(s)
	}
	return big
}

// cut stops keeping tx's changes: it deletes its spill file and releases
// its memory at once, and from now on its changes are only counted (size,
// n, touched). At its commit it becomes quarantine entries (cutEntries);
// on abort it leaves nothing. Keeping it would fill the disk or memory —
// the pod evicted, the disk full — and the same transaction would be
// decoded again after every restart and fail again, halting replication.
func (d *Decoder) cut(tx *txState, reason string, cause error) {
	if tx.sp != nil {
		if err := tx.sp.discard(); err != nil && cause == nil {
			cause = err
		}
		tx.sp = nil
	}
	d.mem -= tx.mem
	d.held -= tx.size
	tx.mem, tx.recMem, tx.dead = 0, 0, 0
	clear(tx.recs)
	tx.recs = tx.recs[:0]
	if cap(tx.recs) > 64<<10 {
		tx.recs = nil
	}
	tx.arena = tx.arena[:0]
	if cap(tx.arena) > spillArenaKeep {
		tx.arena = nil
	}
	tx.spillN, tx.spillOver, tx.aborted = nil, false, nil
	tx.cutReason, tx.cutCause = reason, cause
}

// spill moves in-memory tx to a spill file and releases its buffers: from
// now on each change only passes through the arena on its way to the file.
func (d *Decoder) spill(tx *txState) error {
	sp, err := newSpillWriter(d.cfg.SpillDir)
	if err != nil {
		return err
	}
	for i := range tx.recs {
		r := &tx.recs[i]
		if err := sp.write(r, r.tail(tx.arena)); err != nil {
			_ = sp.discard()
			tx.spillN, tx.spillOver = nil, false
			return err
		}
		tx.countSpilled(r)
	}
	tx.sp = sp
	d.mem -= tx.mem
	tx.mem, tx.recMem, tx.dead = 0, 0, 0
	tx.recs = nil
	if cap(tx.arena) > spillArenaKeep {
		tx.arena = nil
	} else {
		tx.arena = tx.arena[:0]
	}
	d.stats.Spilled++
	return nil
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

// abortSub discards the changes of subtransaction sub of streamed tx. In
// memory, their recs go at once and their tails become dead arena bytes,
// still counted against the budget, until compact reclaims them: as soon as
// they are half the arena, so that the copying costs at most as much as the
// bytes aborted (a savepoint rolled back per row stays linear).
func (d *Decoder) abortSub(tx *txState, sub uint32) {
	tx.flushSub()
	n := tx.subN[sub]
	delete(tx.subN, sub)
	if n == 0 {
		return
	}
	tx.n -= n
	if tx.cutReason != "" {
		return // nothing of it is kept; only the count changes
	}
	if tx.sp != nil {
		if tx.aborted == nil {
			tx.aborted = make(map[uint32]struct{})
		}
		tx.aborted[sub] = struct{}{}
		return
	}
	keep := tx.recs[:0]
	for _, r := range tx.recs {
		if r.sub == sub {
			tx.recMem -= recBytes(&r)
			tx.dead += int64(r.tailLen)
			continue
		}
		keep = append(keep, r)
	}
	clear(tx.recs[len(keep):])
	tx.recs = keep
	if tx.dead*2 >= int64(len(tx.arena)) {
		tx.compact()
	}
	d.account(tx)
}

// compact moves the live tails of tx's arena together, dropping the dead
// bytes of aborted subtransactions, and releases buffers that are now
// mostly empty.
func (tx *txState) compact() {
	w := 0
	for i := range tx.recs {
		r := &tx.recs[i]
		w += copy(tx.arena[w:], r.tail(tx.arena))
		r.tailOff = uint32(w) - r.tailLen
	}
	tx.arena = tx.arena[:w]
	tx.dead = 0
	if c := cap(tx.arena); c > spillArenaKeep && c > 4*w {
		tx.arena = append([]byte(nil), tx.arena...)
	}
	if c := cap(tx.recs); c > 4096 && c > 4*len(tx.recs) {
		tx.recs = append([]rec(nil), tx.recs...)
	}
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
	out := &Transaction{Xid: tx.xid, CommitLSN: commitLSN, EndLSN: endLSN, CommitTime: ts, n: tx.n, controls: tx.controls}
	head := appendHead(nil, tx.xid, endLSN, ts)
	if tx.sp != nil && tx.cutReason == "" {
		if err := tx.sp.flush(); err != nil {
			d.cut(tx, ReasonSpillFailed, err)
		}
	}
	switch {
	case tx.cutReason != "":
		out.mem = d.cutEntries(tx, commitLSN, endLSN, head)
		out.n = len(out.mem)
		d.recycle(tx)
	case tx.sp != nil:
		if !tx.spillOver {
			out.spillCounts, out.spillCounted = tx.spillCounts(), true
		}
		out.spill = tx.sp.source(head, tx.aborted)
		tx.sp = nil
		d.recycle(tx)
	default:
		out.mem = materialize(tx, head)
		out.n = len(out.mem)
		d.recycle(tx)
	}
	d.stats.Committed++
	d.committed = append(d.committed, out)
	return nil
}

// cutEntries builds the quarantine entries of cut transaction tx, one per
// entity it touched, at that entity's first change, and reports it. A
// transaction every change of which was rolled back (subtransactions) has
// none: nothing of it is journaled.
func (d *Decoder) cutEntries(tx *txState, commitLSN, endLSN LSN, head []byte) []Change {
	if tx.n == 0 {
		return nil
	}
	q := TransactionQuarantine{Xid: tx.xid, FirstLSN: tx.firstLSN, CommitLSN: commitLSN, EndLSN: endLSN,
		Reason: tx.cutReason, Cause: tx.cutCause, Bytes: tx.size, Limit: d.cfg.MaxTransactionBytes, Changes: tx.n,
		Entities: make([]string, len(tx.touched)), More: tx.touchedOver, SpillDir: d.cfg.SpillDir}
	for i, e := range tx.touched {
		q.Entities[i] = e.entity
	}
	var detail string
	if q.Reason == ReasonSpillFailed {
		detail = "writing the transaction's spill file failed (" + errString(q.Cause) + "), so its " + strconv.Itoa(q.Changes) + " changes (" +
			strconv.FormatInt(q.Bytes, 10) + " bytes) were not kept: refetch the tables listed from the source"
	} else {
		detail = "the transaction's " + strconv.Itoa(q.Changes) + " changes took " + strconv.FormatInt(q.Bytes, 10) +
			" bytes, more than the limit of " + strconv.FormatInt(q.Limit, 10) + " for in-progress transactions, so they were not kept: refetch the tables listed from the source"
	}
	if q.More {
		detail += "; it touched more than " + strconv.Itoa(maxTouched) + " tables and message prefixes, which are not all named: refetch every published table"
	}
	// The quarantine object is the same in every entry.
	obj := []byte(`,"op":"quarantine","quarantine":{"op":`)
	obj = appendString(obj, []byte(QuarantinedTransaction))
	obj = append(obj, `,"reason":`...)
	obj = appendString(obj, []byte(q.Reason))
	obj = append(obj, `,"detail":`...)
	obj = appendString(obj, []byte(detail))
	obj = append(obj, `,"size":`...)
	obj = strconv.AppendInt(obj, q.Bytes, 10)
	obj = append(obj, `,"changes":`...)
	obj = strconv.AppendInt(obj, int64(q.Changes), 10)
	obj = append(obj, `,"firstLsn":"`...)
	obj = appendLSN(obj, q.FirstLSN)
	obj = append(obj, `","tables":[`...)
	listed := min(len(q.Entities), maxListedTables)
	for i, e := range q.Entities[:listed] {
		if i > 0 {
			obj = append(obj, ',')
		}
		obj = appendString(obj, []byte(e))
	}
	obj = append(obj, ']')
	if n := len(q.Entities) - listed; n > 0 {
		obj = append(obj, `,"tablesOmitted":`...)
		obj = strconv.AppendInt(obj, int64(n), 10)
	}
	obj = append(obj, "}}"...)

	out := make([]Change, len(tx.touched))
	var tail []byte
	for i, e := range tx.touched {
		tail = appendString(append(tail[:0], entityField...), []byte(e.entity))
		tail = append(tail, obj...)
		body, _ := appendBody(nil, e.first, head, tail)
		out[i] = Change{LSN: e.first, Entity: e.entity, Op: OpQuarantine, Body: body}
	}
	d.stats.Quarantined += uint64(len(out))
	if d.cfg.OnQuarantine != nil {
		for range out {
			d.cfg.OnQuarantine(q.Reason)
		}
	}
	if d.cfg.OnTransactionQuarantine != nil {
		d.cfg.OnTransactionQuarantine(q)
	}
	return out
}

func errString(err error) string {
	if err == nil {
		return "no error reported"
	}
	return err.Error()
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
		bodies, off = appendBody(bodies, r.lsn, head, r.tail(tx.arena))
		c := &out[i]
		c.LSN, c.Entity, c.Op, c.Tenant, c.TenantState = r.lsn, r.entity, opNames[r.op], r.tenant, r.tstate
		c.Tenanted, c.OldTenant, c.OldTenantState = r.tenanted, r.oldTenant, r.oldState
		c.Body = bodies[start:len(bodies):len(bodies)]
		if r.keyLen > 0 {
			k := off + int(r.keyOff)
			c.Key = bodies[k : k+int(r.keyLen) : k+int(r.keyLen)]
		}
		if r.oldKeyLen > 0 {
			k := off + int(r.oldKeyOff)
			c.OldKey = bodies[k : k+int(r.oldKeyLen) : k+int(r.oldKeyLen)]
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

// DefaultMaxTransactionBytes is Config.MaxTransactionBytes' default: 8 GiB.
// A transaction of that size spills about as much to disk (and the journal
// must hold it too); the bound keeps the spill directory's use below it, so
// a volume of 10 GiB (the Kubernetes manifest's) always has room, with
// headroom for the change being written and the file's buffers.
const DefaultMaxTransactionBytes = 8 << 30

// Reasons of a whole transaction replaced by quarantine entries (see
// TransactionQuarantine).
const (
	// ReasonTransactionTooLarge: open transactions held more than
	// Config.MaxTransactionBytes and this was the largest.
	ReasonTransactionTooLarge = "transaction-too-large"
	// ReasonSpillFailed: writing its spill file failed (a full disk, a
	// missing or unwritable spill directory).
	ReasonSpillFailed = "spill-failed"
)

// QuarantinedTransaction is the "op" inside the quarantine object of an
// entry standing in for a whole transaction's changes of one entity.
const QuarantinedTransaction Op = "transaction"

// TransactionQuarantine describes a committed transaction whose changes were
// not kept — it outgrew Config.MaxTransactionBytes, or its spill file could
// not be written — and which is journaled instead as one quarantine entry
// per entity it touched, so that consumers of each entity learn that they
// must refetch it from the source.
type TransactionQuarantine struct {
	Xid       uint32
	FirstLSN  LSN // its first change
	CommitLSN LSN
	EndLSN    LSN
	Reason    string // ReasonTransactionTooLarge or ReasonSpillFailed
	// Cause is the spill file's error for ReasonSpillFailed; nil otherwise.
	Cause error
	// Bytes is what its changes took buffered (the size of their spill
	// records: encoded envelopes plus a small overhead each), counted to
	// its commit, rolled-back subtransactions included.
	Bytes int64
	Limit int64 // Config.MaxTransactionBytes
	// Changes is how many changes it committed (those of rolled-back
	// subtransactions left out).
	Changes int
	// Entities are the entities it touched, in the order of their first
	// change: one quarantine entry each. More says it touched more than
	// these 1024, which are not named and get no entry (the entries' detail
	// then says to refetch every published table).
	Entities []string
	More     bool
	SpillDir string // Config.SpillDir
}
