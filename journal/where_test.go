package journal

import (
	"strings"
	"testing"
)

// TestCheckWhere: a snapshot condition is one expression on the row; what
// could leave its parentheses, read other relations, lift the session's
// limits or hide SQL in comments is refused with the reason.
func TestCheckWhere(t *testing.T) {
	ok := []string{
		"",
		"region = 'eu'",
		"id % 3 <> 0 AND org <> 'org4'",
		"(a > 1 OR b IS NULL) AND NOT c",
		"note = 'it''s (not) a select; -- from x'",
		`"Select" = 1 AND "from"."x" IS NOT NULL`,
		"name = E'a\\'b)' AND id IN (1, 2, 3)",
		"created_at > now() - interval '1 day'",
		"lower(email) LIKE '%@example.com'",
		"tags @> ARRAY['x']::text[]",
		"payload->>'kind' = 'order'",
		"a$b = 1",
	}
	for _, w := range ok {
		if err := CheckWhere(w); err != nil {
			t.Errorf("CheckWhere(%q) = %v, want accepted", w, err)
		}
	}
	bad := map[string]string{
		"true) UNION ALL SELECT * FROM pg_authid WHERE (true": "closing parenthesis",
		"id IN (SELECT id FROM secrets)":                      "select",
		"true; DROP TABLE t":                                  "semicolon",
		"true -- )":                                           "comments",
		"true /* ) */":                                        "comments",
		"pg_sleep(600) IS NOT NULL":                           "pg_sleep",
		"set_config('statement_timeout', '0', true) IS NULL":  "set_config",
		"pg_advisory_lock(1) IS NOT NULL":                     "pg_advisory_lock",
		"name = 'open":                                        "not closed",
		`"open = 1`:                                           "not closed",
		"(a = 1":                                              "not closed",
		"x = $$)$$":                                           "dollar",
		"a = 1\x00":                                           "control",
		"a = '\xff'":                                          "UTF-8",
		"EXISTS (TABLE secrets)":                              "table",
		"a = 1 ORDER BY 1":                                    "order",
		"query_to_xml('select 1', true, true, '') IS NOT NULL": "query_to_xml",
		strings.Repeat("a = 1 AND ", 500) + "true":             "bytes",
	}
	for w, want := range bad {
		err := CheckWhere(w)
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(want)) {
			t.Errorf("CheckWhere(%.60q) = %v, want an error about %q", w, err, want)
		}
	}
}

// FuzzCheckWhere: whatever is accepted keeps the parentheses balanced
// outside quotes, and holds no semicolon or comment outside them: it
// cannot close the SELECT's own parenthesis.
func FuzzCheckWhere(f *testing.F) {
	for _, s := range []string{"a = 1", "x = 'a)'", "(b)", `"q)" = 2`, "E'\\')'", ") OR (", "a--b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, w string) {
		if CheckWhere(w) != nil {
			return
		}
		// Strip quoted parts the way PostgreSQL's lexer would and check
		// what is left.
		depth := 0
		for i := 0; i < len(w); i++ {
			switch c := w[i]; {
			case c == '\'' || c == '"':
				esc := c == '\'' && i > 0 && (w[i-1] == 'E' || w[i-1] == 'e') && (i < 2 || !wordByte(w[i-2]))
				end := closeQuote(w, i, c, esc)
				if end < 0 {
					t.Fatalf("accepted an open quote: %q", w)
				}
				i = end - 1
			case c == ';':
				t.Fatalf("accepted a semicolon: %q", w)
			case c == '(':
				depth++
			case c == ')':
				depth--
				if depth < 0 {
					t.Fatalf("accepted an unopened parenthesis: %q", w)
				}
			}
		}
		if depth != 0 {
			t.Fatalf("accepted unbalanced parentheses: %q", w)
		}
	})
}
