package main

// Runnable documentation. A fenced shell block (```sh, ```bash, ```shell)
// of README.md, docs/*.md or fanout/client/js/README.md is run by
// TestDocsBlocksRun when the line directly above its fence is one of these
// HTML comments (GitHub does not render them):
//
//	<!-- test: run -->        run the block to the end; it must exit 0
//	                          within docsBlockTimeout.
//	<!-- test: background --> a command a reader leaves running in another
//	                          terminal while following the page, one that
//	                          ends by itself (walcast tail --count N):
//	                          started in the background; the page's later
//	                          blocks start two seconds after it; once they
//	                          have run it must exit 0 within the timeout.
//	<!-- test: start URL -->  a server a reader starts in a terminal of
//	                          its own (walcast run, walcast sync): started
//	                          in the background and ready once URL
//	                          answers 2xx (without URL: once it has run for
//	                          two seconds). It must keep running until the
//	                          page's last block has run; then it gets
//	                          SIGTERM (its command last in the block) and
//	                          must stop within the timeout.
//
// Each block runs with `bash` under `set -euo pipefail`, in one working
// directory per page (holding bin/walcast and the repository's deploy/),
// with `walcast` on PATH (this test binary standing in for it), psql from
// the PostgreSQL the test starts, and the environment below. What a run
// block exports carries to the page's later blocks, as in one terminal.
// Pages run in order: README.md, docs/*.md by name, then
// fanout/client/js/README.md; a page starts from the environment below and
// from the database earlier pages left (the README's setup.sql, its
// journal and slot).
//
// The environment (a throwaway PostgreSQL 15 with wal_level=logical and a
// database app holding public.orders and public.customers):
//
//	PGHOST, PGPORT, PGUSER  the server, as the superuser postgres (psql
//	                        and walcast read them like libpq: a URL
//	                        without a port takes PGPORT)
//	WALCAST_DATABASE_URL    the database app as the role walcast
//	                        (password change-me) that the README's
//	                        setup.sql creates; the journal lives there
//	DATABASE_URL            the same URL
//
// The docs' commands use walcast's default addresses (NATS 127.0.0.1:4222,
// run's HTTP 127.0.0.1:9187, sync 127.0.0.1:8080 and 127.0.0.1:9188), so
// those ports must be free. Blocks that need what this machine cannot
// offer (make, docker, kubectl, systemctl, the nats CLI, npm, a browser,
// other hosts) stay unmarked; TestDocsCommandsParse still checks their
// walcast lines.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walcast/walcast/internal/pgtest"
)

// docsBlockTimeout bounds each run block, how long a start block may take
// to become ready or to stop, and how long a background block may run on
// after the page's last block.
const docsBlockTimeout = 60 * time.Second

// docsStartSettle is how long a background block, or a start block
// without a ready URL, must run before the next block starts: time for
// walcast tail to subscribe before the next block writes.
const docsStartSettle = 2 * time.Second

// docBlock is a fenced shell block marked runnable.
type docBlock struct {
	file  string // the page, as given to docBlocks or from the repository's root
	line  int    // of the opening fence, 1-based
	mode  string // "run", "background" or "start"
	ready string // start: URL that answers 2xx once the block is ready; empty for none
	text  string // the block's lines
}

func (b docBlock) where() string { return fmt.Sprintf("%s:%d", filepath.ToSlash(b.file), b.line) }

var (
	docsMarker = regexp.MustCompile(`^\s*<!--\s*test:\s*(.*?)\s*-->\s*$`)
	runFence   = regexp.MustCompile("^\\s*```(sh|bash|shell)\\s*$")
	anyFence   = regexp.MustCompile("^\\s*```")
)

