// Package bus is the NATS contract between walcast's publisher
// (fanout/publish) and its sync nodes (fanout/sync): how subjects are built
// and escaped, the headers every published change carries, and how walcast
// connects to NATS (or embeds a server). Both sides import it so they can
// never disagree; it imports neither, reads no journal and keeps no state.
package bus

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/walcast/walcast/decoder"
)

// Subject layout (DESIGN §3):
//
//	<prefix>.change.<schema>.<table>.<tenant>
//
// Each of schema, table and tenant is one subject token, escaped with
// EscapeToken so that no name can change the subject's shape or collide with
// another: bytes other than ASCII letters, digits, '-' and '_' (so '.', '*',
// '>', '%', '~', spaces, control bytes and every byte of a non-ASCII UTF-8
// character) become '%' and two upper-case hex digits. A change with no
// tenant uses the token "_"; a tenant whose value is "_" is written "%5F",
// and an empty tenant "%", so neither collides with it.
//
// Every token is bounded: a name whose escaped form is longer than
// MaxTokenBytes is written as HashedTokenPrefix ("~") followed by the 64
// lower-case hex digits of the SHA-256 of the name's raw bytes (65 bytes in
// all). EscapeToken never writes '~' (it escapes it as "%7E"), so a hashed
// token can never equal the escaped form of any name, and two names share a
// hashed token only if they share a SHA-256. With a prefix of at most
// MaxPrefixBytes every subject walcast builds is at most MaxSubjectBytes,
// far below the NATS server's control-line limit (4 KB by default), so no
// name in the source database can make a PUB or SUB line the server
// refuses. Both the publisher and the sync node build subjects only through
// this file, so routing stays exact for hashed tokens too.
const NoTenantToken = "_"

// Token and subject bounds.
const (
	// MaxTokenBytes is the longest escaped token written as is; longer ones
	// are hashed. 192 holds any PostgreSQL identifier (63 bytes) escaped
	// byte by byte.
	MaxTokenBytes = 192
	// HashedTokenPrefix starts a hashed token.
	HashedTokenPrefix = "~"
	// MaxPrefixBytes bounds the subject prefix (CheckPrefix).
	MaxPrefixBytes = 128
	// MaxSubjectBytes bounds every subject Subject and EntitySubjects
	// return: prefix, ".change.", three tokens and two dots.
	MaxSubjectBytes = MaxPrefixBytes + len(".change.") + 3*MaxTokenBytes + 2
)

// CheckPrefix validates a subject prefix: 1 to MaxPrefixBytes bytes of
// dot-separated tokens of ASCII letters, digits, '-' and '_'.
func CheckPrefix(prefix string) error {
	if prefix == "" || len(prefix) > MaxPrefixBytes {
		return fmt.Errorf("subject prefix %.40q: want 1 to %d bytes (fix: --subject-prefix walcast)", prefix, MaxPrefixBytes)
	}
	for _, tok := range strings.Split(prefix, ".") {
		if tok == "" {
			return errors.New("subject prefix has an empty token (fix: no leading, trailing or double dots in --subject-prefix)")
		}
		for i := 0; i < len(tok); i++ {
			if !plainByte(tok[i]) {
				return fmt.Errorf("subject prefix %q: byte %q is not allowed (fix: use letters, digits, '-', '_' and dots in --subject-prefix)", prefix, tok[i])
			}
		}
	}
	return nil
}

const hexDigits = "0123456789ABCDEF"

func plainByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// Token is the subject token of one name: EscapeToken's form when it is at
// most MaxTokenBytes long, the hashed form otherwise. Every subject token
// walcast builds comes from here.
func Token(s string) string {
	if escapedLen(s) <= MaxTokenBytes {
		return EscapeToken(s)
	}
	sum := sha256.Sum256([]byte(s))
	return HashedTokenPrefix + hex.EncodeToString(sum[:])
}

