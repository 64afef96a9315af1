package decoder

// JSONKind is the JSON form the values of a column take under the rules of
// the package documentation (Values): what a generated client type, or any
// reader that wants to know a column's JSON shape without a value at hand,
// describes.
type JSONKind uint8

// The kinds, one per rule of Values.
const (
	// JSONString: a string of Postgres's text (text, varchar, uuid,
	// date, interval, enums, composites, ranges, unknown types).
	JSONString JSONKind = iota
	// JSONBool: true or false.
	JSONBool
	// JSONInteger: a number (int2, int4, oid, xid, cid).
	JSONInteger
	// JSONInt8: a number when -2^53 <= v <= 2^53, otherwise a string of
	// its decimal digits.
	JSONInt8
	// JSONFloat: a number; NaN, Infinity and -Infinity are strings.
	JSONFloat
	// JSONNumeric: a number when exactly representable (see Values),
	// otherwise a string of its exact text; NaN and ±Infinity are strings.
	JSONNumeric
	// JSONEmbedded: embedded JSON (json, jsonb); a string of the text when
	// it is not valid JSON that readers accept.
	JSONEmbedded
	// JSONBytes: a string, the bytes in standard base64.
	JSONBytes
	// JSONTimestamp: a string, RFC 3339 with six fractional digits and no
	// zone designator; 'infinity', BC dates and years past 9999 as
	// Postgres's text.
	JSONTimestamp
	// JSONTimestamptz: like JSONTimestamp, in UTC with the designator Z.
	JSONTimestamptz
)

// ColumnJSON is the JSON form of a column's values: Kind, or with Array an
// array (nested per dimension, NULL elements as null; a string of its text
// when it has explicit bounds) whose elements are of Kind.
type ColumnJSON struct {
	Kind  JSONKind
	Array bool
}

// JSONOf says how the values of column c are encoded, as NewRowEncoder and
// the stream encode them when its type is described as c describes it.
func JSONOf(c ColumnInfo) ColumnJSON {
	var t colType
	switch {
	case c.TypeOID < firstGenbkiOID:
		t = builtinType(c.TypeOID)
	case c.Element.Name != "":
		t = c.Element.rule()
	default:
		ns := c.BaseSchema
		if ns == "" {
			ns = "pg_catalog"
		}
		t = typeInfo{ns: ns, name: c.BaseName}.rule()
	}
	if t.kind == kArray {
		return ColumnJSON{Kind: jsonKind(t.elem), Array: true}
	}
	return ColumnJSON{Kind: jsonKind(t.kind)}
}

func jsonKind(k kind) JSONKind {
	switch k {
	case kBool:
		return JSONBool
	case kInt:
		return JSONInteger
	case kInt8:
		return JSONInt8
	case kFloat:
		return JSONFloat
	case kNumeric:
		return JSONNumeric
	case kJSON:
		return JSONEmbedded
	case kBytea:
		return JSONBytes
	case kTimestamp:
		return JSONTimestamp
	case kTimestamptz:
		return JSONTimestamptz
	}
	return JSONString
}
