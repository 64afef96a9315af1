package replication

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// exec runs SQL statements (simple protocol, several allowed) as given.
func execSQL(t testing.TB, url string, sqls ...string) {
	t.Helper()
	pgtest.MustExec(t, url, sqls...)
}

func mustVerify(t *testing.T, cfg VerifyConfig) *Report {
	t.Helper()
	r, err := Verify(context.Background(), cfg)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	return r
}

// check returns the report's check with id (and subject, when given); it
// fails the test when there is none.
func check(t *testing.T, r *Report, id, subject string) Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.ID == id && (subject == "" || c.Subject == subject) {
			return c
		}
	}
	t.Fatalf("no check %s %q in report:\n%s", id, subject, dump(r))
	return Check{}
}

func noCheck(t *testing.T, r *Report, id, subject string) {
	t.Helper()
	for _, c := range r.Checks {
		if c.ID == id && (subject == "" || c.Subject == subject) {
			t.Fatalf("unexpected check %+v", c)
		}
	}
}

func dump(r *Report) string {
	var b strings.Builder
	_ = r.WriteText(&b, true)
	return b.String()
}

func wantStatus(t *testing.T, c Check, want Status) {
	t.Helper()
	if c.Status != want {
		t.Fatalf("check %s %q: status %s, want %s (found: %s)", c.ID, c.Subject, c.Status, want, c.Found)
	}
	if want != StatusOK && c.Fix == "" {
		t.Fatalf("check %s %q is %s without a fix", c.ID, c.Subject, c.Status)
	}
}

func TestVerifyHealthyDatabase(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url,
		`CREATE TABLE orders (id bigint PRIMARY KEY, status text)`,
		`CREATE TABLE audit (a int, b int)`,
		`ALTER TABLE audit REPLICA IDENTITY FULL`,
		`CREATE TABLE byidx (a int NOT NULL, b int)`,
		`CREATE UNIQUE INDEX byidx_a ON byidx (a)`,
		`ALTER TABLE byidx REPLICA IDENTITY USING INDEX byidx_a`,
		`CREATE PUBLICATION app FOR TABLE orders, audit, byidx`,
	)
	r := mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "app"})
	if r.Failed() {
		t.Fatalf("healthy database failed verify:\n%s", dump(r))
	}
	wantStatus(t, check(t, r, "wal_level", ""), StatusOK)
	wantStatus(t, check(t, r, "max_replication_slots", ""), StatusOK)
	wantStatus(t, check(t, r, "max_wal_senders", ""), StatusOK)
	wantStatus(t, check(t, r, "replication_privilege", ""), StatusOK)
	wantStatus(t, check(t, r, "publication", ""), StatusOK)
	wantStatus(t, check(t, r, "journal_not_published", ""), StatusOK)
	wantStatus(t, check(t, r, "journal_schema", ""), StatusOK)
	wantStatus(t, check(t, r, "slot", ""), StatusOK)
	wantStatus(t, check(t, r, "tls", ""), StatusOK)
	for _, tbl := range []string{"public.orders", "public.audit", "public.byidx"} {
		wantStatus(t, check(t, r, "replica_identity", tbl), StatusOK)
	}
	// The harness leaves max_slot_wal_keep_size unbounded: a warning, not a failure.
	wantStatus(t, check(t, r, "max_slot_wal_keep_size", ""), StatusWarn)
	if r.Summary.OK+r.Summary.Warn+r.Summary.Fail != len(r.Checks) {
		t.Fatalf("summary %+v does not add up to %d checks", r.Summary, len(r.Checks))
	}
}

