package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the README's flag reference from the CLI")

// TestREADMEFlagReference keeps the README's flag reference equal to the
// flags the CLI defines: every command, flag, environment variable and
// default. Run `go test ./cmd/walcast -run TestREADMEFlagReference
// -update-docs` after changing a flag.
func TestREADMEFlagReference(t *testing.T) {
	const path = "../../README.md"
	readme, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- flag-reference:begin -->", "<!-- flag-reference:end -->"
	i, j := bytes.Index(readme, []byte(begin)), bytes.Index(readme, []byte(end))
	if i < 0 || j < i {
		t.Fatalf("README.md lacks the %s … %s markers", begin, end)
	}
	want := flagReference(newRootCmd(Env{}))
	got := string(readme[i+len(begin) : j])
	if got == want {
		return
	}
	if *updateDocs {
		out := append(append(append([]byte{}, readme[:i+len(begin)]...), want...), readme[j:]...)
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("README.md's flag reference is out of date; run: go test ./cmd/walcast -run TestREADMEFlagReference -update-docs\n--- want ---\n%s", want)
}

// flagReference renders one table per runnable command.
func flagReference(root *cobra.Command) string {
	var cmds []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Runnable() && c != root && c.Name() != "help" && c.Name() != "completion" && !c.Hidden {
			cmds = append(cmds, c)
		}
		for _, sub := range c.Commands() {
			if sub.Name() != "completion" {
				walk(sub)
			}
		}
	}
	walk(root)
	sort.Slice(cmds, func(a, b int) bool { return cmds[a].CommandPath() < cmds[b].CommandPath() })
	envSuffix := regexp.MustCompile(` \[\$WALCAST_[A-Z0-9_]+\]$`)
	var b strings.Builder
	b.WriteString("\n")
	for _, c := range cmds {
		var rows []string
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			env := "`" + envName(f.Name) + "`"
			if commandLineOnly(f) {
				env = "(command line only)"
			}
			def := f.DefValue
			switch {
			case def == "" || def == "[]":
				def = ""
			case f.Value.Type() == "bool" && def == "false":
				def = ""
			default:
				def = "`" + def + "`"
			}
			usage := envSuffix.ReplaceAllString(f.Usage, "")
			usage = strings.ReplaceAll(usage, "|", "\\|")
			rows = append(rows, fmt.Sprintf("| `--%s` | %s | %s | %s |", f.Name, env, def, usage))
		})
		if len(rows) == 0 {
			continue // version, and groups such as `slot`
		}
		fmt.Fprintf(&b, "\n### `%s`\n\n%s\n\n", c.CommandPath(), c.Short)
		b.WriteString("| flag | environment | default | meaning |\n|---|---|---|---|\n")
		b.WriteString(strings.Join(rows, "\n"))
		b.WriteString("\n")
	}
	b.WriteString("\n")
	return b.String()
}
