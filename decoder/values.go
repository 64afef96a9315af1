package decoder

import (
	"encoding/base64"
	"time"
	"unicode/utf8"
)

// kind is how a column's text value becomes JSON; the rules are in the
// package documentation (Values).
type kind uint8

const (
	kText kind = iota
	kBool
	kInt
	kInt8
	kFloat
	kNumeric
	kJSON
	kBytea
	kTimestamp
	kTimestamptz
	kArray
)

// colType is a column's decoding rule.
type colType struct {
	kind  kind
	elem  kind // element kind for kArray
	delim byte // element delimiter for kArray
}

// scalarKind maps built-in scalar type OIDs that are not plain text.
func scalarKind(oid uint32) kind {
	switch oid {
	case 16:
		return kBool
	case 21, 23, 26, 28, 29:
		return kInt
	case 20:
		return kInt8
	case 700, 701:
		return kFloat
	case 1700:
		return kNumeric
	case 114, 3802:
		return kJSON
	case 17:
		return kBytea
	case 1114:
		return kTimestamp
	case 1184:
		return kTimestamptz
	}
	return kText
}

// arrayElem maps built-in array type OIDs (hand-assigned, below
// FirstGenbkiObjectId) to their element type OID (pg_type.typelem of the
// varlena types of typcategory 'A'; int2vector and oidvector, fixed-layout
// and printed as "1 2 3", are not among them). box[] is the only one whose
// delimiter is ';'. TestCatalogTypes checks it against a real server.
var arrayElem = map[uint32]uint32{
	143: 142, 199: 114, 210: 71, 270: 75, 271: 5069, 272: 81, 273: 83, 629: 628, 651: 650, 719: 718, 775: 774, 791: 790,
	1000: 16, 1001: 17, 1002: 18, 1003: 19, 1005: 21, 1006: 22, 1007: 23, 1008: 24,
	1009: 25, 1010: 27, 1011: 28, 1012: 29, 1013: 30, 1014: 1042, 1015: 1043, 1016: 20,
	1017: 600, 1018: 601, 1019: 602, 1020: 603, 1021: 700, 1022: 701, 1027: 604, 1028: 26,
	1034: 1033, 1040: 829, 1041: 869, 1115: 1114, 1182: 1082, 1183: 1083, 1185: 1184,
	1187: 1186, 1231: 1700, 1263: 2275, 1270: 1266, 1561: 1560, 1563: 1562, 2201: 1790,
	2207: 2202, 2208: 2203, 2209: 2204, 2210: 2205, 2211: 2206, 2949: 2970, 2951: 2950,
	3221: 3220, 3643: 3614, 3644: 3642, 3645: 3615, 3735: 3734, 3770: 3769, 3807: 3802,
	3905: 3904, 3907: 3906, 3909: 3908, 3911: 3910, 3913: 3912, 3927: 3926, 4073: 4072,
	4090: 4089, 4097: 4096, 4192: 4191, 5039: 5038, 6150: 4451, 6151: 4532, 6152: 4533,
	6153: 4534, 6155: 4535, 6157: 4536,
}

// builtinType returns the rule for a built-in OID; unknown OIDs are text.
func builtinType(oid uint32) colType {
	if elem, ok := arrayElem[oid]; ok {
		d := byte(',')
		if oid == 1020 {
			d = ';'
		}
		return colType{kind: kArray, elem: scalarKind(elem), delim: d}
	}
	return colType{kind: scalarKind(oid)}
}

