package journaltest

import (
	"strings"
	"testing"
)

func TestValidatorAcceptsCompleteOrderedStream(t *testing.T) {
	v := New()
	v.Observe(Item{Seq: 1, Entity: "a", EntitySeq: 1, ID: "x"})
	v.Commit("x", "y")
	v.Observe(Item{Seq: 2, Entity: "b", EntitySeq: 1, ID: "y"})
	if err := v.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestValidatorCatchesViolations(t *testing.T) {
	cases := []struct {
		name    string
		commit  []string
		observe []Item
		v       *Validator
		want    string
	}{
		{"missing", []string{"x", "y"}, []Item{{1, "a", 1, "x"}}, New(), `"y" never delivered`},
		{"duplicate", []string{"x"}, []Item{{1, "a", 1, "x"}, {2, "a", 2, "x"}}, New(), "delivered twice"},
		{"extra", []string{"x"}, []Item{{1, "a", 1, "x"}, {2, "a", 2, "z"}}, New(), "never committed"},
		{"seq backwards", []string{"x", "y"}, []Item{{2, "a", 1, "x"}, {1, "a", 2, "y"}}, New(), "seq went from 2 to 1"},
		{"seq gap", []string{"x", "y"}, []Item{{1, "a", 1, "x"}, {3, "a", 2, "y"}}, New(), "seq gap"},
		{"seq gap allowed", []string{"x", "y"}, []Item{{1, "a", 1, "x"}, {3, "a", 2, "y"}}, &Validator{ContiguousEntitySeq: true}, ""},
		{"entitySeq gap", []string{"x", "y"}, []Item{{1, "a", 1, "x"}, {2, "a", 3, "y"}}, New(), "entitySeq gap"},
		{"commit order", []string{"x", "y"}, []Item{{1, "a", 1, "y"}, {2, "a", 2, "x"}}, New(), "committed later"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.v.Commit(c.commit...)
			c.v.Observe(c.observe...)
			err := c.v.Check()
			if c.want == "" {
				if err != nil {
					t.Fatalf("unexpected: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want error containing %q", err, c.want)
			}
		})
	}
}
