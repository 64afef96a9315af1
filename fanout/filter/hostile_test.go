package filter

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// allocated reports the bytes f allocates: the least of three runs, as
// the process's counters also count what other goroutines (the runtime's,
// the test framework's) allocate meanwhile.
func allocated(f func()) uint64 {
	least := uint64(1<<64 - 1)
	for range 3 {
		var a, b runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&a)
		f()
		runtime.ReadMemStats(&b)
		least = min(least, b.TotalAlloc-a.TotalAlloc)
	}
	return least
}

func wantRefusal(t *testing.T, name string, src []byte, lim Limits, msg string, maxAlloc uint64) {
	t.Helper()
	var err error
	start := time.Now()
	n := allocated(func() { _, err = Compile(src, testCols, lim) })
	took := time.Since(start)
	var fe *Error
	if !errors.As(err, &fe) || !strings.Contains(fe.Msg, msg) {
		t.Errorf("%s: error %v, want one saying …%s…", name, err, msg)
	}
	if n > maxAlloc {
		t.Errorf("%s: Compile allocated %d bytes refusing %d bytes of input, want at most %d", name, n, len(src), maxAlloc)
	}
	if took > time.Second {
		t.Errorf("%s: Compile took %v", name, took)
	}
}

func TestHostileInputs(t *testing.T) {
	big := Limits{MaxBytes: 64 << 20} // past the size bound, to reach the others
	deep := strings.Repeat(`{"not":`, 10000) + `{"col":"t","op":"is null"}` + strings.Repeat("}", 10000)
	deepAnd := strings.Repeat(`{"and":[`, 10000) + `{"col":"t","op":"is null"}` + strings.Repeat("]}", 10000)
	var ors strings.Builder
	ors.WriteString(`{"or":[`)
	for i := range 10000 {
		if i > 0 {
			ors.WriteByte(',')
		}
		fmt.Fprintf(&ors, `{"col":"id","op":"=","value":%d}`, i)
	}
	ors.WriteString("]}")
	var in strings.Builder
	in.WriteString(`{"col":"id","op":"in","values":[`)
	for i := range 10000 {
		if i > 0 {
			in.WriteByte(',')
		}
		fmt.Fprintf(&in, "%d", i)
	}
	in.WriteString("]}")
	tenMB := []byte(`{"col":"t","op":"=","value":"` + strings.Repeat("x", 10<<20) + `"}`)
	longNum := `{"col":"n","op":"=","value":1` + strings.Repeat("0", 1<<20) + `}`

	wantRefusal(t, "10 MB", tenMB, Limits{}, "more than the limit of 16384", 4<<10)
	wantRefusal(t, "10 MB string past the size bound", tenMB, big, "longer than the limit of 1024 bytes", 64<<10)
	wantRefusal(t, "long number", []byte(longNum), big, "longer than the limit of 1024", 64<<10)
	wantRefusal(t, "10,000 nested nots", []byte(deep), Limits{}, "more than the limit", 4<<10)
	wantRefusal(t, "10,000 nested nots past the size bound", []byte(deep), big, "deeper than 16 levels", 64<<10)
	wantRefusal(t, "10,000 nested ands", []byte(deepAnd), big, "deeper than 16 levels", 64<<10)
	wantRefusal(t, "10,000 or terms", []byte(ors.String()), big, "more than 256 terms", 512<<10)
	wantRefusal(t, "10,000 in values", []byte(in.String()), big, "more than 1000 values", 512<<10)

	// The bounds are the caller's to set.
	if _, err := Compile([]byte(ors.String()), testCols, Limits{MaxBytes: 1 << 20, MaxTerms: 20000}); err != nil {
		t.Errorf("10,000 or terms under raised limits: %v", err)
	}
	// Depth 16 is accepted, 17 is not.
	nest := func(n int) []byte {
		return []byte(strings.Repeat(`{"not":`, n-1) + `{"col":"t","op":"is null"}` + strings.Repeat("}", n-1))
	}
	if _, err := Compile(nest(16), testCols, Limits{}); err != nil {
		t.Errorf("16 levels: %v", err)
	}
	if _, err := Compile(nest(17), testCols, Limits{}); err == nil || !strings.Contains(err.Error(), "deeper than 16") {
		t.Errorf("17 levels: %v", err)
	}
	// The in bound counts every list of the filter together.
	var two strings.Builder
	two.WriteString(`{"and":[`)
	for l := range 2 {
		if l > 0 {
			two.WriteByte(',')
		}
		two.WriteString(`{"col":"id","op":"in","values":[`)
		for i := range 600 {
			if i > 0 {
				two.WriteByte(',')
			}
			fmt.Fprintf(&two, "%d", i)
		}
		two.WriteString("]}")
	}
	two.WriteString("]}")
	if _, err := Compile([]byte(two.String()), testCols, Limits{}); err == nil || !strings.Contains(err.Error(), "filter.and[1].values[400]") {
		t.Errorf("two lists of 600 values: %v, want a refusal at filter.and[1].values[400]", err)
	}
}

// Every input either compiles or is refused with an *Error; none panics,
// and a compiled filter evaluates any row image.
func FuzzCompile(f *testing.F) {
	for _, s := range []string{
		`{"and":[{"col":"t","op":"=","value":"paid"},{"or":[{"col":"n","op":">","value":100},{"col":"vc","op":"in","values":["eu","us"]}]},{"not":{"col":"ts","op":"is null"}}]}`,
		`{"col":"i8","op":">","value":"9007199254740992"}`,
		`{"col":"f8","op":"in","values":[1,"NaN","-Infinity"]}`,
		`{"col":"ts","op":"<","value":"2026-11-30T00:21:24.5+01:00"}`,
		`{"col":"t","op":"=","value":"\ud83d\ude00\u0001"}`,
		`{"col":"u","op":"=","value":"0B7E5A1C-61F2-4B0E-9D0A-6F1C2E3D4A5B"}`,
		`{"col":"b","op":"<>","value":true}`,
		`{"col":"t","col":"t"}`,
		`{"not":{"not":{"col":"j","op":"is not null"}}}`,
	} {
		f.Add([]byte(s))
	}
	rows := []Row{
		{Values: rowOf(f, `{"id":1,"i8":"9007199254740993","n":"NaN","f8":"-Infinity","t":"a\u0000","vc":"eu","ts":"0001-12-31 23:59:59+00 BC","b":true,"u":null}`)},
		{Values: rowOf(f, `{"id":"x","n":[1],"f8":{},"ts":"2026-11-29T23:21:24.500000Z","t":5}`), Unchanged: []string{"j", "t"}},
		{},
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		flt, err := Compile(src, testCols, Limits{})
		if err != nil {
			var fe *Error
			if !errors.As(err, &fe) || !strings.HasPrefix(fe.Path, "filter") || fe.Msg == "" {
				t.Fatalf("error %#v is not a filter error", err)
			}
			return
		}
		for _, r := range rows {
			flt.Match(r)
		}
	})
}
