package filter

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/walcast/walcast/decoder"
)

// kind is how a column's values compare, decided once per column from the
// decoder's rules for its type (decoder.JSONOf) and its type's name.
type kind uint8

const (
	kText        kind = iota // text, varchar, name, "char": bytes, every op
	kBpchar                  // character(n): bytes without trailing spaces
	kUUID                    // uuid: canonical lower-case text, every op
	kTextEq                  // other types carried as text: exact text, equality only
	kBool                    // false < true
	kInt                     // int2, int4, int8, oid: exact integers
	kIntEq                   // xid, cid: integers, equality only
	kFloat                   // float4, float8: IEEE with PostgreSQL's NaN order
	kNumeric                 // numeric: exact decimals, NaN and ±Infinity
	kTimestamptz             // instants, ±infinity
	kTimestamp               // wall-clock times, ±infinity
	kBytea                   // bytes as base64, equality only
	kJSON                    // json, jsonb: is null / is not null only
	kNullOnly                // arrays: is null / is not null only
)

// column is a published column as the filter sees it.
type column struct {
	name   string
	typ    string // the type's name, for messages
	kind   kind
	lo, hi int64 // kInt, kIntEq: the type's range
	f32    bool  // kFloat: float4
}

// builtinNames names the built-in types whose rules differ here.
var builtinNames = map[uint32]string{
	16: "bool", 17: "bytea", 18: "char", 19: "name", 20: "int8", 21: "int2", 23: "int4", 25: "text", 26: "oid",
	28: "xid", 29: "cid", 114: "json", 700: "float4", 701: "float8", 1042: "bpchar", 1043: "varchar",
	1082: "date", 1083: "time", 1114: "timestamp", 1184: "timestamptz", 1186: "interval", 1266: "timetz",
	1700: "numeric", 2950: "uuid", 3802: "jsonb", 5069: "xid8", 869: "inet", 650: "cidr", 829: "macaddr",
}

func typeName(ci decoder.ColumnInfo) string {
	if ci.TypeOID < 10000 {
		if n, ok := builtinNames[ci.TypeOID]; ok {
			return n
		}
		return fmt.Sprintf("type %d", ci.TypeOID)
	}
	if ci.BaseSchema == "" || ci.BaseSchema == "pg_catalog" {
		return ci.BaseName
	}
	return ci.BaseSchema + "." + ci.BaseName
}

func resolve(ci decoder.ColumnInfo) column {
	c := column{name: ci.Name, typ: typeName(ci)}
	j := decoder.JSONOf(ci)
	if j.Array {
		c.kind = kNullOnly
		if !strings.HasSuffix(c.typ, "[]") {
			c.typ = "an array"
		}
		return c
	}
	switch j.Kind {
	case decoder.JSONBool:
		c.kind = kBool
	case decoder.JSONInteger:
		c.kind, c.lo, c.hi = kInt, math.MinInt64, math.MaxInt64
		switch c.typ {
		case "int2":
			c.lo, c.hi = math.MinInt16, math.MaxInt16
		case "int4":
			c.lo, c.hi = math.MinInt32, math.MaxInt32
		case "oid":
			c.lo, c.hi = 0, math.MaxUint32
		case "xid", "cid":
			c.kind, c.lo, c.hi = kIntEq, 0, math.MaxUint32
		}
	case decoder.JSONInt8:
		c.kind, c.lo, c.hi = kInt, math.MinInt64, math.MaxInt64
	case decoder.JSONFloat:
		c.kind, c.f32 = kFloat, c.typ == "float4"
	case decoder.JSONNumeric:
		c.kind = kNumeric
	case decoder.JSONEmbedded:
		c.kind = kJSON
	case decoder.JSONBytes:
		c.kind = kBytea
	case decoder.JSONTimestamp:
		c.kind = kTimestamp
	case decoder.JSONTimestamptz:
		c.kind = kTimestamptz
	default:
		switch c.typ {
		case "text", "varchar", "name", "char":
			c.kind = kText
		case "bpchar":
			c.kind = kBpchar
		case "uuid":
			c.kind = kUUID
		default:
			c.kind = kTextEq
		}
	}
	return c
}

// supports says why col cannot take op, "" when it can.
func (c *column) supports(op opcode) string {
	switch c.kind {
	case kJSON, kNullOnly:
		if op != opIsNull && op != opNotNull {
			return fmt.Sprintf(`column %q is %s; it can only be tested with "is null" and "is not null"`, c.name, c.typ)
		}
	case kTextEq, kIntEq, kBytea:
		if op >= opLt && op <= opGe {
			why := "its values compare only as equal or not"
			if c.kind == kTextEq {
				why = "its values are compared as their text, which does not order as the type does"
			}
			return fmt.Sprintf(`column %q is %s, which has no order here (%s); use "=", "<>", "in", "is null" or "is not null"`, c.name, c.typ, why)
		}
	}
	return ""
}

