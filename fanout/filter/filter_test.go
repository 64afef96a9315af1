package filter

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/walcast/walcast/decoder"
)

// testCols is a table with a column of every type family.
var testCols = []decoder.ColumnInfo{
	{Name: "id", TypeOID: 23, Key: true},
	{Name: "i2", TypeOID: 21},
	{Name: "i8", TypeOID: 20},
	{Name: "n", TypeOID: 1700},
	{Name: "f8", TypeOID: 701},
	{Name: "f4", TypeOID: 700},
	{Name: "t", TypeOID: 25},
	{Name: "vc", TypeOID: 1043},
	{Name: "bp", TypeOID: 1042},
	{Name: "b", TypeOID: 16},
	{Name: "ts", TypeOID: 1184},
	{Name: "tsn", TypeOID: 1114},
	{Name: "u", TypeOID: 2950},
	{Name: "d", TypeOID: 1082},
	{Name: "j", TypeOID: 3802},
	{Name: "by", TypeOID: 17},
	{Name: "arr", TypeOID: 1007},
	{Name: "x", TypeOID: 28},
	{Name: "dom", TypeOID: 16400, BaseSchema: "pg_catalog", BaseName: "int8"},
	{Name: "mood", TypeOID: 16401, BaseSchema: "public", BaseName: "mood"},
}

func mustCompile(t testing.TB, src string) *Filter {
	t.Helper()
	f, err := Compile([]byte(src), testCols, Limits{})
	if err != nil {
		t.Fatalf("Compile(%s): %v", src, err)
	}
	return f
}

func rowOf(t testing.TB, js string) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(js), &m); err != nil {
		t.Fatalf("row %s: %v", js, err)
	}
	return m
}

type semCase struct {
	filter string
	row    string
	want   Result
}

func runCases(t *testing.T, cases []semCase) {
	t.Helper()
	for _, c := range cases {
		f := mustCompile(t, c.filter)
		if got := f.Match(Row{Values: rowOf(t, c.row)}); got != c.want {
			t.Errorf("filter %s\n  row %s\n  got %v, want %v", c.filter, c.row, got, c.want)
		}
	}
}

func cmpF(col, op, val string) string {
	return `{"col":"` + col + `","op":"` + op + `","value":` + val + `}`
}

func TestIntegers(t *testing.T) {
	runCases(t, []semCase{
		{cmpF("id", "=", "1"), `{"id":1}`, Matches},
		{cmpF("id", "=", "1"), `{"id":2}`, NoMatch},
		{cmpF("id", "=", "1.0"), `{"id":1}`, Matches},
		{cmpF("id", "=", "1e1"), `{"id":10}`, Matches},
		{cmpF("id", "<>", "1"), `{"id":2}`, Matches},
		{cmpF("id", "!=", "1"), `{"id":1}`, NoMatch},
		{cmpF("id", "<", "-5"), `{"id":-6}`, Matches},
		{cmpF("id", "<=", "-5"), `{"id":-5}`, Matches},
		{cmpF("id", ">", "-5"), `{"id":-5}`, NoMatch},
		{cmpF("id", ">=", "-5"), `{"id":-5}`, Matches},
		{cmpF("id", "=", "1"), `{"id":null}`, NoMatch},
		{cmpF("id", "<>", "1"), `{"id":null}`, NoMatch},
		// int8 beyond 2^53 arrives as a string and compares exactly.
		{cmpF("i8", ">", "9007199254740992"), `{"i8":"9007199254740993"}`, Matches},
		{cmpF("i8", ">", `"9007199254740992"`), `{"i8":"9007199254740993"}`, Matches},
		{cmpF("i8", "=", `"9007199254740993"`), `{"i8":9007199254740992}`, NoMatch},
		{cmpF("i8", "=", "9007199254740993"), `{"i8":"9007199254740993"}`, Matches},
		{cmpF("i8", "<", `"-9223372036854775808"`), `{"i8":"-9223372036854775807"}`, NoMatch},
		{cmpF("i8", "=", `"9223372036854775807"`), `{"i8":"9223372036854775807"}`, Matches},
		{cmpF("dom", "=", `"9223372036854775807"`), `{"dom":"9223372036854775807"}`, Matches},
		{cmpF("i2", "=", "-32768"), `{"i2":-32768}`, Matches},
		{cmpF("x", "=", "4000000000"), `{"x":4000000000}`, Matches},
	})
}

