package filter

import (
	"fmt"
	"strings"
	"testing"
)

// benchRow is a 10-column row image as an envelope's after carries it.
const benchRow = `{"id":4711,"i8":"9007199254740993","n":"1234.5678","f8":0.25,"t":"paid","vc":"eu","b":true,` +
	`"ts":"2026-11-29T23:21:24.123456Z","u":"0b7e5a1c-61f2-4b0e-9d0a-6f1c2e3d4a5b","d":"2026-11-29"}`

func BenchmarkMatch(b *testing.B) {
	var in strings.Builder
	in.WriteString(`{"col":"id","op":"in","values":[`)
	for i := range 1000 {
		if i > 0 {
			in.WriteByte(',')
		}
		fmt.Fprintf(&in, "%d", i*10+3)
	}
	in.WriteString("]}")
	for _, c := range []struct{ name, src string }{
		{"eq", `{"col":"t","op":"=","value":"paid"}`},
		{"and-or-10", `{"and":[{"col":"t","op":"=","value":"paid"},{"col":"b","op":"=","value":true},` +
			`{"col":"i8","op":">","value":"9007199254740992"},{"col":"n","op":">=","value":"1000.5"},` +
			`{"col":"ts","op":">","value":"2026-11-29T00:00:00+01:00"},{"not":{"col":"d","op":"is null"}},` +
			`{"or":[{"col":"id","op":"<","value":100},{"col":"f8","op":"<","value":0.5},{"col":"vc","op":"in","values":["eu","us"]},` +
			`{"col":"u","op":"=","value":"0b7e5a1c-61f2-4b0e-9d0a-6f1c2e3d4a5b"}]}]}`},
		{"in-1000", in.String()},
	} {
		f := mustCompile(b, c.src)
		row := Row{Values: rowOf(b, benchRow)}
		want := Matches
		if c.name == "in-1000" {
			want = NoMatch
		}
		if got := f.Match(row); got != want {
			b.Fatalf("%s: %v, want %v", c.name, got, want)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				f.Match(row)
			}
		})
	}
}

func BenchmarkCompile(b *testing.B) {
	src := []byte(`{"and":[{"col":"t","op":"=","value":"paid"},{"or":[{"col":"n","op":">","value":100},{"col":"vc","op":"in","values":["eu","us"]}]},{"not":{"col":"ts","op":"is null"}}]}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compile(src, testCols, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}
