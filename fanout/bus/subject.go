// Package bus is the NATS contract between walcast's publisher
// (fanout/publish) and its sync nodes (fanout/sync): how subjects are built
// and escaped, the headers every published change carries, and how walcast
// connects to NATS (or embeds a server). Both sides import it so they can
// never disagree; it imports neither, reads no journal and keeps no state.
package bus

import (
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
// '>', '%', spaces, control bytes and every byte of a non-ASCII UTF-8
// character) become '%' and two upper-case hex digits. A change with no
// tenant uses the token "_"; a tenant whose value is "_" is written "%5F",
// and an empty tenant "%", so neither collides with it.
const NoTenantToken = "_"

const hexDigits = "0123456789ABCDEF"

func plainByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// EscapeToken escapes one name for use as a single subject token.
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
// EscapeToken cannot produce.
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
// entity is the envelope's entity (decoder.EntityName for tables).
func Subject(prefix string, op decoder.Op, entity, tenant string, hasTenant bool) string {
	switch op {
	case decoder.OpResync:
		return prefix + ".resync"
	case decoder.OpMessage:
		return prefix + ".message." + EscapeToken(entity)
	}
	t := NoTenantToken
	if hasTenant {
		t = EscapeToken(tenant)
	}
	return entityBase(prefix, entity) + "." + t
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
	return prefix + ".change." + EscapeToken(schema) + "." + EscapeToken(table)
}