func TestVerifyWalLevelAndSlotCapacity(t *testing.T) {
	c := pgtest.Start(t, pgtest.Options{WalLevel: "replica", Settings: map[string]string{
		"max_replication_slots": "1", "max_wal_senders": "2"}})
	url := c.NewDatabase(t)
	execSQL(t, url,
		`CREATE TABLE t (id int PRIMARY KEY)`,
		`CREATE PUBLICATION p FOR TABLE t`,
		`SELECT pg_create_physical_replication_slot('someone_else')`,
	)
	r := mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "p"})
	wl := check(t, r, "wal_level", "")
	wantStatus(t, wl, StatusFail)
	if !wl.Blocking || !strings.Contains(wl.Found, "replica") || !strings.Contains(wl.Fix, "wal_level = logical") || !strings.Contains(wl.Fix, "restart") {
		t.Fatalf("wal_level check: %+v", wl)
	}
	slots := check(t, r, "max_replication_slots", "")
	wantStatus(t, slots, StatusFail)
	if !strings.Contains(slots.Fix, "max_replication_slots = 3") {
		t.Fatalf("slots fix: %s", slots.Fix)
	}
	if got := len(r.Blocking()); got < 2 {
		t.Fatalf("want at least 2 blocking failures, got %d:\n%s", got, dump(r))
	}
	// Once the other slot is gone, the capacity check passes.
	execSQL(t, url, `SELECT pg_drop_replication_slot('someone_else')`)
	r = mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "p"})
	wantStatus(t, check(t, r, "max_replication_slots", ""), StatusOK)
}

func TestVerifyRolePrivileges(t *testing.T) {
	url := pgtest.NewDatabase(t)
	c := pgtest.Shared(t)
	db := dbName(t, url)
	role := "plain_" + strings.ToLower(strings.ReplaceAll(db, "_", ""))[:20]
	execSQL(t, url,
		`CREATE TABLE t1 (id int PRIMARY KEY)`,
		`CREATE TABLE t2 (id int PRIMARY KEY)`,
		`CREATE PUBLICATION p FOR TABLE t1, t2`,
		`CREATE ROLE `+role+` LOGIN PASSWORD 'pw'`,
		`GRANT SELECT ON t1 TO `+role,
	)
	t.Cleanup(func() {
		execSQL(t, url, `DROP OWNED BY `+role+` CASCADE`)
		execSQL(t, c.URL("postgres"), `DROP ROLE `+role)
	})
	userURL := c.UserURL(db, role, "pw")
	r := mustVerify(t, VerifyConfig{DatabaseURL: userURL, Publication: "p"})
	priv := check(t, r, "replication_privilege", "")
	wantStatus(t, priv, StatusFail)
	if priv.Fix != "ALTER ROLE "+role+" WITH REPLICATION;  -- on Amazon RDS: GRANT rds_replication TO "+role+";" {
		t.Fatalf("fix: %q", priv.Fix)
	}
	wantStatus(t, check(t, r, "select_privilege", "public.t1"), StatusOK)
	sel := check(t, r, "select_privilege", "public.t2")
	wantStatus(t, sel, StatusFail)
	// Every check ran or said why not; nothing crashed for lack of superuser.
	for _, ch := range r.Checks {
		if ch.Status == "" || ch.Found == "" {
			t.Fatalf("incomplete check %+v", ch)
		}
	}
	// Apply the fixes as printed; the same checks then pass.
	execSQL(t, url, strings.SplitN(priv.Fix, "--", 2)[0], sel.Fix)
	r = mustVerify(t, VerifyConfig{DatabaseURL: userURL, Publication: "p"})
	wantStatus(t, check(t, r, "replication_privilege", ""), StatusOK)
	wantStatus(t, check(t, r, "select_privilege", "public.t2"), StatusOK)
}

func dbName(t *testing.T, url string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

func TestVerifyPublication(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url, `CREATE TABLE t (id int PRIMARY KEY)`)

	r := mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "Missing Pub"})
	pub := check(t, r, "publication", "")
	wantStatus(t, pub, StatusFail)
	if !pub.Blocking || !strings.Contains(pub.Fix, `CREATE PUBLICATION "Missing Pub"`) {
		t.Fatalf("missing publication: %+v", pub)
	}
	noCheck(t, r, "replica_identity", "")

	execSQL(t, url, `CREATE PUBLICATION "Missing Pub" FOR TABLE t WITH (publish = 'insert, update, delete')`)
	r = mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "Missing Pub"})
	pub = check(t, r, "publication", "")
	wantStatus(t, pub, StatusFail)
	if !strings.Contains(pub.Found, "truncate") {
		t.Fatalf("publication without truncate: %+v", pub)
	}
	execSQL(t, url, pub.Fix)
	r = mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "Missing Pub"})
	wantStatus(t, check(t, r, "publication", ""), StatusOK)

	execSQL(t, url, `CREATE PUBLICATION empty`)
	r = mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "empty"})
	wantStatus(t, check(t, r, "published_tables", ""), StatusWarn)
}