func TestNumeric(t *testing.T) {
	runCases(t, []semCase{
		{cmpF("n", "=", "1.5"), `{"n":1.50}`, Matches},
		{cmpF("n", "=", `"1.500000000000000000000000000001"`), `{"n":"1.5000000000000000000000000000010"}`, Matches},
		{cmpF("n", "<", `"1.500000000000000000000000000001"`), `{"n":1.5}`, Matches},
		{cmpF("n", ">", `"9007199254740992"`), `{"n":"9007199254740993"}`, Matches},
		{cmpF("n", ">", "9007199254740992"), `{"n":"9007199254740993"}`, Matches},
		{cmpF("n", "=", `"1e3"`), `{"n":1000}`, Matches},
		{cmpF("n", "=", `" 12.0 "`), `{"n":12}`, Matches},
		{cmpF("n", "=", "0"), `{"n":"-0.000"}`, Matches},
		{cmpF("n", "<", "0"), `{"n":-0.001}`, Matches},
		{cmpF("n", "<", "-1"), `{"n":-10}`, Matches},
		{cmpF("n", ">", "-1"), `{"n":-0.5}`, Matches},
		{cmpF("n", ">", "0.001"), `{"n":0.0011}`, Matches},
		{cmpF("n", ">", "12345678901234567890123456789"), `{"n":"12345678901234567890123456790"}`, Matches},
		// NaN equals NaN and sorts above everything, Infinity included.
		{cmpF("n", "=", `"NaN"`), `{"n":"NaN"}`, Matches},
		{cmpF("n", ">", `"Infinity"`), `{"n":"NaN"}`, Matches},
		{cmpF("n", "<", `"NaN"`), `{"n":"Infinity"}`, Matches},
		{cmpF("n", ">", "1e300"), `{"n":"Infinity"}`, Matches},
		{cmpF("n", "<", "-1e300"), `{"n":"-Infinity"}`, Matches},
		{cmpF("n", "=", `"-Infinity"`), `{"n":"-Infinity"}`, Matches},
		{cmpF("n", "<>", `"NaN"`), `{"n":1}`, Matches},
	})
}

func TestFloats(t *testing.T) {
	runCases(t, []semCase{
		{cmpF("f8", "=", "0.1"), `{"f8":0.1}`, Matches},
		{cmpF("f8", "=", "0"), `{"f8":-0}`, Matches},
		{cmpF("f8", "<", "0.30000000000000004"), `{"f8":0.3}`, Matches},
		{cmpF("f8", "=", `"NaN"`), `{"f8":"NaN"}`, Matches},
		{cmpF("f8", ">", `"Infinity"`), `{"f8":"NaN"}`, Matches},
		{cmpF("f8", ">", "1e308"), `{"f8":"Infinity"}`, Matches},
		{cmpF("f8", "<", "-1e308"), `{"f8":"-Infinity"}`, Matches},
		{cmpF("f8", "<", `"NaN"`), `{"f8":"Infinity"}`, Matches},
		{cmpF("f8", "<>", `"NaN"`), `{"f8":"NaN"}`, NoMatch},
		{cmpF("f4", "=", "0.1"), `{"f4":0.1}`, Matches},
		{cmpF("f4", "=", "0.1"), `{"f4":0.10000001}`, NoMatch},
		{`{"col":"f8","op":"in","values":[1,"NaN"]}`, `{"f8":"NaN"}`, Matches},
		{`{"col":"f8","op":"in","values":[1,"NaN"]}`, `{"f8":2}`, NoMatch},
	})
}

