package decoder

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// typeDef is a Type message: what pgoutput says about a type OID.
type typeDef struct {
	oid      uint32
	ns, name string
}

// afterOf decodes one insert into a relation with an int4 key "id" and one
// column "v" of type oid, after the given Type messages, and returns the
// body's after.v exactly as written.
func afterOf(t *testing.T, types []typeDef, oid uint32, v any) string {
	t.Helper()
	f := newFeeder(t, Config{})
	var msgs [][]byte
	for _, ty := range types {
		msgs = append(msgs, typeMsg(false, 0, ty.oid, ty.ns, ty.name))
	}
	msgs = append(msgs, beginMsg(700, 0x1F00),
		relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 23, true}, col{"v", oid, false}),
		insertMsg(false, 0, 1, "1", v), commitMsg(0x1F00, 0x2000))
	f.feed(msgs...)
	var env Envelope
	if err := json.Unmarshal([]byte(f.take()[0][0]), &env); err != nil {
		t.Fatal(err)
	}
	return string(env.After["v"])
}

// TestDomainOverArray: pgoutput names a domain over int4[] by its base type,
// pg_catalog._int4 (sent with the empty namespace), so it is an array of
// numbers, not of strings; likewise for the other built-in array rules.
func TestDomainOverArray(t *testing.T) {
	cases := []struct {
		base, in, want string
	}{
		{"_int4", "{1,2,NULL}", `[1,2,null]`},
		{"_int8", "{1,9007199254740993}", `[1,"9007199254740993"]`},
		{"_bool", "{t,f}", `[true,false]`},
		{"_jsonb", `{"{\"a\": 1}",NULL}`, `[{"a": 1},null]`},
		{"_timestamptz", `{"2026-01-01 00:00:00+00"}`, `["2026-01-01T00:00:00.000000Z"]`},
		{"_bytea", `{"\\x0102"}`, `["AQI="]`},
		{"_box", "{(1,1),(0,0);(2,2),(1,1)}", `["(1,1),(0,0)","(2,2),(1,1)"]`},
		{"_text", `{a,"b c"}`, `["a","b c"]`},
	}
	for _, c := range cases {
		for _, ns := range []string{"", "pg_catalog"} {
			got := afterOf(t, []typeDef{{20001, ns, c.base}}, 20001, c.in)
			if got != c.want {
				t.Errorf("domain over %s.%s %q: got %s, want %s", ns, c.base, c.in, got, c.want)
			}
		}
	}
}

// TestDomainEncodesAsBaseType: a domain encodes exactly as the built-in type
// it is over, which its Type message names. Only pg_catalog maps by name: a
// user type named like a built-in one is not that type; arrays of user types
// (enums, domains: pgoutput names the array but not its element type) are
// arrays of strings, domains over user types are strings, and a "_name" type
// whose value is not an array is its text.
func TestDomainEncodesAsBaseType(t *testing.T) {
	cases := []struct {
		ns, name, in, want string
	}{
		{"", "bool", "t", `true`}, {"", "bool", "f", `false`},
		{"", "int2", "-7", `-7`}, {"", "int4", "7", `7`}, {"", "oid", "42", `42`},
		{"", "int8", "9007199254740992", `9007199254740992`}, {"", "int8", "9007199254740993", `"9007199254740993"`},
		{"", "float8", "0.1", `0.1`}, {"", "float4", "NaN", `"NaN"`},
		{"", "numeric", "12.50", `12.50`}, {"", "numeric", "1234567890123456.1", `"1234567890123456.1"`},
		{"", "jsonb", `{"a": [1, null]}`, `{"a": [1, null]}`}, {"", "json", `[1,  2]`, `[1,  2]`},
		{"", "json", "\"\xff\"", `"\"\ufffd\""`}, // not UTF-8: a string, never invalid JSON
		{"", "bytea", `\x00ff10`, `"AP8Q"`},
		{"", "timestamptz", "2026-11-29 23:21:24.5+05:30", `"2026-11-29T17:51:24.500000Z"`},
		{"", "timestamp", "2026-11-29 23:21:24", `"2026-11-29T23:21:24.000000"`},
		{"pg_catalog", "bool", "t", `true`},
		{"", "text", "t", `"t"`}, {"", "name", "abc", `"abc"`},
		{"", "uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", `"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`},
		{"", "date", "2026-11-29", `"2026-11-29"`}, {"", "pg_attrdef", "(1,2)", `"(1,2)"`},

		{"public", "_int4", "{1,2}", `["1","2"]`},
		{"public", "int4", "7", `"7"`},
		{"public", "bool", "t", `"t"`},
		{"public", "jsonb", `{"a":1}`, `"{\"a\":1}"`},
		{"public", "mood", "happy", `"happy"`},      // an enum, or a domain over it
		{"public", "_posint", "{4,5}", `["4","5"]`}, // an array of a domain over int4
		{"public", "_x", "hello", `"hello"`},
	}
	for _, c := range cases {
		got := afterOf(t, []typeDef{{20001, c.ns, c.name}}, 20001, c.in)
		if got != c.want {
			t.Errorf("Type %q.%q %q: got %s, want %s", c.ns, c.name, c.in, got, c.want)
		}
	}
}

