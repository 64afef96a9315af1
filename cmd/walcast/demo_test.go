package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/walcast/walcast/decoder"
)

// TestDemo runs `make demo`'s script non-interactively, with this test
// binary standing in for bin/walcast, and checks that every envelope the
// script's writes produce was printed by `walcast tail`.
func TestDemo(t *testing.T) {
	cmd := exec.Command("bash", "../../deploy/demo/demo.sh")
	cmd.Env = append(os.Environ(), "WALCAST_BIN="+os.Args[0], "WALCAST_TEST_EXEC=1", "DEMO_NONINTERACTIVE=1", "DEMO_TIMEOUT=60")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	var ops []string
	var toastUnchanged bool
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		if !strings.HasPrefix(line, "{\"seq\"") {
			continue // verify's report
		}
		var env decoder.Envelope
		if err := json.Unmarshal([]byte(line), &env); err != nil {
			t.Fatalf("tail printed a line that is not an envelope: %v\n%s", err, line)
		}
		ops = append(ops, string(env.Op))
		if env.Op == decoder.OpUpdate && len(env.Unchanged) == 1 && env.Unchanged[0] == "notes" {
			toastUnchanged = true
		}
	}
	if got, want := strings.Join(ops, ","), "insert,insert,insert,update,delete,message,truncate"; got != want {
		t.Fatalf("envelopes printed: %s, want %s\nstderr:\n%s", got, want, stderr.String())
	}
	if !toastUnchanged {
		t.Fatalf("the update of the TOASTed row does not list notes as unchanged:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "stopping everything") {
		t.Fatalf("the demo did not clean up:\n%s", stderr.String())
	}
}

// TestDemoBuildSaysWhatItDoes: make demo's build step (deploy/demo/build.sh)
// says that a first build takes minutes, passes on each module download,
// counts the packages go build compiles, and fails with go build's errors
// when it fails. A stand-in for the go command prints what go build -v
// prints on a cold cache.
func TestDemoBuildSaysWhatItDoes(t *testing.T) {
	dir := t.TempDir()
	fakeGo := dir + "/go"
	script := `#!/bin/sh
echo "go: downloading github.com/example/mod v1.2.3" >&2
i=0
while [ $i -lt 120 ]; do echo "github.com/example/mod/pkg$i" >&2; i=$((i+1)); done
if [ -n "$FAIL_BUILD" ]; then
  echo "# github.com/walcast/walcast/cmd/walcast" >&2
  echo "cmd/walcast/x.go:1:2: undefined: y" >&2
  exit 1
fi
`
	if err := os.WriteFile(fakeGo, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(fail bool) (string, error) {
		cmd := exec.Command("bash", "deploy/demo/build.sh", dir+"/walcast")
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "GO="+fakeGo)
		if fail {
			cmd.Env = append(cmd.Env, "FAIL_BUILD=1")
		}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(false)
	if err != nil {
		t.Fatalf("build.sh: %v\n%s", err, out)
	}
	for _, want := range []string{"first build downloads and compiles every dependency", "a few minutes",
		"downloading github.com/example/mod v1.2.3", "compiled 50 packages", "compiled 100 packages", "built " + dir + "/walcast in"} {
		if !strings.Contains(out, want) {
			t.Fatalf("build.sh output lacks %q:\n%s", want, out)
		}
	}
	out, err = run(true)
	if err == nil {
		t.Fatalf("build.sh succeeded although go build failed:\n%s", out)
	}
	for _, want := range []string{"cmd/walcast/x.go:1:2: undefined: y", "failed (the errors are above)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("a failed build's output lacks %q:\n%s", want, out)
		}
	}
}