// value is one typed value: a constant of the filter or a row's value.
// Which field holds it depends on the column's kind.
type value struct {
	i  int64   // kInt, kIntEq; microseconds since 2000-01-01 for timestamps
	f  float64 // kFloat
	d  decimal // kNumeric
	bs []byte  // text kinds and kBytea (its base64 text)
	b  bool    // kBool
}

// constant converts a filter value for c, or says what to give instead.
func (c *column) constant(t token) (value, string) {
	switch c.kind {
	case kBool:
		if t.kind != tokBool {
			return value{}, "give true or false"
		}
		return value{b: t.b}, ""
	case kInt, kIntEq:
		want := "give an integer number"
		if c.hi == math.MaxInt64 {
			want = "give an integer number or a string of its decimal digits"
		}
		var s string
		switch {
		case t.kind == tokNumber:
			s = t.num
		case t.kind == tokString && c.hi == math.MaxInt64:
			s = t.s
		default:
			return value{}, want
		}
		d, ok := parseDecimal([]byte(s), nil)
		if !ok || d.class != finite {
			return value{}, want
		}
		i, ok := d.int64()
		switch {
		case !ok && int(d.exp) < len(d.digits):
			return value{}, fmt.Sprintf("%s is not an integer; %s", s, want)
		case !ok:
			return value{}, fmt.Sprintf("%s is out of its range (%d to %d)", s, c.lo, c.hi)
		}
		if i < c.lo || i > c.hi {
			return value{}, fmt.Sprintf("%s is out of its range (%d to %d)", s, c.lo, c.hi)
		}
		return value{i: i}, ""
	case kFloat:
		want := `give a number, or "NaN", "Infinity" or "-Infinity"`
		switch t.kind {
		case tokNumber:
			f, err := strconv.ParseFloat(t.num, c.bits())
			if err != nil {
				return value{}, fmt.Sprintf("%s is out of its range", t.num)
			}
			return value{f: f}, ""
		case tokString:
			if f, ok := specialFloat([]byte(t.s)); ok {
				return value{f: f}, ""
			}
		}
		return value{}, want
	case kNumeric:
		want := `give a number or a decimal string ("12.50", "NaN", "Infinity", "-Infinity")`
		var s string
		switch t.kind {
		case tokNumber:
			s = t.num
		case tokString:
			s = strings.TrimSpace(t.s)
		default:
			return value{}, want
		}
		d, ok := parseDecimal([]byte(s), nil)
		if !ok {
			return value{}, fmt.Sprintf("%q is not a decimal number; %s", s, want)
		}
		return value{d: d}, ""
	case kTimestamptz, kTimestamp:
		want := `give an RFC 3339 string with its offset, such as "2026-11-29T23:21:24.5Z" or "2026-11-30T00:21:24+01:00" (or "infinity", "-infinity")`
		if c.kind == kTimestamp {
			want = `give an RFC 3339 date and time without an offset, such as "2026-11-29T23:21:24.5" (or "infinity", "-infinity"), since the column names no instant`
		}
		if t.kind != tokString {
			return value{}, want
		}
		us, zone, ok := parseTimestamp([]byte(t.s), true)
		if !ok || zone != (c.kind == kTimestamptz) && us != math.MinInt64 && us != math.MaxInt64 {
			return value{}, fmt.Sprintf("%q is not such a value; %s (at most six fractional digits)", t.s, want)
		}
		return value{i: us}, ""
	case kBytea:
		if t.kind != tokString {
			return value{}, "give its bytes as a standard base64 string"
		}
		b, err := base64.StdEncoding.DecodeString(t.s)
		if err != nil {
			return value{}, "give its bytes as a standard base64 string (with padding)"
		}
		return value{bs: []byte(base64.StdEncoding.EncodeToString(b))}, ""
	}
	// Text kinds.
	if t.kind != tokString {
		return value{}, "give a string"
	}
	if strings.IndexByte(t.s, 0) >= 0 {
		return value{}, "a string holds U+0000, which no PostgreSQL text can; remove it"
	}
	switch c.kind {
	case kBpchar:
		return value{bs: bytes.TrimRight([]byte(t.s), " ")}, ""
	case kUUID:
		u, ok := canonicalUUID(t.s)
		if !ok {
			return value{}, `give it as 32 hex digits in groups 8-4-4-4-12, such as "0b7e5a1c-61f2-4b0e-9d0a-6f1c2e3d4a5b"`
		}
		return value{bs: u}, ""
	}
	return value{bs: []byte(t.s)}, ""
}

