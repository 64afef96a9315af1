package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/reference from the command tree")

// referenceDir holds the command reference, one page per command,
// generated from the command tree.
const referenceDir = "../../docs/reference"

// referenceHeader opens every generated page.
const referenceHeader = "<!-- Generated from walcast's command tree by `make docs`; do not edit. -->\n\n"

// TestCommandReference keeps docs/reference equal to what cobra's doc
// generator makes of the command tree: every command's description, usage,
// flags (with their environment variables and defaults) and the commands
// around it, one page per command, and no page for a command that is gone.
// Run `make docs` (or `go test ./cmd/walcast -run TestCommandReference
// -update-docs`) after changing a command or a flag.
func TestCommandReference(t *testing.T) {
	want, err := commandReference(newRootCmd(Env{}))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	entries, err := os.ReadDir(referenceDir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".md") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(referenceDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		got[e.Name()] = b
	}
	var stale []string
	for name, w := range want {
		if g, ok := got[name]; !ok || !bytes.Equal(g, w) {
			stale = append(stale, name)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			stale = append(stale, name+" (no such command)")
		}
	}
	if len(stale) == 0 {
		return
	}
	sort.Strings(stale)
	if !*updateDocs {
		t.Fatalf("docs/reference is out of date (%s); run: make docs", strings.Join(stale, ", "))
	}
	if err := os.MkdirAll(referenceDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			if err := os.Remove(filepath.Join(referenceDir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, w := range want {
		if err := os.WriteFile(filepath.Join(referenceDir, name), w, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// commandReference renders one Markdown page per available command, keyed
// by file name (walcast_slot_drop.md). A command's long description is
// terminal text, laid out with line breaks and indentation, and may hold
// characters Markdown reads as markup (WALCAST_<FLAG>): it is kept as a
// preformatted block.
func commandReference(root *cobra.Command) (map[string][]byte, error) {
	pages := map[string][]byte{}
	var walk func(c *cobra.Command) error
	walk = func(c *cobra.Command) error {
		c.DisableAutoGenTag = true // no generation date: the pages must be reproducible
		var buf bytes.Buffer
		if err := doc.GenMarkdownCustom(c, &buf, func(s string) string { return s }); err != nil {
			return err
		}
		page := buf.String()
		if c.Long != "" {
			page = strings.Replace(page, "### Synopsis\n\n"+c.Long+"\n\n", "### Synopsis\n\n```text\n"+strings.TrimRight(c.Long, "\n")+"\n```\n\n", 1)
		}
		pages[strings.ReplaceAll(c.CommandPath(), " ", "_")+".md"] = []byte(referenceHeader + page)
		for _, sub := range c.Commands() {
			if !sub.IsAvailableCommand() || sub.IsAdditionalHelpTopicCommand() {
				continue
			}
			if err := walk(sub); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(root); err != nil {
		return nil, err
	}
	return pages, nil
}
