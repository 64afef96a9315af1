package replication

import (
	"fmt"
	"io"
	"strings"
)

// WriteText prints the report for a person. Checks about many subjects (one
// per table) that passed are folded into one line unless verbose is set;
// every warning and failure is printed with its fix.
func (r *Report) WriteText(w io.Writer, verbose bool) error {
	var b strings.Builder
	fmt.Fprintf(&b, "walcast verify: %s (PostgreSQL %s), publication %q, slot %q\n\n", r.Target, r.ServerVersion, r.Publication, r.Slot)
	folded := map[string]int{}
	if !verbose {
		for _, c := range r.Checks {
			if c.Subject != "" && c.Status == StatusOK {
				folded[c.ID]++
			}
		}
	}
	printedFold := map[string]bool{}
	for _, c := range r.Checks {
		if n := folded[c.ID]; n > 1 && c.Subject != "" && c.Status == StatusOK {
			if !printedFold[c.ID] {
				printedFold[c.ID] = true
				fmt.Fprintf(&b, "  %-5s %-24s %d tables pass (use --verbose to list them)\n", label(c.Status), c.ID, n)
			}
			continue
		}
		fmt.Fprintf(&b, "  %-5s %-24s %s\n", label(c.Status), c.ID, c.Found)
		if c.Fix != "" {
			fmt.Fprintf(&b, "  %-5s %-24s fix: %s\n", "", "", c.Fix)
		}
	}
	fmt.Fprintf(&b, "\n%d ok, %d %s, %d %s\n", r.Summary.OK,
		r.Summary.Warn, plural(r.Summary.Warn, "warning", "warnings"),
		r.Summary.Fail, plural(r.Summary.Fail, "failure", "failures"))
	_, err := io.WriteString(w, b.String())
	return err
}

func label(s Status) string {
	switch s {
	case StatusWarn:
		return "WARN"
	case StatusFail:
		return "FAIL"
	}
	return "ok"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
