package journal

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"

	"github.com/walcast/walcast/decoder"
)

// The encoding of an append: each change becomes an entry (its seq and
// entitySeq spliced into the decoder's envelope, its tenant resolved, an
// update that moves a row between tenants preceded by a delete in the old
// one), and the entries become chunk rows (chunks.go) in COPY binary form.

// ErrUnencodable is in the chain of an append error caused by a change the
// journal cannot encode as an entry (its body is not a JSON object, its LSN
// does not fit): the same input fails the same way, so the replicator
// quarantines it rather than retrying forever.
var ErrUnencodable = errors.New("change cannot be journaled as-is")

// copySource streams a batch's changes as COPY binary data (an io.Reader),
// building each row's envelope as it goes, so a spilled transaction is never
// materialised.
type copySource struct {
	txs     []*decoder.Transaction
	ti      int
	cur     *decoder.Transaction
	it      *decoder.ChangeIter
	next    int64                            // seq of the next row
	base    map[string]entityState           // before the batch (read only)
	dirty   map[string]entityState           // changed in the batch
	resolve map[string]map[string]*tenantRes // nil when no change needs resolving
	// keys learns the tenant of every key written for a tenanted entity;
	// a failed append resets it (append). Nil in tests of the encoding.
	keys *keyTenants
	// keep gathers the rows for the recent log (recent.go); nil in tests
	// of the encoding.
	keep *recentBatch

	chunk     *chunkBuilder // entries not yet encoded as a chunk row
	buf       []byte        // encoded, not yet read
	off       int
	started   bool
	finished  bool
	env       []byte // scratch for one envelope
	bytes     int64
	unknown   int
	moved     int // deletes written for rows that changed tenant
	resyncSeq int64
	err       error

	// mu is held by every Read. pgconn.CopyFrom can return on a server or
	// connection error while its reader goroutine is still inside Read (or
	// about to call it); abandon takes mu once CopyFrom has returned, so no
	// Read touches the source, its buffer or its transactions afterwards.
	mu        sync.Mutex
	abandoned bool
}

const copyChunk = 64 << 10

var errAbandoned = errors.New("journal: COPY source read after the COPY ended")

// abandon stops the source for good; see mu.
func (s *copySource) abandon() {
	s.mu.Lock()
	s.abandoned = true
	s.mu.Unlock()
}

// Read implements io.Reader for pgconn.CopyFrom.
func (s *copySource) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.abandoned {
		return 0, errAbandoned
	}
	if s.off == len(s.buf) {
		if s.err != nil {
			return 0, s.err
		}
		if s.finished {
			return 0, io.EOF
		}
		s.fill()
		if s.off == len(s.buf) && s.err != nil {
			return 0, s.err
		}
	}
	n := copy(p, s.buf[s.off:])
	s.off += n
	return n, nil
}

// prefill encodes rows until the batch ends (true) or limit bytes are
// buffered (false); Read then serves them first.
func (s *copySource) prefill(limit int) bool {
	s.encodeUntil(limit)
	return s.finished && s.err == nil
}

// fill replaces buf with about copyChunk bytes of rows.
func (s *copySource) fill() {
	s.buf, s.off = s.buf[:0], 0
	s.encodeUntil(copyChunk)
}

// encodeUntil appends rows to buf until it holds limit bytes or the batch
// ends (appending the trailer and setting finished).
func (s *copySource) encodeUntil(limit int) {
	if !s.started {
		s.started = true
		s.buf = append(s.buf, "PGCOPY\n\xff\r\n\x00"...)
		s.buf = binary.BigEndian.AppendUint32(s.buf, 0) // flags
		s.buf = binary.BigEndian.AppendUint32(s.buf, 0) // header extension
	}
	for len(s.buf) < limit && !s.finished {
		if s.it == nil {
			if s.ti >= len(s.txs) {
				if s.chunk != nil {
					s.buf = s.chunk.row(s.buf)
				}
				s.buf = binary.BigEndian.AppendUint16(s.buf, 0xffff) // trailer
				s.finished = true
				return
			}
			s.cur = s.txs[s.ti]
			s.ti++
			s.it = s.cur.Changes()
		}
		if s.it.Next() {
			if s.err = s.encode(s.it.Change()); s.err != nil {
				s.buf = s.buf[:0]
				return
			}
			continue
		}
		if err := s.it.Err(); err != nil {
			s.err = fmt.Errorf("read transaction %d: %w", s.cur.Xid, err)
			s.buf = s.buf[:0]
			return
		}
		s.it = nil
	}
}