// docBlocks returns the runnable blocks of a Markdown file, in order. A
// marker that is not directly above a shell fence, or that names no known
// mode, is an error: a misplaced marker must not silently leave a block
// unrun.
func docBlocks(file string) ([]docBlock, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(b), "\n")
	var out []docBlock
	inFence := false
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if anyFence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		m := docsMarker.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		where := fmt.Sprintf("%s:%d", filepath.ToSlash(file), i+1)
		fields := strings.Fields(m[1])
		blk := docBlock{file: file, line: i + 2}
		switch {
		case len(fields) == 1 && fields[0] == "run":
			blk.mode = "run"
		case len(fields) == 1 && fields[0] == "background":
			blk.mode = "background"
		case len(fields) >= 1 && len(fields) <= 2 && fields[0] == "start":
			blk.mode = "start"
			if len(fields) == 2 {
				blk.ready = fields[1]
			}
		default:
			return nil, fmt.Errorf("%s: marker %q: write <!-- test: run -->, <!-- test: background --> or <!-- test: start [READY-URL] --> directly above a shell block", where, line)
		}
		if i+1 >= len(lines) || !runFence.MatchString(lines[i+1]) {
			return nil, fmt.Errorf("%s: marker %q is not directly above a ```sh, ```bash or ```shell fence: move it to the line above the block's opening fence", where, strings.TrimSpace(line))
		}
		var body []string
		closed := false
		for i += 2; i < len(lines); i++ {
			if anyFence.MatchString(lines[i]) {
				closed = true
				break
			}
			body = append(body, lines[i])
		}
		if !closed {
			return nil, fmt.Errorf("%s: the block below the marker is never closed: end it with ```", where)
		}
		blk.text = strings.Join(body, "\n") + "\n"
		out = append(out, blk)
	}
	return out, nil
}

// docRunner runs the blocks of one page, in order, in one directory.
type docRunner struct {
	dir     string                           // working directory of every block
	env     []string                         // environment of the next block; run blocks' exports update it
	timeout time.Duration                    // per run block; per start block to become ready and to stop
	settle  time.Duration                    // docsStartSettle, shorter in the runner's own test
	logf    func(format string, args ...any) // when not nil, shows each run block's output
	started []*startedBlock
}

// startedBlock is a start block running in the background.
type startedBlock struct {
	blk  docBlock
	cmd  *exec.Cmd
	out  string // file holding its output
	done chan struct{}
	err  error // of Wait, set before done closes
}

// blockError is a block that failed: where it is, what it says, what it
// printed.
func blockError(b docBlock, what, outFile string) error {
	out, _ := os.ReadFile(outFile)
	return fmt.Errorf("%s: the %s block %s; fix the page or what it runs.\n--- block ---\n%s--- output ---\n%s", b.where(), b.mode, what, b.text, out)
}

// script writes the bash script of b, which records its exported
// environment in envFile when it ends (when envFile is not empty), and
// returns its path.
func (r *docRunner) script(b docBlock, n int, envFile string) (string, error) {
	var s strings.Builder
	s.WriteString("set -euo pipefail\n")
	if envFile != "" {
		fmt.Fprintf(&s, "trap 'env -0 > %q' EXIT\n", envFile)
	}
	if b.mode != "run" {
		// SIGTERM goes to the block's whole process group: the command
		// stops, and bash, which holds the trap until its foreground
		// command has exited, ends after it.
		s.WriteString("trap 'exit 143' TERM\n")
	}
	s.WriteString(b.text)
	p := filepath.Join(r.dir, fmt.Sprintf(".block-%d.sh", n))
	return p, os.WriteFile(p, []byte(s.String()), 0o600)
}

func (r *docRunner) command(script, out string) (*exec.Cmd, error) {
	f, err := os.Create(out)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("bash", script)
	cmd.Dir = r.dir
	cmd.Env = r.env
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = f, f // a file, so a process left behind cannot hold Wait
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	f.Close()
	return cmd, nil
}

// check fails when a start block of the page has exited: it had to keep
// running.
func (r *docRunner) check() error {
	for _, s := range r.started {
		select {
		case <-s.done:
			if s.blk.mode == "background" && s.err == nil {
				continue // it finished, as it may
			}
			return blockError(s.blk, fmt.Sprintf("exited (%v) before the page's last block had run; it must keep running", s.err), s.out)
		default:
		}
	}
	return nil
}

