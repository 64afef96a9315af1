package filter

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/walcast/walcast/decoder"
)

// Limits bound what Compile accepts. Every bound is checked while the input
// is read, so a hostile filter costs at most what the bounds allow. A field
// left zero (or negative) takes its default.
type Limits struct {
	// MaxBytes bounds the filter's JSON text; a longer input is refused
	// before any of it is read. Default 16 KiB.
	MaxBytes int
	// MaxDepth bounds how deep and, or and not nest: the top node is at
	// depth 1. Default 16.
	MaxDepth int
	// MaxTerms bounds the nodes of the filter in all (each and, or, not and
	// comparison counts one). Default 256.
	MaxTerms int
	// MaxInValues bounds the values of all in lists together. Default 1,000.
	MaxInValues int
	// MaxStringBytes bounds each string (decoded) and each number (as
	// written). Default 1 KiB.
	MaxStringBytes int
}

// DefaultLimits are the bounds a zero Limits field takes.
var DefaultLimits = Limits{MaxBytes: 16 << 10, MaxDepth: 16, MaxTerms: 256, MaxInValues: 1000, MaxStringBytes: 1 << 10}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxBytes > 0 {
		d.MaxBytes = l.MaxBytes
	}
	if l.MaxDepth > 0 {
		d.MaxDepth = l.MaxDepth
	}
	if l.MaxTerms > 0 {
		d.MaxTerms = l.MaxTerms
	}
	if l.MaxInValues > 0 {
		d.MaxInValues = l.MaxInValues
	}
	if l.MaxStringBytes > 0 {
		d.MaxStringBytes = l.MaxStringBytes
	}
	return d
}

// Error is a filter (or column list) Compile or NewProjection refused.
// Path is the JSON path of the offending node ("filter.and[2].value",
// "columns[1]"); Msg says what is wrong and what to change. Error() is
// "Path: Msg", fit to show the person who wrote the filter.
type Error struct {
	Path string
	Msg  string
}

func (e *Error) Error() string { return e.Path + ": " + e.Msg }

// Result is the outcome of matching one row image.
type Result uint8

const (
	// NoMatch: the filter is false or unknown (SQL NULL) for the row,
	// which as in a WHERE clause is not a match.
	NoMatch Result = iota
	// Matches: the filter is true for the row.
	Matches
	// Undecided: the outcome depends on a column the row image does not
	// carry — an unchanged TOAST column (listed in the envelope's
	// unchanged), a column outside a key-only image — or on a value
	// that does not have its type's form (which the decoder writes as a
	// string of its text). The caller must get the values some other way
	// or treat the row as it sees fit.
	Undecided
)

func (r Result) String() string {
	switch r {
	case NoMatch:
		return "no match"
	case Matches:
		return "match"
	}
	return "undecided"
}

// Filter is a compiled filter. It is immutable and safe for concurrent use.
type Filter struct {
	root node
	cols []string
}

// Columns returns the columns the filter reads, in the table's column
// order, each once. The slice is shared; do not modify it.
func (f *Filter) Columns() []string { return f.cols }

// Row is one row image of an envelope, as the envelope's JSON carries it
// (decoder.Envelope's fields): Values is its after, before or key object;
// Unchanged its unchanged list (columns whose values were not sent and are
// known not to be NULL); JSONNull its afterJsonNull or beforeJsonNull list
// (json and jsonb columns whose null is the JSON literal, not SQL NULL).
// A key image has no Unchanged or JSONNull. Match reads Row and keeps
// nothing of it.
type Row struct {
	Values    map[string]json.RawMessage
	Unchanged []string
	JSONNull  []string
}

// Match evaluates the filter against row. It allocates only to read a
// string holding escapes or a numeric, either longer than 64 bytes.
func (f *Filter) Match(row Row) Result {
	m := f.root.eval(&row)
	switch {
	case m == tvTrue:
		return Matches
	case m&tvTrue == 0:
		return NoMatch
	}
	return Undecided
}

