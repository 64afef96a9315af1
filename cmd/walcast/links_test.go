package main

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is the repository's root, seen from this package's directory.
const repoRoot = "../.."

// TestDocsRelativeLinks: every relative link in the README and under docs/
// (and in any other Markdown file of the repository outside node_modules)
// names a file or directory that exists in the repository, and a #anchor
// into a Markdown file names one of its headings (as GitHub derives
// anchors from them) or an explicit id. Absolute URLs are not checked.
func TestDocsRelativeLinks(t *testing.T) {
	var files []string
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != repoRoot && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, must := range []string{"README.md", "docs/sync.md"} {
		if !containsPath(files, filepath.Join(repoRoot, must)) {
			t.Fatalf("the walk did not find %s (found %v)", must, files)
		}
	}
	var broken []string
	for _, f := range files {
		bad, err := brokenLinks(repoRoot, f)
		if err != nil {
			t.Fatal(err)
		}
		broken = append(broken, bad...)
	}
	if len(broken) > 0 {
		t.Fatalf("%d relative links name nothing in the repository; fix the path or the file:\n%s", len(broken), strings.Join(broken, "\n"))
	}
}

func containsPath(paths []string, p string) bool {
	for _, q := range paths {
		if filepath.Clean(q) == filepath.Clean(p) {
			return true
		}
	}
	return false
}

var (
	// inlineLink matches [text](target) and ![alt](target), with an
	// optional <…> around the target and an optional title after it.
	inlineLink = regexp.MustCompile(`\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:"[^"]*"|'[^']*'|\([^)]*\)))?\s*\)`)
	// refDef matches a reference definition: [label]: target.
	refDef = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)`)
	// htmlLink matches href="…" and src="…" in inline HTML.
	htmlLink = regexp.MustCompile(`\b(?:href|src)\s*=\s*"([^"]*)"`)
	// codeSpan matches an inline code span, whose text is not a link.
	codeSpan = regexp.MustCompile("(`+)[^`]*?`+")
	// scheme matches a target with a URL scheme (https:, mailto:, …).
	scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
)

// brokenLinks returns "file:line: target" for every relative link in the
// Markdown file that names no existing file or directory, or one outside
// root. Links in fenced code blocks and code spans are not links.
func brokenLinks(root, file string) ([]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	absRoot, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	rel, err := filepath.Rel(root, file)
	if err != nil {
		return nil, err
	}
	var broken []string
	for _, pl := range proseLines(string(b)) {
		n, line := pl.n, codeSpan.ReplaceAllString(pl.line, "")
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		for _, m := range htmlLink.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		if m := refDef.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
		for _, target := range targets {
			target = strings.TrimSuffix(strings.TrimPrefix(target, "<"), ">")
			if target == "" || target == "#" || strings.HasPrefix(target, "//") || scheme.MatchString(target) {
				continue
			}
			if strings.HasPrefix(target, "#") {
				if !anchorsOf(file)[target[1:]] {
					broken = append(broken, fmt.Sprintf("%s:%d: %s (no such heading)", filepath.ToSlash(rel), n, target))
				}
				continue
			}
			p, frag := target, ""
			if i := strings.IndexByte(p, '#'); i >= 0 {
				p, frag = p[:i], p[i+1:]
			}
			if i := strings.IndexByte(p, '?'); i >= 0 {
				p = p[:i]
			}
			if unescaped, err := url.PathUnescape(p); err == nil {
				p = unescaped
			}
			var abs string
			if strings.HasPrefix(p, "/") {
				abs = filepath.Join(absRoot, p) // GitHub resolves /path from the repository root
			} else {
				dir, err := filepath.Abs(filepath.Dir(file))
				if err != nil {
					return nil, err
				}
				abs = filepath.Join(dir, p)
			}
			where := fmt.Sprintf("%s:%d: %s", filepath.ToSlash(rel), n, target)
			if r, err := filepath.Rel(absRoot, abs); err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
				broken = append(broken, where+" (outside the repository)")
				continue
			}
			if _, err := os.Stat(abs); err != nil {
				broken = append(broken, where)
			} else if frag != "" && strings.HasSuffix(abs, ".md") && !anchorsOf(abs)[frag] {
				broken = append(broken, where+" (no such heading)")
			}
		}
	}
	sort.Strings(broken)
	return broken, nil
}

