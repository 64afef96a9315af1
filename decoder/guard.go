package decoder

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"unicode/utf8"
)

// OpQuarantine is the op of an entry standing in for a change walcast could
// not carry as-is (DESIGN §5 Limits).
const OpQuarantine Op = "quarantine"

// Limits on one change (DESIGN §5 Limits). Every envelope the decoder emits
// is valid UTF-8 JSON within them, so the journal, NATS and sockets can take
// it; guard enforces them before a change is buffered.
const (
	// DefaultMaxEnvelopeBytes is Config.MaxEnvelopeBytes' default: 64 MiB
	// of envelope. Postgres can send rows up to 1 GB; walcast refuses to
	// carry one envelope of more than this (NATS and sockets would carry only
	// a reference anyway) and journals a quarantine entry instead.
	DefaultMaxEnvelopeBytes = 64 << 20
	// MaxEntityBytes bounds an entity name. Table entities are at most
	// 2×63 bytes + 1; a logical message's entity is its prefix, which
	// Postgres does not bound: a longer prefix is cut (see SafeEntity) while
	// the envelope's "prefix" field keeps it whole.
	MaxEntityBytes = 255
	// MaxQuarantineRawBytes bounds the original bytes a quarantine entry
	// keeps (base64 in "raw"); past it only their size and SHA-256 are kept.
	MaxQuarantineRawBytes = 1 << 20
	// maxQuarantineKeyBytes bounds the key a quarantine entry carries.
	maxQuarantineKeyBytes = 4096
)

// Quarantine reasons: short, stable codes for metrics and alerts.
const (
	ReasonEntityNotUTF8 = "entity-not-utf8" // a table name or message prefix in another encoding (SQL_ASCII databases)
	ReasonTenantNotUTF8 = "tenant-not-utf8" // the tenant column's value in another encoding (or holding NUL)
	ReasonMalformed     = "malformed"       // an envelope not shaped as the decoder builds them (a bug)
	ReasonTooLarge      = "too-large"       // the envelope exceeds Config.MaxEnvelopeBytes
	ReasonAppendFailed  = "append-failed"   // the journal refused the change repeatedly (replication)
	// ReasonTenantUnscoped: the table has the tenant column but the
	// publication's column list leaves it out, so the row's tenant cannot
	// be known (Config.Unscoped).
	ReasonTenantUnscoped = "tenant-unscoped"
)

// Quarantine is what an op "quarantine" entry says about the change it
// stands for. The entry keeps the change's lsn, xid, commit fields, entity
// (in its safe form) and, where they can be carried, its key and tenant, so
// a consumer can count it, alert on it and refetch the row from the source.
type Quarantine struct {
	Op     Op     `json:"op"`     // the change's own op
	Reason string `json:"reason"` // one of the Reason constants
	Detail string `json:"detail"` // for people
	Size   int    `json:"size"`   // bytes of the envelope that could not be carried
	SHA256 string `json:"sha256"` // of those bytes, hex
	// Raw is the change's envelope as the decoder built it, from its
	// "entity" field on (base64 in JSON); absent past MaxQuarantineRawBytes
	// (or half of Config.MaxEnvelopeBytes, when that is smaller).
	Raw []byte `json:"raw,omitempty"`
	// Entity and Tenant hold the original bytes (base64) of an entity name or
	// tenant value that is not valid UTF-8 or was cut.
	Entity []byte `json:"entity,omitempty"`
	Tenant []byte `json:"tenant,omitempty"`
	// For a whole transaction (Op QuarantinedTransaction; see
	// TransactionQuarantine): its changes, its first change's LSN and the
	// entities it touched, up to 64 named and the rest counted.
	Changes       int      `json:"changes,omitempty"`
	FirstLSN      LSN      `json:"firstLsn,omitempty"`
	Tables        []string `json:"tables,omitempty"`
	TablesOmitted int      `json:"tablesOmitted,omitempty"`
}

// SafeEntity returns entity when it is valid UTF-8 of at most MaxEntityBytes,
// and otherwise a stable stand-in that is: its valid UTF-8 start, "~" and
// 16 hex digits of its SHA-256, within MaxEntityBytes. Distinct names get
// distinct stand-ins (up to the hash), the same name always the same one.
func SafeEntity(entity string) string {
	if len(entity) <= MaxEntityBytes && utf8.ValidString(entity) {
		return entity
	}
	sum := sha256.Sum256([]byte(entity))
	suffix := "~" + hex.EncodeToString(sum[:8])
	v := strings.ToValidUTF8(entity, "\uFFFD")
	n := MaxEntityBytes - len(suffix)
	if len(v) > n {
		for n > 0 && !utf8.RuneStart(v[n]) {
			n--
		}
		v = v[:n]
	}
	return v + suffix
}