func TestText(t *testing.T) {
	runCases(t, []semCase{
		{cmpF("t", "=", `""`), `{"t":""}`, Matches},
		{cmpF("t", "=", `""`), `{"t":null}`, NoMatch},
		{cmpF("t", "<", `"a"`), `{"t":""}`, Matches},
		// Byte order, as COLLATE "C": upper case before lower case, é after z.
		{cmpF("t", "<", `"a"`), `{"t":"Z"}`, Matches},
		{cmpF("t", ">", `"z"`), `{"t":"é"}`, Matches},
		{cmpF("t", "=", `"é"`), `{"t":"\u00e9"}`, Matches},
		{cmpF("t", "=", `"a\"b\\c"`), `{"t":"a\"b\\c"}`, Matches},
		{cmpF("t", "=", `"\ud83d\ude00"`), `{"t":"😀"}`, Matches},
		{cmpF("t", "=", `"\u0001\t"`), `{"t":"\u0001\t"}`, Matches},
		// Pattern characters are plain text.
		{cmpF("t", "=", `"%"`), `{"t":"abc"}`, NoMatch},
		{cmpF("t", "=", `".*"`), `{"t":"abc"}`, NoMatch},
		{cmpF("t", "=", `"\\"`), `{"t":"\\"}`, Matches},
		{cmpF("t", "=", `"a"`), `{"t":"a "}`, NoMatch},
		// Bytes that are not UTF-8 (which the decoder never writes) still
		// compare as bytes.
		{cmpF("t", ">", `"a"`), "{\"t\":\"\xff\"}", Matches},
		{cmpF("t", "=", `"\ufffd"`), "{\"t\":\"\xff\"}", NoMatch},
		{cmpF("vc", ">=", `"b"`), `{"vc":"b"}`, Matches},
		// character(n) ignores trailing spaces.
		{cmpF("bp", "=", `"ab"`), `{"bp":"ab   "}`, Matches},
		{cmpF("bp", "<", `"ab "`), `{"bp":"ab"}`, NoMatch},
		{cmpF("u", "=", `"0B7E5A1C-61F2-4B0E-9D0A-6F1C2E3D4A5B"`), `{"u":"0b7e5a1c-61f2-4b0e-9d0a-6f1c2e3d4a5b"}`, Matches},
		{cmpF("u", "<", `"1b7e5a1c-61f2-4b0e-9d0a-6f1c2e3d4a5b"`), `{"u":"0b7e5a1c-61f2-4b0e-9d0a-6f1c2e3d4a5b"}`, Matches},
		{cmpF("d", "=", `"2026-11-29"`), `{"d":"2026-11-29"}`, Matches},
		{cmpF("mood", "=", `"happy"`), `{"mood":"happy"}`, Matches},
		{cmpF("by", "=", `"AAEC"`), `{"by":"AAEC"}`, Matches},
		{cmpF("by", "<>", `"AAEC"`), `{"by":"AAED"}`, Matches},
	})
}

func TestBool(t *testing.T) {
	runCases(t, []semCase{
		{cmpF("b", "=", "true"), `{"b":true}`, Matches},
		{cmpF("b", "=", "true"), `{"b":false}`, NoMatch},
		{cmpF("b", "<", "true"), `{"b":false}`, Matches},
		{cmpF("b", "=", "false"), `{"b":null}`, NoMatch},
		{`{"col":"b","op":"is null"}`, `{"b":null}`, Matches},
	})
}

func TestTimestamps(t *testing.T) {
	runCases(t, []semCase{
		{cmpF("ts", "=", `"2026-11-30T00:21:24.5+01:00"`), `{"ts":"2026-11-29T23:21:24.500000Z"}`, Matches},
		{cmpF("ts", "=", `"2026-11-29T18:21:24.5-05:00"`), `{"ts":"2026-11-29T23:21:24.500000Z"}`, Matches},
		{cmpF("ts", "<", `"2026-11-30T00:21:24.5+01:00"`), `{"ts":"2026-11-29T23:21:24.499999Z"}`, Matches},
		{cmpF("ts", ">", `"2026-11-29T23:21:24Z"`), `{"ts":"2026-11-29T23:21:24.000001Z"}`, Matches},
		{cmpF("ts", "<", `"infinity"`), `{"ts":"2026-11-29T23:21:24.000001Z"}`, Matches},
		{cmpF("ts", "=", `"infinity"`), `{"ts":"infinity"}`, Matches},
		{cmpF("ts", ">", `"9999-12-31T23:59:59Z"`), `{"ts":"10000-01-01 00:00:00+00"}`, Matches},
		{cmpF("ts", "<", `"0001-01-01T00:00:00Z"`), `{"ts":"0001-12-31 23:59:59+00 BC"}`, Matches},
		{cmpF("ts", ">", `"-infinity"`), `{"ts":"0100-12-31 23:59:59+00 BC"}`, Matches},
		{cmpF("ts", "<", `"2000-01-01T00:00:00Z"`), `{"ts":"1999-12-31T23:59:59.999999Z"}`, Matches},
		{cmpF("ts", "=", `"2024-02-29T12:00:00Z"`), `{"ts":"2024-02-29T12:00:00.000000Z"}`, Matches},
		{cmpF("tsn", "=", `"2026-11-29T23:21:24.5"`), `{"tsn":"2026-11-29T23:21:24.500000"}`, Matches},
		{cmpF("tsn", ">", `"2026-11-29T23:21:24"`), `{"tsn":"2026-11-29T23:21:24.500000"}`, Matches},
		// A value not of its type's form cannot be judged.
		{cmpF("ts", "=", `"2026-11-29T23:21:24Z"`), `{"ts":"garbage"}`, Undecided},
	})
}

