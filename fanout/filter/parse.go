package filter

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// The parser reads the filter's JSON directly, guided by its grammar, so
// that every bound is checked as the input is read: nesting is refused at
// the first level past MaxDepth, a list at its first item past its bound,
// a string at its first byte past MaxStringBytes. Nothing is decoded into
// generic values first (a generic decoder would allocate for the whole
// input before any bound could be checked), and objects are refused when
// they repeat a key, which encoding/json silently accepts.

// tokKind is the JSON type of a scalar value.
type tokKind uint8

const (
	tokString tokKind = iota
	tokNumber
	tokBool
	tokNull
	tokOther // an object or array where a scalar belongs
)

func (k tokKind) String() string {
	switch k {
	case tokString:
		return "a string"
	case tokNumber:
		return "a number"
	case tokBool:
		return "a boolean"
	case tokNull:
		return "null"
	}
	return "an object or array"
}

// token is one scalar value: s is a string's decoded text, num a number's
// text as written (never through float64), b a boolean.
type token struct {
	kind tokKind
	s    string
	num  string
	b    bool
}

// seg is one step of a JSON path: an object key, or an index when key is "".
type seg struct {
	key string
	idx int
}

type parser struct {
	src   []byte
	pos   int
	lim   Limits
	terms int
	path  []seg
}

// err builds an Error at the current path.
func (p *parser) err(format string, args ...any) *Error {
	return &Error{Path: pathString(p.path), Msg: fmt.Sprintf(format, args...)}
}

func pathString(path []seg) string {
	var b strings.Builder
	b.WriteString("filter")
	for _, s := range path {
		if s.key != "" {
			b.WriteByte('.')
			b.WriteString(s.key)
		} else {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(s.idx))
			b.WriteByte(']')
		}
	}
	return b.String()
}

func (p *parser) push(key string) { p.path = append(p.path, seg{key: key}) }
func (p *parser) pushIdx(i int)   { p.path = append(p.path, seg{idx: i}) }
func (p *parser) pop()            { p.path = p.path[:len(p.path)-1] }

func (p *parser) ws() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, 0 at the end.
func (p *parser) peek() byte {
	p.ws()
	if p.pos >= len(p.src) {
		return 0
	}
	return p.src[p.pos]
}

func (p *parser) expect(c byte, what string) error {
	if p.peek() != c {
		return p.syntax(what)
	}
	p.pos++
	return nil
}

// syntax is the error for input that is not the JSON the grammar expects.
func (p *parser) syntax(want string) *Error {
	if p.pos >= len(p.src) {
		return p.err("the filter ends early; expected %s", want)
	}
	return p.err("invalid JSON at byte %d: expected %s", p.pos, want)
}

// list reads a JSON array, calling item for each element with its index.
func (p *parser) list(what string, item func(i int) error) error {
	if err := p.expect('[', what); err != nil {
		return err
	}
	if p.peek() == ']' {
		p.pos++
		return nil
	}
	for i := 0; ; i++ {
		p.pushIdx(i)
		err := item(i)
		p.pop()
		if err != nil {
			return err
		}
		switch p.peek() {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return nil
		default:
			return p.syntax(`"," or "]"`)
		}
	}
}

// object reads a JSON object, calling field for each key with the parser
// positioned at its value. A repeated key is refused.
func (p *parser) object(field func(key string) error) error {
	if err := p.expect('{', "an object"); err != nil {
		return err
	}
	if p.peek() == '}' {
		p.pos++
		return nil
	}
	var seen []string
	for {
		if p.peek() != '"' {
			return p.syntax("a quoted field name")
		}
		key, err := p.str()
		if err != nil {
			return err
		}
		for _, s := range seen {
			if s == key {
				return p.err("field %q appears twice; give it once", key)
			}
		}
		// field refuses an unknown key at once, so seen holds known keys
		// only and stays short.
		seen = append(seen, key)
		if err := p.expect(':', `":"`); err != nil {
			return err
		}
		if err := field(key); err != nil {
			return err
		}
		switch p.peek() {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return nil
		default:
			return p.syntax(`"," or "}"`)
		}
	}
}