// guard checks a change against what the journal, NATS and sockets can
// carry before it is buffered, and replaces one that cannot be carried as-is
// with its safe form: an over-long entity with SafeEntity's stand-in, and
// everything else with a quarantine entry. Its tail is the last bytes of
// tx.arena (the caller has just appended it).
//
// The tail itself is not rescanned for UTF-8: it is valid by construction
// (every string goes through appendString, embedded JSON through jsonValid,
// everything else is ASCII the decoder writes), which FuzzSession checks;
// entity and tenant are raw bytes from the wire and are checked here. Should
// a bug still produce bytes the journal refuses, the replicator quarantines
// the transaction (ReasonAppendFailed).
func (d *Decoder) guard(tx *txState, r rec) rec {
	tail := tx.arena[r.tailOff:] // the tail is the end of the arena
	var reason, detail string
	switch {
	case d.rowRel != nil && d.rowRel.unscoped:
		reason, detail = ReasonTenantUnscoped, "the table has the tenant column but the publication's column list leaves it out, so the row's tenant cannot be known; add the column to the publication's column list"
	case !utf8.ValidString(r.entity):
		reason, detail = ReasonEntityNotUTF8, "the entity name (table or message prefix) is not valid UTF-8"
	case r.tstate == TenantKnown && !textOK(r.tenant):
		reason, detail = ReasonTenantNotUTF8, "the tenant column's value is not valid UTF-8 text"
	case len(tail) > d.cfg.MaxEnvelopeBytes:
		reason, detail = ReasonTooLarge, "the envelope of "+strconv.Itoa(len(tail))+" bytes exceeds the limit of "+strconv.Itoa(d.cfg.MaxEnvelopeBytes)
	case len(r.entity) > MaxEntityBytes:
		return d.renameEntity(tx, r, SafeEntity(r.entity))
	default:
		return r
	}
	return d.quarantine(tx, r, reason, detail)
}

// textOK reports whether s can be stored as Postgres text: valid UTF-8
// without NUL (Postgres never sends a NUL in text, but a value is checked,
// not trusted).
func textOK(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }

// entityField is how every tail starts.
const entityField = `,"entity":`

// renameEntity replaces the entity of r's tail (`,"entity":"…"` first) with
// name, keeping the rest of the tail.
func (d *Decoder) renameEntity(tx *txState, r rec, name string) rec {
	tail := tx.arena[r.tailOff:] // the tail is the end of the arena
	old := appendString(append(d.scratch[:0], entityField...), []byte(r.entity))
	d.scratch = old
	if !bytes.HasPrefix(tail, old) {
		// Not the shape every tail is built with: carry it as quarantine.
		return d.quarantine(tx, r, ReasonMalformed, "the envelope does not start with its entity")
	}
	rest := len(old)
	buf := append([]byte(nil), tail[rest:]...)
	out := appendString(append(tx.arena[:r.tailOff], entityField...), []byte(name))
	delta := len(out) - int(r.tailOff) - rest
	out = append(out, buf...)
	tx.arena = out
	r.tailLen = uint32(len(out) - int(r.tailOff))
	if r.keyLen > 0 {
		r.keyOff = uint32(int(r.keyOff) + delta)
	}
	if r.oldKeyLen > 0 {
		r.oldKeyOff = uint32(int(r.oldKeyOff) + delta)
	}
	r.entity = name
	return r
}