func TestNullTests(t *testing.T) {
	runCases(t, []semCase{
		{`{"col":"t","op":"is null"}`, `{"t":null}`, Matches},
		{`{"col":"t","op":"IS NULL"}`, `{"t":""}`, NoMatch},
		{`{"col":"t","op":"is not null"}`, `{"t":""}`, Matches},
		{`{"col":"j","op":"is null"}`, `{"j":null}`, Matches},
		{`{"col":"j","op":"is not null"}`, `{"j":{"a":1}}`, Matches},
		{`{"col":"arr","op":"is not null"}`, `{"arr":[1,null]}`, Matches},
		{`{"col":"arr","op":"is null"}`, `{"arr":null}`, Matches},
		// Three-valued logic: NOT of unknown is unknown.
		{`{"not":` + cmpF("t", "=", `"a"`) + `}`, `{"t":null}`, NoMatch},
		{`{"not":` + cmpF("t", "=", `"a"`) + `}`, `{"t":"b"}`, Matches},
		{`{"or":[` + cmpF("t", "=", `"a"`) + `,{"col":"t","op":"is null"}]}`, `{"t":null}`, Matches},
		{`{"and":[` + cmpF("t", "=", `"a"`) + `,` + cmpF("id", "=", "1") + `]}`, `{"t":null,"id":2}`, NoMatch},
		{`{"not":{"and":[` + cmpF("t", "=", `"a"`) + `,` + cmpF("id", "=", "1") + `]}}`, `{"t":null,"id":2}`, Matches},
		{`{"not":{"and":[` + cmpF("t", "=", `"a"`) + `,` + cmpF("id", "=", "1") + `]}}`, `{"t":null,"id":1}`, NoMatch},
		{`{"col":"t","op":"in","values":["a","b"]}`, `{"t":null}`, NoMatch},
		{`{"not":{"col":"t","op":"in","values":["a","b"]}}`, `{"t":null}`, NoMatch},
		{`{"not":{"col":"t","op":"in","values":["a","b"]}}`, `{"t":"c"}`, Matches},
	})
}

func TestIn(t *testing.T) {
	runCases(t, []semCase{
		{`{"col":"id","op":"in","values":[3,1,2,2]}`, `{"id":2}`, Matches},
		{`{"col":"id","op":"in","values":[3,1,2]}`, `{"id":4}`, NoMatch},
		{`{"col":"t","op":"in","values":["eu","us"]}`, `{"t":"us"}`, Matches},
		{`{"col":"t","op":"in","values":["eu","us"]}`, `{"t":"u"}`, NoMatch},
		{`{"col":"n","op":"in","values":["1.10",2]}`, `{"n":1.1}`, Matches},
		{`{"col":"ts","op":"in","values":["2026-11-30T00:00:00+01:00"]}`, `{"ts":"2026-11-29T23:00:00.000000Z"}`, Matches},
		{`{"col":"b","op":"in","values":[true]}`, `{"b":false}`, NoMatch},
		{`{"col":"mood","op":"in","values":["sad","happy"]}`, `{"mood":"happy"}`, Matches},
	})
}

