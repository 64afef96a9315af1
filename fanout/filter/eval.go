package filter

import (
	"bytes"
	"slices"
)

// Evaluation works on sets of possible truth values rather than on one:
// a column the row does not carry could hold anything, so a comparison of
// it is "true, false or unknown", and and/or/not combine such sets value by
// value. The filter is decided when its set is {true} (a match) or holds no
// true (no match); otherwise it is Undecided. Each missing column is taken
// on its own, so a filter testing the same missing column twice in ways
// that exclude each other may be Undecided where a cleverer evaluator could
// decide; it is never wrong.

// tv is a set of SQL truth values.
type tv uint8

const (
	tvTrue  tv = 1
	tvFalse tv = 2
	tvNull  tv = 4 // SQL unknown

	tvNotNull = tvTrue | tvFalse // a non-NULL value we cannot see
	tvAny     = tvTrue | tvFalse | tvNull
)

// andTV, orTV and notTV apply SQL's three-valued logic to sets.
var andTV, orTV [8][8]tv
var notTV [8]tv

func init() {
	and3 := func(a, b tv) tv {
		switch {
		case a == tvFalse || b == tvFalse:
			return tvFalse
		case a == tvNull || b == tvNull:
			return tvNull
		}
		return tvTrue
	}
	or3 := func(a, b tv) tv {
		switch {
		case a == tvTrue || b == tvTrue:
			return tvTrue
		case a == tvNull || b == tvNull:
			return tvNull
		}
		return tvFalse
	}
	not3 := map[tv]tv{tvTrue: tvFalse, tvFalse: tvTrue, tvNull: tvNull}
	for a := tv(1); a < 8; a++ {
		for b := tv(1); b < 8; b++ {
			for x := tv(1); x <= 4; x <<= 1 {
				for y := tv(1); y <= 4; y <<= 1 {
					if a&x != 0 && b&y != 0 {
						andTV[a][b] |= and3(x, y)
						orTV[a][b] |= or3(x, y)
					}
				}
			}
		}
		for x := tv(1); x <= 4; x <<= 1 {
			if a&x != 0 {
				notTV[a] |= not3[x]
			}
		}
	}
}

type opcode uint8

const (
	opAnd opcode = iota
	opOr
	opNot
	opEq
	opNe
	opLt
	opLe
	opGt
	opGe
	opIn
	opIsNull
	opNotNull
)

var opNames = map[string]opcode{
	"=": opEq, "<>": opNe, "!=": opNe, "<": opLt, "<=": opLe, ">": opGt, ">=": opGe,
	"in": opIn, "is null": opIsNull, "is not null": opNotNull,
}

// node is one compiled node: and/or with kids, not with kids[0], or a test
// of col against c (a comparison) or set (in: sorted by compare, without
// duplicates).
type node struct {
	op   opcode
	kids []node
	col  *column
	c    value
	set  []value
	ints []int64 // set's integers, for the kinds compared as int64
}

func (n *node) eval(row *Row) tv {
	switch n.op {
	case opAnd:
		acc := tvTrue
		for i := range n.kids {
			acc = andTV[acc][n.kids[i].eval(row)]
			if acc == tvFalse {
				return tvFalse
			}
		}
		return acc
	case opOr:
		acc := tvFalse
		for i := range n.kids {
			acc = orTV[acc][n.kids[i].eval(row)]
			if acc == tvTrue {
				return tvTrue
			}
		}
		return acc
	case opNot:
		return notTV[n.kids[0].eval(row)]
	}
	raw, ok := row.Values[n.col.name]
	if !ok {
		// Not carried: an unchanged TOAST column is known not to be NULL
		// (NULLs are never TOASTed); anything else could be anything.
		notNull := contains(row.Unchanged, n.col.name)
		switch {
		case n.op == opIsNull && notNull:
			return tvFalse
		case n.op == opNotNull && notNull:
			return tvTrue
		case n.op == opIsNull || n.op == opNotNull || notNull:
			return tvNotNull
		}
		return tvAny
	}
	isNull := string(raw) == "null" && !(n.col.kind == kJSON && contains(row.JSONNull, n.col.name))
	switch n.op {
	case opIsNull:
		return truth(isNull)
	case opNotNull:
		return truth(!isNull)
	}
	if isNull {
		return tvNull
	}
	var buf [64]byte
	v, ok := n.col.parse(raw, buf[:0])
	if !ok {
		return tvNotNull
	}
	if n.op == opIn {
		if n.ints != nil {
			_, found := slices.BinarySearch(n.ints, v.i)
			return truth(found)
		}
		lo, hi := 0, len(n.set)
		for lo < hi {
			m := int(uint(lo+hi) >> 1)
			switch c := compare(n.col, &v, &n.set[m]); {
			case c == 0:
				return tvTrue
			case c > 0:
				lo = m + 1
			default:
				hi = m
			}
		}
		return tvFalse
	}
	c := compare(n.col, &v, &n.c)
	switch n.op {
	case opEq:
		return truth(c == 0)
	case opNe:
		return truth(c != 0)
	case opLt:
		return truth(c < 0)
	case opLe:
		return truth(c <= 0)
	case opGt:
		return truth(c > 0)
	}
	return truth(c >= 0)
}

func truth(b bool) tv {
	if b {
		return tvTrue
	}
	return tvFalse
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// compare orders two values of col's kind as PostgreSQL orders them (text
// in byte order).
func compare(col *column, a, b *value) int {
	switch col.kind {
	case kInt, kIntEq, kTimestamptz, kTimestamp:
		return cmp3(a.i, b.i)
	case kFloat:
		return cmpFloat(a.f, b.f)
	case kNumeric:
		return cmpDecimal(&a.d, &b.d)
	case kBool:
		return cmp3(b2i(a.b), b2i(b.b))
	}
	return bytes.Compare(a.bs, b.bs)
}

func cmp3[T int64 | int](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