func TestVerifyReplicaIdentity(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url,
		`CREATE TABLE pk (id int PRIMARY KEY)`,
		`CREATE TABLE full_ri (a int)`,
		`ALTER TABLE full_ri REPLICA IDENTITY FULL`,
		`CREATE TABLE good_idx (a int NOT NULL)`,
		`CREATE UNIQUE INDEX good_idx_a ON good_idx (a)`,
		`ALTER TABLE good_idx REPLICA IDENTITY USING INDEX good_idx_a`,
		`CREATE TABLE nopk (a int)`,
		`CREATE TABLE nothing (id int PRIMARY KEY)`,
		`ALTER TABLE nothing REPLICA IDENTITY NOTHING`,
		`CREATE TABLE dropped_idx (a int NOT NULL)`,
		`CREATE UNIQUE INDEX dropped_idx_a ON dropped_idx (a)`,
		`ALTER TABLE dropped_idx REPLICA IDENTITY USING INDEX dropped_idx_a`,
		`DROP INDEX dropped_idx_a`,
		`CREATE PUBLICATION p FOR TABLE pk, full_ri, good_idx, nopk, nothing, dropped_idx`,
	)
	r := mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "p"})
	for _, ok := range []string{"public.pk", "public.full_ri", "public.good_idx"} {
		wantStatus(t, check(t, r, "replica_identity", ok), StatusOK)
	}
	for _, bad := range []string{"public.nopk", "public.nothing", "public.dropped_idx"} {
		c := check(t, r, "replica_identity", bad)
		wantStatus(t, c, StatusFail)
		if c.Blocking {
			t.Fatalf("replica identity must not block start-up (DESIGN §4.12): %+v", c)
		}
		if !strings.HasPrefix(c.Found, bad) {
			t.Fatalf("failure does not name the table: %q", c.Found)
		}
	}
	if !r.Failed() {
		t.Fatal("report with failing tables says it passed")
	}
	// Paste every fix as printed; the next verify passes.
	for _, bad := range []string{"public.nopk", "public.nothing", "public.dropped_idx"} {
		execSQL(t, url, check(t, r, "replica_identity", bad).Fix)
	}
	r = mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "p"})
	if r.Failed() {
		t.Fatalf("still failing after the fixes:\n%s", dump(r))
	}
}

// TestVerifyHostileIdentifiers pastes the printed fix into psql, as an
// operator would, for names with spaces, quotes, dots, '?' and mixed case.
func TestVerifyHostileIdentifiers(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url,
		`CREATE SCHEMA "we""ird sch.ema?"`,
		`CREATE TABLE "we""ird sch.ema?"."Mixed ""Case"" tbl.?" (v text)`,
		`CREATE TABLE "we""ird sch.ema?"."select" (v text)`,
		`CREATE PUBLICATION "My ""Pub"" v1.0?" FOR TABLE "we""ird sch.ema?"."Mixed ""Case"" tbl.?", "we""ird sch.ema?"."select"`,
	)
	cfg := VerifyConfig{DatabaseURL: url, Publication: `My "Pub" v1.0?`}
	r := mustVerify(t, cfg)
	psql := filepath.Join(pgtest.Shared(t).BinDir(), "psql")
	for _, name := range []string{`we"ird sch.ema?.Mixed "Case" tbl.?`, `we"ird sch.ema?.select`} {
		c := check(t, r, "replica_identity", name)
		wantStatus(t, c, StatusFail)
		out, err := exec.Command(psql, "-X", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", c.Fix).CombinedOutput()
		if err != nil {
			t.Fatalf("fix %q does not paste into psql: %v\n%s", c.Fix, err, out)
		}
	}
	r = mustVerify(t, cfg)
	if r.Failed() {
		t.Fatalf("still failing after pasting the fixes:\n%s", dump(r))
	}
}

