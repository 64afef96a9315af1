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
//	version(1) | journal id(16) | position(8, big endian) | scope hash(16) | HMAC-SHA256(32)
//
// where the HMAC covers a domain-separation label and every preceding byte,
// and the scope hash is the first 16 bytes of SHA-256 over the canonical
// scope (tenant mode, tenant, sorted distinct entities, each length-prefixed).
// The position is the seq of the last entry handed to the reader.
const (
	cursorVersion = 1
	cursorPayload = 1 + 16 + 8 + 16
	cursorLen     = cursorPayload + sha256.Size
	cursorLabel   = "walcast journal cursor v1\x00"
)

// scope is what a cursor is bound to: the entity filter and tenant scope of
// the query it was issued for.
type scope struct {
	entities   []string // sorted, distinct; empty = all entities
	tenant     string
	allTenants bool
}

func newScope(q Query) scope {
	ents := slices.Clone(q.Entities)
	slices.Sort(ents)
	ents = slices.Compact(ents)
	s := scope{entities: ents, tenant: q.Tenant, allTenants: q.AllTenants}
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
	var out [16]byte
	copy(out[:], h.Sum(nil))
	return out
}

type cursor struct {
	journal  [16]byte
	position int64
	scope    [16]byte
}

func mac(secret, payload []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(cursorLabel))
	m.Write(payload)
	return m.Sum(nil)
}

// encodeCursor signs c with secret.
func encodeCursor(c cursor, secret []byte) string {
	b := make([]byte, cursorPayload, cursorLen)
	b[0] = cursorVersion
	copy(b[1:17], c.journal[:])
	binary.BigEndian.PutUint64(b[17:25], uint64(c.position))
	copy(b[25:41], c.scope[:])
	b = append(b, mac(secret, b)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeCursor parses s and verifies its HMAC under each secret in turn
// (current first), comparing in constant time. It returns the index of the
// secret that verified, or ok=false when the cursor is malformed or verifies
// under none.
func decodeCursor(s string, secrets [][]byte) (c cursor, secretIdx int, ok bool) {
	if base64.RawURLEncoding.DecodedLen(len(s)) != cursorLen {
		return cursor{}, 0, false
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != cursorLen || b[0] != cursorVersion {
		return cursor{}, 0, false
	}
	// Re-encoding must give the same string: rejects non-canonical base64
	// (stray bits in the last character), so one cursor has one spelling.
	if base64.RawURLEncoding.EncodeToString(b) != s {
		return cursor{}, 0, false
	}
	payload, sum := b[:cursorPayload], b[cursorPayload:]
	idx := -1
	for i, secret := range secrets {
		if hmac.Equal(mac(secret, payload), sum) && idx < 0 {
			idx = i
		}
	}
	if idx < 0 {
		return cursor{}, 0, false
	}
	copy(c.journal[:], b[1:17])
	c.position = int64(binary.BigEndian.Uint64(b[17:25]))
	copy(c.scope[:], b[25:41])
	if c.position < 0 {
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
