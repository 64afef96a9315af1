package main

import (
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"

	"github.com/walcast/walcast/internal/pgtest"
)

// TestJournalConnectHintsMatchTheError: a journal URL that fails at the
// first use of the journal (sync, tail) gets the remedy for what went
// wrong: the password for SQLSTATE 28P01, the database name for 3D000, the
// server for a refused connection, and GRANT CREATE only for a role that
// may not create the schema.
func TestJournalConnectHintsMatchTheError(t *testing.T) {
	c := pgtest.Shared(t)
	dbURL := pgtest.NewDatabase(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	var suffix [4]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		t.Fatal(err)
	}
	role := "journal_hint_" + hex.EncodeToString(suffix[:])
	execSQL(t, dbURL, "CREATE ROLE "+role+" LOGIN PASSWORD 'right-pw'")
	t.Cleanup(func() { execSQL(t, c.URL("postgres"), "DROP OWNED BY "+role, "DROP ROLE IF EXISTS "+role) })

	grant := "GRANT CREATE"
	for _, tc := range []struct {
		name, journalURL string
		want             []string
		notWant          string
	}{
		{"wrong password", c.UserURL(db, role, "wrong-pw"), []string{"28P01", "the password was rejected", "--journal-url"}, grant},
		{"missing database", c.UserURL("no_such_db_here", role, "right-pw"), []string{"3D000", "does not exist", "CREATE DATABASE"}, grant},
		{"nothing listening", "postgres://" + role + ":right-pw@127.0.0.1:1/" + db + "?sslmode=disable&connect_timeout=5", []string{"nothing accepted the connection"}, grant},
		// tail only reads (journal.Config.ReadOnly): it never creates the
		// journal, so it says there is none instead.
		{"no CREATE privilege", c.UserURL(db, role, "right-pw"), []string{"42501", grant}, "password was rejected"},
	} {
		tailWant := tc.want
		if tc.name == "no CREATE privilege" {
			tailWant = []string{"holds no journal", "walcast run creates the journal"}
		}
		t.Run(tc.name, func(t *testing.T) {
			for _, args := range [][]string{
				{"sync", "--nats-url", "nats://127.0.0.1:1", "--journal-url", tc.journalURL, "--cursor-secret", string(cursorSecret),
					"--jwt-secret", syncJWTSecret, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"},
				{"tail", "--journal-url", tc.journalURL},
			} {
				code, _, stderr := walcast(t, nil, args...)
				if code != exitUsage {
					t.Fatalf("%s: exit %d, want %d\n%s", args[0], code, exitUsage, stderr)
				}
				want := tc.want
				if args[0] == "tail" {
					want = tailWant
				}
				for _, w := range want {
					if !strings.Contains(stderr, w) {
						t.Fatalf("%s: output lacks %q:\n%s", args[0], w, stderr)
					}
				}
				if strings.Contains(stderr, tc.notWant) {
					t.Fatalf("%s: output has the unrelated hint %q:\n%s", args[0], tc.notWant, stderr)
				}
				if strings.Contains(stderr, "right-pw") || strings.Contains(stderr, "wrong-pw") {
					t.Fatalf("%s: a password was printed:\n%s", args[0], stderr)
				}
			}
		})
	}
}
