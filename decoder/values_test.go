package decoder

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestAppendValue(t *testing.T) {
	cases := []struct {
		oid  uint32
		in   string
		want string
	}{
		{16, "t", `true`}, {16, "f", `false`},
		{21, "-32768", `-32768`}, {23, "2147483647", `2147483647`}, {23, "abc", `"abc"`},
		{20, "9007199254740992", `9007199254740992`},
		{20, "-9007199254740992", `-9007199254740992`},
		{20, "9007199254740993", `"9007199254740993"`},
		{20, "9223372036854775807", `"9223372036854775807"`},
		{20, "-9223372036854775808", `"-9223372036854775808"`},
		{700, "1.1", `1.1`}, {701, "1e+100", `1e+100`}, {701, "-0", `-0`}, {701, "1.5e-07", `1.5e-07`},
		{701, "NaN", `"NaN"`}, {701, "Infinity", `"Infinity"`}, {701, "-Infinity", `"-Infinity"`},
		{1700, "1.5000000000", `1.5000000000`},
		{1700, "123456789012345.0000000000", `123456789012345.0000000000`},
		{1700, "1234567890123456.1", `"1234567890123456.1"`},
		{1700, "0.1234567890123456", `"0.1234567890123456"`},
		{1700, "0.000000000000000000001", `0.000000000000000000001`},
		{1700, "9007199254740992", `9007199254740992`},
		{1700, "9007199254740993", `"9007199254740993"`},
		{1700, "1000000000000000000000", `1000000000000000000000`},
		{1700, "1000000000000000000001", `"1000000000000000000001"`},
		{1700, "1234567890123456789012345678.1234567890", `"1234567890123456789012345678.1234567890"`},
		{1700, "NaN", `"NaN"`}, {1700, "-Infinity", `"-Infinity"`}, {1700, "0", `0`}, {1700, "-0.50", `-0.50`},
		{114, `{"a": 1}`, `{"a": 1}`}, {3802, `[1, "x", null]`, `[1, "x", null]`}, {3802, `{bad`, `"{bad"`},
		{17, `\x00ff10`, `"AP8Q"`}, {17, `\x`, `""`}, {17, `\xzz`, `"\\xzz"`},
		{1114, "2026-11-29 23:21:24.123456", `"2026-11-29T23:21:24.123456"`},
		{1114, "2026-11-29 23:21:24", `"2026-11-29T23:21:24.000000"`},
		{1114, "infinity", `"infinity"`}, {1114, "0044-03-15 00:00:00 BC", `"0044-03-15 00:00:00 BC"`},
		{1184, "2026-11-29 23:21:24.5+00", `"2026-11-29T23:21:24.500000Z"`},
		{1184, "2026-11-29 23:21:24.5+05:30", `"2026-11-29T17:51:24.500000Z"`},
		{1184, "2026-01-01 00:00:00-08", `"2026-01-01T08:00:00.000000Z"`},
		{1184, "1883-11-18 12:00:00-04:56:02", `"1883-11-18T16:56:02.000000Z"`},
		{1184, "-infinity", `"-infinity"`}, {1184, "12345-01-01 00:00:00+00", `"12345-01-01 00:00:00+00"`},
		{25, "he said \"hi\"\n\t\\ \x01 é", `"he said \"hi\"\n\t\\ \u0001 é"`}, {25, "\xff", `"\ufffd"`},
		{2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", `"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`},
		{1186, "P1Y2M3DT4H5M6S", `"P1Y2M3DT4H5M6S"`}, {1560, "101", `"101"`}, {3904, "[1,5)", `"[1,5)"`},
		{1007, "{1,2,3}", `[1,2,3]`}, {1007, "{{1,2},{3,NULL}}", `[[1,2],[3,null]]`}, {1007, "{}", `[]`},
		{1007, "[0:1]={1,2}", `"[0:1]={1,2}"`}, {1007, "{1,2", `"{1,2"`},
		{1009, `{a,"b c","d\"e","NULL",NULL}`, `["a","b c","d\"e","NULL",null]`},
		{1016, "{1,9007199254740993}", `[1,"9007199254740993"]`},
		{1022, "{1.5,NaN}", `[1.5,"NaN"]`}, {1000, "{t,f}", `[true,false]`},
		{3807, `{"{\"a\": 1}","[2]"}`, `[{"a": 1},[2]]`},
		{1001, `{"\\x0102","\\x"}`, `["AQI=",""]`},
		{1185, `{"2026-01-01 00:00:00+00",infinity}`, `["2026-01-01T00:00:00.000000Z","infinity"]`},
		{1020, "{(1,1),(0,0);(2,2),(1,1)}", `["(1,1),(0,0)","(2,2),(1,1)"]`},
		{1231, "{1.5,NaN}", `[1.5,"NaN"]`},
	}
	var scratch []byte
	for _, c := range cases {
		got := string(appendValue(nil, builtinType(c.oid), []byte(c.in), &scratch))
		if got != c.want {
			t.Errorf("oid %d %q: got %s, want %s", c.oid, c.in, got, c.want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("oid %d %q: invalid JSON %s", c.oid, c.in, got)
		}
	}
}

// FuzzValidJSON checks the hot-path validator against encoding/json.
func FuzzValidJSON(f *testing.F) {
	for _, s := range []string{`{"a": [1, 2.5e-3, "x\u00e9\n"], "b": null}`, `[]`, ` true `, `{"a":}`, `"\x01"`, `01`, `-`, `[1,]`,
		`{"a":1,}`, `"\ud800"`, `"\uzzzz"`, `1e`, `[[[[[[]]]]]]`, `{"a" 1}`, "\"\xff\"", `nul`, `-0.0e+1`} {
		f.Add([]byte(s))
	}
	f.Add(nested("[", "]", MaxEmbeddedJSONDepth))
	f.Add(nested("[", "]", MaxEmbeddedJSONDepth+1))
	f.Add(nested(`{"a":`, "}", MaxEmbeddedJSONDepth+1))
	f.Fuzz(func(t *testing.T, b []byte) {
		want := json.Valid(b) && jsonDepth(b) <= MaxEmbeddedJSONDepth
		if got := validJSON(b); got != want {
			t.Fatalf("validJSON(%.80q) = %v, want %v (json.Valid and depth %d)", b, got, want, jsonDepth(b))
		}
		if !want || !utf8.Valid(b) {
			return
		}
		// Embedded at the deepest place an envelope holds a value — an
		// element of a six-dimensional jsonb[] in "after" — the envelope
		// still parses.
		arr := "{{{{{{" + `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(string(b)) + `"` + "}}}}}}"
		row := string(appendValue(nil, builtinType(3807), []byte(arr), new([]byte)))
		env := `{"lsn":"0/1","op":"insert","after":{"ja":` + row + `,"j":` + string(appendValue(nil, builtinType(3802), b, nil)) + `}}`
		var x any
		if err := json.Unmarshal([]byte(env), &x); err != nil {
			t.Fatalf("envelope embedding %.80q does not parse: %v", b, err)
		}
	})
}

// nested returns open repeated n times, "1", then close repeated n times.
func nested(open, close string, n int) []byte {
	return []byte(strings.Repeat(open, n) + "1" + strings.Repeat(close, n))
}

// jsonDepth is the deepest nesting of arrays and objects in b, counting
// brackets outside strings.
func jsonDepth(b []byte) int {
	depth, deepest, inStr := 0, 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inStr && c == '\\':
			i++
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}

// TestJSONDepthBound: json and jsonb nested deeper than MaxEmbeddedJSONDepth
// (Postgres accepts any depth its stack allows) are carried as a JSON string
// of their text, as invalid JSON is, in columns, arrays and message content,
// so that the envelope around them never exceeds a JSON reader's depth limit
// (encoding/json's is 10,000).
func TestJSONDepthBound(t *testing.T) {
	for _, n := range []int{MaxEmbeddedJSONDepth, MaxEmbeddedJSONDepth + 1, 9999, 10001} {
		doc := nested("[", "]", n)
		embedded := n <= MaxEmbeddedJSONDepth
		if got := validJSON(doc); got != embedded {
			t.Fatalf("depth %d: validJSON = %v, want %v", n, got, embedded)
		}
		arr := `{"` + string(doc) + `"}`
		f := newFeeder(t, Config{})
		f.feed(relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 23, true}, col{"j", 114, false}, col{"jb", 3802, false}, col{"ja", 3807, false}),
			beginMsg(5, 0x2000), insertMsg(false, 0, 1, "1", string(doc), string(doc), arr),
			messageMsg(false, 0, true, 0x1f00, "walcast.m", string(doc)), commitMsg(0x2000, 0x2010))
		got := f.take() // checks every body parses with encoding/json
		if len(got) != 1 || len(got[0]) != 2 {
			t.Fatalf("depth %d: %d transactions", n, len(got))
		}
		var env Envelope
		if err := json.Unmarshal([]byte(got[0][0]), &env); err != nil {
			t.Fatal(err)
		}
		for _, c := range []string{"j", "jb"} {
			want := string(doc)
			if !embedded {
				want = string(appendString(nil, doc))
			}
			if string(env.After[c]) != want {
				t.Errorf("depth %d: after.%s = %.40s…, want %.40s…", n, c, env.After[c], want)
			}
		}
		wantArr := "[" + string(doc) + "]"
		if !embedded {
			wantArr = "[" + string(appendString(nil, doc)) + "]"
		}
		if string(env.After["ja"]) != wantArr {
			t.Errorf("depth %d: after.ja = %.40s…", n, env.After["ja"])
		}
		var msg Envelope
		if err := json.Unmarshal([]byte(got[0][1]), &msg); err != nil {
			t.Fatal(err)
		}
		wantContent := string(doc)
		if !embedded {
			wantContent = `"` + base64.StdEncoding.EncodeToString(doc) + `"`
		}
		if string(msg.Content) != wantContent {
			t.Errorf("depth %d: message content %.40s…", n, msg.Content)
		}
	}
}

func TestValidJSONDeep(t *testing.T) {
	deep := make([]byte, 0, 2000)
	for i := 0; i < 1000; i++ {
		deep = append(deep, '[')
	}
	for i := 0; i < 1000; i++ {
		deep = append(deep, ']')
	}
	if !validJSON(deep) || validJSON(deep[:1999]) {
		t.Fatal("deep nesting misjudged")
	}
}
