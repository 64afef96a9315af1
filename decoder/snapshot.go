package decoder

import (
	"bytes"
	"strconv"
	"time"
)

// Snapshots. The replicator reads existing rows of a table and journals them
// at a position of the stream (a snapshot's high watermark, see package
// replication). A row read is an op "read" envelope built exactly as an
// insert of the same row would be — the same key, after and tenant, with
// values converted by the same rules from the same text forms — so a
// consumer treats it as an upsert. Each table's snapshot is bracketed by a
// "snapshot-begin" and a "snapshot-end" envelope on the table's entity:
//
//	{"lsn":…,"entity":"public.t","op":"snapshot-begin","snapshot":{"id":7,"table":"public.t"}}
//	{"lsn":…,"entity":"public.t","op":"snapshot-end","snapshot":{"id":7,"table":"public.t","rows":20000}}
//
// A snapshot that was cancelled ends with "cancelled":true in its
// snapshot-end; its rows are then not the whole table.

// ColumnInfo describes one column of a table as pgoutput's Relation and
// Type messages would: its name, type OID, whether it is part of the
// replica identity, and — for a type OID at or above 10000, for which
// pgoutput sends a Type message — the schema and name of the column type's
// base type (the type at the end of a chain of domains; "pg_catalog" for a
// built-in one).
type ColumnInfo struct {
	Name       string
	TypeOID    uint32
	BaseSchema string
	BaseName   string
	Key        bool
	// PrimaryKey marks the columns of the table's primary key. It matters
	// only when every column is Key (REPLICA IDENTITY FULL): a read
	// quarantined by the guard then carries these columns as its key rather
	// than the whole row (see Config.KeyColumns).
	PrimaryKey bool
	// Element describes the elements of an array type outside pg_catalog
	// (TypeOID at or above 10000, BaseName "_name"), as
	// Config.ArrayElement does for the stream; zero when unknown.
	Element ArrayElement
}

// RowEncoder encodes rows of one table, given as the text forms Postgres's
// output functions produce under the replication session's settings
// (DESIGN §4.7), into read envelopes. It is not safe for concurrent use.
type RowEncoder struct {
	d   *Decoder
	rel *relation
}

// NewRowEncoder returns an encoder for rows of schema.table with cols in
// attribute order (the published columns), hoisting tenantColumn (empty:
// none) into "tenant" as the decoder does for inserts.
func NewRowEncoder(schema, table string, cols []ColumnInfo, tenantColumn string) *RowEncoder {
	d := New(Config{TenantColumn: tenantColumn})
	for _, c := range cols {
		if c.TypeOID >= firstGenbkiOID {
			ns := c.BaseSchema
			if ns == "" {
				ns = "pg_catalog"
			}
			d.types[c.TypeOID] = typeInfo{ns: ns, name: c.BaseName}
			if c.Element.Name != "" {
				if d.elems == nil {
					d.elems = make(map[uint32]ArrayElement)
				}
				d.elems[c.TypeOID] = c.Element
			}
		}
	}
	rel := newRelation(0, schema, table, &d.cfg)
	var pk []string
	for _, c := range cols {
		rel.addColumn(c.Name, c.Key, d.columnType(c.TypeOID), &d.cfg)
		if c.PrimaryKey {
			pk = append(pk, c.Name)
		}
	}
	if rel.fullKey {
		d.setQuarantineKey(rel, pk)
	}
	return &RowEncoder{d: d, rel: rel}
}

// Guard sets what reads are checked against before they are added, as the
// decoder checks changes (see Config): a read whose envelope exceeds
// maxEnvelopeBytes (0: DefaultMaxEnvelopeBytes), or whose tenant is not
// valid UTF-8 text, is added as a quarantine entry standing for it (op
// "read" in its "quarantine"), with its key, so that a consumer can fetch
// the row from the source; onQuarantine, when set, is called with the
// reason of each (for metrics; it must not block).
func (e *RowEncoder) Guard(maxEnvelopeBytes int, onQuarantine func(reason string)) {
	if maxEnvelopeBytes <= 0 {
		maxEnvelopeBytes = DefaultMaxEnvelopeBytes
	}
	e.d.cfg.MaxEnvelopeBytes, e.d.cfg.OnQuarantine = maxEnvelopeBytes, onQuarantine
}