// A column the row image does not carry leaves the result Undecided unless
// the rest of the filter settles it.
func TestMissingColumns(t *testing.T) {
	f := mustCompile(t, `{"and":[{"col":"id","op":"=","value":1},{"col":"t","op":"=","value":"a"}]}`)
	key := Row{Values: rowOf(t, `{"id":1}`)}
	if got := f.Match(key); got != Undecided {
		t.Errorf("key image with the key matching: %v, want undecided", got)
	}
	if got := f.Match(Row{Values: rowOf(t, `{"id":2}`)}); got != NoMatch {
		t.Errorf("key image with the key not matching: %v, want no match", got)
	}
	or := mustCompile(t, `{"or":[{"col":"id","op":"=","value":1},{"col":"t","op":"=","value":"a"}]}`)
	if got := or.Match(key); got != Matches {
		t.Errorf("or settled by the key: %v, want match", got)
	}
	// An unchanged TOAST column is known not to be NULL.
	toast := Row{Values: rowOf(t, `{"id":1}`), Unchanged: []string{"t"}}
	for src, want := range map[string]Result{
		`{"col":"t","op":"is null"}`:                                                  NoMatch,
		`{"col":"t","op":"is not null"}`:                                              Matches,
		`{"col":"t","op":"=","value":"a"}`:                                            Undecided,
		`{"not":{"col":"t","op":"=","value":"a"}}`:                                    Undecided,
		`{"or":[{"col":"t","op":"=","value":"a"},{"col":"t","op":"<>","value":"a"}]}`: Undecided,
		`{"or":[{"col":"t","op":"is not null"},{"col":"id","op":"=","value":9}]}`:     Matches,
	} {
		if got := mustCompile(t, src).Match(toast); got != want {
			t.Errorf("%s on an unchanged column: %v, want %v", src, got, want)
		}
	}
	missing := Row{Values: rowOf(t, `{"id":1}`)}
	if got := mustCompile(t, `{"col":"t","op":"is null"}`).Match(missing); got != Undecided {
		t.Errorf("is null of a column outside the image: %v, want undecided", got)
	}
	// A JSON null in a jsonb column is not SQL NULL.
	jn := Row{Values: rowOf(t, `{"j":null}`), JSONNull: []string{"j"}}
	if got := mustCompile(t, `{"col":"j","op":"is null"}`).Match(jn); got != NoMatch {
		t.Errorf("is null of a JSON null: %v, want no match", got)
	}
}

func TestColumns(t *testing.T) {
	f := mustCompile(t, `{"and":[{"col":"t","op":"=","value":"a"},{"or":[{"col":"id","op":">","value":1},{"col":"t","op":"is null"}]},{"not":{"col":"b","op":"=","value":true}}]}`)
	if got := strings.Join(f.Columns(), ","); got != "id,t,b" {
		t.Fatalf("Columns() = %s, want id,t,b (table order)", got)
	}
}

