package journal

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"slices"
)

// A cursor is base64url (unpadded) of
//
//	version 2: 2 | journal id(16) | epoch(8) | position(8) | scope hash(16) | HMAC-SHA256(32)
//	version 1: 1 | journal id(16) | position(8) | scope hash(16) | HMAC-SHA256(32)
//
// (integers big endian) where the HMAC covers a domain-separation label of
// the version and every preceding byte, and the scope hash is the first 16
// bytes of SHA-256 over the canonical scope (tenant mode, tenant, sorted
// distinct entities, each length-prefixed). The position is the seq of the
// last entry handed to the reader; the epoch is the journal's epoch when the
// cursor was issued (Epoch). Version 1 cursors, issued before epochs
// existed, are read as epoch 0, a journal's first epoch, so they stay valid
// until the epoch changes. Only version 2 is issued.
const (
	cursorVersion   = 2
	cursorPayload   = 1 + 16 + 8 + 8 + 16
	cursorLen       = cursorPayload + sha256.Size
	cursorLabel     = "walcast journal cursor v2\x00"
	cursorV1Payload = 1 + 16 + 8 + 16
	cursorV1Len     = cursorV1Payload + sha256.Size
	cursorV1Label   = "walcast journal cursor v1\x00"
)

// scope is what a cursor is bound to: the entity filter and tenant scope of
// the query it was issued for.
type scope struct {
	entities   []string // sorted, distinct; empty = all entities
	tenant     string
	allTenants bool
	view       string
}

func newScope(q Query) scope {
	ents := slices.Clone(q.Entities)
	slices.Sort(ents)
	ents = slices.Compact(ents)
	s := scope{entities: ents, tenant: q.Tenant, allTenants: q.AllTenants, view: q.View}
	if s.allTenants {
		s.tenant = ""
	}
	return s
}

func (s scope) hash() [16]byte {
	h := sha256.New()
	mode := byte('u') // unscoped
	switch {
	case s.allTenants:
		mode = 'a'
	case s.tenant != "":
		mode = 't'
	}
	var n [8]byte
	h.Write([]byte{mode})
	binary.BigEndian.PutUint64(n[:], uint64(len(s.tenant)))
	h.Write(n[:])
	h.Write([]byte(s.tenant))
	binary.BigEndian.PutUint64(n[:], uint64(len(s.entities)))
	h.Write(n[:])
	for _, e := range s.entities {
		binary.BigEndian.PutUint64(n[:], uint64(len(e)))
		h.Write(n[:])
		h.Write([]byte(e))
	}
	if s.view != "" {
		// After the entities, so a scope without a view hashes as it
		// always has.
		binary.BigEndian.PutUint64(n[:], uint64(len(s.view)))
		h.Write([]byte{'v'})
		h.Write(n[:])
		h.Write([]byte(s.view))
	}
	var out [16]byte
	copy(out[:], h.Sum(nil))
	return out
}

type cursor struct {
	journal  [16]byte
	epoch    int64
	position int64
	scope    [16]byte
}

func mac(label string, secret, payload []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	m.Write(payload)
	return m.Sum(nil)
}

// encodeCursor signs c with secret.
func encodeCursor(c cursor, secret []byte) string {
	b := make([]byte, cursorPayload, cursorLen)
	b[0] = cursorVersion
	copy(b[1:17], c.journal[:])
	binary.BigEndian.PutUint64(b[17:25], uint64(c.epoch))
	binary.BigEndian.PutUint64(b[25:33], uint64(c.position))
	copy(b[33:49], c.scope[:])
	b = append(b, mac(cursorLabel, secret, b)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeCursor parses s and verifies its HMAC under each secret in turn
// (current first), comparing in constant time. It returns the index of the
// secret that verified, or ok=false when the cursor is malformed or verifies
// under none.
func decodeCursor(s string, secrets [][]byte) (c cursor, secretIdx int, ok bool) {
	var payloadLen, off int
	var label string
	switch base64.RawURLEncoding.DecodedLen(len(s)) {
	case cursorLen:
		payloadLen, off, label = cursorPayload, 8, cursorLabel
	case cursorV1Len:
		payloadLen, off, label = cursorV1Payload, 0, cursorV1Label
	default:
		return cursor{}, 0, false
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != payloadLen+sha256.Size {
		return cursor{}, 0, false
	}
	if (off == 8 && b[0] != cursorVersion) || (off == 0 && b[0] != 1) {
		return cursor{}, 0, false
	}
	// Re-encoding must give the same string: rejects non-canonical base64
	// (stray bits in the last character), so one cursor has one spelling.
	if base64.RawURLEncoding.EncodeToString(b) != s {
		return cursor{}, 0, false
	}
	payload, sum := b[:payloadLen], b[payloadLen:]
	idx := -1
	for i, secret := range secrets {
		if hmac.Equal(mac(label, secret, payload), sum) && idx < 0 {
			idx = i
		}
	}
	if idx < 0 {
		return cursor{}, 0, false
	}
	copy(c.journal[:], b[1:17])
	if off == 8 {
		c.epoch = int64(binary.BigEndian.Uint64(b[17:25]))
	}
	c.position = int64(binary.BigEndian.Uint64(b[17+off : 25+off]))
	copy(c.scope[:], b[25+off:41+off])
	if c.position < 0 || c.epoch < 0 {
		return cursor{}, 0, false
	}
	return c, idx, true
}

// CursorPosition returns the position (the seq of the last entry delivered)
// an authentic cursor holds, for logs and tests. It does not check journal or
// scope.
func (j *Journal) CursorPosition(s string) (int64, error) {
	if len(j.secrets) == 0 {
		return 0, opErr("journal.CursorPosition", ErrNoCursorSecret, "set --cursor-secret")
	}
	c, _, ok := decodeCursor(s, j.secrets)
	if !ok {
		return 0, opErr("journal.CursorPosition", ErrCursorTampered, "")
	}
	return c.position, nil
}
