package decoder

// MaxEmbeddedJSONDepth bounds the nesting of arrays and objects in a json or
// jsonb value (in a column, an array element or a logical decoding
// message's content) that is embedded in an envelope as JSON. Postgres
// accepts deeper documents (as deep as its stack allows, 10,000 and more);
// a JSON reader does not: encoding/json refuses input nested more than
// 10,000 deep, and an envelope adds its own levels (envelope, row, up to six
// of an array's dimensions) and its readers may wrap it in frames of their
// own. A deeper value is carried as a JSON string of its text (a message's
// content as base64), as invalid JSON is, so every envelope parses.
const MaxEmbeddedJSONDepth = 1000

// validJSON reports whether b is one JSON value (surrounded by optional
// whitespace) nested at most MaxEmbeddedJSONDepth deep: exactly what
// encoding/json's Valid accepts within that depth, several times faster on
// the hot path (json and jsonb columns).
func validJSON(b []byte) bool {
	v := jsonValidator{b: b}
	v.ws()
	if !v.value(0) {
		return false
	}
	v.ws()
	return v.i == len(b)
}

type jsonValidator struct {
	b []byte
	i int
}

func (v *jsonValidator) ws() {
	for v.i < len(v.b) {
		switch v.b[v.i] {
		case ' ', '\t', '\n', '\r':
			v.i++
		default:
			return
		}
	}
}

func (v *jsonValidator) lit(s string) bool {
	if len(v.b)-v.i < len(s) || string(v.b[v.i:v.i+len(s)]) != s {
		return false
	}
	v.i += len(s)
	return true
}

// value validates one value inside depth arrays and objects.
func (v *jsonValidator) value(depth int) bool {
	if v.i >= len(v.b) {
		return false
	}
	switch c := v.b[v.i]; {
	case c == '{':
		if depth >= MaxEmbeddedJSONDepth {
			return false
		}
		v.i++
		v.ws()
		if v.i < len(v.b) && v.b[v.i] == '}' {
			v.i++
			return true
		}
		for {
			v.ws()
			if v.i >= len(v.b) || v.b[v.i] != '"' || !v.str() {
				return false
			}
			v.ws()
			if v.i >= len(v.b) || v.b[v.i] != ':' {
				return false
			}
			v.i++
			v.ws()
			if !v.value(depth + 1) {
				return false
			}
			v.ws()
			if v.i >= len(v.b) {
				return false
			}
			if v.b[v.i] == '}' {
				v.i++
				return true
			}
			if v.b[v.i] != ',' {
				return false
			}
			v.i++
		}
	case c == '[':
		if depth >= MaxEmbeddedJSONDepth {
			return false
		}
		v.i++
		v.ws()
		if v.i < len(v.b) && v.b[v.i] == ']' {
			v.i++
			return true
		}
		for {
			v.ws()
			if !v.value(depth + 1) {
				return false
			}
			v.ws()
			if v.i >= len(v.b) {
				return false
			}
			if v.b[v.i] == ']' {
				v.i++
				return true
			}
			if v.b[v.i] != ',' {
				return false
			}
			v.i++
		}
	case c == '"':
		return v.str()
	case c == 't':
		return v.lit("true")
	case c == 'f':
		return v.lit("false")
	case c == 'n':
		return v.lit("null")
	case c == '-' || (c >= '0' && c <= '9'):
		start := v.i
		v.i++
		for v.i < len(v.b) {
			c := v.b[v.i]
			if (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' {
				v.i++
				continue
			}
			break
		}
		return isJSONNumber(v.b[start:v.i])
	}
	return false
}

// str validates a string starting at the opening quote.
func (v *jsonValidator) str() bool {
	v.i++
	for v.i < len(v.b) {
		c := v.b[v.i]
		switch {
		case c == '"':
			v.i++
			return true
		case c == '\\':
			v.i++
			if v.i >= len(v.b) {
				return false
			}
			switch v.b[v.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				v.i++
			case 'u':
				if len(v.b)-v.i < 5 {
					return false
				}
				for _, h := range v.b[v.i+1 : v.i+5] {
					if _, ok := unhex(h); !ok {
						return false
					}
				}
				v.i += 5
			default:
				return false
			}
		case c < 0x20:
			return false
		default:
			v.i++
		}
	}
	return false
}