// TestInitdbTypeOIDs: types initdb creates have OIDs from FirstGenbkiObjectId
// (10000) to 16383, and pgoutput describes them with Type messages (the OIDs
// here are those of a PostgreSQL 15 cluster), so they follow the Type
// message, not the built-in table.
func TestInitdbTypeOIDs(t *testing.T) {
	types := []typeDef{
		{13225, "information_schema", "_sql_identifier"},
		{13226, "", "name"}, // information_schema.sql_identifier, a domain over name
		{13220, "information_schema", "_cardinal_number"},
		{13221, "", "int4"}, // information_schema.cardinal_number, a domain over int4
		{10000, "", "_pg_attrdef"},
	}
	cases := []struct {
		oid      uint32
		in, want string
	}{
		{13225, "{a,b}", `["a","b"]`},
		{13226, "abc", `"abc"`},
		{13220, "{8,9}", `["8","9"]`},
		{13221, "7", `7`},
		{10000, `{"(1,2)"}`, `["(1,2)"]`},
		{12345, "{1}", `"{1}"`}, // no Type message: text
	}
	for _, c := range cases {
		if got := afterOf(t, types, c.oid, c.in); got != c.want {
			t.Errorf("oid %d %q: got %s, want %s", c.oid, c.in, got, c.want)
		}
	}
}

// TestCatalogRowTypeArrays: arrays of the catalogs' row types with
// hand-assigned OIDs (pg_type[], pg_attribute[], pg_proc[], pg_class[]) get
// no Type message, so the built-in table must know them as arrays.
func TestCatalogRowTypeArrays(t *testing.T) {
	var scratch []byte
	for _, oid := range []uint32{210, 270, 272, 273} {
		got := string(appendValue(nil, builtinType(oid), []byte(`{"(1,x)",NULL}`), &scratch))
		if got != `["(1,x)",null]` {
			t.Errorf("oid %d: got %s", oid, got)
		}
	}
}

// jsonNullCols: a relation with a jsonb key, json and jsonb columns, a
// domain over jsonb (OID 20001, Type message pg_catalog.jsonb), and columns
// whose text "null" is not JSON null (text, jsonb[]).
var jsonNullCols = []col{{"k", 3802, true}, {"doc", 3802, false}, {"meta", 114, false}, {"dj", 20001, false},
	{"txt", 25, false}, {"ja", 3807, false}}

