package replication

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcast/walcast/internal/pgtest"
)

// syncChecks are the report's sync-role checks.
func syncChecks(r *Report) []Check {
	var out []Check
	for _, c := range r.Checks {
		if strings.HasPrefix(c.ID, "sync_") {
			out = append(out, c)
		}
	}
	return out
}

// TestVerifySyncRoleFromSetupSQL: setup.sql's sync_role branch, run with
// psql, makes a role that verify --sync-role passes, and that role can
// read the published tables (the tenant column too) and write nothing.
func TestVerifySyncRoleFromSetupSQL(t *testing.T) {
	url := pgtest.NewDatabase(t)
	c := pgtest.Shared(t)
	db := dbName(t, url)
	suffix := strings.ReplaceAll(db, "_", "")[:16]
	role, syncRole := "setup_"+suffix, "sync_"+suffix
	execSQL(t, url, `CREATE SCHEMA app`,
		`CREATE TABLE app.orders (id int PRIMARY KEY, tenant text)`, `ALTER TABLE app.orders REPLICA IDENTITY FULL`,
		`CREATE TABLE "Odd Name" (id int PRIMARY KEY)`)
	t.Cleanup(func() {
		execSQL(t, url, `DROP OWNED BY `+role+` CASCADE`, `DROP OWNED BY `+syncRole+` CASCADE`)
		execSQL(t, c.URL("postgres"), `DROP ROLE `+role, `DROP ROLE `+syncRole)
	})
	psql := filepath.Join(c.BinDir(), "psql")
	for i := 0; i < 2; i++ { // idempotent
		out, err := exec.Command(psql, "-X", "-q", "-d", url, "-v", "role="+role, "-v", "password=pw",
			"-v", "publication=walcast", "-v", `tables=app.orders, public."Odd Name"`,
			"-v", "sync_role="+syncRole, "-v", "sync_password=syncpw",
			"-f", "../deploy/postgres/setup.sql").CombinedOutput()
		if err != nil {
			t.Fatalf("setup.sql run %d: %v\n%s", i+1, err, out)
		}
	}
	r := mustVerify(t, VerifyConfig{DatabaseURL: c.UserURL(db, role, "pw"), Publication: "walcast", TenantColumn: "tenant", SyncRole: syncRole})
	if r.Failed() || r.Summary.Warn > 1 { // max_slot_wal_keep_size is unbounded in the harness
		t.Fatalf("verify --sync-role after setup.sql:\n%s", dump(r))
	}
	for _, ch := range syncChecks(r) {
		wantStatus(t, ch, StatusOK)
	}
	sel := check(t, r, "sync_select", "app.orders")
	if !strings.Contains(sel.Found, `tenant column "tenant"`) {
		t.Errorf("sync_select of a tenanted table: %q", sel.Found)
	}
	check(t, r, "sync_no_write", "public.Odd Name")
	check(t, r, "sync_read_only", "")

	// What verify said holds: the role reads, and cannot write.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.UserURL(db, syncRole, "syncpw"))
	if err != nil {
		t.Fatalf("the sync role cannot log in: %v", err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(tenant) FROM app.orders`).Scan(&n); err != nil {
		t.Fatalf("the sync role cannot read: %v", err)
	}
	// Read-only by default, and refused INSERT when asked for read-write.
	for _, step := range []struct{ sql, code string }{
		{`INSERT INTO app.orders VALUES (1, 'a')`, "25006"},
		{`SET default_transaction_read_only = off`, ""},
		{`INSERT INTO app.orders VALUES (1, 'a')`, "42501"},
		{`TRUNCATE app.orders`, "42501"},
	} {
		_, err := conn.Exec(ctx, step.sql)
		var pgErr *pgconn.PgError
		switch {
		case step.code == "" && err != nil:
			t.Fatalf("%s: %v", step.sql, err)
		case step.code != "" && (!errors.As(err, &pgErr) || pgErr.Code != step.code):
			t.Fatalf("%s as the sync role: %v, want SQLSTATE %s", step.sql, err, step.code)
		}
	}
}

// TestVerifySyncRoleTooPowerful: a sync role that can write, replicate and
// create databases, is not read-only by default and cannot read one table
// fails verify --sync-role, each failure with its fix; the fixes, pasted as
// printed, make it pass. A missing role and a NOLOGIN role fail too.
func TestVerifySyncRoleTooPowerful(t *testing.T) {
	url := pgtest.NewDatabase(t)
	c := pgtest.Shared(t)
	db := dbName(t, url)
	role := "strong_" + strings.ReplaceAll(db, "_", "")[:16]
	execSQL(t, url,
		`CREATE TABLE t1 (id int PRIMARY KEY, tenant text)`,
		`CREATE TABLE t2 (id int PRIMARY KEY)`,
		`CREATE SCHEMA hidden`,
		`CREATE TABLE hidden.t3 (id int PRIMARY KEY)`,
		`CREATE PUBLICATION p FOR TABLE t1, t2, hidden.t3`,
		`CREATE ROLE `+role+` LOGIN REPLICATION CREATEDB PASSWORD 'pw'`,
		`GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON t1 TO `+role,
		`GRANT SELECT ON hidden.t3 TO `+role,
		`GRANT UPDATE (id) ON t2 TO `+role,
	)
	t.Cleanup(func() {
		execSQL(t, url, `DROP OWNED BY `+role+` CASCADE`)
		execSQL(t, c.URL("postgres"), `DROP ROLE `+role)
	})
	cfg := VerifyConfig{DatabaseURL: url, Publication: "p", TenantColumn: "tenant", SyncRole: role}
	r := mustVerify(t, cfg)
	if !r.Failed() {
		t.Fatalf("a writable sync role passes:\n%s", dump(r))
	}
	wantStatus(t, check(t, r, "sync_role", ""), StatusOK)
	attrs := check(t, r, "sync_role_attributes", "")
	wantStatus(t, attrs, StatusFail)
	if !strings.Contains(attrs.Found, "REPLICATION, CREATEDB") {
		t.Errorf("sync_role_attributes: %q", attrs.Found)
	}
	wantStatus(t, check(t, r, "sync_read_only", ""), StatusWarn)
	w1 := check(t, r, "sync_no_write", "public.t1")
	wantStatus(t, w1, StatusFail)
	if !strings.Contains(w1.Found, "INSERT, UPDATE, DELETE, TRUNCATE") {
		t.Errorf("sync_no_write t1: %q", w1.Found)
	}
	wantStatus(t, check(t, r, "sync_select", "public.t1"), StatusOK)
	w2 := check(t, r, "sync_no_write", "public.t2") // a column privilege is a write too
	wantStatus(t, w2, StatusFail)
	s2 := check(t, r, "sync_select", "public.t2")
	wantStatus(t, s2, StatusFail)
	s3 := check(t, r, "sync_select", "hidden.t3")
	wantStatus(t, s3, StatusFail)
	if !strings.Contains(s3.Fix, "GRANT USAGE ON SCHEMA hidden") {
		t.Errorf("sync_select hidden.t3 fix: %q", s3.Fix)
	}
	var fixes []string
	for _, ch := range syncChecks(r) {
		if ch.Status != StatusOK {
			fixes = append(fixes, strings.SplitN(ch.Fix, "--", 2)[0])
		}
	}
	execSQL(t, url, fixes...)
	r = mustVerify(t, cfg)
	for _, ch := range syncChecks(r) {
		wantStatus(t, ch, StatusOK)
	}

	// No such role; a role that cannot log in.
	r = mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "p", SyncRole: role + "_missing"})
	missing := check(t, r, "sync_role", "")
	wantStatus(t, missing, StatusFail)
	if !strings.Contains(missing.Fix, "CREATE ROLE "+role+"_missing LOGIN") || !strings.Contains(missing.Fix, "GRANT SELECT ON hidden.t3, public.t1, public.t2 TO") {
		t.Errorf("fix for a missing role: %q", missing.Fix)
	}
	execSQL(t, url, `ALTER ROLE `+role+` NOLOGIN`)
	r = mustVerify(t, cfg)
	login := check(t, r, "sync_role", "")
	wantStatus(t, login, StatusFail)
	execSQL(t, url, login.Fix)
	wantStatus(t, check(t, mustVerify(t, cfg), "sync_role", ""), StatusOK)
}