// Entity is the table's entity name (EntityName).
func (e *RowEncoder) Entity() string { return e.rel.entity }

// Columns is the number of columns a row must have.
func (e *RowEncoder) Columns() int { return len(e.rel.cols) }

// setRow loads row (nil for SQL NULL) as a text tuple.
func (e *RowEncoder) setRow(row [][]byte) {
	e.d.tup = e.d.tup[:0]
	for _, v := range row {
		if v == nil {
			e.d.tup = append(e.d.tup, tval{kind: 'n'})
		} else {
			e.d.tup = append(e.d.tup, tval{kind: 't', v: v})
		}
	}
}

// Values encodes the values of the columns at idx of row as a JSON array,
// each value exactly as it appears in an envelope's key, before or after
// object: the identity the replicator compares a read row's key with.
func (e *RowEncoder) Values(dst []byte, row [][]byte, idx []int) []byte {
	dst = append(dst, '[')
	for n, i := range idx {
		if n > 0 {
			dst = append(dst, ',')
		}
		if row[i] == nil {
			dst = append(dst, "null"...)
			continue
		}
		dst = appendValue(dst, e.rel.cols[i].typ, row[i], &e.d.scratch)
	}
	return append(dst, ']')
}

// TxBuilder builds a committed transaction of entries the replicator makes
// itself — snapshot reads and markers, and changes copied from a decoded
// transaction — at one position of the stream.
type TxBuilder struct {
	xid        uint32
	commitLSN  LSN
	endLSN     LSN
	commitTime time.Time
	tx         txState
}

// NewTxBuilder starts a transaction with the position and commit fields its
// entries carry.
func NewTxBuilder(xid uint32, commitLSN, endLSN LSN, commitTime time.Time) *TxBuilder {
	return &TxBuilder{xid: xid, commitLSN: commitLSN, endLSN: endLSN, commitTime: commitTime}
}

// Len is the number of entries added so far.
func (b *TxBuilder) Len() int { return len(b.tx.recs) }

// Read adds row (text values in column order, nil for SQL NULL) as an op
// "read" envelope at lsn: the insert envelope of the row with op "read";
// or, when the row cannot be carried as-is, the quarantine entry the
// decoder's guard makes of it (see RowEncoder.Guard).
func (b *TxBuilder) Read(e *RowEncoder, lsn LSN, row [][]byte) {
	rel, d := e.rel, e.d
	e.setRow(row)
	buf := b.tx.arena
	start := len(buf)
	buf = append(buf, rel.entityOp...)
	buf = append(buf, OpRead...)
	buf = append(buf, '"')
	var keyOff, keyLen int
	if rel.hasKey {
		buf = append(buf, `,"key":`...)
		keyOff = len(buf) - start
		buf = d.appendRow(buf, rel, d.tup, nil, true, false)
		keyLen = len(buf) - start - keyOff
	}
	buf = append(buf, `,"after":`...)
	d.unch = d.unch[:0]
	buf = d.appendRow(buf, rel, d.tup, nil, false, true)
	tstate, tenant := TenantNone, ""
	if rel.tenant >= 0 {
		tstate, tenant, buf = d.appendTenant(buf, rel, 'I', 0, nil)
	}
	buf = append(buf, '}')
	b.tx.arena = buf
	r := rec{lsn: lsn, op: opRead, tstate: tstate, tenanted: rel.tenant >= 0, entity: rel.entity, tenant: tenant,
		tailOff: uint32(start), tailLen: uint32(len(buf) - start), keyOff: uint32(keyOff), keyLen: uint32(keyLen)}
	d.rowRel, d.rowNew, d.rowOld = rel, d.tup, nil
	r = d.guard(&b.tx, r)
	d.rowRel, d.rowNew = nil, nil
	b.tx.recs = append(b.tx.recs, r)
}

