package filter

import (
	"bytes"
	"strconv"
	"strings"
)

// decimal is an exact decimal number as PostgreSQL's numeric holds it:
// finite values are 0.digits × 10^exp, digits without leading or trailing
// zeros (empty for zero, which is never negative).
type decimal struct {
	class  int8 // negInf, finite, posInf or nan
	neg    bool
	exp    int32
	digits []byte
}

const (
	negInf int8 = iota
	finite
	posInf
	nan
)

// maxExponent bounds the exponent a decimal may be written with; far
// beyond PostgreSQL's numeric range (about 10^131072), far within int32.
const maxExponent = 1 << 20

// parseDecimal reads [+-]digits[.digits][e[+-]digits] (either part may be
// empty but not both), NaN, Infinity, -Infinity (any case, also inf). The
// digits are appended to buf.
func parseDecimal(s, buf []byte) (decimal, bool) {
	if len(s) > 0 && (s[0] < '0' || s[0] > '9') && s[0] != '.' {
		if c, ok := specialClass(s); ok {
			return decimal{class: c}, true
		}
	}
	d := decimal{class: finite, digits: buf}
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		d.neg = s[i] == '-'
		i++
	}
	var exp int64
	n := 0
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		n++
		if len(d.digits) == 0 && s[i] == '0' {
			continue
		}
		d.digits = append(d.digits, s[i])
		exp++
	}
	if i < len(s) && s[i] == '.' {
		i++
		for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			n++
			if len(d.digits) == 0 && s[i] == '0' {
				exp--
				continue
			}
			d.digits = append(d.digits, s[i])
		}
	}
	if n == 0 {
		return d, false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		j := i
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		k := j
		for k < len(s) && s[k] >= '0' && s[k] <= '9' {
			k++
		}
		if k == j || k-j > 8 {
			return d, false
		}
		e, err := strconv.ParseInt(string(s[i:k]), 10, 64)
		if err != nil {
			return d, false
		}
		exp += e
		i = k
	}
	if i != len(s) {
		return d, false
	}
	d.digits = bytes.TrimRight(d.digits, "0")
	if len(d.digits) == 0 {
		return decimal{class: finite}, true
	}
	if exp > maxExponent || exp < -maxExponent {
		return d, false
	}
	d.exp = int32(exp)
	return d, true
}

// int64 returns d as an integer when it is one and fits.
func (d *decimal) int64() (int64, bool) {
	if d.class != finite {
		return 0, false
	}
	if len(d.digits) == 0 {
		return 0, true
	}
	if int(d.exp) < len(d.digits) || d.exp > 19 {
		return 0, false
	}
	s := string(d.digits) + strings.Repeat("0", int(d.exp)-len(d.digits))
	if d.neg {
		s = "-" + s
	}
	i, err := strconv.ParseInt(s, 10, 64)
	return i, err == nil
}

func (d *decimal) sign() int {
	switch {
	case len(d.digits) == 0:
		return 0
	case d.neg:
		return -1
	}
	return 1
}

// cmpDecimal orders decimals as PostgreSQL orders numeric: -Infinity, the
// finite values, Infinity, NaN (which equals NaN).
func cmpDecimal(a, b *decimal) int {
	if a.class != b.class {
		return cmp3(int(a.class), int(b.class))
	}
	if a.class != finite {
		return 0
	}
	sa, sb := a.sign(), b.sign()
	if sa != sb || sa == 0 {
		return cmp3(sa, sb)
	}
	var m int
	if a.exp != b.exp {
		m = cmp3(int(a.exp), int(b.exp))
	} else {
		m = bytes.Compare(a.digits, b.digits)
	}
	return m * sa
}

// specialClass reads NaN, Infinity and -Infinity in the spellings
// PostgreSQL accepts (any case; inf for infinity; an optional +).
func specialClass(s []byte) (int8, bool) {
	if len(s) > 9 {
		return 0, false
	}
	switch {
	case bytes.EqualFold(s, []byte("nan")):
		return nan, true
	case bytes.EqualFold(s, []byte("infinity")), bytes.EqualFold(s, []byte("+infinity")),
		bytes.EqualFold(s, []byte("inf")), bytes.EqualFold(s, []byte("+inf")):
		return posInf, true
	case bytes.EqualFold(s, []byte("-infinity")), bytes.EqualFold(s, []byte("-inf")):
		return negInf, true
	}
	return 0, false
}
