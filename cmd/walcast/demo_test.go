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