// scalar reads one value that must be a scalar; an object or array is
// reported as tokOther after the opening byte, without reading it.
func (p *parser) scalar() (token, error) {
	switch c := p.peek(); {
	case c == '"':
		s, err := p.str()
		return token{kind: tokString, s: s}, err
	case c == '-' || c >= '0' && c <= '9':
		n, err := p.number()
		return token{kind: tokNumber, num: n}, err
	case c == 't':
		return token{kind: tokBool, b: true}, p.literal("true")
	case c == 'f':
		return token{kind: tokBool}, p.literal("false")
	case c == 'n':
		return token{kind: tokNull}, p.literal("null")
	case c == '{' || c == '[':
		return token{kind: tokOther}, nil
	}
	return token{}, p.syntax("a value")
}

func (p *parser) literal(lit string) error {
	if !strings.HasPrefix(string(p.src[p.pos:min(len(p.src), p.pos+len(lit))]), lit) {
		return p.syntax(lit)
	}
	p.pos += len(lit)
	return nil
}

// number reads a JSON number and returns its text.
func (p *parser) number() (string, error) {
	start := p.pos
	s := p.src
	i := p.pos
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	default:
		p.pos = i
		return "", p.syntax("a digit")
	}
	if i < len(s) && s[i] == '.' {
		i++
		d := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == d {
			p.pos = i
			return "", p.syntax("a digit after the decimal point")
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		d := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == d {
			p.pos = i
			return "", p.syntax("a digit in the exponent")
		}
	}
	if i-start > p.lim.MaxStringBytes {
		return "", p.err("a number of %d characters is longer than the limit of %d", i-start, p.lim.MaxStringBytes)
	}
	p.pos = i
	return string(s[start:i]), nil
}

// str reads a JSON string, refusing invalid UTF-8, control characters, lone
// surrogates and a decoded length over MaxStringBytes.
func (p *parser) str() (string, error) {
	p.pos++ // the opening quote
	s := p.src
	start := p.pos
	// Fast path: no escapes.
	i := start
	for i < len(s) && s[i] != '"' && s[i] != '\\' && s[i] >= 0x20 {
		i++
		if i-start > p.lim.MaxStringBytes {
			return "", p.tooLong()
		}
	}
	if i < len(s) && s[i] == '"' {
		if !utf8.Valid(s[start:i]) {
			return "", p.err("a string is not valid UTF-8; filters are UTF-8 JSON")
		}
		p.pos = i + 1
		return string(s[start:i]), nil
	}
	buf := append([]byte(nil), s[start:i]...)
	for {
		if i >= len(s) {
			p.pos = i
			return "", p.syntax(`the closing quote of a string`)
		}
		c := s[i]
		switch {
		case c == '"':
			if !utf8.Valid(buf) {
				return "", p.err("a string is not valid UTF-8; filters are UTF-8 JSON")
			}
			p.pos = i + 1
			return string(buf), nil
		case c < 0x20:
			p.pos = i
			return "", p.err("a string holds the control character %#x unescaped; write it as \\u%04x", c, c)
		case c == '\\':
			if i+1 >= len(s) {
				p.pos = i
				return "", p.syntax("an escape sequence")
			}
			i++
			switch s[i] {
			case '"', '\\', '/':
				buf = append(buf, s[i])
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			case 'u':
				r, n, ok := hex4(s[i+1:])
				if !ok {
					p.pos = i
					return "", p.syntax("four hex digits after \\u")
				}
				i += n
				if utf16.IsSurrogate(r) {
					r2, n2, ok2 := rune(0), 0, false
					if i+2 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
						r2, n2, ok2 = hex4(s[i+3:])
					}
					dec := utf16.DecodeRune(r, r2)
					if !ok2 || dec == utf8.RuneError {
						p.pos = i
						return "", p.err("a string holds a lone UTF-16 surrogate (\\u%04x), which is not a character", r)
					}
					i += 2 + n2
					r = dec
				}
				buf = utf8.AppendRune(buf, r)
			default:
				p.pos = i
				return "", p.syntax(`an escape (\" \\ \/ \b \f \n \r \t \uXXXX)`)
			}
			i++
		default:
			buf = append(buf, c)
			i++
		}
		if len(buf) > p.lim.MaxStringBytes {
			return "", p.tooLong()
		}
	}
}

func (p *parser) tooLong() *Error {
	return p.err("a string is longer than the limit of %d bytes", p.lim.MaxStringBytes)
}

func hex4(b []byte) (rune, int, bool) {
	if len(b) < 4 {
		return 0, 0, false
	}
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, 0, false
		}
	}
	return r, 4, true
}
