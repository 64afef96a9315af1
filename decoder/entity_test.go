package decoder

import "testing"

func TestEntityNameRoundTrip(t *testing.T) {
	cases := []struct{ schema, table, want string }{
		{"public", "orders", "public.orders"},
		{"we.ird", "t", `"we.ird".t`},
		{"s", `Mixed "Case" tbl.?`, `s."Mixed ""Case"" tbl.?"`},
		{"", "x", `"".x`},
		{"sp ace", "ünï", "sp ace.ünï"},
	}
	for _, c := range cases {
		got := EntityName(c.schema, c.table)
		if got != c.want {
			t.Errorf("EntityName(%q, %q) = %q, want %q", c.schema, c.table, got, c.want)
		}
		s, tb, ok := SplitEntity(got)
		if !ok || s != c.schema || tb != c.table {
			t.Errorf("SplitEntity(%q) = %q, %q, %v", got, s, tb, ok)
		}
	}
	for _, bad := range []string{"", "noschema", ".t", `"unterminated.t`, `a"b.c`, `"a"x.b`, "a.b.c"} {
		if s, tb, ok := SplitEntity(bad); ok {
			t.Errorf("SplitEntity(%q) = %q, %q, true; want false", bad, s, tb)
		}
	}
}