var (
	seqPrefix       = []byte(`{"seq":`)
	entitySeqInfix  = []byte(`,"entitySeq":`)
	tenantUnknownKV = []byte(`,"tenantUnknown":true}`)
)

// pgEpoch is PostgreSQL's timestamp epoch, in Unix microseconds.
const pgEpoch = 946684800 * 1000000

// encode appends one change's rows in COPY binary format, columns as
// entryColumns: one row, or two for an update that moved its row to
// another tenant (moved).
func (s *copySource) encode(c *decoder.Change) error {
	t := s.cur
	body := c.Body
	if len(body) < 3 || body[0] != '{' || body[1] != '"' || body[len(body)-1] != '}' {
		return fmt.Errorf("%w: change at %s in transaction %d: body is not a JSON object starting with a field", ErrUnencodable, c.LSN, t.Xid)
	}
	if c.LSN > math.MaxInt64 {
		return fmt.Errorf("%w: change LSN %s does not fit the journal's bigint", ErrUnencodable, c.LSN)
	}
	st, ok := s.dirty[c.Entity]
	if !ok {
		st = s.base[c.Entity]
	}
	if c.TenantState != decoder.TenantNone || c.Tenanted {
		st.tenanted = true
	}

	// The key's previous tenant, when the change needs it (priorKey).
	var prior *tenantRes
	pk := priorKey(c)
	if pk != nil && s.resolve != nil {
		prior = s.resolve[c.Entity][string(pk)]
	}

	var tenant []byte
	hasTenant, unknown := false, false
	var suffix []byte // replaces the body's closing brace when non-nil
	switch c.TenantState {
	case decoder.TenantKnown:
		tenant, hasTenant = []byte(c.Tenant), true
	case decoder.TenantUnresolved:
		switch {
		case prior == nil || !prior.found:
			unknown = true
			s.unknown++
			suffix = tenantUnknownKV
		case prior.tenant != nil:
			tenant, hasTenant = []byte(*prior.tenant), true
			q, _ := json.Marshal(*prior.tenant)
			suffix = append(append([]byte(`,"tenant":`), q...), '}')
		}
	}

	if c.Op == decoder.OpUpdate && !unknown && c.Key != nil {
		// Did the row change tenant? Its old tenant is in the old row
		// (FULL, or an identity holding the tenant column), else it is the
		// tenant of the newest change of its old key.
		var old *string
		oldKnown := false
		switch {
		case c.OldTenantState == decoder.TenantKnown:
			v := c.OldTenant
			old, oldKnown = &v, true
		case c.OldTenantState == decoder.TenantNone:
			oldKnown = c.Tenanted // zero for changes built without the old row's state
		case prior != nil && prior.found:
			old, oldKnown = prior.tenant, true
		}
		if oldKnown && ((old != nil) != hasTenant || (old != nil && *old != string(tenant))) {
			oldKey := c.OldKey
			if oldKey == nil {
				oldKey = c.Key
			}
			if err := s.encodeMoved(c, &st, oldKey, old); err != nil {
				return err
			}
			s.learn(c.Entity, oldKey, old)
		}
	}

	seq := s.next
	s.next++
	st.seq++
	s.dirty[c.Entity] = st
	if c.Op == decoder.OpResync {
		s.resyncSeq = seq
	}
	if !unknown && c.Key != nil && st.tenanted {
		var v *string
		if hasTenant {
			x := string(tenant)
			v = &x
		}
		s.learn(c.Entity, c.Key, v)
	}

	e := append(s.env[:0], seqPrefix...)
	e = strconv.AppendInt(e, seq, 10)
	e = append(e, entitySeqInfix...)
	e = strconv.AppendInt(e, st.seq, 10)
	e = append(e, ',')
	if suffix == nil {
		e = append(e, body[1:]...)
	} else {
		e = append(e, body[1:len(body)-1]...)
		e = append(e, suffix...)
	}
	s.env = e
	s.row(c, seq, st, c.Op, c.Key, tenant, hasTenant, unknown, e)
	return nil
}

// learn records the tenant (nil: none) of the newest change of a key of a
// tenanted entity so far: for the batch's later changes that look it up,
// and for later appends (keys).
func (s *copySource) learn(entity string, key []byte, tenant *string) {
	if s.keys != nil {
		t := keyTenant{has: tenant != nil}
		if tenant != nil {
			t.tenant = *tenant
		}
		s.keys.put(entity, key, t)
	}
	if s.resolve == nil {
		return
	}
	if r := s.resolve[entity][string(key)]; r != nil {
		r.found, r.tenant = true, tenant
	}
}

// movedKV marks the delete an update's move to another tenant is journaled
// with (see encodeMoved).
var movedKV = []byte(`,"moved":"tenant"}`)