func TestVerifyJournalSchemaPublished(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url,
		`CREATE SCHEMA walcast`,
		`CREATE TABLE walcast.entries (seq bigint PRIMARY KEY)`,
		`CREATE TABLE app (id int PRIMARY KEY)`,
		`CREATE PUBLICATION p FOR TABLE app, walcast.entries`,
		`CREATE PUBLICATION everything FOR ALL TABLES`,
	)
	r := mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "p"})
	c := check(t, r, "journal_not_published", "")
	wantStatus(t, c, StatusFail)
	if !c.Blocking {
		t.Fatalf("publishing the journal must block run: %+v", c)
	}
	execSQL(t, url, c.Fix)
	r = mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "p"})
	wantStatus(t, check(t, r, "journal_not_published", ""), StatusOK)

	r = mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "everything"})
	if c := check(t, r, "journal_not_published", ""); c.Status != StatusFail || !c.Blocking {
		t.Fatalf("FOR ALL TABLES with the journal in the source database: %+v", c)
	}
	// The same schema name with the journal in another database is data.
	r = mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "everything", JournalURL: pgtest.NewDatabase(t)})
	wantStatus(t, check(t, r, "journal_not_published", ""), StatusOK)
	r = mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "everything", JournalURL: url})
	wantStatus(t, check(t, r, "journal_not_published", ""), StatusFail)
}

func TestVerifyPartitionsAndTenant(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url,
		`CREATE TABLE events (id int, tenant_id text, PRIMARY KEY (id)) PARTITION BY RANGE (id)`,
		`CREATE TABLE events_1 PARTITION OF events FOR VALUES FROM (0) TO (100)`,
		`CREATE TABLE docs (id int PRIMARY KEY, tenant_id text)`,
		`CREATE TABLE docs_full (id int PRIMARY KEY, tenant_id text)`,
		`ALTER TABLE docs_full REPLICA IDENTITY FULL`,
		`CREATE TABLE plain (id int PRIMARY KEY)`,
		`CREATE PUBLICATION p FOR TABLE events, docs, docs_full, plain`,
	)
	cfg := VerifyConfig{DatabaseURL: url, Publication: "p", TenantColumn: "tenant_id"}
	r := mustVerify(t, cfg)
	part := check(t, r, "partition_root", "public.events")
	wantStatus(t, part, StatusWarn)
	wantStatus(t, check(t, r, "tenant_column", "public.docs"), StatusWarn)
	wantStatus(t, check(t, r, "tenant_column", "public.docs_full"), StatusOK)
	wantStatus(t, check(t, r, "tenant_column", "public.events_1"), StatusWarn)
	noCheck(t, r, "tenant_column", "public.plain")
	wantStatus(t, check(t, r, "replica_identity", "public.events_1"), StatusOK)
	if r.Failed() {
		t.Fatalf("warnings only, but the report failed:\n%s", dump(r))
	}
	execSQL(t, url, part.Fix)
	r = mustVerify(t, cfg)
	noCheck(t, r, "partition_root", "")
}