// quarantine replaces r's tail with a quarantine entry's.
func (d *Decoder) quarantine(tx *txState, r rec, reason, detail string) rec {
	tail := tx.arena[r.tailOff:] // the tail is the end of the arena
	// A tenant that cannot be carried routes the entry to no tenant-scoped
	// reader; its key is left out too, or the journal would route it by the
	// key's previous row. An unresolved tenant (a key-only delete) keeps its
	// key, so the journal resolves it as it would the delete.
	// A row of a table whose tenant column is not published has no
	// tenant to carry: it is dropped likewise, whatever the row had.
	dropTenant := reason == ReasonTenantUnscoped || (r.tstate == TenantKnown && !textOK(r.tenant))
	var key, oldKey []byte
	if !dropTenant {
		key, oldKey = d.quarantineKeys(tail, r)
	}
	q := AppendQuarantine(nil, QuarantineOf{
		Entity: r.entity, Op: opNames[r.op], Reason: reason, Detail: detail, Body: tail, Key: key, OldKey: oldKey,
		Tenant: r.tenant, HasTenant: r.tstate == TenantKnown, RawLimit: min(MaxQuarantineRawBytes, d.cfg.MaxEnvelopeBytes/2),
	})
	out := append(tx.arena[:r.tailOff], q.Tail...)
	tx.arena = out
	r.tailLen = uint32(len(q.Tail))
	r.keyOff, r.keyLen = uint32(q.KeyOff), uint32(q.KeyLen)
	r.entity, r.op = q.Entity, opQuarantine
	// Not an update any more: its old key is in the entry's "before" for
	// consumers, but the journal tracks no tenant move for it.
	r.oldKeyOff, r.oldKeyLen, r.oldState, r.oldTenant = 0, 0, TenantNone, ""
	if dropTenant {
		r.tstate, r.tenant = TenantUnresolved, ""
	}
	d.stats.Quarantined++
	if d.cfg.OnQuarantine != nil {
		d.cfg.OnQuarantine(reason)
	}
	return r
}

// quarantineKeys returns the key and the old key (nil when the key did not
// change) a quarantine entry standing for r carries, each only when it is
// valid UTF-8 of at most maxQuarantineKeyBytes. They are r's own, except
// for a row change of a relation whose every column is a key column and
// whose primary key is known (Config.KeyColumns): that key, taken from the
// row being added.
func (d *Decoder) quarantineKeys(tail []byte, r rec) (key, oldKey []byte) {
	if r.keyLen > 0 {
		key = tail[r.keyOff : r.keyOff+r.keyLen]
	}
	if r.oldKeyLen > 0 {
		oldKey = tail[r.oldKeyOff : r.oldKeyOff+r.oldKeyLen]
	}
	if rel := d.rowRel; rel != nil {
		if idx := d.qkeys[rel.id]; idx != nil {
			key, oldKey = nil, nil
			row := d.rowNew
			if row == nil {
				row = d.rowOld // a delete
			}
			if k, ok := d.appendColumns(nil, rel, row, d.rowOld, idx); ok {
				key = k
			}
			if d.rowNew != nil && d.rowOld != nil {
				if k, ok := d.appendColumns(nil, rel, d.rowOld, nil, idx); ok && !bytes.Equal(k, key) {
					oldKey = k
				}
			}
		}
	}
	fits := func(k []byte) []byte {
		if len(k) > maxQuarantineKeyBytes || !utf8.Valid(k) {
			return nil
		}
		return k
	}
	return fits(key), fits(oldKey)
}

// QuarantineOf describes a change to be carried as a quarantine entry.
type QuarantineOf struct {
	Entity string
	Op     Op
	Reason string
	Detail string
	Body   []byte // the change's envelope (or its tail) as built
	Key    []byte // its key object, when it may be carried; nil otherwise
	// OldKey is an update's old key object when the update changed the
	// key and it may be carried (the entry's "before"); nil otherwise.
	OldKey    []byte
	Tenant    string
	HasTenant bool
	// RawLimit bounds the Body bytes kept in the entry; 0 means
	// MaxQuarantineRawBytes.
	RawLimit int
}

// QuarantineTail is a quarantine entry's tail: Tail runs from `,"entity":`
// to the closing brace, as every change's does, with the key at
// Tail[KeyOff:KeyOff+KeyLen] (KeyLen 0: none).
type QuarantineTail struct {
	Tail           []byte
	Entity         string
	KeyOff, KeyLen int
	HasTenant      bool // the tenant is carried in the entry
}