func TestCompileErrors(t *testing.T) {
	for _, c := range []struct{ src, path, msg string }{
		{`{"col":"nope","op":"=","value":1}`, "filter.col", `column "nope" is not a published column`},
		{`{"and":[{"col":"id","op":"=","value":1},{"col":"id","op":"=","value":1},{"col":"n","op":"=","value":true}]}`, "filter.and[2].value", `column "n" is numeric; give a number or a decimal string`},
		{`{"col":"id","op":"=","value":1.5}`, "filter.value", "1.5 is not an integer"},
		{`{"col":"id","op":"=","value":"1"}`, "filter.value", "give an integer number"},
		{`{"col":"i2","op":"=","value":40000}`, "filter.value", "out of its range"},
		{`{"col":"i8","op":"=","value":"9223372036854775808"}`, "filter.value", "out of its range"},
		{`{"col":"i8","op":"=","value":1e30}`, "filter.value", "out of its range"},
		{`{"col":"i8","op":"=","value":"1.5"}`, "filter.value", "not an integer"},
		{`{"col":"n","op":"=","value":"1e99999999999"}`, "filter.value", "not a decimal number"},
		{`{"col":"i8","op":"=","value":"NaN"}`, "filter.value", "give an integer number or a string"},
		{`{"col":"f8","op":"=","value":1e400}`, "filter.value", "out of its range"},
		{`{"col":"f8","op":"=","value":"1.5"}`, "filter.value", `give a number, or "NaN"`},
		{`{"col":"n","op":"=","value":"1.2.3"}`, "filter.value", "not a decimal number"},
		{`{"col":"t","op":"=","value":null}`, "filter.value", `to test for NULL use {"col":"t","op":"is null"}`},
		{`{"col":"t","op":"<>","value":null}`, "filter.value", `"op":"is not null"`},
		{`{"col":"t","op":"in","values":["a",null]}`, "filter.values[1]", "null is not a value"},
		{`{"col":"t","op":"=","value":1}`, "filter.value", `column "t" is text; give a string`},
		{`{"col":"t","op":"=","value":"a\u0000b"}`, "filter.value", "U+0000"},
		{`{"col":"t","op":"=","value":["a"]}`, "filter.value", `op "in" with values`},
		{`{"col":"t","op":"like","value":"a%"}`, "filter.op", `unknown op "like"`},
		{`{"col":"j","op":"=","value":"{}"}`, "filter.op", `only be tested with "is null"`},
		{`{"col":"arr","op":"=","value":1}`, "filter.op", `only be tested with "is null"`},
		{`{"col":"by","op":"<","value":"AA=="}`, "filter.op", "has no order"},
		{`{"col":"d","op":"<","value":"2026-01-01"}`, "filter.op", "has no order"},
		{`{"col":"x","op":">","value":1}`, "filter.op", "has no order"},
		{`{"col":"by","op":"=","value":"not base64"}`, "filter.value", "base64"},
		{`{"col":"u","op":"=","value":"xyz"}`, "filter.value", "32 hex digits"},
		{`{"col":"ts","op":"=","value":"2026-11-29T23:21:24"}`, "filter.value", "with its offset"},
		{`{"col":"ts","op":"=","value":"2026-11-29 23:21:24Z"}`, "filter.value", "with its offset"},
		{`{"col":"ts","op":"=","value":"2026-02-30T00:00:00Z"}`, "filter.value", "not such a value"},
		{`{"col":"ts","op":"=","value":"2026-11-29T23:21:24.1234567Z"}`, "filter.value", "at most six fractional digits"},
		{`{"col":"tsn","op":"=","value":"2026-11-29T23:21:24Z"}`, "filter.value", "without an offset"},
		{`{"col":"t","op":"is null","value":"a"}`, "filter", "takes no value"},
		{`{"col":"t","op":"in","value":"a"}`, "filter.value", "in takes values"},
		{`{"col":"t","op":"in","values":[]}`, "filter.values", "values is empty"},
		{`{"col":"t","op":"in","values":"a"}`, "filter.values", "values must be a list"},
		{`{"col":"t","op":"=","values":["a"]}`, "filter.values", "values is for in"},
		{`{"col":"t","op":"="}`, "filter", "needs value"},
		{`{"col":"t"}`, "filter", "needs op"},
		{`{"op":"=","value":1}`, "filter", "needs col"},
		{`{"col":1,"op":"=","value":1}`, "filter.col", "col must be a string"},
		{`{"and":[]}`, "filter", "and needs at least one"},
		{`{"and":{}}`, "filter.and", "and takes a list"},
		{`{"not":[]}`, "filter.not", "expected an object"},
		{`{}`, "filter", "the object is empty"},
		{`{"and":[{"col":"t","op":"is null"}],"col":"t"}`, "filter", "mixes fields"},
		{`{"col":"t","op":"=","value":"a","colour":"red"}`, "filter", `unknown field "colour"`},
		{`{"col":"t","op":"=","value":"a","value":"b"}`, "filter", `field "value" appears twice`},
		{`{"col":"t","col":"t","op":"is null"}`, "filter", `field "col" appears twice`},
		{`[]`, "filter", "expected an object"},
		{``, "filter", "the filter is empty"},
		{`   `, "filter", "the filter is empty"},
		{`{"col":"t","op":"is null"} {}`, "filter", "unexpected data after the filter"},
		{`{"col":"t","op":"is null"`, "filter", "ends early"},
		{`{"col":"t","op":"is null",}`, "filter", "quoted field name"},
		{`{"col":"t","op":"=","value":"a` + "\xff" + `"}`, "filter.value", "not valid UTF-8"},
		{`{"col":"t","op":"=","value":"a` + "\n" + `"}`, "filter.value", "control character"},
		{`{"col":"t","op":"=","value":"\ud800"}`, "filter.value", "lone UTF-16 surrogate"},
		{`{"col":"t","op":"=","value":"\x"}`, "filter.value", "invalid JSON"},
		{`{"col":"t","op":"=","value":01}`, "filter", "invalid JSON at byte 29"},
		{`{"col":"t","op":"=","value":tru}`, "filter.value", "expected true"},
		{`{"col":"t","op":"=","value":NaN}`, "filter.value", "expected a value"},
	} {
		_, err := Compile([]byte(c.src), testCols, Limits{})
		var fe *Error
		if !errors.As(err, &fe) {
			t.Errorf("%s: error %v, want an *Error", c.src, err)
			continue
		}
		if fe.Path != c.path || !strings.Contains(fe.Msg, c.msg) {
			t.Errorf("%s:\n  got  %v\n  want %s: …%s…", c.src, err, c.path, c.msg)
		}
	}
}