// SnapshotMarker is what a snapshot-begin or snapshot-end envelope says.
type SnapshotMarker struct {
	ID        int64
	Entity    string // the table's entity
	Rows      int64  // snapshot-end: read entries journaled for the snapshot
	Cancelled bool   // snapshot-end: the snapshot was cancelled before the table's end
	Failed    string // snapshot-end: the snapshot failed before the table's end, why, and the fix
}

// Marker adds a snapshot-begin (begin true) or snapshot-end envelope at lsn
// on m's entity. It carries no key and no tenant.
func (b *TxBuilder) Marker(lsn LSN, begin bool, m SnapshotMarker) {
	op, opc := OpSnapshotEnd, opSnapshotEnd
	if begin {
		op, opc = OpSnapshotBegin, opSnapshotBegin
	}
	buf := b.tx.arena
	start := len(buf)
	buf = append(buf, `,"entity":`...)
	buf = appendString(buf, []byte(m.Entity))
	buf = append(buf, `,"op":"`...)
	buf = append(buf, op...)
	buf = append(buf, `","snapshot":{"id":`...)
	buf = strconv.AppendInt(buf, m.ID, 10)
	buf = append(buf, `,"table":`...)
	buf = appendString(buf, []byte(m.Entity))
	if !begin {
		buf = append(buf, `,"rows":`...)
		buf = strconv.AppendInt(buf, m.Rows, 10)
		if m.Cancelled {
			buf = append(buf, `,"cancelled":true`...)
		}
		if m.Failed != "" {
			buf = append(buf, `,"failed":true,"reason":`...)
			buf = appendString(buf, []byte(m.Failed))
		}
	}
	buf = append(buf, "}}"...)
	b.tx.arena = buf
	b.tx.recs = append(b.tx.recs, rec{lsn: lsn, op: opc, entity: m.Entity, tailOff: uint32(start), tailLen: uint32(len(buf) - start)})
}

// Copy adds a change of a decoded transaction, its body re-headed with the
// builder's commit fields (the same as the transaction's when the builder
// was started from them).
func (b *TxBuilder) Copy(c *Change) {
	tail := c.Body
	// The tail starts at `,"entity":` (every body the decoder builds has one),
	// right after the head.
	if i := bytes.Index(tail, []byte(`,"entity":`)); i >= 0 {
		tail = tail[i:]
	}
	op := uint8(opInsert)
	for i, n := range opNames {
		if n == c.Op {
			op = uint8(i)
		}
	}
	buf := b.tx.arena
	start := len(buf)
	buf = append(buf, tail...)
	b.tx.arena = buf
	r := rec{lsn: c.LSN, op: op, tstate: c.TenantState, entity: c.Entity, tenant: c.Tenant,
		tenanted: c.Tenanted, oldState: c.OldTenantState, oldTenant: c.OldTenant,
		tailOff: uint32(start), tailLen: uint32(len(buf) - start)}
	from := 0
	if c.Key != nil {
		if k := bytes.Index(tail, c.Key); k >= 0 {
			r.keyOff, r.keyLen = uint32(k), uint32(len(c.Key))
			from = k + len(c.Key)
		}
	}
	if c.OldKey != nil {
		// The old key is "before", which follows "key".
		if k := bytes.Index(tail[from:], c.OldKey); k >= 0 {
			r.oldKeyOff, r.oldKeyLen = uint32(from+k), uint32(len(c.OldKey))
		}
	}
	b.tx.recs = append(b.tx.recs, r)
}

// Transaction returns the built transaction; the builder must not be used
// afterwards.
func (b *TxBuilder) Transaction() *Transaction {
	head := appendHead(nil, b.xid, b.endLSN, b.commitTime)
	mem := materialize(&b.tx, head)
	return &Transaction{Xid: b.xid, CommitLSN: b.commitLSN, EndLSN: b.endLSN, CommitTime: b.commitTime, n: len(mem), mem: mem}
}