// TestVerifyTenantColumnList: a publication column list that leaves out the
// tenant column fails and blocks walcast run (no row's tenant could be
// known), with a fix that pastes; a row filter is reported.
func TestVerifyTenantColumnList(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url,
		`CREATE TABLE docs (id int PRIMARY KEY, "Tenant id" text, body text)`,
		`CREATE TABLE notes (id int PRIMARY KEY, "Tenant id" text, body text)`,
		`ALTER TABLE notes REPLICA IDENTITY FULL`,
		`CREATE PUBLICATION p FOR TABLE docs (id, body), notes WHERE (id > 0)`,
	)
	cfg := VerifyConfig{DatabaseURL: url, Publication: "p", TenantColumn: "Tenant id"}
	r := mustVerify(t, cfg)
	c := check(t, r, "tenant_column", "public.docs")
	wantStatus(t, c, StatusFail)
	if !c.Blocking || !strings.Contains(c.Found, "column list") || !strings.Contains(c.Fix, `"Tenant id"`) {
		t.Fatalf("column list check: %+v", c)
	}
	wantStatus(t, check(t, r, "tenant_row_filter", "public.notes"), StatusOK)
	wantStatus(t, check(t, r, "tenant_column", "public.notes"), StatusOK)
	execSQL(t, url, c.Fix)
	r = mustVerify(t, cfg)
	if c := check(t, r, "tenant_column", "public.docs"); c.Status == StatusFail {
		t.Fatalf("still failing after pasting the fix: %+v", c)
	}
}

func TestVerifySlot(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url,
		`CREATE TABLE t (id int PRIMARY KEY)`,
		`CREATE PUBLICATION p FOR TABLE t`,
		`SELECT pg_create_logical_replication_slot('good', 'pgoutput')`,
		`SELECT pg_create_logical_replication_slot('wrong_plugin', 'test_decoding')`,
	)
	r := mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "p", Slot: "good"})
	s := check(t, r, "slot", "")
	wantStatus(t, s, StatusOK)
	if !strings.Contains(s.Found, "inactive") || !strings.Contains(s.Found, "behind") {
		t.Fatalf("slot found: %q", s.Found)
	}
	r = mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "p", Slot: "wrong_plugin"})
	s = check(t, r, "slot", "")
	wantStatus(t, s, StatusFail)
	if !strings.Contains(s.Found, "test_decoding") || !strings.Contains(s.Fix, "pg_drop_replication_slot('wrong_plugin')") {
		t.Fatalf("wrong plugin: %+v", s)
	}
	// A lag above the threshold warns.
	execSQL(t, url, `INSERT INTO t SELECT generate_series(1, 1000)`)
	r = mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "p", Slot: "good", LagWarnBytes: 1})
	wantStatus(t, check(t, r, "slot", ""), StatusWarn)
}

// TestVerifyLostSlot produces a lost slot cheaply: a tiny
// max_slot_wal_keep_size, a few WAL segment switches and a checkpoint.
func TestVerifyLostSlot(t *testing.T) {
	c := pgtest.Start(t, pgtest.Options{Settings: map[string]string{
		"max_slot_wal_keep_size": "1MB", "min_wal_size": "32MB", "max_wal_size": "64MB", "wal_keep_size": "0"}})
	url := c.NewDatabase(t)
	execSQL(t, url,
		`CREATE TABLE t (id int PRIMARY KEY)`,
		`CREATE PUBLICATION p FOR TABLE t`,
		`SELECT pg_create_logical_replication_slot('walcast', 'pgoutput')`,
	)
	r := mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "p"})
	wantStatus(t, check(t, r, "slot", ""), StatusOK)
	wantStatus(t, check(t, r, "max_slot_wal_keep_size", ""), StatusOK)
	for i := 0; i < 5; i++ {
		execSQL(t, url, `INSERT INTO t VALUES (`+string(rune('1'+i))+`)`, `SELECT pg_switch_wal()`)
	}
	execSQL(t, url, `CHECKPOINT`)
	r = mustVerify(t, VerifyConfig{DatabaseURL: url, Publication: "p"})
	s := check(t, r, "slot", "")
	wantStatus(t, s, StatusFail)
	if !s.Blocking || !strings.Contains(s.Found, "lost") || !strings.Contains(s.Fix, "--recreate-lost-slot") {
		t.Fatalf("lost slot: %+v\n%s", s, dump(r))
	}
}