// catalogOIDs maps pg_catalog type names to their OIDs, for the types a
// Type message can name as a domain's base type (pgoutput names a domain by
// its base type, DESIGN §3 wants it encoded as that type). It lists every
// name whose rule differs from what catalogType gives a name it does not
// list — text, or an array of strings for "_name" — so the table stays
// short; TestCatalogTypes checks that every pg_catalog type of a real server
// resolves by name exactly as by OID.
var catalogOIDs = map[string]uint32{
	"bool": 16, "bytea": 17, "int8": 20, "int2": 21, "int4": 23, "oid": 26, "xid": 28, "cid": 29,
	"json": 114, "float4": 700, "float8": 701, "timestamp": 1114, "timestamptz": 1184, "numeric": 1700,
	"jsonb": 3802,
	"_json": 199, "_bool": 1000, "_bytea": 1001, "_int2": 1005, "_int4": 1007, "_xid": 1011, "_cid": 1012,
	"_int8": 1016, "_box": 1020, "_float4": 1021, "_float8": 1022, "_oid": 1028, "_timestamp": 1115,
	"_timestamptz": 1185, "_numeric": 1231, "_jsonb": 3807,
}

// catalogType is the rule for the pg_catalog type named name: its built-in
// rule when the name is known, otherwise an array of strings for "_name"
// (every pg_catalog type so named is an array, such as _pg_attrdef, the
// array of a catalog's row type) and text for anything else.
func catalogType(name string) colType {
	if oid, ok := catalogOIDs[name]; ok {
		return builtinType(oid)
	}
	return userType(name)
}

// userType is the rule for a type outside pg_catalog, known only by name: a
// name starting with '_' is taken for an array (Postgres names array types
// so), whose elements are strings since pgoutput does not say what they
// are; anything else is text. A value that does not parse as an array is
// written as a string, so a type merely named "_x" still comes out as text.
func userType(name string) colType {
	if len(name) > 0 && name[0] == '_' {
		return colType{kind: kArray, elem: kText, delim: ','}
	}
	return colType{kind: kText}
}

// appendValue appends the JSON form of text value v of type t to dst.
// scratch is a reusable buffer for unescaping and byte decoding.
func appendValue(dst []byte, t colType, v []byte, scratch *[]byte) []byte {
	if t.kind == kArray {
		start := len(dst)
		out, ok := appendArray(dst, v, t.elem, t.delim, scratch)
		if ok {
			return out
		}
		return appendString(dst[:start], v)
	}
	return appendScalar(dst, t.kind, v, scratch)
}

func appendScalar(dst []byte, k kind, v []byte, scratch *[]byte) []byte {
	switch k {
	case kBool:
		if len(v) == 1 && v[0] == 't' {
			return append(dst, "true"...)
		}
		if len(v) == 1 && v[0] == 'f' {
			return append(dst, "false"...)
		}
	case kInt, kFloat:
		if isJSONNumber(v) {
			return append(dst, v...)
		}
	case kInt8:
		if isJSONNumber(v) && int8Exact(v) {
			return append(dst, v...)
		}
	case kNumeric:
		if isJSONNumber(v) && numericExact(v) {
			return append(dst, v...)
		}
	case kJSON:
		if jsonValid(v) {
			return append(dst, v...)
		}
	case kBytea:
		if out, ok := appendBytea(dst, v, scratch); ok {
			return out
		}
	case kTimestamp, kTimestamptz:
		if out, ok := appendTimestamp(dst, v, k == kTimestamptz); ok {
			return out
		}
	}
	return appendString(dst, v)
}

// isJSONNumber reports whether b matches the JSON number grammar.
func isJSONNumber(b []byte) bool {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return false
	}
	if b[i] == '0' {
		i++
	} else if b[i] >= '1' && b[i] <= '9' {
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	} else {
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		j := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == j {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == j {
			return false
		}
	}
	return i == len(b)
}

const maxExact = "9007199254740992" // 2^53

// intDigitsLE reports whether the decimal digit string d (no sign, no
// leading zeros) is <= 2^53.
func intDigitsLE(d []byte) bool {
	if len(d) != len(maxExact) {
		return len(d) < len(maxExact)
	}
	return string(d) <= maxExact
}

// int8Exact: v is a valid JSON integer; is |v| <= 2^53?
func int8Exact(v []byte) bool {
	if len(v) > 0 && v[0] == '-' {
		v = v[1:]
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return false
		}
	}
	return intDigitsLE(v)
}