// TestJSONNullLists: SQL NULL and the JSON literal null are both null in
// the row; the row is followed by the list of its JSON-null columns,
// beforeJsonNull or afterJsonNull, absent when empty. key has none and stays
// exactly Change.Key.
func TestJSONNullLists(t *testing.T) {
	f := newFeeder(t, Config{})
	f.feed(
		typeMsg(false, 0, 20001, "", "jsonb"),
		beginMsg(700, 0x1F00),
		relationMsg(false, 0, 1, "public", "j", 'f', jsonNullCols...),
		insertMsg(false, 0, 1, "1", "null", " null\n", "null", "null", `{"null",NULL}`),
		insertMsg(false, 0, 1, "2", nil, nil, nil, nil, nil),
		updateMsg(false, 0, 1, 'O', []any{"1", "null", " null\n", "null", "null", nil}, "1", nil, `{}`, "null", "x", nil),
		updateMsg(false, 0, 1, 'O', []any{"1", "null", nil, nil, nil, nil}, "1", unchangedToast, nil, nil, nil, nil),
		deleteMsg(false, 0, 1, 'O', "null", nil, nil, nil, nil, nil),
		commitMsg(0x1F00, 0x2000),
	)
	got := f.take()[0]
	tail := func(s string) string { return s[strings.Index(s, `,"key"`):] }
	want := []string{
		`,"key":{"k":1},"after":{"k":1,"doc":null,"meta": null` + "\n" + `,"dj":null,"txt":"null","ja":[null,null]},"afterJsonNull":["doc","meta","dj"]}`,
		`,"key":{"k":2},"after":{"k":2,"doc":null,"meta":null,"dj":null,"txt":null,"ja":null}}`,
		`,"key":{"k":1},"before":{"k":1,"doc":null,"meta": null` + "\n" + `,"dj":null,"txt":"null","ja":null},"beforeJsonNull":["doc","meta","dj"],` +
			`"after":{"k":1,"doc":null,"meta":{},"dj":null,"txt":"x","ja":null},"afterJsonNull":["dj"]}`,
		`,"key":{"k":1},"before":{"k":1,"doc":null,"meta":null,"dj":null,"txt":null,"ja":null},"beforeJsonNull":["doc"],` +
			`"after":{"k":1,"doc":null,"meta":null,"dj":null,"txt":null,"ja":null},"afterJsonNull":["doc"]}`,
		`,"key":{"k":null},"before":{"k":null,"doc":null,"meta":null,"dj":null,"txt":null,"ja":null},"beforeJsonNull":["k"]}`,
	}
	if len(got) != len(want) {
		t.Fatalf("%d changes, want %d", len(got), len(want))
	}
	for i := range want {
		if tail(got[i]) != want[i] {
			t.Errorf("change %d:\n got %s\nwant %s", i, tail(got[i]), want[i])
		}
	}
	// Readers decode the lists with Envelope.
	var env Envelope
	if err := json.Unmarshal([]byte(got[2]), &env); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(env.BeforeJSONNull, []string{"doc", "meta", "dj"}) || !reflect.DeepEqual(env.AfterJSONNull, []string{"dj"}) {
		t.Errorf("Envelope lists: before %q, after %q", env.BeforeJSONNull, env.AfterJSONNull)
	}
}

// TestJSONNullKeyOnly: a key-only old row ('K') gets its list too, and a
// column name is escaped in the list as in the row.
func TestJSONNullKeyOnly(t *testing.T) {
	f := newFeeder(t, Config{})
	f.feed(
		beginMsg(700, 0x1F00),
		relationMsg(false, 0, 1, "public", "j", 'i', col{`k"1`, 3802, true}, col{"v", 3802, false}),
		updateMsg(false, 0, 1, 'K', []any{" null", nil}, "2", "null"),
		deleteMsg(false, 0, 1, 'K', "null", nil),
		commitMsg(0x1F00, 0x2000),
	)
	got := f.take()[0]
	want := []string{
		`,"key":{"k\"1":2},"before":{"k\"1": null},"beforeJsonNull":["k\"1"],"after":{"k\"1":2,"v":null},"afterJsonNull":["v"]}`,
		`,"key":{"k\"1":null},"before":{"k\"1":null},"beforeJsonNull":["k\"1"]}`,
	}
	for i := range want {
		if g := got[i][strings.Index(got[i], `,"key"`):]; g != want[i] {
			t.Errorf("change %d:\n got %s\nwant %s", i, g, want[i])
		}
	}
}

func TestIsJSONNull(t *testing.T) {
	for in, want := range map[string]bool{"null": true, " \t\r\nnull\n ": true, "Null": false, "nul": false,
		`"null"`: false, "null null": false, "": false, "[null]": false} {
		if got := isJSONNull([]byte(in)); got != want {
			t.Errorf("isJSONNull(%q) = %v", in, got)
		}
	}
}

// BenchmarkDecodeInsertJSONNull: the 10-column insert of
// BenchmarkDecodeInsert10Col with its jsonb column holding JSON null, so
// the row carries an afterJsonNull list.
func BenchmarkDecodeInsertJSONNull(b *testing.B) {
	row := benchRow(42)
	row[8] = "null"
	benchLoop(b, relationMsg(false, 0, 1, "public", "accounts", 'd', benchCols...), insertMsg(false, 0, 1, row...))
}