// AppendQuarantine builds the tail of a quarantine entry for q into dst. The
// entry is valid UTF-8 JSON whatever q holds: the entity is SafeEntity's,
// the original bytes are base64, and a tenant that is not valid UTF-8 is
// left out (kept as base64 in "quarantine").
func AppendQuarantine(dst []byte, q QuarantineOf) QuarantineTail {
	ent := SafeEntity(q.Entity)
	b := append(dst, entityField...)
	b = appendString(b, []byte(ent))
	b = append(b, `,"op":"quarantine","quarantine":{"op":`...)
	b = appendString(b, []byte(q.Op))
	b = append(b, `,"reason":`...)
	b = appendString(b, []byte(q.Reason))
	b = append(b, `,"detail":`...)
	b = appendString(b, []byte(q.Detail))
	b = append(b, `,"size":`...)
	b = strconv.AppendInt(b, int64(len(q.Body)), 10)
	sum := sha256.Sum256(q.Body)
	b = append(b, `,"sha256":"`...)
	b = hex.AppendEncode(b, sum[:])
	b = append(b, '"')
	if q.RawLimit <= 0 {
		q.RawLimit = MaxQuarantineRawBytes
	}
	if len(q.Body) <= q.RawLimit {
		b = append(b, `,"raw":"`...)
		b = base64StdAppend(b, q.Body)
		b = append(b, '"')
	}
	if ent != q.Entity {
		b = append(b, `,"entity":"`...)
		b = base64StdAppend(b, []byte(q.Entity))
		b = append(b, '"')
	}
	tenantOK := q.HasTenant && textOK(q.Tenant)
	if q.HasTenant && !tenantOK {
		b = append(b, `,"tenant":"`...)
		b = base64StdAppend(b, []byte(q.Tenant))
		b = append(b, '"')
	}
	b = append(b, '}')
	out := QuarantineTail{Entity: ent, HasTenant: tenantOK}
	if q.Key != nil {
		b = append(b, `,"key":`...)
		out.KeyOff = len(b) - len(dst)
		b = append(b, q.Key...)
		out.KeyLen = len(q.Key)
	}
	if q.OldKey != nil {
		// A consumer refetches both rows: the old key's may be gone.
		b = append(b, `,"before":`...)
		b = append(b, q.OldKey...)
	}
	if tenantOK {
		b = append(b, `,"tenant":`...)
		b = appendString(b, []byte(q.Tenant))
	}
	b = append(b, '}')
	out.Tail = b[len(dst):]
	return out
}

// QuarantineTransaction returns tx with every change replaced by a
// quarantine entry of the given reason, built lazily as the result is
// iterated (a huge transaction is never held in memory for it), for a
// transaction the journal keeps refusing (DESIGN §5 Limits). Closing the
// result closes tx.
func QuarantineTransaction(tx *Transaction, reason, detail string) *Transaction {
	src := &quarantineSource{tx: tx, reason: reason, detail: detail,
		head: appendHead(nil, tx.Xid, tx.EndLSN, tx.CommitTime)}
	return &Transaction{Xid: tx.Xid, CommitLSN: tx.CommitLSN, EndLSN: tx.EndLSN, CommitTime: tx.CommitTime, n: tx.Len(), spill: src}
}

// quarantineSource is a changeSource mapping a transaction's changes to
// quarantine entries.
type quarantineSource struct {
	tx             *Transaction
	reason, detail string
	head           []byte
}

func (s *quarantineSource) open() (changeReader, error) {
	return &quarantineReader{src: s, it: s.tx.Changes()}, nil
}

func (s *quarantineSource) close() error { return s.tx.Close() }

type quarantineReader struct {
	src  *quarantineSource
	it   *ChangeIter
	tail []byte
}

func (r *quarantineReader) next(c *Change) (bool, error) {
	if !r.it.Next() {
		return false, r.it.Err()
	}
	o := r.it.Change()
	var key []byte
	dropTenant := o.TenantState == TenantKnown && !textOK(o.Tenant)
	var oldKey []byte
	if !dropTenant && len(o.Key) > 0 && len(o.Key) <= maxQuarantineKeyBytes && utf8.Valid(o.Key) {
		key = o.Key
	}
	if !dropTenant && len(o.OldKey) > 0 && len(o.OldKey) <= maxQuarantineKeyBytes && utf8.Valid(o.OldKey) {
		oldKey = o.OldKey
	}
	q := AppendQuarantine(r.tail[:0], QuarantineOf{Entity: o.Entity, Op: o.Op, Reason: r.src.reason, Detail: r.src.detail,
		Body: o.Body, Key: key, OldKey: oldKey, Tenant: o.Tenant, HasTenant: o.TenantState == TenantKnown})
	r.tail = q.Tail
	var off int
	c.Body, off = appendBody(c.Body[:0], o.LSN, r.src.head, q.Tail)
	c.LSN, c.Entity, c.Op = o.LSN, q.Entity, OpQuarantine
	c.Tenant, c.TenantState = o.Tenant, o.TenantState
	c.Tenanted, c.OldKey, c.OldTenant, c.OldTenantState = o.Tenanted, nil, "", TenantNone
	if dropTenant {
		c.Tenant, c.TenantState = "", TenantUnresolved
	}
	c.Key = nil
	if q.KeyLen > 0 {
		c.Key = c.Body[off+q.KeyOff : off+q.KeyOff+q.KeyLen : off+q.KeyOff+q.KeyLen]
	}
	return true, nil
}

func (r *quarantineReader) close() error { return nil }