var (
	atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$`)
	explicitID = regexp.MustCompile(`<a\s+(?:name|id)\s*=\s*"([^"]+)"`)
	mdLink     = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag    = regexp.MustCompile(`<[^>]+>`)
)

// anchorsOf returns the anchors of a Markdown file: GitHub's anchor of
// each ATX heading (lower case; markup, punctuation and symbols dropped;
// each space a hyphen; a repeated anchor suffixed -1, -2, …), and the ids
// of <a name="…"> or <a id="…"> tags. A file that cannot be read has none.
func anchorsOf(file string) map[string]bool {
	anchors := map[string]bool{}
	b, err := os.ReadFile(file)
	if err != nil {
		return anchors
	}
	seen := map[string]int{}
	for _, pl := range proseLines(string(b)) {
		line := pl.line
		for _, m := range explicitID.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		m := atxHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := githubSlug(m[1])
		if k := seen[slug]; k > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, k)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

// githubSlug is the anchor GitHub gives a heading's text.
func githubSlug(text string) string {
	text = mdLink.ReplaceAllString(text, "$1")
	text = htmlTag.ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestBrokenLinksFindsEachKind: the checker reports a missing file, a
// missing directory, a path outside the repository, a reference definition
// and an anchor no heading has, and passes existing files, headings'
// anchors (markup dropped, repeats numbered), explicit ids, URLs and
// anything in code.
func TestBrokenLinksFindsEachKind(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"docs/sub", "deploy"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for f, text := range map[string]string{
		"README.md":            "",
		"deploy/setup.sql":     "",
		"docs/sub/page one.md": "# Intro\n\n## State, then changes (`snapshot:true`, [GET /v1/snapshot](x.md))\n\n## Intro\n\n```\n# not a heading\n```\n<a id=\"custom\"></a>\n",
	} {
		if err := os.WriteFile(filepath.Join(root, f), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	page := strings.Join([]string{
		"# Top",
		"See [the page](sub/page%20one.md#intro), [setup](../deploy/setup.sql \"SQL\"), [deploy](../deploy/) and [home](/README.md).",
		"[anchor](#top), [site](https://example.com/x.md), [mail](mailto:a@example.com), ![img](<sub/page one.md>)",
		"`[in code](missing-in-span.md)`",
		"```",
		"[in a fence](missing-in-fence.md)",
		"```",
		"Broken: [gone](gone.md#part), [dir](../nodir/), [out](../../outside.md)",
		`<a href="missing.html">x</a>`,
		"[ref]: ../deploy/missing.sql",
		"[a](sub/page%20one.md#state-then-changes-snapshottrue-get-v1snapshot) [b](sub/page%20one.md#intro-1) [c](<sub/page one.md#custom>)",
		"[d](sub/page%20one.md#intro-2) [e](sub/page%20one.md#not-a-heading) [f](#nowhere)",
	}, "\n")
	file := filepath.Join(root, "docs", "guide.md")
	if err := os.WriteFile(file, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := brokenLinks(root, file)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"docs/guide.md:8: ../../outside.md (outside the repository)",
		"docs/guide.md:8: ../nodir/",
		"docs/guide.md:8: gone.md#part",
		"docs/guide.md:9: missing.html",
		"docs/guide.md:10: ../deploy/missing.sql",
		"docs/guide.md:12: sub/page%20one.md#intro-2 (no such heading)",
		"docs/guide.md:12: sub/page%20one.md#not-a-heading (no such heading)",
		"docs/guide.md:12: #nowhere (no such heading)",
	}
	sort.Strings(want)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("broken links:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// proseLine is a line of a Markdown file and its number (from 1).
type proseLine struct {
	n    int
	line string
}

// proseLines returns the lines of Markdown text outside fenced code
// blocks (``` or ~~~), the fences themselves left out.
func proseLines(text string) []proseLine {
	var out []proseLine
	fence := ""
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
		case strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~"):
			fence = trimmed[:3]
		default:
			out = append(out, proseLine{i + 1, line})
		}
	}
	return out
}