// TestArrayOfDomain: pgoutput names an array of a domain "_name" and says
// nothing of its elements; with Config.ArrayElement (or
// ColumnInfo.Element for snapshot reads) they are encoded exactly as the
// domain's base type, with the element type's delimiter. Without it, or
// for a type it does not know, they stay strings.
func TestArrayOfDomain(t *testing.T) {
	elems := map[uint32]ArrayElement{16601: {Schema: "pg_catalog", Name: "numeric"}, 16602: {Schema: "pg_catalog", Name: "box", Delim: ';'},
		16603: {Schema: "public", Name: "mood"}}
	var asked []uint32
	lookup := func(oid uint32) (ArrayElement, bool, error) {
		asked = append(asked, oid)
		e, ok := elems[oid]
		return e, ok, nil
	}
	row := []any{"1", "{42.5,NULL,NaN}", "{(1,1),(0,0);(2,2),(1,1)}", "{sad,ok}", "{7}"}
	want := `"after":{"id":1,"pn":[42.5,null,"NaN"],"pb":["(1,1),(0,0)","(2,2),(1,1)"],"pm":["sad","ok"],"other":["7"]}`
	cols := []col{{"id", 23, true}, {"pn", 16601, false}, {"pb", 16602, false}, {"pm", 16603, false}, {"other", 16604, false}}
	f := newFeeder(t, Config{ArrayElement: lookup})
	f.feed(typeMsg(false, 0, 16601, "public", "_posnum"), typeMsg(false, 0, 16602, "public", "_posbox"),
		typeMsg(false, 0, 16603, "public", "_dmood"), typeMsg(false, 0, 16604, "public", "_unknown"),
		typeMsg(false, 0, 16605, "public", "notarray"), typeMsg(false, 0, 16606, "", "_pg_attrdef"),
		relationMsg(false, 0, 1, "public", "t", 'd', cols...), beginMsg(5, 0x2000), insertMsg(false, 0, 1, row...), commitMsg(0x2000, 0x2010))
	got := f.take()
	if !strings.Contains(got[0][0], want) {
		t.Fatalf("with ArrayElement:\n%s\nwant %s", got[0][0], want)
	}
	if len(asked) != 4 {
		t.Fatalf("ArrayElement asked about %v: only arrays outside pg_catalog", asked)
	}

	// A snapshot read of the same row is the same.
	var infos []ColumnInfo
	for _, c := range cols {
		ci := ColumnInfo{Name: c.name, TypeOID: c.oid, Key: c.key, BaseSchema: "public", BaseName: "_x", Element: elems[c.oid]}
		if c.oid < 10000 {
			ci.BaseSchema, ci.BaseName = "", ""
		}
		infos = append(infos, ci)
	}
	vals := make([][]byte, len(row))
	for i, v := range row {
		vals[i] = []byte(v.(string))
	}
	b := NewTxBuilder(5, 0x2000, 0x2010, testTime)
	b.Read(NewRowEncoder("public", "t", infos, ""), 0x1000, vals)
	if rd := bodies(t, b.Transaction()); !strings.Contains(rd[0], want) {
		t.Fatalf("read:\n%s\nwant %s", rd[0], want)
	}

	// Without it: strings, as documented for types pgoutput does not describe.
	f = newFeeder(t, Config{})
	f.feed(typeMsg(false, 0, 16601, "public", "_posnum"), relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 23, true}, col{"pn", 16601, false}),
		beginMsg(5, 0x2000), insertMsg(false, 0, 1, "1", "{42.5}"), commitMsg(0x2000, 0x2010))
	if got := f.take(); !strings.Contains(got[0][0], `"pn":["42.5"]`) {
		t.Fatalf("without ArrayElement: %s", got[0][0])
	}

	// A failed lookup ends Decode with its error.
	d := New(Config{ArrayElement: func(uint32) (ArrayElement, bool, error) {
		return ArrayElement{}, false, errors.New("catalog unreachable")
	}})
	defer d.Close()
	if err := d.Decode(0x1000, typeMsg(false, 0, 16601, "public", "_posnum")); err == nil || !strings.Contains(err.Error(), "catalog unreachable") {
		t.Fatalf("Decode = %v, want the lookup's error", err)
	}
}
