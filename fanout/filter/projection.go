package filter

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/walcast/walcast/decoder"
)

// Projection is a column list: the published columns a subscriber asked
// for plus the table's key columns, which are always kept so that every
// row image can still be told apart from the others. It is immutable and
// safe for concurrent use.
type Projection struct {
	cols []string
	keep map[string]bool
}

// NewProjection checks names, a subscriber's column list, against the
// table's published columns cols (their Key flags name the key columns).
// An unknown column or one named twice is refused with an *Error whose
// path is columns[i]. An empty list keeps the key columns only.
func NewProjection(names []string, cols []decoder.ColumnInfo) (*Projection, error) {
	if len(names) > len(cols) {
		return nil, &Error{Path: "columns", Msg: fmt.Sprintf("the list names %d columns and the table publishes %d; name each published column at most once", len(names), len(cols))}
	}
	published := make(map[string]bool, len(cols))
	for _, c := range cols {
		published[c.Name] = true
	}
	p := &Projection{keep: make(map[string]bool, len(names))}
	for i, n := range names {
		path := fmt.Sprintf("columns[%d]", i)
		if !published[n] {
			return nil, &Error{Path: path, Msg: fmt.Sprintf("column %q is not a published column of the table; remove it or name a published one", n)}
		}
		if p.keep[n] {
			return nil, &Error{Path: path, Msg: fmt.Sprintf("column %q is listed twice; list it once", n)}
		}
		p.keep[n] = true
	}
	for _, c := range cols {
		if c.Key {
			p.keep[c.Name] = true
		}
		if p.keep[c.Name] {
			p.cols = append(p.cols, c.Name)
		}
	}
	return p, nil
}

// Columns returns the kept columns in the table's column order. The slice
// is shared; do not modify it.
func (p *Projection) Columns() []string { return p.cols }

// Has reports whether column name is kept.
func (p *Projection) Has(name string) bool { return p.keep[name] }

// Values returns the kept entries of values, a row image, in a new map
// (nil for a nil image); values itself is not modified.
func (p *Projection) Values(values map[string]json.RawMessage) map[string]json.RawMessage {
	if values == nil {
		return nil
	}
	out := make(map[string]json.RawMessage, min(len(values), len(p.cols)))
	for k, v := range values {
		if p.keep[k] {
			out[k] = v
		}
	}
	return out
}

// Names returns the kept entries of a list of column names (an envelope's
// unchanged or afterJsonNull), in their order; nil when none is kept.
func (p *Projection) Names(list []string) []string {
	var out []string
	for _, n := range list {
		if p.keep[n] {
			out = append(out, n)
		}
	}
	return slices.Clip(out)
}