// Compile parses and checks the filter raw against the table's published
// columns cols (journal.CatalogEntry.ColumnInfos gives them). Every
// failure is an *Error.
func Compile(raw []byte, cols []decoder.ColumnInfo, lim Limits) (*Filter, error) {
	lim = lim.withDefaults()
	if len(raw) > lim.MaxBytes {
		return nil, &Error{Path: "filter", Msg: fmt.Sprintf("the filter is %d bytes, more than the limit of %d; make it shorter (an in list of many values is usually the cause)", len(raw), lim.MaxBytes)}
	}
	c := &compiler{parser: parser{src: raw, lim: lim}, byName: make(map[string]int, len(cols))}
	for _, ci := range cols {
		c.byName[ci.Name] = len(c.cols)
		c.cols = append(c.cols, resolve(ci))
	}
	c.used = make([]bool, len(c.cols))
	if c.peek() == 0 {
		return nil, &Error{Path: "filter", Msg: "the filter is empty; give a JSON object such as {\"col\":\"id\",\"op\":\"=\",\"value\":1}"}
	}
	root, err := c.node(1)
	if err != nil {
		return nil, err
	}
	if c.peek() != 0 {
		return nil, c.err("unexpected data after the filter at byte %d; a filter is one JSON object (combine terms with and or or)", c.pos)
	}
	f := &Filter{root: root}
	for i, u := range c.used {
		if u {
			f.cols = append(f.cols, c.cols[i].name)
		}
	}
	return f, nil
}

// compiler turns the parsed nodes into evaluable ones.
type compiler struct {
	parser
	cols     []column
	byName   map[string]int
	used     []bool
	inValues int
}

// field bits of a node object.
const (
	fAnd = 1 << iota
	fOr
	fNot
	fCol
	fOp
	fValue
	fValues
)

var fieldBits = map[string]int{"and": fAnd, "or": fOr, "not": fNot, "col": fCol, "op": fOp, "value": fValue, "values": fValues}

const nodeForms = `a filter node is {"and":[…]}, {"or":[…]}, {"not":{…}} or a comparison {"col":…,"op":…,"value":…} ({"values":[…]} for in, no value for is null and is not null)`

func (c *compiler) node(depth int) (node, error) {
	if depth > c.lim.MaxDepth {
		return node{}, c.err("the filter nests deeper than %d levels; flatten it (and and or take many terms)", c.lim.MaxDepth)
	}
	c.terms++
	if c.terms > c.lim.MaxTerms {
		return node{}, c.err("the filter has more than %d terms; make it smaller (an in list counts as one term)", c.lim.MaxTerms)
	}
	if c.peek() != '{' {
		return node{}, c.err("expected an object: %s", nodeForms)
	}
	var (
		have    int
		kids    []node
		colName string
		opName  string
		val     token
		vals    []token
	)
	err := c.object(func(key string) error {
		bit, ok := fieldBits[key]
		if !ok {
			return c.err("unknown field %q: %s", key, nodeForms)
		}
		have |= bit
		c.push(key)
		defer c.pop()
		switch key {
		case "and", "or":
			if c.peek() != '[' {
				return c.err("%s takes a list of filters: {%q:[{…},{…}]}", key, key)
			}
			return c.list("a list of filters", func(int) error {
				n, err := c.node(depth + 1)
				kids = append(kids, n)
				return err
			})
		case "not":
			n, err := c.node(depth + 1)
			kids = append(kids, n)
			return err
		case "col", "op":
			t, err := c.scalar()
			if err != nil {
				return err
			}
			if t.kind != tokString {
				return c.err("%s must be a string, not %s", key, t.kind)
			}
			if key == "col" {
				colName = t.s
			} else {
				opName = t.s
			}
			return nil
		case "value":
			t, err := c.scalar()
			if err != nil {
				return err
			}
			if t.kind == tokOther {
				return c.err("value must be one string, number or boolean; for a list of values use op \"in\" with values")
			}
			val = t
			return nil
		default: // values
			if c.peek() != '[' {
				return c.err(`values must be a list: "values":[…]`)
			}
			return c.list("a list of values", func(int) error {
				c.inValues++
				if c.inValues > c.lim.MaxInValues {
					return c.err("the filter's in lists hold more than %d values in all; use fewer values", c.lim.MaxInValues)
				}
				t, err := c.scalar()
				if err != nil {
					return err
				}
				if t.kind == tokOther {
					return c.err("each of values must be a string, number or boolean")
				}
				vals = append(vals, t)
				return nil
			})
		}
	})
	if err != nil {
		return node{}, err
	}
	switch have {
	case fAnd, fOr:
		op, word := opAnd, "and"
		if have == fOr {
			op, word = opOr, "or"
		}
		if len(kids) == 0 {
			return node{}, c.err("%s needs at least one filter in its list", word)
		}
		if len(kids) == 1 {
			return kids[0], nil
		}
		return node{op: op, kids: kids}, nil
	case fNot:
		return node{op: opNot, kids: kids}, nil
	case 0:
		return node{}, c.err("the object is empty: %s", nodeForms)
	}
	if have&(fAnd|fOr|fNot) != 0 {
		return node{}, c.err("the object mixes fields of different node kinds: %s", nodeForms)
	}
	if have&fCol == 0 {
		return node{}, c.err("a comparison needs col, the column it tests")
	}
	if have&fOp == 0 {
		return node{}, c.err(`a comparison needs op, one of "=", "<>", "<", "<=", ">", ">=", "in", "is null", "is not null"`)
	}
	return c.comparison(colName, opName, have, val, vals)
}