// encodeMoved appends the entry that takes a row out of its old tenant when
// update c moves it to another (DESIGN §5): a delete of the old key in the
// old tenant (nil: none), journaled just before the update with its own seq
// and entitySeq, and marked "moved":"tenant". It is shaped as a key-only
// delete — key and before both the old key — with the update's position,
// transaction and entity, and says nothing of the new tenant.
func (s *copySource) encodeMoved(c *decoder.Change, st *entityState, oldKey []byte, old *string) error {
	body := c.Body
	// The body is `{"lsn":…,"commitTime":"…","entity":"…","op":"update",…}`;
	// the entity is a JSON string, in which `,"` cannot occur, so the first
	// `,"op":"` after `,"entity":` is the op's.
	i := bytes.Index(body, entityKey)
	var k int
	if i >= 0 {
		k = bytes.Index(body[i:], opKey)
	}
	if i < 0 || k < 0 {
		return fmt.Errorf("%w: update at %s in transaction %d: body has no entity and op", ErrUnencodable, c.LSN, s.cur.Xid)
	}
	seq := s.next
	s.next++
	st.seq++
	e := append(s.env[:0], seqPrefix...)
	e = strconv.AppendInt(e, seq, 10)
	e = append(e, entitySeqInfix...)
	e = strconv.AppendInt(e, st.seq, 10)
	e = append(e, ',')
	e = append(e, body[1:i+k]...)
	e = append(e, `,"op":"delete","key":`...)
	e = append(e, oldKey...)
	e = append(e, `,"before":`...)
	e = append(e, oldKey...)
	var tenant []byte
	if old != nil {
		tenant = []byte(*old)
		q, _ := json.Marshal(*old)
		e = append(e, `,"tenant":`...)
		e = append(e, q...)
	}
	e = append(e, movedKV...)
	s.env = e
	s.moved++
	s.row(c, seq, *st, decoder.OpDelete, oldKey, tenant, old != nil, false, e)
	return nil
}

var (
	entityKey = []byte(`,"entity":`)
	opKey     = []byte(`,"op":"`)
)

// row adds one entry with envelope e to the current chunk, first encoding
// the chunk as a COPY row if it is full.
func (s *copySource) row(c *decoder.Change, seq int64, st entityState, op decoder.Op, key, tenant []byte, hasTenant, unknown bool, e []byte) {
	t := s.cur
	s.bytes += int64(len(e))
	if s.chunk == nil {
		s.chunk = newChunkBuilder()
	}
	k := s.chunk
	if k.full() {
		s.buf = k.row(s.buf)
	}
	if k.n == 0 {
		k.first = seq
	}
	k.n++
	k.bytes += len(e)
	k.entity.str(c.Entity)
	k.entitySeq.int8(st.seq)
	if hasTenant {
		k.tenant.text(tenant)
	} else {
		k.tenant.null()
	}
	k.unknown.bool(unknown)
	k.op.str(string(op))
	// Only entities that carry tenants need their keys found again (to
	// route a key-only delete, to see a row change tenant); indexing the
	// others' keys would tax every append for nothing.
	if key != nil && st.tenanted {
		k.keyHash.int8(keyHash(c.Entity, key))
	} else {
		k.keyHash.null()
	}
	if key != nil {
		k.key.text(key)
	} else {
		k.key.null()
	}
	k.lsn.int8(int64(c.LSN))
	k.commitLSN.int8(int64(t.EndLSN))
	k.xid.int8(int64(t.Xid))
	k.commitTime.int8(t.CommitTime.UnixMicro() - pgEpoch)
	k.size.int4(int32(len(e)))
	k.envelope.text(e)
	if x, ok := xid8(t); ok {
		k.xid8.int8(x)
	} else {
		k.xid8.null() // unknown
	}
	if s.keep != nil {
		s.keep.add(rowEntry(c, t, seq, st.seq, op, tenant, hasTenant, unknown), e)
	}
}

// xid8 is the entries.xid8 value of t's rows: its 64-bit xid, 0 for an
// entry of no transaction (xid 0), and false (NULL) when the full xid is
// not known or does not extend the 32-bit one.
func xid8(t *decoder.Transaction) (int64, bool) {
	switch {
	case t.Xid == 0:
		return 0, true
	case t.Xid8 == 0 || uint32(t.Xid8) != t.Xid || t.Xid8 > math.MaxInt64:
		return 0, false
	}
	return int64(t.Xid8), true
}

func appendInt8(b []byte, v int64) []byte {
	b = binary.BigEndian.AppendUint32(b, 8)
	return binary.BigEndian.AppendUint64(b, uint64(v))
}