// numericExact: v is a valid JSON number in numeric's plain notation; see
// the rule on kind.
func numericExact(v []byte) bool {
	if len(v) > 0 && v[0] == '-' {
		v = v[1:]
	}
	intPart, frac := v, []byte(nil)
	for i, c := range v {
		if c == '.' {
			intPart, frac = v[:i], v[i+1:]
			break
		}
		if c == 'e' || c == 'E' {
			return false // numeric output never uses exponents
		}
	}
	for _, c := range frac {
		if c == 'e' || c == 'E' {
			return false
		}
	}
	// Strip leading zeros of the integer part and trailing zeros of the
	// fraction: they do not change the value.
	for len(intPart) > 0 && intPart[0] == '0' {
		intPart = intPart[1:]
	}
	for len(frac) > 0 && frac[len(frac)-1] == '0' {
		frac = frac[:len(frac)-1]
	}
	if len(frac) == 0 && intDigitsLE(intPart) {
		return true
	}
	if len(intPart) > 300 {
		return false
	}
	var sig int
	if len(intPart) > 0 {
		// Significant digits run from the integer part's first digit to the
		// last non-zero digit overall.
		if len(frac) > 0 {
			sig = len(intPart) + len(frac)
		} else {
			t := intPart
			for len(t) > 0 && t[len(t)-1] == '0' {
				t = t[:len(t)-1]
			}
			sig = len(t)
		}
	} else {
		lead := 0
		for lead < len(frac) && frac[lead] == '0' {
			lead++
		}
		if lead == len(frac) {
			return true // zero
		}
		if lead >= 300 {
			return false
		}
		sig = len(frac) - lead
	}
	return sig <= 15
}