func (c *compiler) comparison(colName, opName string, have int, val token, vals []token) (node, error) {
	ci, ok := c.byName[colName]
	if !ok {
		c.push("col")
		defer c.pop()
		return node{}, c.err("%s", c.unknownColumn(colName))
	}
	col := &c.cols[ci]
	op, ok := opNames[strings.ToLower(opName)]
	if !ok {
		c.push("op")
		defer c.pop()
		return node{}, c.err(`unknown op %q; use one of "=", "<>", "<", "<=", ">", ">=", "in", "is null", "is not null"`, opName)
	}
	if msg := col.supports(op); msg != "" {
		c.push("op")
		defer c.pop()
		return node{}, c.err("%s", msg)
	}
	c.used[ci] = true
	n := node{op: op, col: col}
	switch op {
	case opIsNull, opNotNull:
		if have&(fValue|fValues) != 0 {
			return node{}, c.err("%q takes no value; remove value and values", opName)
		}
		return n, nil
	case opIn:
		if have&fValue != 0 {
			c.push("value")
			defer c.pop()
			return node{}, c.err(`in takes values, a list ("values":[…]), not value`)
		}
		if have&fValues == 0 {
			return node{}, c.err(`in needs values, a list: "values":[…]`)
		}
		if len(vals) == 0 {
			c.push("values")
			defer c.pop()
			return node{}, c.err("values is empty; give at least one value")
		}
		c.push("values")
		for i, t := range vals {
			c.pushIdx(i)
			v, err := c.constant(col, t, opName)
			c.pop()
			if err != nil {
				return node{}, err
			}
			n.set = append(n.set, v)
		}
		c.pop()
		slices.SortFunc(n.set, func(a, b value) int { return compare(col, &a, &b) })
		n.set = slices.CompactFunc(n.set, func(a, b value) bool { return compare(col, &a, &b) == 0 })
		if col.intOrdered() {
			for _, v := range n.set {
				n.ints = append(n.ints, v.i)
			}
			n.set = nil
		}
		return n, nil
	}
	if have&fValues != 0 {
		c.push("values")
		defer c.pop()
		return node{}, c.err(`values is for in; %q takes value, one value`, opName)
	}
	if have&fValue == 0 {
		return node{}, c.err("%q needs value, the value to compare with", opName)
	}
	c.push("value")
	defer c.pop()
	v, err := c.constant(col, val, opName)
	if err != nil {
		return node{}, err
	}
	n.c = v
	return n, nil
}

func (c *compiler) unknownColumn(name string) string {
	names := make([]string, 0, len(c.cols))
	for _, col := range c.cols {
		names = append(names, fmt.Sprintf("%q", col.name))
	}
	list := strings.Join(names, ", ")
	if len(names) > 20 {
		list = strings.Join(names[:20], ", ") + fmt.Sprintf(" and %d more", len(names)-20)
	}
	if len(names) == 0 {
		return fmt.Sprintf("column %q is not a published column of the table, which publishes none", name)
	}
	return fmt.Sprintf("column %q is not a published column of the table; use one of %s", name, list)
}

// constant converts one filter value for col, or says what to give instead.
func (c *compiler) constant(col *column, t token, opName string) (value, error) {
	if t.kind == tokNull {
		hint := `{"col":"` + col.name + `","op":"is null"}`
		if opName == "<>" || opName == "!=" {
			hint = `{"col":"` + col.name + `","op":"is not null"}`
		}
		return value{}, c.err("null is not a value to compare with (a comparison with NULL is never true); to test for NULL use %s", hint)
	}
	v, msg := col.constant(t)
	if msg != "" {
		return value{}, c.err("column %q is %s; %s", col.name, col.typ, msg)
	}
	return v, nil
}