// IsHashedToken reports whether tok is a hashed token (which UnescapeToken
// cannot reverse).
func IsHashedToken(tok string) bool { return strings.HasPrefix(tok, HashedTokenPrefix) }

// TenantToken is the tenant token of a change: NoTenantToken when it has no
// tenant, Token(tenant) otherwise (so "" and "_" are tenants distinct from
// none).
func TenantToken(tenant string, hasTenant bool) string {
	if !hasTenant {
		return NoTenantToken
	}
	return Token(tenant)
}

// escapedLen is len(EscapeToken(s)) without building it.
func escapedLen(s string) int {
	switch s {
	case "", NoTenantToken:
		return len(EscapeToken(s))
	}
	n := len(s)
	for i := 0; i < len(s); i++ {
		if !plainByte(s[i]) {
			n += 2
		}
	}
	return n
}

// EscapeToken escapes one name for use as a single subject token, whatever
// its length; subjects use Token, which bounds it.
func EscapeToken(s string) string {
	switch s {
	case "":
		return "%"
	case NoTenantToken:
		return "%5F"
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if !plainByte(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plainByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}

// UnescapeToken reverses EscapeToken. It reports false for a token
// EscapeToken cannot produce, hashed tokens included.
func UnescapeToken(tok string) (string, bool) {
	switch tok {
	case "%":
		return "", true
	case "":
		return "", false
	}
	if !strings.Contains(tok, "%") {
		for i := 0; i < len(tok); i++ {
			if !plainByte(tok[i]) {
				return "", false
			}
		}
		return tok, true
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case plainByte(c):
			b.WriteByte(c)
		case c == '%' && i+2 < len(tok):
			hi, lo := unhex(tok[i+1]), unhex(tok[i+2])
			if hi < 0 || lo < 0 {
				return "", false
			}
			b.WriteByte(byte(hi<<4 | lo))
			i += 2
		default:
			return "", false
		}
	}
	return b.String(), true
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// Subject is the subject of a journaled change (DESIGN §3):
//
//   - row changes and truncates: <prefix>.change.<schema>.<table>.<tenant>,
//     tenant "_" when the change has none;
//   - logical decoding messages: <prefix>.message.<message prefix>;
//   - resync entries: <prefix>.resync.
//
// The publisher's position (PositionSubject) has a subject of its own.
//
// entity is the envelope's entity (decoder.EntityName for tables). With a
// prefix that passes CheckPrefix the subject is at most MaxSubjectBytes.
func Subject(prefix string, op decoder.Op, entity, tenant string, hasTenant bool) string {
	switch op {
	case decoder.OpResync:
		return prefix + ".resync"
	case decoder.OpMessage:
		return prefix + ".message." + Token(entity)
	}
	return entityBase(prefix, entity) + "." + TenantToken(tenant, hasTenant)
}

// PositionSubject carries the publisher's position: a message with no body
// whose Walcast-Seq is the seq of the last entry published before it and
// whose Walcast-Epoch is the journal epoch. Sync nodes use it to move quiet
// subscribers' positions (DESIGN §6). No journal entry is published on it.
func PositionSubject(prefix string) string { return prefix + ".position" }

// TenantOf returns the tenant token of a change subject built by Subject
// (its last token), or false when subject is not one.
func TenantOf(subject string) (string, bool) {
	i := strings.LastIndexByte(subject, '.')
	if i < 0 || i == len(subject)-1 {
		return "", false
	}
	return subject[i+1:], true
}

// EntitySubjects is the subscription that receives every change of a table
// entity, for every tenant.
func EntitySubjects(prefix, entity string) string {
	return entityBase(prefix, entity) + ".*"
}

func entityBase(prefix, entity string) string {
	schema, table, ok := decoder.SplitEntity(entity)
	if !ok {
		// Not a table entity: keep it whole in the table position so it can
		// never alias a real table (whose schema token is never "%").
		schema, table = "", entity
	}
	return prefix + ".change." + Token(schema) + "." + Token(table)
}