func appendBytea(dst, v []byte, scratch *[]byte) ([]byte, bool) {
	if len(v) < 2 || v[0] != '\\' || v[1] != 'x' || len(v)%2 != 0 {
		return dst, false
	}
	h := v[2:]
	raw := (*scratch)[:0]
	for i := 0; i < len(h); i += 2 {
		hi, ok1 := unhex(h[i])
		lo, ok2 := unhex(h[i+1])
		if !ok1 || !ok2 {
			return dst, false
		}
		raw = append(raw, hi<<4|lo)
	}
	*scratch = raw
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, raw)
	return append(dst, '"'), true
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// digits parses exactly n ASCII digits at b[i:].
func digits(b []byte, i, n int) (int, bool) {
	if i+n > len(b) {
		return 0, false
	}
	v := 0
	for _, c := range b[i : i+n] {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, true
}

// appendTimestamp converts ISO-style "YYYY-MM-DD HH:MM:SS[.ffffff][±HH[:MM[:SS]]]"
// to RFC 3339 with six fractional digits; see the rule on kind. It reports
// false for anything else (infinity, BC, five-digit years), which the caller
// writes as a string.
func appendTimestamp(dst, v []byte, tz bool) ([]byte, bool) {
	if len(v) < 19 || v[4] != '-' || v[7] != '-' || v[10] != ' ' || v[13] != ':' || v[16] != ':' {
		return dst, false
	}
	year, ok1 := digits(v, 0, 4)
	mon, ok2 := digits(v, 5, 2)
	day, ok3 := digits(v, 8, 2)
	hour, ok4 := digits(v, 11, 2)
	min, ok5 := digits(v, 14, 2)
	sec, ok6 := digits(v, 17, 2)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || mon < 1 || mon > 12 || day < 1 || day > 31 || hour > 24 || min > 59 || sec > 60 {
		return dst, false
	}
	i := 19
	var frac [6]byte
	for k := range frac {
		frac[k] = '0'
	}
	if i < len(v) && v[i] == '.' {
		i++
		n := 0
		for i < len(v) && v[i] >= '0' && v[i] <= '9' {
			if n >= 6 {
				return dst, false
			}
			frac[n] = v[i]
			n++
			i++
		}
		if n == 0 {
			return dst, false
		}
	}
	offset := 0 // seconds east of UTC
	if tz {
		if i >= len(v) || (v[i] != '+' && v[i] != '-') {
			return dst, false
		}
		sign := 1
		if v[i] == '-' {
			sign = -1
		}
		i++
		oh, ok := digits(v, i, 2)
		if !ok {
			return dst, false
		}
		i += 2
		offset = oh * 3600
		for _, mult := range []int{60, 1} {
			if i < len(v) && v[i] == ':' {
				x, ok := digits(v, i+1, 2)
				if !ok {
					return dst, false
				}
				offset += x * mult
				i += 3
			}
		}
		offset *= sign
	}
	if i != len(v) {
		return dst, false // " BC", or trailing text
	}
	if offset == 0 {
		dst = append(dst, '"')
		dst = append(dst, v[:10]...)
		dst = append(dst, 'T')
		dst = append(dst, v[11:19]...)
		dst = append(dst, '.')
		dst = append(dst, frac[:]...)
		if tz {
			dst = append(dst, 'Z')
		}
		return append(dst, '"'), true
	}
	usec, _ := digits(frac[:], 0, 6)
	t := time.Date(year, time.Month(mon), day, hour, min, sec, usec*1000, time.UTC).Add(-time.Duration(offset) * time.Second)
	if t.Year() < 1 || t.Year() > 9999 {
		return dst, false
	}
	dst = append(dst, '"')
	dst = t.AppendFormat(dst, "2006-01-02T15:04:05.000000Z")
	return append(dst, '"'), true
}

// plainASCII marks bytes that stand for themselves inside a JSON string.
var plainASCII = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD.
func appendString(dst, s []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		for i < len(s) && plainASCII[s[i]] {
			i++
		}
		if i == len(s) {
			break
		}
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, s[start:i]...)
				dst = append(dst, `\ufffd`...)
				i++
				start = i
				continue
			}
			i += size
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"':
			dst = append(dst, '\\', '"')
		case '\\':
			dst = append(dst, '\\', '\\')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			const hexd = "0123456789abcdef"
			dst = append(dst, '\\', 'u', '0', '0', hexd[c>>4], hexd[c&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// maxArrayDepth bounds recursion on hostile input; Postgres allows 6.
const maxArrayDepth = 8

// appendArray converts Postgres array text ("{1,2,{3}}", quoted elements
// with backslash escapes, unquoted NULL) to a JSON array. It reports false on
// anything else, leaving the caller to write the text as a string.
func appendArray(dst, s []byte, elem kind, delim byte, scratch *[]byte) ([]byte, bool) {
	p := arrayParser{s: s, elem: elem, delim: delim, scratch: scratch}
	out, ok := p.array(dst, 0)
	if !ok {
		return dst, false
	}
	p.skipSpace()
	return out, p.i == len(s)
}

type arrayParser struct {
	s       []byte
	i       int
	elem    kind
	delim   byte
	scratch *[]byte
}

func (p *arrayParser) skipSpace() {
	for p.i < len(p.s) && isArraySpace(p.s[p.i]) {
		p.i++
	}
}

func isArraySpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

func (p *arrayParser) array(dst []byte, depth int) ([]byte, bool) {
	if depth >= maxArrayDepth {
		return dst, false
	}
	p.skipSpace()
	if p.i >= len(p.s) || p.s[p.i] != '{' {
		return dst, false
	}
	p.i++
	dst = append(dst, '[')
	p.skipSpace()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return append(dst, ']'), true
	}
	for n := 0; ; n++ {
		if n > 0 {
			dst = append(dst, ',')
		}
		p.skipSpace()
		if p.i >= len(p.s) {
			return dst, false
		}
		var ok bool
		switch p.s[p.i] {
		case '{':
			dst, ok = p.array(dst, depth+1)
		case '"':
			dst, ok = p.quoted(dst)
		default:
			dst, ok = p.unquoted(dst)
		}
		if !ok {
			return dst, false
		}
		p.skipSpace()
		if p.i >= len(p.s) {
			return dst, false
		}
		switch p.s[p.i] {
		case p.delim:
			p.i++
		case '}':
			p.i++
			return append(dst, ']'), true
		default:
			return dst, false
		}
	}
}

func (p *arrayParser) quoted(dst []byte) ([]byte, bool) {
	p.i++ // opening quote
	buf := (*p.scratch)[:0]
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch c {
		case '\\':
			if p.i >= len(p.s) {
				return dst, false
			}
			buf = append(buf, p.s[p.i])
			p.i++
		case '"':
			// Encode from a copy: bytea decoding reuses the scratch buffer.
			*p.scratch = buf
			return p.element(dst, buf), true
		default:
			buf = append(buf, c)
		}
	}
	return dst, false
}

