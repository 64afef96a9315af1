package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunSpillSettingsChecked: a spill directory that cannot take files
// and a --max-transaction-bytes below 1 (from the flag or its environment
// variable) stop walcast run at start with exit 2, naming what is wrong and
// the fix, before any connection is made.
func TestRunSpillSettingsChecked(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"run", "--database-url", "postgres://127.0.0.1:1/x?sslmode=disable", "--publication", "p", "--skip-preflight"}
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"spill dir is a file", nil, []string{"--spill-dir", file}, []string{file, "fix: point --spill-dir"}},
		{"spill dir missing", nil, []string{"--spill-dir", file + "/gone"}, []string{file + "/gone", "fix: point --spill-dir"}},
		{"bound zero", nil, []string{"--max-transaction-bytes", "0"}, []string{"--max-transaction-bytes must be at least 1"}},
		{"bound from the environment", map[string]string{"WALCAST_MAX_TRANSACTION_BYTES": "-1"}, nil, []string{"--max-transaction-bytes must be at least 1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := walcast(t, tc.env, append(append([]string{}, base...), tc.args...)...)
			if code != 2 {
				t.Fatalf("exit %d, want 2\n%s%s", code, out, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Fatalf("output lacks %q:\n%s", w, errOut)
				}
			}
		})
	}
}