// runBlock runs b, the page's n-th block, and returns an error that names
// it, shows it and its output unless it succeeded.
func (r *docRunner) runBlock(b docBlock, n int) error {
	if err := r.check(); err != nil {
		return err
	}
	switch b.mode {
	case "run":
		return r.run(b, n)
	case "start", "background":
		return r.start(b, n)
	}
	return fmt.Errorf("%s: unknown mode %q", b.where(), b.mode)
}

func (r *docRunner) run(b docBlock, n int) error {
	envFile := filepath.Join(r.dir, fmt.Sprintf(".block-%d.env", n))
	script, err := r.script(b, n, envFile)
	if err != nil {
		return err
	}
	out := filepath.Join(r.dir, fmt.Sprintf(".block-%d.out", n))
	cmd, err := r.command(script, out)
	if err != nil {
		return fmt.Errorf("%s: start bash: %w (is bash installed?)", b.where(), err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var werr error
	select {
	case werr = <-done:
	case <-time.After(r.timeout):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return blockError(b, fmt.Sprintf("did not finish within %s (killed); a command that keeps running belongs in a <!-- test: start --> block", r.timeout), out)
	}
	// Whatever the block left running in its process group ends with it.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if werr != nil {
		return blockError(b, fmt.Sprintf("failed (%v)", werr), out)
	}
	if r.logf != nil {
		o, _ := os.ReadFile(out)
		r.logf("%s: ran\n%s", b.where(), o)
	}
	env, err := os.ReadFile(envFile)
	if err != nil {
		return fmt.Errorf("%s: read the environment the block left: %w", b.where(), err)
	}
	r.env = r.env[:0:0]
	for _, kv := range strings.Split(string(env), "\x00") {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "_" || k == "SHLVL" || k == "PWD" || k == "OLDPWD" {
			continue
		}
		r.env = append(r.env, kv)
	}
	return nil
}

func (r *docRunner) start(b docBlock, n int) error {
	if b.ready != "" && answers(b.ready) {
		return fmt.Errorf("%s: %s answers before the block started: something else listens there; stop it and run the test again", b.where(), b.ready)
	}
	script, err := r.script(b, n, "")
	if err != nil {
		return err
	}
	out := filepath.Join(r.dir, fmt.Sprintf(".block-%d.out", n))
	cmd, err := r.command(script, out)
	if err != nil {
		return fmt.Errorf("%s: start bash: %w (is bash installed?)", b.where(), err)
	}
	s := &startedBlock{blk: b, cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		s.err = cmd.Wait()
		close(s.done)
	}()
	r.started = append(r.started, s)
	if b.ready == "" {
		// Nothing to poll: the block is ready once it has run for
		// r.settle without exiting.
		select {
		case <-s.done:
			if b.mode == "background" && s.err == nil {
				return nil
			}
			return blockError(b, fmt.Sprintf("exited (%v) within %s of its start; it must keep running", s.err, r.settle), out)
		case <-time.After(r.settle):
		}
		return nil
	}
	deadline := time.Now().Add(r.timeout)
	for b.ready != "" && !answers(b.ready) {
		select {
		case <-s.done:
			return blockError(b, fmt.Sprintf("exited (%v) before %s answered", s.err, b.ready), out)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return blockError(b, fmt.Sprintf("was not ready within %s: %s never answered 2xx", r.timeout, b.ready), out)
		}
	}
	return nil
}

// answers reports whether url answers a GET with a 2xx status.
func answers(url string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode/100 == 2
}

// stop ends the page's background and start blocks. With wait (the page's
// blocks all ran) each background block must first exit 0 by itself
// within the timeout. Then each block still running gets SIGTERM to its
// process group, all at once, and SIGKILL for what is left after the
// timeout. It fails when a start block had already exited, or one did not
// stop in time.
func (r *docRunner) stop(wait bool) error {
	var errs []error
	if wait {
		for _, s := range r.started {
			if s.blk.mode != "background" {
				continue
			}
			select {
			case <-s.done:
				if s.err != nil {
					errs = append(errs, blockError(s.blk, fmt.Sprintf("failed (%v)", s.err), s.out))
				} else if r.logf != nil {
					o, _ := os.ReadFile(s.out)
					r.logf("%s: ran\n%s", s.blk.where(), o)
				}
			case <-time.After(r.timeout):
				errs = append(errs, blockError(s.blk, fmt.Sprintf("did not finish within %s after the page's last block (killed)", r.timeout), s.out))
			}
		}
		errs = append(errs, r.check())
	}
	// SIGTERM to every block still running at once, then wait for each
	// within one deadline.
	var stopping []*startedBlock
	for i := len(r.started) - 1; i >= 0; i-- {
		s := r.started[i]
		select {
		case <-s.done:
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			continue
		default:
		}
		if r.logf != nil {
			o, _ := os.ReadFile(s.out)
			r.logf("%s: stopping; its output so far:\n%s", s.blk.where(), o)
		}
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		stopping = append(stopping, s)
	}
	deadline := time.After(r.timeout)
	for _, s := range stopping {
		pgid := s.cmd.Process.Pid
		select {
		case <-s.done:
		case <-deadline:
			errs = append(errs, blockError(s.blk, fmt.Sprintf("did not stop within %s of SIGTERM (killed)", r.timeout), s.out))
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-s.done
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	r.started = nil
	return errors.Join(errs...)
}

// runPage runs the blocks of one page in order and stops its background
// and start blocks, returning the first failure.
func (r *docRunner) runPage(blocks []docBlock) error {
	for n, b := range blocks {
		if err := r.runBlock(b, n); err != nil {
			return errors.Join(err, r.stop(false))
		}
	}
	return r.stop(true)
}

// docsPrelude holds what a page assumes is already running, started
// before its blocks: the client's README begins where the repository's
// README leaves off, with walcast run streaming.
var docsPrelude = map[string]docBlock{
	"fanout/client/js/README.md": {line: 1, mode: "start", ready: "http://127.0.0.1:9187/readyz",
		text: "walcast run --database-url \"$WALCAST_DATABASE_URL\" --publication walcast\n"},
}

// docsPages are the pages whose marked blocks run, in the order they run.
func docsPages(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(docs)
	pages := append([]string{filepath.Join(root, "README.md")}, docs...)
	return append(pages, filepath.Join(root, "fanout", "client", "js", "README.md"))
}

// walcastOnPath writes dir/walcast, a script that runs this test binary as
// the walcast binary (see TestMain).
func walcastOnPath(t *testing.T, dir string) string {
	t.Helper()
	exe, err := filepath.Abs(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "walcast")
	script := fmt.Sprintf("#!/bin/sh\nWALCAST_TEST_EXEC=1 exec %q \"$@\"\n", exe)
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// docsEnv is this process's environment without what could point the
// docs' commands elsewhere (PG*, WALCAST_*, DATABASE_URL), plus extra.
func docsEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "WALCAST_") || k == "DATABASE_URL" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// TestDocsBlocksRun runs every block of the README, docs/ and the client's
// README that is marked runnable (see the top of this file) against a
// throwaway PostgreSQL, the walcast binary under test and the documented
// environment: the pages' commands must work as written.
func TestDocsBlocksRun(t *testing.T) {
	root := filepath.Join("..", "..")
	absRoot, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	var pages [][]docBlock
	total := 0
	for _, f := range docsPages(t, root) {
		blocks, err := docBlocks(f)
		if err != nil {
			t.Fatal(err)
		}
		total += len(blocks)
		if len(blocks) == 0 {
			continue
		}
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		rel = filepath.ToSlash(rel)
		for i := range blocks {
			blocks[i].file = rel // reports name the page from the repository's root
		}
		if before, ok := docsPrelude[rel]; ok {
			before.file = "(what " + rel + " assumes runs)"
			blocks = append([]docBlock{before}, blocks...)
		}
		pages = append(pages, blocks)
	}
	if total < 15 {
		t.Fatalf("found %d runnable blocks in the docs; the markers are gone or the extraction is broken", total)
	}

	for _, tool := range []string{"bash", "curl", "openssl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the docs' blocks run %s, which is not on PATH: install it (apt-get install -y %s)", tool, tool)
		}
	}
	c := pgtest.Start(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Exec(ctx, "postgres", "CREATE DATABASE app"); err != nil {
		t.Fatal(err)
	}
	execSQL(t, c.URL("app"),
		`CREATE TABLE public.customers (id bigint PRIMARY KEY, name text NOT NULL)`,
		`CREATE TABLE public.orders (id bigint PRIMARY KEY, customer_id bigint REFERENCES public.customers, status text NOT NULL, total numeric(10,2))`,
		`INSERT INTO public.customers SELECT g, 'customer ' || g FROM generate_series(1, 10) g`,
		`INSERT INTO public.orders SELECT g, 1 + g % 10, 'new', g * 1.5 FROM generate_series(1, 20) g`,
	)
	pathDir := filepath.Join(t.TempDir(), "path")
	walcastOnPath(t, pathDir)
	base := docsEnv(
		"PATH="+pathDir+string(os.PathListSeparator)+c.BinDir()+string(os.PathListSeparator)+os.Getenv("PATH"),
		"PGHOST=127.0.0.1", fmt.Sprintf("PGPORT=%d", c.Port()), "PGUSER=postgres",
		"WALCAST_DATABASE_URL=postgres://walcast:change-me@localhost/app",
		"DATABASE_URL=postgres://walcast:change-me@localhost/app",
	)

	start := time.Now()
	for _, blocks := range pages {
		dir := t.TempDir()
		walcastOnPath(t, filepath.Join(dir, "bin"))
		for _, d := range []string{"src"} {
			if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(filepath.Join(absRoot, "deploy"), filepath.Join(dir, "deploy")); err != nil {
			t.Fatal(err)
		}
		r := &docRunner{dir: dir, env: append([]string(nil), base...), timeout: docsBlockTimeout, settle: docsStartSettle}
		if testing.Verbose() {
			r.logf = t.Logf
		}
		pageStart := time.Now()
		if err := r.runPage(blocks); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d blocks in %s", filepath.ToSlash(blocks[len(blocks)-1].file), len(blocks), time.Since(pageStart).Round(time.Millisecond))
	}
	t.Logf("%d runnable blocks on %d pages ran in %s", total, len(pages), time.Since(start).Round(time.Millisecond))
}

// TestDocsBlocksRunnerFails: the runner reports a block that exits non-zero,
// a run block that outlives its timeout, a start block that exits early,
// exits while the page runs or never gets ready, a background block that
// fails or never ends, and misplaced or unknown markers; each report names
// the file and line and shows the block and its output. A page whose
// blocks all do what they should passes.
func TestDocsBlocksRunnerFails(t *testing.T) {
	dir := t.TempDir()
	page := filepath.Join(dir, "page.md")
	text := "# A page\n\n" +
		"<!-- test: run -->\n```sh\necho fine\nexport CARRIED=yes\n```\n\n" + // line 4
		"<!-- test: run -->\n```sh\ntest \"$CARRIED\" = yes\necho about to fail\nfalse\necho not reached\n```\n\n" + // line 10
		"<!-- test: run -->\n```bash\necho sleeping\nsleep 30\n```\n\n" + // line 18
		"<!-- test: start -->\n```sh\necho starting; exit 3\n```\n\n" + // line 24
		"<!-- test: start http://127.0.0.1:1/never -->\n```sh\nsleep 30\n```\n\n" + // line 29
		"<!-- test: background -->\n```sh\nsleep 0.5; echo background failing; exit 4\n```\n\n" + // line 34
		"<!-- test: background -->\n```sh\nsleep 30\n```\n\n" + // line 39
		"<!-- test: start -->\n```sh\necho serving; sleep 30\n```\n\n" + // line 44
		"<!-- test: background -->\n```sh\necho done at once\n```\n\n" + // line 49
		"<!-- test: start -->\n```sh\nsleep 0.5; echo dying; exit 5\n```\n\n" + // line 54
		"<!-- test: run -->\n```sh\nsleep 0.6\n```\n\n" + // line 59
		"```sh\nfalse   # not marked: never run\n```\n"
	if err := os.WriteFile(page, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	blocks, err := docBlocks(page)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 11 {
		t.Fatalf("found %d runnable blocks, want 11: %+v", len(blocks), blocks)
	}
	newRunner := func() *docRunner {
		return &docRunner{dir: t.TempDir(), env: docsEnv(), timeout: time.Second, settle: 200 * time.Millisecond}
	}

	r := newRunner()
	if err := r.runBlock(blocks[0], 0); err != nil {
		t.Fatalf("a block that exits 0 failed: %v", err)
	}
	err = r.runBlock(blocks[1], 1)
	mustReport(t, "a block that exits 1", err, "page.md:10", "failed (exit status 1)", "about to fail", "false\n", "--- output ---")
	if _, out, _ := strings.Cut(fmt.Sprint(err), "--- output ---"); strings.Contains(out, "not reached") {
		t.Errorf("the block went on after a failing command (set -e):\n%v", err)
	}

	begun := time.Now()
	err = r.runBlock(blocks[2], 2)
	mustReport(t, "a block that outlives its timeout", err, "page.md:18", "did not finish within 1s", "sleeping", "sleep 30")
	if d := time.Since(begun); d > 10*time.Second {
		t.Errorf("the timed-out block took %s to be stopped", d)
	}

	r = newRunner()
	err = r.runPage(blocks[3:4])
	mustReport(t, "a start block that exits at once", err, "page.md:24", "exited", "starting")

	r = newRunner()
	err = r.runPage(blocks[4:5])
	mustReport(t, "a start block that never gets ready", err, "page.md:29", "was not ready within 1s", "http://127.0.0.1:1/never")

	r = newRunner()
	err = r.runPage(blocks[5:6])
	mustReport(t, "a background block that exits 4", err, "page.md:34", "failed (exit status 4)", "background failing")

	r = newRunner()
	err = r.runPage(blocks[6:7])
	mustReport(t, "a background block that never ends", err, "page.md:39", "did not finish within 1s")

	r = newRunner()
	if err := r.runPage(blocks[7:9]); err != nil {
		t.Errorf("a page whose server runs to its end and whose background block exits 0 failed: %v", err)
	}

	r = newRunner()
	err = r.runPage(blocks[9:11])
	mustReport(t, "a start block that exits while the page runs", err, "page.md:54", "exited (exit status 5) before the page's last block had run", "dying")

	for _, bad := range []string{
		"<!-- test: run -->\n\n```sh\necho x\n```\n",
		"<!-- test: run -->\n```ts\nx\n```\n",
		"<!-- test: walk -->\n```sh\necho x\n```\n",
		"<!-- test: run -->\n```sh\necho never closed\n",
	} {
		f := filepath.Join(dir, "bad.md")
		if err := os.WriteFile(f, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := docBlocks(f); err == nil || !strings.Contains(err.Error(), "bad.md:1") {
			t.Errorf("marker in %q: error %v, want one naming bad.md:1", bad, err)
		}
	}
}

// mustReport fails unless err is a report holding every one of wants.
func mustReport(t *testing.T, what string, err error, wants ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: the runner reported success", what)
		return
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: the report lacks %q:\n%v", what, w, err)
		}
	}
}