// intOrdered reports whether c's values compare as their int64 field.
func (c *column) intOrdered() bool {
	switch c.kind {
	case kInt, kIntEq, kTimestamptz, kTimestamp:
		return true
	}
	return false
}

func (c *column) bits() int {
	if c.f32 {
		return 32
	}
	return 64
}

// parse reads a row's non-null JSON value raw (as the decoder writes it
// for c's type); buf is scratch space the result may point into. ok is
// false when the value does not have the form the type's rule promises.
func (c *column) parse(raw, buf []byte) (v value, ok bool) {
	quoted := len(raw) >= 2 && raw[0] == '"'
	var s []byte
	if quoted {
		s, ok = unquote(raw, buf)
		if !ok {
			return v, false
		}
	}
	switch c.kind {
	case kBool:
		switch string(raw) {
		case "true":
			return value{b: true}, true
		case "false":
			return value{}, true
		}
		return v, false
	case kInt, kIntEq:
		if quoted {
			raw = s
		}
		i, ok := parseInt(raw)
		return value{i: i}, ok
	case kFloat:
		if quoted {
			f, ok := specialFloat(s)
			return value{f: f}, ok
		}
		f, err := strconv.ParseFloat(string(raw), c.bits())
		return value{f: f}, err == nil
	case kNumeric:
		if quoted {
			raw = s
		}
		d, ok := parseDecimal(raw, buf[len(buf):])
		return value{d: d}, ok
	case kTimestamptz, kTimestamp:
		if !quoted {
			return v, false
		}
		us, _, ok := parseTimestamp(s, false)
		return value{i: us}, ok
	case kBpchar:
		if !quoted {
			return v, false
		}
		return value{bs: bytes.TrimRight(s, " ")}, true
	}
	if !quoted {
		return v, false
	}
	return value{bs: s}, true
}

// unquote returns the text of JSON string raw: a slice of raw when it holds
// no escapes, otherwise decoded into buf.
func unquote(raw, buf []byte) ([]byte, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, false
	}
	in := raw[1 : len(raw)-1]
	if bytes.IndexByte(in, '\\') < 0 {
		return in, true
	}
	out := buf
	for i := 0; i < len(in); i++ {
		c := in[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		if i >= len(in) {
			return nil, false
		}
		switch in[i] {
		case '"', '\\', '/':
			out = append(out, in[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, _, ok := hex4(in[i+1:])
			if !ok {
				return nil, false
			}
			i += 4
			if r >= 0xD800 && r < 0xDC00 && i+6 < len(in) && in[i+1] == '\\' && in[i+2] == 'u' {
				if r2, _, ok := hex4(in[i+3:]); ok && r2 >= 0xDC00 && r2 < 0xE000 {
					r = 0x10000 + (r-0xD800)<<10 + (r2 - 0xDC00)
					i += 6
				}
			}
			if r >= 0xD800 && r < 0xE000 {
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, false
		}
	}
	return out, true
}

// specialFloat reads the strings the decoder writes for float specials (and
// the spellings PostgreSQL accepts for them).
func specialFloat(s []byte) (float64, bool) {
	c, ok := specialClass(s)
	switch {
	case !ok:
		return 0, false
	case c == nan:
		return math.NaN(), true
	case c == posInf:
		return math.Inf(1), true
	}
	return math.Inf(-1), true
}

// cmpFloat orders floats as PostgreSQL does: NaN equals NaN and is greater
// than every other value, -0 equals 0.
func cmpFloat(a, b float64) int {
	an, bn := a != a, b != b
	switch {
	case an && bn:
		return 0
	case an:
		return 1
	case bn:
		return -1
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func canonicalUUID(s string) ([]byte, bool) {
	if len(s) != 36 {
		return nil, false
	}
	out := make([]byte, 36)
	for i := 0; i < 36; i++ {
		c := s[i]
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if c != '-' {
				return nil, false
			}
			out[i] = c
			continue
		}
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		case c >= 'A' && c <= 'F':
			c += 'a' - 'A'
		default:
			return nil, false
		}
		out[i] = c
	}
	return out, true
}

// parseInt reads a decimal integer as the decoder writes one; short values
// skip strconv.
func parseInt(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		i, err := strconv.ParseInt(string(b), 10, 64)
		return i, err == nil
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
		if len(b) == 0 {
			return 0, false
		}
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}
