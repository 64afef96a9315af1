package decoder

import (
	"bytes"
	"os"
	"time"
)

// Config configures a Decoder. The zero value is usable; New fills defaults.
type Config struct {
	// SkipRelations holds the relation OIDs of walcast's own journal tables
	// when the journal lives in the source database; their changes are
	// dropped (DESIGN §4.10). Relations are matched by OID, never by schema
	// name: a table of the same name in another database is data.
	SkipRelations map[uint32]bool
	// MessagePrefix selects logical decoding messages: only those whose
	// prefix starts with it become envelopes (DESIGN §4.11). Default
	// "walcast.".
	MessagePrefix string
	// ControlPrefix names the logical decoding messages that are walcast's
	// own control signals (snapshot watermarks): a message whose prefix
	// equals it exactly is never an envelope, whatever MessagePrefix says.
	// The content of a transactional one that looks like a watermark
	// (see acceptControl: at most MaxControlBytes, starting with
	// ControlContentStart, at most MaxControlsPerTransaction in its
	// transaction) is carried on the committed Transaction (Controls) at
	// its place in commit order; any other is dropped without keeping its
	// bytes and counted (Stats.ControlsDropped, OnControlDropped). Any role
	// may emit messages of any prefix, so nothing it sends under this one
	// may cost more than these bounds. Empty: none.
	ControlPrefix string
	// OnControlDropped, when set, is called with the reason (a
	// ControlDrop constant) of every ControlPrefix message dropped, for
	// metrics; it must not block.
	OnControlDropped func(reason string)
	// TenantColumn, when set, names the column hoisted into "tenant".
	TenantColumn string
	// Unscoped, when set with TenantColumn, is asked at every Relation
	// message of a relation whose columns do not include TenantColumn:
	// whether the table has that column nonetheless (a publication column
	// list that leaves it out). Then no change of the relation can be
	// scoped to a tenant, and each of its row changes is journaled as a
	// quarantine entry (ReasonTenantUnscoped) that carries neither a
	// tenant nor a key: it reaches no tenant-scoped reader and no unscoped
	// one. It runs on the caller's goroutine; an error ends Decode with it
	// (the caller reconnects and the message comes again).
	Unscoped func(relID uint32, schema, table string) (bool, error)
	// MemoryBudget bounds, in bytes, the encoded changes of all in-progress
	// transactions held in memory; past it the largest is moved to a spill
	// file, and every later change of it goes straight to the file. Default
	// 64 MiB. It counts encoded envelope bytes plus a per-change overhead;
	// buffer capacity can make the heap in use up to about twice that.
	// Committed transactions are not counted: they belong to the caller.
	MemoryBudget int64
	// MaxEnvelopeBytes bounds one change's envelope; a larger one is
	// journaled as a quarantine entry (see Quarantine). Default
	// DefaultMaxEnvelopeBytes.
	MaxEnvelopeBytes int
	// SpillDir is where spill files are created. Default os.TempDir().
	SpillDir string
	// MaxTransactionBytes bounds, in bytes, what open transactions hold
	// buffered, in memory and spill files together; past it the largest
	// is no longer buffered and is journaled at its commit as quarantine
	// entries (see TransactionQuarantine). Default
	// DefaultMaxTransactionBytes.
	MaxTransactionBytes int64
	// OnTransactionQuarantine, when set, is called at the commit of every
	// transaction replaced by quarantine entries (for logs; it must not
	// block).
	OnTransactionQuarantine func(TransactionQuarantine)
	// Counters counts decoded changes by entity and op (DESIGN §8), for
	// metrics read from another goroutine. Default: a fresh Counters, see
	// Decoder.Counters. Pass one to keep totals across decoders. Every
	// change decoded is counted, including those of streamed transactions
	// that later abort; changes of journal tables and messages of
	// other prefixes, which are dropped, are not.
	Counters *Counters
	// OnQuarantine, when set, is called with the reason of every change the
	// decoder replaces by a quarantine entry (for metrics; it must not block).
	OnQuarantine func(reason string)
	// KeyColumns, when set, names the primary-key columns of a relation
	// whose replica identity is FULL (pgoutput then marks every column as
	// a key column), or nil when it has none. It is asked once per Relation
	// message of such a relation, on the caller's goroutine; its answer is
	// used only for quarantine entries, whose key and old key (see
	// Quarantine) would otherwise be the whole row — too large to carry for
	// a row too large to journal. The names are matched against the
	// relation's published columns; when any is missing, the whole row is
	// the key as without it.
	KeyColumns func(relID uint32, schema, table string) []string
	// ArrayElement, when set, describes the element type of the array type
	// oid (or of the array at the end of oid's chain of domains) that a
	// Type message names "_name" outside pg_catalog, where pgoutput does
	// not say what the elements are; ok false when oid is no such array
	// (or no longer exists). It is asked once per such Type message, on the
	// caller's goroutine; an error ends Decode with it (the caller
	// reconnects and the message comes again). Without it, or for a type
	// it does not know, the elements are strings of their text.
	ArrayElement func(oid uint32) (e ArrayElement, ok bool, err error)
	// Now stamps the commitTime of non-transactional logical messages, which
	// belong to no commit. Default time.Now.
	Now func() time.Time
}