func (p *arrayParser) unquoted(dst []byte) ([]byte, bool) {
	start := p.i
	for p.i < len(p.s) && p.s[p.i] != p.delim && p.s[p.i] != '}' {
		c := p.s[p.i]
		if c == '{' || c == '"' || c == '\\' {
			return dst, false
		}
		p.i++
	}
	tok := p.s[start:p.i]
	for len(tok) > 0 && isArraySpace(tok[len(tok)-1]) {
		tok = tok[:len(tok)-1]
	}
	if len(tok) == 0 {
		return dst, false
	}
	if len(tok) == 4 && (tok[0]|0x20) == 'n' && (tok[1]|0x20) == 'u' && (tok[2]|0x20) == 'l' && (tok[3]|0x20) == 'l' {
		return append(dst, "null"...), true
	}
	return p.element(dst, tok), true
}

func (p *arrayParser) element(dst, v []byte) []byte {
	if p.elem == kBytea {
		// The element text may live in scratch, which bytea decoding
		// overwrites; decode through a separate buffer.
		var tmp []byte
		if out, ok := appendBytea(dst, v, &tmp); ok {
			return out
		}
		return appendString(dst, v)
	}
	return appendScalar(dst, p.elem, v, nil)
}

// rowValue is the value of column i of a row: tup's, or old's when tup has
// the column as an unchanged TOAST value and old (REPLICA IDENTITY FULL)
// carries it.
func rowValue(tup, old []tval, i int) tval {
	tv := tup[i]
	if tv.kind == 'u' && old != nil && (old[i].kind == 't' || old[i].kind == 'b') {
		tv = old[i]
	}
	return tv
}

// isJSONNull reports whether the text of a json or jsonb value is the JSON
// literal null, with the whitespace json keeps.
func isJSONNull(v []byte) bool {
	for len(v) > 0 && isJSONSpace(v[0]) {
		v = v[1:]
	}
	for len(v) > 0 && isJSONSpace(v[len(v)-1]) {
		v = v[:len(v)-1]
	}
	return string(v) == "null"
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// jsonNullLists pairs the field change opens for a row with the field that
// lists the row's JSON-null columns.
var jsonNullLists = [...]struct{ row, list string }{
	{`,"before":`, `,"beforeJsonNull":[`},
	{`,"after":`, `,"afterJsonNull":[`},
}

// appendJSONNulls follows the row object written from buf[start:] with the
// list of its json and jsonb columns holding the JSON literal null, choosing
// the list by the row's field name before start. It appends nothing for a
// row of another name (the key). The columns are picked as appendRow picks
// them.
func appendJSONNulls(buf []byte, start int, rel *relation, tup, old []tval, onlyKey bool) []byte {
	list := ""
	for _, l := range jsonNullLists {
		if hasSuffix(buf[:start], l.row) {
			list = l.list
		}
	}
	if list == "" {
		return buf
	}
	buf = append(buf, list...)
	n := 0
	for i := range tup {
		c := &rel.cols[i]
		if c.typ.kind != kJSON || (onlyKey && !c.key) {
			continue
		}
		if tv := rowValue(tup, old, i); tv.kind == 't' && isJSONNull(tv.v) {
			if n > 0 {
				buf = append(buf, ',')
			}
			n++
			buf = append(buf, c.jsonKey[:len(c.jsonKey)-1]...) // `"name"`
		}
	}
	return append(buf, ']')
}

func hasSuffix(b []byte, s string) bool {
	return len(b) >= len(s) && string(b[len(b)-len(s):]) == s
}
