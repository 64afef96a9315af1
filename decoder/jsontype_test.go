package decoder

import (
	"encoding/json"
	"testing"
)

// TestJSONOf: the kind JSONOf names for a column is the JSON a value of
// that column is encoded as (RowEncoder.Values, the encoding of every
// envelope), for built-in types, domains named by their base type, arrays
// of built-in types and of a described domain, and types not built in.
func TestJSONOf(t *testing.T) {
	for _, c := range []struct {
		col   ColumnInfo
		want  ColumnJSON
		value string // a text value, and the JSON type it must become
		json  string
	}{
		{ColumnInfo{TypeOID: 16}, ColumnJSON{Kind: JSONBool}, "t", "bool"},
		{ColumnInfo{TypeOID: 23}, ColumnJSON{Kind: JSONInteger}, "42", "number"},
		{ColumnInfo{TypeOID: 20}, ColumnJSON{Kind: JSONInt8}, "9007199254740993", "string"},
		{ColumnInfo{TypeOID: 20}, ColumnJSON{Kind: JSONInt8}, "12", "number"},
		{ColumnInfo{TypeOID: 701}, ColumnJSON{Kind: JSONFloat}, "NaN", "string"},
		{ColumnInfo{TypeOID: 1700}, ColumnJSON{Kind: JSONNumeric}, "1.5", "number"},
		{ColumnInfo{TypeOID: 3802}, ColumnJSON{Kind: JSONEmbedded}, `{"a":1}`, "object"},
		{ColumnInfo{TypeOID: 17}, ColumnJSON{Kind: JSONBytes}, `\x0102`, "string"},
		{ColumnInfo{TypeOID: 1184}, ColumnJSON{Kind: JSONTimestamptz}, "2026-01-02 03:04:05+00", "string"},
		{ColumnInfo{TypeOID: 1114}, ColumnJSON{Kind: JSONTimestamp}, "2026-01-02 03:04:05", "string"},
		{ColumnInfo{TypeOID: 2950}, ColumnJSON{Kind: JSONString}, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "string"},
		{ColumnInfo{TypeOID: 1007}, ColumnJSON{Kind: JSONInteger, Array: true}, "{1,2}", "array"},
		{ColumnInfo{TypeOID: 1009}, ColumnJSON{Kind: JSONString, Array: true}, "{a,b}", "array"},
		// A domain over bool; a domain over int4[]; an enum.
		{ColumnInfo{TypeOID: 16400, BaseSchema: "pg_catalog", BaseName: "bool"}, ColumnJSON{Kind: JSONBool}, "f", "bool"},
		{ColumnInfo{TypeOID: 16401, BaseSchema: "pg_catalog", BaseName: "_int4"}, ColumnJSON{Kind: JSONInteger, Array: true}, "{1}", "array"},
		{ColumnInfo{TypeOID: 16402, BaseSchema: "public", BaseName: "mood"}, ColumnJSON{Kind: JSONString}, "ok", "string"},
		// An array of a domain over numeric, described and not.
		{ColumnInfo{TypeOID: 16403, BaseSchema: "public", BaseName: "_posnum", Element: ArrayElement{Schema: "pg_catalog", Name: "numeric"}},
			ColumnJSON{Kind: JSONNumeric, Array: true}, "{4.5}", "array"},
		{ColumnInfo{TypeOID: 16403, BaseSchema: "public", BaseName: "_posnum"}, ColumnJSON{Kind: JSONString, Array: true}, "{4.5}", "array"},
		// A type of another schema named like a built-in is not one.
		{ColumnInfo{TypeOID: 16404, BaseSchema: "public", BaseName: "int4"}, ColumnJSON{Kind: JSONString}, "7", "string"},
	} {
		c.col.Name = "v"
		if got := JSONOf(c.col); got != c.want {
			t.Errorf("JSONOf(%+v) = %+v, want %+v", c.col, got, c.want)
		}
		enc := NewRowEncoder("public", "t", []ColumnInfo{c.col}, "")
		var vals []any
		if err := json.Unmarshal(enc.Values(nil, [][]byte{[]byte(c.value)}, []int{0}), &vals); err != nil {
			t.Fatal(err)
		}
		var got string
		switch v := vals[0].(type) {
		case bool:
			got = "bool"
		case float64:
			got = "number"
		case string:
			got = "string"
		case []any:
			got = "array"
			if len(v) > 0 {
				if _, str := v[0].(string); str != (c.want.Kind == JSONString) {
					t.Errorf("%+v %q: element %v (%T), kind %v", c.col, c.value, v[0], v[0], c.want.Kind)
				}
			}
		case map[string]any:
			got = "object"
		}
		if got != c.json {
			t.Errorf("%+v: %q encoded as %v (%s), want a %s", c.col, c.value, vals[0], got, c.json)
		}
	}
}