const defaultMemoryBudget = 64 << 20

// Decoder turns pgoutput (protocol version 2, streaming and messages on)
// payloads into committed transactions. It is not safe for concurrent use:
// the replication loop owns it.
//
// The replication loop feeds it every XLogData payload and takes what
// committed, in commit order, to batch into journal appends:
//
//	dec := decoder.New(decoder.Config{MemoryBudget: 64 << 20})
//	defer dec.Close()
//	for each XLogData x {
//		if err := dec.Decode(decoder.LSN(x.WALStart), x.WALData); err != nil { ... reconnect, dec.Reset() }
//		txs = dec.Committed(txs[:0]) // hand to the journal; Close each once journaled
//	}
//
// Each Transaction carries its xid, the commit record's LSN, the commit's
// end LSN (the position to acknowledge once journaled) and commit time, and
// its changes, each with its complete envelope body minus the sequence
// fields the journal assigns.
type Decoder struct {
	cfg Config

	rels  map[uint32]*relation
	types map[uint32]typeInfo

	cur       *txState            // ordinary transaction between Begin and Commit
	streams   map[uint32]*txState // streamed transactions by top-level xid
	inStream  bool                // between StreamStart and StreamStop
	streamTx  *txState            // the transaction of the open stream block
	mem       int64               // bytes of in-memory changes across open transactions
	held      int64               // bytes of open transactions' changes, in memory and spilled (MaxTransactionBytes)
	committed []*Transaction

	// Reused per message.
	tup, old []tval
	unch     []int
	scratch  []byte
	rowEnd   int // where appendRow's last row object ended in its buffer (before any JSON-null list)
	free     []*txState

	stats    Stats
	msgCount map[string]*EntityCounters // cfg.Counters' entries by message prefix

	// qkeys holds, by relation OID, the column indexes of the primary key
	// of a relation whose every column is a key column (Config.KeyColumns).
	qkeys map[uint32][]int
	// elems holds Config.ArrayElement's answers by type OID.
	elems map[uint32]ArrayElement
	// The row change being added, while add runs, for quarantine entries'
	// keys: its relation, its new row (nil for a delete) and its old row
	// (nil when none was sent).
	rowRel         *relation
	rowNew, rowOld []tval
}

// Stats are counters for metrics and tests.
type Stats struct {
	Changes     uint64 // changes appended to transactions (including later aborted ones)
	Committed   uint64 // transactions committed
	Aborted     uint64 // streamed transactions aborted
	Spilled     uint64 // transactions moved to a spill file
	Quarantined uint64 // changes replaced by quarantine entries (see Quarantine)
	// ControlsDropped counts Config.ControlPrefix messages dropped as not
	// walcast's (see Config.ControlPrefix).
	ControlsDropped uint64
	BufferedHigh    int64 // high-water mark of in-memory change bytes
}

