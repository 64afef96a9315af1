package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
)

func TestMain(m *testing.M) {
	// ...and as NATS servers (natstest.StartProcessCluster).
	natstest.ServeIfChild()
	// Process-level tests re-execute this binary as walcast itself.
	if os.Getenv("WALCAST_TEST_EXEC") == "1" {
		main()
		return
	}
	os.Exit(pgtest.Main(m))
}

// walcast runs the CLI in-process with the given environment and returns its
// exit code and output.
func walcast(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Run(context.Background(), args, Env{Stdout: &out, Stderr: &errb, LookupEnv: func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}})
	return code, out.String(), errb.String()
}

func execSQL(t testing.TB, url string, sqls ...string) {
	t.Helper()
	pgtest.MustExec(t, url, sqls...)
}

// TestVerifyFailsThenPassesAfterPastingFix is the operator's path: verify
// names the table without a primary key, exits 1, and the printed fix makes
// the next verify exit 0.
func TestVerifyFailsThenPassesAfterPastingFix(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url, `CREATE TABLE "Line Items" (sku text, qty int)`, `CREATE PUBLICATION shop FOR TABLE "Line Items"`)

	code, out, _ := walcast(t, nil, "verify", "--database-url", url, "--publication", "shop")
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, out)
	}
	var fix string
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if strings.Contains(l, "FAIL") && strings.Contains(l, "replica_identity") && strings.Contains(l, "public.Line Items") {
			_, fix, _ = strings.Cut(lines[i+1], "fix: ")
		}
	}
	if fix == "" {
		t.Fatalf("no replica identity failure with a fix for the table:\n%s", out)
	}
	execSQL(t, url, fix)
	code, out, _ = walcast(t, nil, "verify", "--database-url", url, "--publication", "shop")
	if code != 0 {
		t.Fatalf("after the fix: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, "0 failures") {
		t.Fatalf("summary line missing:\n%s", out)
	}
}

func TestVerifyJSONAndEnvironment(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url, `CREATE TABLE t (id int PRIMARY KEY)`, `CREATE PUBLICATION p FOR TABLE t`)
	// Flags come from WALCAST_* variables; a flag on the command line wins.
	env := map[string]string{"WALCAST_DATABASE_URL": url, "WALCAST_PUBLICATION": "nope", "WALCAST_JSON": "true"}
	code, out, errOut := walcast(t, env, "verify", "--publication", "p")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	var report struct {
		Target        string `json:"target"`
		Publication   string `json:"publication"`
		Slot          string `json:"slot"`
		ServerVersion string `json:"serverVersion"`
		Checks        []struct {
			ID, Subject, Status, Found, Fix string
			Blocking                        bool
		} `json:"checks"`
		Summary struct{ OK, Warn, Fail int } `json:"summary"`
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&report); err != nil {
		t.Fatalf("JSON report: %v\n%s", err, out)
	}
	if report.Publication != "p" || report.Slot != "walcast" || !strings.HasPrefix(report.ServerVersion, "1") {
		t.Fatalf("report header: %+v", report)
	}
	if len(report.Checks) == 0 || report.Summary.OK == 0 || report.Summary.Fail != 0 {
		t.Fatalf("report body: %+v", report)
	}
	for _, c := range report.Checks {
		if c.Status != "ok" && c.Status != "warn" && c.Status != "fail" {
			t.Fatalf("status %q", c.Status)
		}
	}
	if strings.Contains(out, "password") {
		t.Fatal("report mentions a password")
	}

	code, _, errOut = walcast(t, map[string]string{"WALCAST_JSON": "maybe"}, "verify", "--database-url", url, "--publication", "p")
	if code != 2 || !strings.Contains(errOut, "WALCAST_JSON") {
		t.Fatalf("bad environment value: exit %d, %q", code, errOut)
	}
}

func TestVerifyExitCodes(t *testing.T) {
	url := pgtest.NewDatabase(t)
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"missing publication flag", []string{"verify", "--database-url", url}, 2, "--publication is required"},
		{"missing url", []string{"verify", "--publication", "p"}, 2, "--database-url is required"},
		{"unknown flag", []string{"verify", "--bogus"}, 2, "unknown flag"},
		{"unknown command", []string{"frobnicate"}, 2, "unknown command"},
		{"unreachable", []string{"verify", "--database-url", "postgres://u:s3cret@127.0.0.1:1/x?sslmode=disable", "--publication", "p"}, 2, "check that PostgreSQL is running"},
		{"missing publication", []string{"verify", "--database-url", url, "--publication", "p"}, 1, "CREATE PUBLICATION p"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := walcast(t, nil, tc.args...)
			if code != tc.code || !strings.Contains(out+errOut, tc.want) {
				t.Fatalf("exit %d (want %d), output lacks %q:\n%s%s", code, tc.code, tc.want, out, errOut)
			}
			if strings.Contains(out+errOut, "s3cret") {
				t.Fatal("password printed")
			}
		})
	}
	if code, out, _ := walcast(t, nil, "version"); code != 0 || !strings.HasPrefix(out, "walcast ") {
		t.Fatalf("version: %d %q", code, out)
	}
}
