package journal

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxWhereBytes bounds a snapshot's --where condition.
const MaxWhereBytes = 4096

// CheckWhere reports whether where can be a snapshot's row condition: one
// boolean expression on the table's columns that stays inside the
// parentheses the chunk's SELECT puts around it. The snapshots table takes
// requests from any role granted INSERT on it, and the condition is SQL the
// snapshot session runs, so it is held to what a row condition needs:
//
//   - at most MaxWhereBytes of UTF-8 with no control characters but white
//     space;
//   - string literals ('…', E'…') and quoted identifiers ("…") closed, no
//     dollar quoting, no comments, no semicolon;
//   - parentheses balanced, never closing one it did not open;
//   - no word that starts a query or a clause (SELECT, FROM, UNION, WITH,
//     …): no subqueries, so nothing but the table's row is read;
//   - no call of set_config (which could lift the session's time limits)
//     or of any pg_* function (sleeps, advisory locks, file and server
//     administration).
//
// Words inside quotes are data, not SQL, and pass. The check is lexical;
// what it lets through still runs in a READ ONLY transaction under the
// snapshot session's statement and lock timeouts.
func CheckWhere(where string) error {
	if len(where) > MaxWhereBytes {
		return fmt.Errorf("the condition is %d bytes; at most %d are accepted", len(where), MaxWhereBytes)
	}
	if !utf8.ValidString(where) {
		return errors.New("the condition is not valid UTF-8")
	}
	depth := 0
	for i := 0; i < len(where); {
		ch := where[i]
		switch {
		case ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r', ch == 0x7f:
			return fmt.Errorf("the condition holds the control character %#02x", ch)
		case ch == '\'' || (ch == 'E' || ch == 'e') && i+1 < len(where) && where[i+1] == '\'' && !wordByte(prev(where, i)):
			escapes := ch != '\''
			if escapes {
				i++
			}
			end := closeQuote(where, i, '\'', escapes)
			if end < 0 {
				return errors.New("a string literal is not closed")
			}
			i = end
			continue
		case ch == '"':
			end := closeQuote(where, i, '"', false)
			if end < 0 {
				return errors.New("a quoted identifier is not closed")
			}
			i = end
			continue
		case ch == '$' && !wordByte(prev(where, i)):
			return errors.New("dollar quoting ($…$) is not accepted; write the literal in single quotes")
		case ch == ';':
			return errors.New("the condition holds a semicolon; give one expression")
		case ch == '-' && i+1 < len(where) && where[i+1] == '-', ch == '/' && i+1 < len(where) && where[i+1] == '*':
			return errors.New("comments are not accepted in the condition")
		case ch == '(':
			depth++
		case ch == ')':
			depth--
			if depth < 0 {
				return errors.New("a closing parenthesis has no opening one")
			}
		case wordByte(ch) && (ch < '0' || ch > '9'):
			j := i
			for j < len(where) && wordByte(where[j]) {
				j++
			}
			w := strings.ToLower(where[i:j])
			if notInWhere[w] || strings.HasPrefix(w, "pg_") {
				return fmt.Errorf("%q is not accepted in a snapshot's condition (only an expression on the row's columns is: no subqueries, no pg_* or set_config calls)", where[i:j])
			}
			i = j
			continue
		}
		i++
	}
	if depth != 0 {
		return errors.New("a parenthesis is not closed")
	}
	return nil
}

// notInWhere are the words that start a query or one of its clauses, or
// call what a row condition has no need of.
var notInWhere = map[string]bool{
	"select": true, "from": true, "union": true, "intersect": true, "except": true, "with": true, "into": true,
	"returning": true, "insert": true, "update": true, "delete": true, "merge": true, "values": true, "table": true,
	"limit": true, "offset": true, "order": true, "group": true, "having": true, "window": true, "fetch": true,
	"for": true, "lateral": true, "set_config": true, "dblink": true, "lo_import": true, "lo_export": true,
	"query_to_xml": true, "table_to_xml": true, "cursor_to_xml": true, "schema_to_xml": true, "database_to_xml": true,
}

func wordByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80 || c == '$'
}

func prev(s string, i int) byte {
	if i == 0 {
		return ' '
	}
	return s[i-1]
}

// closeQuote returns the index after the quote q that closes the one at
// s[i], a doubled quote standing for itself (and, with escapes, a
// backslash escaping the next byte); -1 when it is not closed.
func closeQuote(s string, i int, q byte, escapes bool) int {
	for j := i + 1; j < len(s); j++ {
		switch {
		case escapes && s[j] == '\\':
			j++
		case s[j] == q:
			if j+1 < len(s) && s[j+1] == q {
				j++
				continue
			}
			return j + 1
		}
	}
	return -1
}
