package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// docCommand is a walcast command line shown in a fenced shell block.
type docCommand struct {
	where string // file:line
	args  []string
}

// shellWords splits a documentation command line into words: quotes
// group, a # outside quotes starts a comment, nothing is expanded.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	in, quote, seen := false, byte(0), false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, in, seen = c, true, true
		case c == '#' && !in:
			i = len(line)
		case c == ' ' || c == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in, seen = true, true
		}
	}
	if in || (seen && cur.Len() > 0) {
		words = append(words, cur.String())
	}
	return words
}

var (
	shellFence = regexp.MustCompile("^\\s*```(sh|bash|shell|console)\\s*$")
	envAssign  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
	// cmdSubst matches a walcast command inside $(…), as in TOKEN=$(walcast token …).
	cmdSubst = regexp.MustCompile(`\$\(((?:bin/)?walcast [^)]*)\)`)
)

// docCommands returns the walcast command lines of the fenced shell blocks
// of a Markdown file: continuation lines joined, environment assignments
// before the command dropped, the command started by `walcast` or
// `bin/walcast`, or inside a command substitution $(…).
func docCommands(t *testing.T, file string) []docCommand {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []docCommand
	in := false
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		trimmed := strings.TrimSpace(line)
		if !in {
			in = shellFence.MatchString(line)
			continue
		}
		if strings.HasPrefix(trimmed, "```") {
			in = false
			continue
		}
		start := i + 1
		for strings.HasSuffix(strings.TrimRight(line, " "), "\\") && i+1 < len(lines) {
			line = strings.TrimSuffix(strings.TrimRight(line, " "), "\\") + " " + lines[i+1]
			i++
		}
		if m := cmdSubst.FindStringSubmatch(line); m != nil {
			line = m[1]
		}
		words := shellWords(strings.TrimPrefix(strings.TrimSpace(line), "$ "))
		for len(words) > 0 && envAssign.MatchString(words[0]) {
			words = words[1:]
		}
		if len(words) == 0 || (words[0] != "walcast" && words[0] != "bin/walcast") {
			continue
		}
		out = append(out, docCommand{where: filepath.ToSlash(file) + ":" + strconv.Itoa(start), args: words[1:]})
	}
	return out
}

// TestDocsCommandsParse: every walcast command line in the fenced shell
// blocks of the README and docs/ names a command that exists and flags
// that command has, with values its flags accept (a placeholder such as
// "$URL" or "…" stands for a string). What a page shows cannot drift from
// the CLI.
func TestDocsCommandsParse(t *testing.T) {
	root := filepath.Join("..", "..")
	files := []string{filepath.Join(root, "README.md"), filepath.Join(root, "fanout", "client", "js", "README.md")}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, docs...)
	bad, n := checkDocCommands(t, files)
	for _, b := range bad {
		t.Error(b)
	}
	if n < 20 {
		t.Fatalf("found %d walcast command lines in the docs; the extraction is broken", n)
	}
	t.Logf("%d walcast command lines parsed", n)
}

// checkDocCommands parses the walcast command lines of files against the
// CLI and returns what does not parse, and how many lines it checked.
func checkDocCommands(t *testing.T, files []string) (bad []string, n int) {
	t.Helper()
	for _, f := range files {
		for _, c := range docCommands(t, f) {
			n++
			cmd := newRootCmd(Env{Stdout: io.Discard, Stderr: io.Discard, LookupEnv: func(string) (string, bool) { return "", false }})
			sub, rest, err := cmd.Find(c.args)
			if err != nil || sub == cmd {
				bad = append(bad, c.where+": walcast "+strings.Join(c.args, " ")+": no such command")
				continue
			}
			if err := sub.ParseFlags(rest); err != nil {
				bad = append(bad, c.where+": walcast "+strings.Join(c.args, " ")+": "+err.Error())
			}
		}
	}
	return bad, n
}

// TestDocsCommandsParseFindsEachKind: the check finds an unknown command,
// an unknown flag and a bad value, through continuation lines, comments,
// environment assignments and command substitutions, and passes good lines.
func TestDocsCommandsParseFindsEachKind(t *testing.T) {
	f := filepath.Join(t.TempDir(), "page.md")
	page := "text\n```sh\n" +
		"walcast nosuch --x\n" +
		"WALCAST_DATABASE_URL=postgres://x bin/walcast run --no-such-flag   # a comment\n" +
		"walcast run --publication p \\\n  --retention-max-rows many\n" +
		"walcast tail --nats-url nats://127.0.0.1:4222 --subject 'walcast.change.public.orders.*'\n" +
		"echo walcast run --no-such-flag\n" +
		"TOKEN=$(bin/walcast token --dev --no-such-flag)   # a command substitution\n" +
		"```\n" +
		"walcast run --outside-a-block\n"
	if err := os.WriteFile(f, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	bad, n := checkDocCommands(t, []string{f})
	if n != 5 || len(bad) != 4 {
		t.Fatalf("checked %d lines, found %d bad, want 5 and 4: %q", n, len(bad), bad)
	}
	for i, want := range []string{"no such command", "unknown flag: --no-such-flag", "invalid argument \"many\"", "unknown flag: --no-such-flag"} {
		if !strings.Contains(bad[i], want) {
			t.Errorf("finding %d: %q, want it to say %q", i, bad[i], want)
		}
	}
}