func TestVerifyConnectErrors(t *testing.T) {
	c := pgtest.Shared(t)
	execSQL(t, c.URL("postgres"), `DO $$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'verify_pw') THEN
			CREATE ROLE verify_pw LOGIN PASSWORD 'right';
		END IF; END $$`)
	cases := []struct {
		name string
		url  string
		code Code
	}{
		{"bad password", c.UserURL("postgres", "verify_pw", "wrong"), CodeAuth},
		{"missing database", c.URL("no_such_db"), CodeDatabaseMissing},
		{"refused", "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5", CodeUnreachable},
		{"malformed", "postgres://[::1", CodeConfig},
		{"unreadable sslrootcert", c.URL("postgres") + "&sslrootcert=/nonexistent/ca.pem", CodeTLS},
		{"tls refused", strings.Replace(c.URL("postgres"), "sslmode=disable", "sslmode=require", 1), CodeTLS},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Verify(context.Background(), VerifyConfig{DatabaseURL: tc.url, Publication: "p"})
			if err == nil {
				t.Fatal("verify connected")
			}
			if got := CodeOf(err); got != tc.code {
				t.Fatalf("code %s, want %s: %v", got, tc.code, err)
			}
			var e *Error
			if !asError(err, &e) || e.Fix == "" {
				t.Fatalf("no fix in %v", err)
			}
			if strings.Contains(err.Error(), "wrong") && tc.name == "bad password" {
				t.Fatalf("password leaked into the error: %v", err)
			}
		})
	}
}

func asError(err error, target **Error) bool { return errors.As(err, target) }

func TestIsLocalHost(t *testing.T) {
	for host, want := range map[string]bool{
		"": true, "/var/run/postgresql": true, "localhost": true, "127.0.0.1": true, "::1": true,
		"db.internal": false, "10.0.0.5": false,
	} {
		if got := isLocalHost(host); got != want {
			t.Errorf("isLocalHost(%q) = %v, want %v", host, got, want)
		}
	}
}

// TestDeploySetupSQL runs deploy/postgres/setup.sql through psql as the
// README says and checks that verify then passes for the role it creates.
func TestDeploySetupSQL(t *testing.T) {
	url := pgtest.NewDatabase(t)
	c := pgtest.Shared(t)
	db := dbName(t, url)
	role := "setup_" + strings.ReplaceAll(db, "_", "")[:16]
	execSQL(t, url, `CREATE TABLE orders (id int PRIMARY KEY)`, `CREATE TABLE "Odd Name" (id int PRIMARY KEY)`)
	t.Cleanup(func() {
		execSQL(t, url, `DROP OWNED BY `+role+` CASCADE`)
		execSQL(t, c.URL("postgres"), `DROP ROLE `+role)
	})
	psql := filepath.Join(c.BinDir(), "psql")
	for i := 0; i < 2; i++ { // idempotent: a second run changes nothing and does not fail
		out, err := exec.Command(psql, "-X", "-q", "-d", url, "-v", "role="+role, "-v", "password=pw",
			"-v", "publication=walcast", "-v", `tables=public.orders, public."Odd Name"`,
			"-f", "../deploy/postgres/setup.sql").CombinedOutput()
		if err != nil {
			t.Fatalf("setup.sql run %d: %v\n%s", i+1, err, out)
		}
	}
	r := mustVerify(t, VerifyConfig{DatabaseURL: c.UserURL(db, role, "pw"), Publication: "walcast"})
	if r.Failed() {
		t.Fatalf("verify fails after setup.sql:\n%s", dump(r))
	}
	wantStatus(t, check(t, r, "replication_privilege", ""), StatusOK)
	wantStatus(t, check(t, r, "select_privilege", `public.Odd Name`), StatusOK)
	wantStatus(t, check(t, r, "journal_schema", ""), StatusOK)
	// The least-privileged role can open (create and migrate) its journal in
	// the schema setup.sql gave it, without CREATE on the database.
	j, err := journal.Open(context.Background(), journal.Config{URL: c.UserURL(db, role, "pw")})
	if err != nil {
		t.Fatalf("journal.Open as the setup.sql role: %v", err)
	}
	j.Close()
}