// New returns a Decoder with cfg's defaults filled in.
func New(cfg Config) *Decoder {
	if cfg.MessagePrefix == "" {
		cfg.MessagePrefix = "walcast."
	}
	if cfg.MemoryBudget <= 0 {
		cfg.MemoryBudget = defaultMemoryBudget
	}
	if cfg.MaxEnvelopeBytes <= 0 {
		cfg.MaxEnvelopeBytes = DefaultMaxEnvelopeBytes
	}
	if cfg.SpillDir == "" {
		cfg.SpillDir = os.TempDir()
	}
	if cfg.MaxTransactionBytes <= 0 {
		cfg.MaxTransactionBytes = DefaultMaxTransactionBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Counters == nil {
		cfg.Counters = NewCounters()
	}
	return &Decoder{
		cfg:     cfg,
		rels:    make(map[uint32]*relation),
		types:   make(map[uint32]typeInfo),
		streams: make(map[uint32]*txState),
	}
}

// Stats returns the decoder's counters.
func (d *Decoder) Stats() Stats { return d.stats }

// Counters returns the counts of decoded changes by entity and op
// (Config.Counters). Unlike Stats, they may be read from any goroutine.
func (d *Decoder) Counters() *Counters { return d.cfg.Counters }

// messageCounts returns the counters of a message prefix; the lookup with
// string(prefix) does not allocate once the prefix has been seen.
func (d *Decoder) messageCounts(prefix []byte) *EntityCounters {
	if ec := d.msgCount[string(prefix)]; ec != nil {
		return ec
	}
	if d.msgCount == nil {
		d.msgCount = make(map[string]*EntityCounters)
	}
	ec := d.cfg.Counters.Message(string(prefix))
	if len(d.msgCount) < 4*MaxMessageEntities {
		d.msgCount[string(prefix)] = ec
	}
	return ec
}

// Decode consumes one XLogData payload. walStart is the XLogData's WAL start
// position, which for a change is the change's LSN. data is only borrowed for
// the call: nothing refers to it afterwards, so the caller may reuse it.
//
// Transactions completed by the payload are queued for Committed. A
// malformed payload returns a *ProtocolError and leaves the decoder in an
// unspecified state: drop the connection and Reset. Other errors come from
// the spill file or Config.ArrayElement, and call for the same. Unknown
// message types are skipped.
func (d *Decoder) Decode(walStart LSN, data []byte) error {
	if len(data) == 0 {
		return &ProtocolError{WAL: walStart, Err: ErrTruncated, Detail: "empty payload"}
	}
	w := wire{b: data, off: 1}
	var err error
	switch data[0] {
	case 'B':
		d.begin(&w)
	case 'C':
		d.commit(&w)
	case 'O':
		w.u64()     // origin commit LSN
		w.cstring() // origin name
	case 'R':
		err = d.relationMsg(&w)
	case 'Y':
		err = d.typeMsg(&w)
	case 'I', 'U', 'D':
		err = d.change(&w, data[0], walStart)
	case 'T':
		err = d.truncate(&w, walStart)
	case 'M':
		err = d.message(&w, walStart)
	case 'S':
		d.streamStart(&w)
	case 'E':
		if !d.inStream {
			w.fail(ErrSequence, "stream stop outside a stream")
		}
		d.inStream, d.streamTx = false, nil
	case 'c':
		err = d.streamCommit(&w)
	case 'A':
		d.streamAbort(&w)
	default:
		// Unknown message types (newer protocol versions) are skipped.
	}
	if !w.ok() {
		return &ProtocolError{Type: data[0], WAL: walStart, Offset: w.failAt, Err: w.cause, Detail: w.detail}
	}
	return err
}

// Committed appends the transactions committed since the last call to dst,
// in commit order, and returns it. The caller owns them and must Close each
// once it is journaled or discarded (spilled ones hold a file).
//
// A transaction whose every change was dropped (journal tables, messages
// with another prefix) is still returned, with Len 0, so that its EndLSN
// can be journaled as the watermark and acknowledged. A non-transactional
// logical message is returned as a transaction of its own with Xid 0 and
// CommitLSN = EndLSN = the message's LSN.
func (d *Decoder) Committed(dst []*Transaction) []*Transaction {
	dst = append(dst, d.committed...)
	clear(d.committed)
	d.committed = d.committed[:0]
	return dst
}

// Idle reports whether the decoder holds nothing: no transaction in
// progress (ordinary or streamed) and none committed but not yet taken. Only
// then may the replication loop confirm a keepalive's position (DESIGN §4.4).
func (d *Decoder) Idle() bool {
	return d.cur == nil && len(d.streams) == 0 && len(d.committed) == 0
}

// Reset prepares for a new replication connection: it forgets every Relation
// and Type message and discards every partial transaction, deleting their
// spill files. Committed transactions not yet taken stay queued; they are
// complete.
func (d *Decoder) Reset() error {
	clear(d.rels)
	clear(d.types)
	clear(d.qkeys)
	clear(d.elems)
	return d.discardPartial()
}

// Close discards all state, including committed transactions not yet taken,
// and deletes every spill file the decoder still owns.
func (d *Decoder) Close() error {
	err := d.Reset()
	for _, tx := range d.committed {
		if cerr := tx.Close(); err == nil {
			err = cerr
		}
	}
	clear(d.committed)
	d.committed = d.committed[:0]
	return err
}

func (d *Decoder) discardPartial() error {
	var err error
	if d.cur != nil {
		err = d.drop(d.cur)
		d.cur = nil
	}
	for xid, tx := range d.streams {
		if derr := d.drop(tx); err == nil {
			err = derr
		}
		delete(d.streams, xid)
	}
	d.inStream, d.streamTx = false, nil
	return err
}

func (d *Decoder) begin(w *wire) {
	w.u64() // final LSN: the commit record's start; Commit repeats it
	w.u64() // commit time; Commit repeats it
	xid := w.u32()
	if !w.ok() {
		return
	}
	if d.cur != nil || d.inStream {
		w.fail(ErrSequence, "begin inside a transaction")
		return
	}
	d.cur = d.newTx(xid, false)
}

func (d *Decoder) commit(w *wire) {
	w.u8() // flags, unused
	commitLSN := LSN(w.u64())
	endLSN := LSN(w.u64())
	ts := int64(w.u64())
	if !w.ok() {
		return
	}
	if d.cur == nil {
		w.fail(ErrSequence, "commit outside a transaction")
		return
	}
	tx := d.cur
	d.cur = nil
	if err := d.finish(tx, commitLSN, endLSN, pgTime(ts)); err != nil {
		w.fail(err, "")
	}
}

func (d *Decoder) relationMsg(w *wire) error {
	if d.inStream {
		w.u32() // xid
	}
	id := w.u32()
	ns := w.cstring()
	name := w.cstring()
	w.u8() // replica identity setting; the per-column key flags say it all
	n := int(w.u16())
	if !w.ok() {
		return nil
	}
	rel := newRelation(id, string(ns), string(name), &d.cfg)
	for i := 0; i < n; i++ {
		flags := w.u8()
		cname := w.cstring()
		oid := w.u32()
		w.u32() // typmod
		if !w.ok() {
			return nil
		}
		rel.addColumn(string(cname), flags&1 != 0, d.columnType(oid), &d.cfg)
	}
	schema := string(ns)
	if schema == "" {
		schema = "pg_catalog"
	}
	if !rel.skip && rel.tenant < 0 && d.cfg.TenantColumn != "" && d.cfg.Unscoped != nil {
		u, err := d.cfg.Unscoped(id, schema, string(name))
		if err != nil {
			return err
		}
		rel.unscoped = u
	}
	d.rels[id] = rel
	delete(d.qkeys, id)
	if rel.fullKey && d.cfg.KeyColumns != nil && !rel.skip {
		d.setQuarantineKey(rel, d.cfg.KeyColumns(id, schema, string(name)))
	}
	return nil
}

// setQuarantineKey records the columns named in names, in column order, as
// the key quarantine entries of rel's changes carry; names that are not all
// among rel's columns are ignored.
func (d *Decoder) setQuarantineKey(rel *relation, names []string) {
	if len(names) == 0 {
		return
	}
	var idx []int
	for i := range rel.cols {
		for _, n := range names {
			if rel.cols[i].name == n {
				idx = append(idx, i)
				break
			}
		}
	}
	if len(idx) != len(names) {
		return
	}
	if d.qkeys == nil {
		d.qkeys = make(map[uint32][]int)
	}
	d.qkeys[rel.id] = idx
}

func (d *Decoder) typeMsg(w *wire) error {
	if d.inStream {
		w.u32() // xid
	}
	oid := w.u32()
	ns := w.cstring()
	name := w.cstring()
	if !w.ok() {
		return nil
	}
	ti := typeInfo{ns: string(ns), name: string(name)}
	if ti.ns == "" {
		ti.ns = "pg_catalog" // pgoutput sends "" for pg_catalog
	}
	d.types[oid] = ti
	return d.learnElement(oid, ti)
}

// target returns the transaction a change belongs to and, inside a stream
// block, the (sub)transaction xid the change carries.
func (d *Decoder) target(w *wire) (*txState, uint32) {
	if d.inStream {
		sub := w.u32()
		return d.streamTx, sub
	}
	if d.cur == nil {
		w.fail(ErrSequence, "change outside a transaction")
		return nil, 0
	}
	return d.cur, d.cur.xid
}

func (d *Decoder) relation(w *wire, id uint32) *relation {
	rel := d.rels[id]
	if rel == nil && w.ok() {
		w.fail(ErrUnknownRelation, "relation OID "+utoa(id))
	}
	return rel
}

// tval is one column of a TupleData: kind 'n' null, 'u' unchanged TOAST,
// 't' text, 'b' binary; v is borrowed from the payload.
type tval struct {
	kind byte
	v    []byte
}

func (d *Decoder) readTuple(w *wire, rel *relation, dst []tval) []tval {
	n := int(w.u16())
	if !w.ok() {
		return dst[:0]
	}
	if n != len(rel.cols) {
		w.fail(ErrMalformed, "tuple has "+utoa(uint32(n))+" columns, relation "+rel.entity+" has "+utoa(uint32(len(rel.cols))))
		return dst[:0]
	}
	dst = dst[:0]
	for i := 0; i < n; i++ {
		k := w.u8()
		var v []byte
		switch k {
		case 'n', 'u':
		case 't', 'b':
			l := w.u32()
			if l > 1<<30 {
				w.fail(ErrMalformed, "column length out of range")
				return dst[:0]
			}
			v = w.bytes(int(l))
		default:
			if w.ok() {
				w.fail(ErrMalformed, "unknown column kind "+quoteByte(k))
			}
		}
		if !w.ok() {
			return dst[:0]
		}
		dst = append(dst, tval{kind: k, v: v})
	}
	return dst
}

// change decodes Insert, Update and Delete.
func (d *Decoder) change(w *wire, typ byte, lsn LSN) error {
	tx, sub := d.target(w)
	relID := w.u32()
	if !w.ok() {
		return nil
	}
	rel := d.relation(w, relID)
	if rel == nil {
		return nil
	}
	var oldKind byte // 0, 'K' or 'O'
	d.old = d.old[:0]
	d.tup = d.tup[:0]
	t := w.u8()
	if typ != 'I' && (t == 'K' || t == 'O') {
		oldKind = t
		d.old = d.readTuple(w, rel, d.old)
		if typ == 'U' {
			t = w.u8()
		}
	}
	switch typ {
	case 'I', 'U':
		if t != 'N' {
			if w.ok() {
				w.fail(ErrMalformed, "expected new tuple 'N', got "+quoteByte(t))
			}
			return nil
		}
		d.tup = d.readTuple(w, rel, d.tup)
	case 'D':
		if oldKind == 0 && w.ok() {
			w.fail(ErrMalformed, "expected old tuple 'K' or 'O', got "+quoteByte(t))
		}
	}
	if !w.ok() || rel.skip {
		return nil
	}

	op := opInsert
	switch typ {
	case 'U':
		op = opUpdate
	case 'D':
		op = opDelete
	}
	buf := tx.arena
	start := len(buf)
	buf = append(buf, rel.entityOp...)
	buf = append(buf, opNames[op]...)
	buf = append(buf, '"')
	var old []tval
	if oldKind != 0 {
		old = d.old
	}
	var keyOff, keyLen int
	if rel.hasKey {
		buf = append(buf, `,"key":`...)
		keyOff = len(buf) - start
		if typ == 'D' {
			buf = d.appendRow(buf, rel, old, nil, true, false)
		} else {
			buf = d.appendRow(buf, rel, d.tup, old, true, false)
		}
		keyLen = len(buf) - start - keyOff
	}
	var oldKeyOff, oldKeyLen int
	if oldKind != 0 {
		buf = append(buf, `,"before":`...)
		off := len(buf)
		buf = d.appendRow(buf, rel, old, nil, oldKind == 'K', false)
		// An update's old key: "before" is the old row's key columns ('K')
		// or, under FULL, every column, each of them a key column.
		if typ == 'U' && rel.hasKey && (oldKind == 'K' || rel.fullKey) {
			if k := buf[off:d.rowEnd]; !bytes.Equal(k, buf[start+keyOff:start+keyOff+keyLen]) {
				oldKeyOff, oldKeyLen = off-start, len(k)
			}
		}
	}
	d.unch = d.unch[:0]
	if typ != 'D' {
		buf = append(buf, `,"after":`...)
		buf = d.appendRow(buf, rel, d.tup, old, false, true)
		if len(d.unch) > 0 {
			buf = append(buf, `,"unchanged":[`...)
			for i, c := range d.unch {
				if i > 0 {
					buf = append(buf, ',')
				}
				buf = appendString(buf, []byte(rel.cols[c].name))
			}
			buf = append(buf, ']')
		}
	}
	tstate, tenant := TenantNone, ""
	oldState, oldTenant := TenantNone, ""
	if rel.tenant >= 0 {
		tstate, tenant, buf = d.appendTenant(buf, rel, typ, oldKind, old)
		if typ == 'U' {
			oldState, oldTenant = oldTenantOf(rel, oldKind, old, tstate, tenant)
		}
	}
	buf = append(buf, '}')
	tx.arena = buf
	rel.counts.n[op].Add(1)
	d.rowRel, d.rowNew, d.rowOld = rel, nil, old
	if typ != 'D' {
		d.rowNew = d.tup
	}
	err := d.add(tx, rec{lsn: lsn, sub: sub, op: op, tstate: tstate, entity: rel.entity, tenant: tenant,
		tenanted: rel.tenant >= 0, oldState: oldState, oldTenant: oldTenant,
		tailOff: uint32(start), tailLen: uint32(len(buf) - start), keyOff: uint32(keyOff), keyLen: uint32(keyLen),
		oldKeyOff: uint32(oldKeyOff), oldKeyLen: uint32(oldKeyLen)})
	d.rowRel, d.rowNew, d.rowOld = nil, nil, nil
	return err
}

// oldTenantOf is what an update's old row says of its tenant (see
// Change.OldTenantState): known when the old row was sent whole (FULL) or
// as a key that includes the tenant column, unresolved otherwise. An old
// tenant equal to the new one shares its string. A replica identity that
// holds the tenant column and was not sent did not change: the old tenant
// is the new one.
func oldTenantOf(rel *relation, oldKind byte, old []tval, tstate TenantState, tenant string) (TenantState, string) {
	i := rel.tenant
	switch {
	case oldKind == 0 && rel.cols[i].key && tstate != TenantUnresolved:
		// No old row although the tenant column is in the replica
		// identity: the identity, tenant included, did not change.
		return tstate, tenant
	case oldKind == 0 || (oldKind == 'K' && !rel.cols[i].key):
		return TenantUnresolved, ""
	}
	switch tv := old[i]; tv.kind {
	case 'n':
		return TenantNone, ""
	case 't', 'b':
		if tstate == TenantKnown && string(tv.v) == tenant {
			return TenantKnown, tenant
		}
		if !textOK(string(tv.v)) {
			// Not storable as the journal's tenant: the change that put
			// the row there was quarantined without its tenant, so the
			// old tenant's readers never held the row.
			return TenantUnresolved, ""
		}
		return TenantKnown, string(tv.v)
	}
	return TenantUnresolved, ""
}

// appendRow appends a JSON object of tup's columns (only key columns when
// onlyKey). An unchanged TOAST column takes its value from old when Postgres
// sent it there (REPLICA IDENTITY FULL); otherwise it is left out, and listed
// in d.unch when collect is set.
//
// When a json or jsonb column of a before or after row holds the JSON
// literal null, the row is followed by the field listing such columns
// (beforeJsonNull, afterJsonNull; see Values in the package doc). Which row
// it is, appendRow reads from the field name change has just written for
// it; the key row never gets a list, because Change.Key is the key object
// alone and its values are always those of after (or before, for a delete).
func (d *Decoder) appendRow(buf []byte, rel *relation, tup, old []tval, onlyKey, collect bool) []byte {
	start := len(buf)
	buf = append(buf, '{')
	first := true
	jsonNull := false
	for i := range tup {
		c := &rel.cols[i]
		if onlyKey && !c.key {
			continue
		}
		tv := rowValue(tup, old, i)
		if tv.kind == 'u' {
			if collect {
				d.unch = append(d.unch, i)
			}
			continue
		}
		if !first {
			buf = append(buf, ',')
		}
		first = false
		buf = d.appendColumn(buf, c, tv)
		if tv.kind == 't' && c.typ.kind == kJSON && !jsonNull {
			jsonNull = isJSONNull(tv.v)
		}
	}
	buf = append(buf, '}')
	d.rowEnd = len(buf)
	if jsonNull {
		buf = appendJSONNulls(buf, start, rel, tup, old, onlyKey)
	}
	return buf
}

// appendColumn appends `"name":value` for column c's value tv (not 'u').
func (d *Decoder) appendColumn(buf []byte, c *column, tv tval) []byte {
	buf = append(buf, c.jsonKey...)
	switch tv.kind {
	case 'n':
		buf = append(buf, "null"...)
	case 't':
		buf = appendValue(buf, c.typ, tv.v, &d.scratch)
	case 'b':
		// Binary format is never requested; keep the bytes exactly.
		buf = append(buf, '"')
		buf = base64StdAppend(buf, tv.v)
		buf = append(buf, '"')
	}
	return buf
}

// appendColumns appends a JSON object of the columns at idx of tup (an
// unchanged TOAST value taken from old, as appendRow does); it reports false
// when one of them has no value to write.
func (d *Decoder) appendColumns(buf []byte, rel *relation, tup, old []tval, idx []int) ([]byte, bool) {
	buf = append(buf, '{')
	for n, i := range idx {
		tv := rowValue(tup, old, i)
		if tv.kind == 'u' {
			return buf, false
		}
		if n > 0 {
			buf = append(buf, ',')
		}
		buf = d.appendColumn(buf, &rel.cols[i], tv)
	}
	return append(buf, '}'), true
}

// appendTenant works out the change's tenant and appends its field.
func (d *Decoder) appendTenant(buf []byte, rel *relation, typ, oldKind byte, old []tval) (TenantState, string, []byte) {
	i := rel.tenant
	var tv tval
	switch {
	case typ == 'D':
		if oldKind == 'K' && !rel.cols[i].key {
			return TenantUnresolved, "", buf
		}
		tv = old[i]
	default:
		tv = d.tup[i]
		if tv.kind == 'u' {
			// An unchanged TOASTed tenant: known only if the old row
			// carries it (a 'K' old row has nulls outside the key).
			if old == nil || (old[i].kind != 't' && old[i].kind != 'b') {
				return TenantUnresolved, "", buf
			}
			tv = old[i]
		}
	}
	switch tv.kind {
	case 'n':
		return TenantNone, "", buf
	case 't', 'b':
		buf = append(buf, `,"tenant":`...)
		buf = appendString(buf, tv.v)
		return TenantKnown, string(tv.v), buf
	}
	return TenantUnresolved, "", buf
}

func (d *Decoder) truncate(w *wire, lsn LSN) error {
	tx, sub := d.target(w)
	n := w.u32()
	opts := w.u8()
	if !w.ok() {
		return nil
	}
	if int64(n)*4 > int64(len(w.b)-w.off) {
		w.fail(ErrTruncated, "relation list")
		return nil
	}
	for i := uint32(0); i < n; i++ {
		rel := d.relation(w, w.u32())
		if rel == nil {
			return nil
		}
		if rel.skip {
			continue
		}
		buf := tx.arena
		start := len(buf)
		buf = append(buf, rel.entityOp...)
		buf = append(buf, `truncate","truncate":{"cascade":`...)
		buf = appendBool(buf, opts&1 != 0)
		buf = append(buf, `,"restartIdentity":`...)
		buf = appendBool(buf, opts&2 != 0)
		buf = append(buf, "}}"...)
		tx.arena = buf
		rel.counts.n[opTruncate].Add(1)
		if err := d.add(tx, rec{lsn: lsn, sub: sub, op: opTruncate, entity: rel.entity,
			tailOff: uint32(start), tailLen: uint32(len(buf) - start)}); err != nil {
			return err
		}
	}
	return nil
}

func (d *Decoder) message(w *wire, lsn LSN) error {
	var sub uint32
	if d.inStream {
		sub = w.u32()
	}
	flags := w.u8()
	w.u64() // message LSN, the same as the payload's
	prefix := w.cstring()
	n := w.u32()
	if n > 1<<30 {
		w.fail(ErrMalformed, "content length out of range")
		return nil
	}
	content := w.bytes(int(n))
	if !w.ok() {
		return nil
	}
	transactional := flags&1 != 0
	if d.cfg.ControlPrefix != "" && string(prefix) == d.cfg.ControlPrefix {
		d.control(transactional, content)
		return nil
	}
	if !hasPrefix(prefix, d.cfg.MessagePrefix) {
		return nil
	}
	var tx *txState
	switch {
	case !transactional:
		tx = d.newTx(0, false)
	case d.inStream:
		tx = d.streamTx
	case d.cur != nil:
		tx, sub = d.cur, d.cur.xid
	default:
		w.fail(ErrSequence, "transactional message outside a transaction")
		return nil
	}
	buf := tx.arena
	start := len(buf)
	buf = append(buf, `,"entity":`...)
	buf = appendString(buf, prefix)
	buf = append(buf, `,"op":"message","prefix":`...)
	buf = appendString(buf, prefix)
	buf = append(buf, `,"content":`...)
	if jsonValid(content) {
		buf = append(buf, content...)
	} else {
		buf = append(buf, '"')
		buf = base64StdAppend(buf, content)
		buf = append(buf, '"')
	}
	buf = append(buf, `,"transactional":`...)
	buf = appendBool(buf, transactional)
	buf = append(buf, '}')
	tx.arena = buf
	r := rec{lsn: lsn, sub: sub, op: opMessage, entity: string(prefix), tailOff: uint32(start), tailLen: uint32(len(buf) - start)}
	d.messageCounts(prefix).n[opMessage].Add(1)
	if err := d.add(tx, r); err != nil {
		return err
	}
	if !transactional {
		// Outside any transaction: it is final now (DESIGN §4.11). Its
		// position is its own LSN.
		return d.finish(tx, lsn, lsn, d.cfg.Now())
	}
	return nil
}

// Bounds on the control messages a transaction may carry (see
// Config.ControlPrefix). walcast's own watermarks are emitted one per
// transaction, in a transaction of their own, as a JSON object whose first
// field is the token; the largest, a low watermark naming a 32-column key
// of 63-byte names, is under 14 KiB even with every byte escaped.
const (
	// MaxControlBytes bounds one control message's content.
	MaxControlBytes = 16 << 10
	// MaxControlsPerTransaction bounds the control messages kept per
	// transaction, so that one holds at most 64 KiB of them.
	MaxControlsPerTransaction = 4
	// ControlContentStart is how every control message's content starts.
	ControlContentStart = `{"token":"`
)

// Reasons a control message is dropped (Config.OnControlDropped).
const (
	ControlDropNonTransactional = "non-transactional" // emitted outside any transaction
	ControlDropTooLarge         = "too-large"         // content over MaxControlBytes
	ControlDropNotWatermark     = "not-a-watermark"   // content not starting with ControlContentStart
	ControlDropTooMany          = "too-many"          // past MaxControlsPerTransaction in its transaction
)

// control keeps the content of a Config.ControlPrefix message on its
// transaction when it may be walcast's own watermark, and drops it
// otherwise: no role can make walcast hold more than
// MaxControlsPerTransaction × MaxControlBytes per transaction with them.
func (d *Decoder) control(transactional bool, content []byte) {
	var tx *txState
	switch {
	case !transactional:
		d.dropControl(ControlDropNonTransactional)
		return
	case d.inStream:
		tx = d.streamTx
	case d.cur != nil:
		tx = d.cur
	default:
		// A transactional message outside a transaction is a protocol
		// violation for changes; for a control message it only means it
		// is not one of ours.
		d.dropControl(ControlDropNonTransactional)
		return
	}
	switch {
	case len(content) > MaxControlBytes:
		d.dropControl(ControlDropTooLarge)
	case !bytes.HasPrefix(content, []byte(ControlContentStart)):
		d.dropControl(ControlDropNotWatermark)
	case len(tx.controls) >= MaxControlsPerTransaction:
		d.dropControl(ControlDropTooMany)
	default:
		tx.controls = append(tx.controls, append([]byte(nil), content...))
	}
}

func (d *Decoder) dropControl(reason string) {
	d.stats.ControlsDropped++
	if d.cfg.OnControlDropped != nil {
		d.cfg.OnControlDropped(reason)
	}
}

func (d *Decoder) streamStart(w *wire) {
	xid := w.u32()
	first := w.u8()
	if !w.ok() {
		return
	}
	if d.inStream || d.cur != nil {
		w.fail(ErrSequence, "stream start inside a transaction or stream")
		return
	}
	tx := d.streams[xid]
	switch {
	case first == 1 && tx != nil:
		w.fail(ErrSequence, "first stream chunk of transaction "+utoa(xid)+" seen twice")
		return
	case first != 1 && tx == nil:
		w.fail(ErrSequence, "stream chunk of transaction "+utoa(xid)+" whose first chunk was not seen")
		return
	case tx == nil:
		tx = d.newTx(xid, true)
		d.streams[xid] = tx
	}
	d.inStream, d.streamTx = true, tx
}

func (d *Decoder) streamCommit(w *wire) error {
	xid := w.u32()
	w.u8() // flags
	commitLSN := LSN(w.u64())
	endLSN := LSN(w.u64())
	ts := int64(w.u64())
	if !w.ok() {
		return nil
	}
	tx := d.streams[xid]
	if d.inStream || tx == nil {
		w.fail(ErrSequence, "stream commit of transaction "+utoa(xid)+" not in progress")
		return nil
	}
	delete(d.streams, xid)
	return d.finish(tx, commitLSN, endLSN, pgTime(ts))
}

func (d *Decoder) streamAbort(w *wire) {
	xid := w.u32()
	sub := w.u32()
	// Protocol 4 appends the abort LSN and time; they are not needed.
	if !w.ok() {
		return
	}
	if d.inStream {
		w.fail(ErrSequence, "stream abort inside a stream")
		return
	}
	tx := d.streams[xid]
	if tx == nil {
		return // nothing of it was streamed to this decoder
	}
	if sub == xid {
		delete(d.streams, xid)
		d.stats.Aborted++
		if err := d.drop(tx); err != nil {
			w.fail(err, "")
		}
		return
	}
	d.abortSub(tx, sub)
}

// pgEpoch is 2000-01-01 UTC, the origin of pgoutput timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func pgTime(usec int64) time.Time {
	return pgEpoch.Add(time.Duration(usec) * time.Microsecond)
}

func hasPrefix(b []byte, prefix string) bool {
	return len(b) >= len(prefix) && string(b[:len(prefix)]) == prefix
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, "true"...)
	}
	return append(b, "false"...)
}

func utoa(v uint32) string {
	var b [10]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return string(b[i:])
}

func quoteByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return "'" + string(rune(c)) + "'"
	}
	return "0x" + string("0123456789abcdef"[c>>4]) + string("0123456789abcdef"[c&0xf])
}
