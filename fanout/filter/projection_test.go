package filter

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestProjection(t *testing.T) {
	p, err := NewProjection([]string{"t", "b"}, testCols)
	if err != nil {
		t.Fatal(err)
	}
	// The key column comes first, as in the table, though not asked for.
	if got := strings.Join(p.Columns(), ","); got != "id,t,b" {
		t.Fatalf("Columns() = %s, want id,t,b", got)
	}
	if !p.Has("id") || !p.Has("t") || p.Has("n") {
		t.Fatal("Has disagrees with Columns")
	}
	row := rowOf(t, `{"id":1,"t":"a","n":2,"b":null}`)
	got := p.Values(row)
	if len(got) != 3 || string(got["id"]) != "1" || string(got["t"]) != `"a"` || string(got["b"]) != "null" || len(row) != 4 {
		t.Fatalf("Values = %s (row now %s)", got, row)
	}
	if p.Values(nil) != nil {
		t.Fatal("a nil image projected to a non-nil one")
	}
	if got := p.Names([]string{"n", "t", "j"}); !slices.Equal(got, []string{"t"}) {
		t.Fatalf("Names = %q", got)
	}
	keys, err := NewProjection(nil, testCols)
	if err != nil || strings.Join(keys.Columns(), ",") != "id" {
		t.Fatalf("empty list: %v %v, want the key column only", keys.Columns(), err)
	}
	for _, c := range []struct {
		names     []string
		path, msg string
	}{
		{[]string{"t", "nope"}, "columns[1]", `column "nope" is not a published column`},
		{[]string{"t", "b", "t"}, "columns[2]", `column "t" is listed twice`},
		{slices.Repeat([]string{"t"}, 100), "columns", "the table publishes 20"},
	} {
		_, err := NewProjection(c.names, testCols)
		var fe *Error
		if !errors.As(err, &fe) || fe.Path != c.path || !strings.Contains(fe.Msg, c.msg) {
			t.Errorf("%q: %v, want %s: …%s…", c.names, err, c.path, c.msg)
		}
	}
}
