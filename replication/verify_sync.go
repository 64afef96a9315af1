package replication

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// syncRole is what the catalogs say about the sync nodes' role.
type syncRole struct {
	oid                      uint32
	quoted, literal          string // quote_ident, quote_literal of its name
	database, quotedDatabase string // the current database
	login, super, repl       bool
	createRole, createDB     bool
	bypassRLS                bool
	validUntil               *time.Time
	connLimit                int
	connect                  bool // CONNECT on this database
	readOnly                 bool // default_transaction_read_only = on for it here
}

// checkSyncRole checks the role `walcast sync --database-url` connects as
// to read snapshots (deploy/postgres/setup.sql -v sync_role=…): it must log
// in and SELECT every published table (with the tenant column), and must
// not be able to write to them, replicate or manage roles. It reads the
// catalogs only, so it needs no password for the role; a role the verify
// session cannot see into is reported, never guessed.
func (v *verifier) checkSyncRole(ctx context.Context) {
	name := v.cfg.SyncRole
	var r syncRole
	var exists bool
	err := v.conn.QueryRow(ctx, `SELECT quote_ident($1), quote_literal($1), current_database(), quote_ident(current_database()),
			EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, name).
		Scan(&r.quoted, &r.literal, &r.database, &r.quotedDatabase, &exists)
	if err != nil {
		v.cannot("sync_role", err)
		return
	}
	tables := make([]string, len(v.tables))
	for i, t := range v.tables {
		tables[i] = t.quoted
	}
	grant := "GRANT SELECT ON " + strings.Join(tables, ", ") + " TO " + r.quoted + ";"
	if len(tables) == 0 {
		grant = "GRANT SELECT ON schema.table TO " + r.quoted + ";"
	}
	if !exists {
		v.report.add(Check{ID: "sync_role", Status: StatusFail,
			Found: fmt.Sprintf("role %q (--sync-role) does not exist; sync nodes serving snapshots cannot connect", name),
			Fix: fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD 'change-me'; ALTER ROLE %s SET default_transaction_read_only = on; %s  -- or run deploy/postgres/setup.sql with -v sync_role=%s -v sync_password=…",
				r.quoted, r.quoted, grant, name)})
		return
	}
	err = v.conn.QueryRow(ctx, `SELECT r.oid, r.rolcanlogin, r.rolsuper, r.rolreplication, r.rolcreaterole, r.rolcreatedb, r.rolbypassrls,
			r.rolvaliduntil, r.rolconnlimit, has_database_privilege(r.oid, current_database(), 'CONNECT'),
			EXISTS (SELECT 1 FROM pg_db_role_setting s, unnest(s.setconfig) c
			        WHERE s.setrole = r.oid AND s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))
			          AND lower(c) IN ('default_transaction_read_only=on', 'default_transaction_read_only=true', 'default_transaction_read_only=1'))
		FROM pg_roles r WHERE r.rolname = $1`, name).
		Scan(&r.oid, &r.login, &r.super, &r.repl, &r.createRole, &r.createDB, &r.bypassRLS, &r.validUntil, &r.connLimit, &r.connect, &r.readOnly)
	if err != nil {
		v.cannot("sync_role", err)
		return
	}

	// It can log in.
	var why, fixes []string
	if !r.login {
		why = append(why, "it has NOLOGIN")
		fixes = append(fixes, fmt.Sprintf("ALTER ROLE %s LOGIN;", r.quoted))
	}
	if r.validUntil != nil && r.validUntil.Before(time.Now()) {
		why = append(why, "its password expired at "+r.validUntil.UTC().Format(time.RFC3339))
		fixes = append(fixes, fmt.Sprintf("ALTER ROLE %s VALID UNTIL 'infinity';", r.quoted))
	}
	if r.connLimit == 0 {
		why = append(why, "its CONNECTION LIMIT is 0")
		fixes = append(fixes, fmt.Sprintf("ALTER ROLE %s CONNECTION LIMIT -1;", r.quoted))
	}
	if !r.connect {
		why = append(why, fmt.Sprintf("it lacks CONNECT on database %q", r.database))
		fixes = append(fixes, fmt.Sprintf("GRANT CONNECT ON DATABASE %s TO %s;", r.quotedDatabase, r.quoted))
	}
	if len(why) > 0 {
		v.report.add(Check{ID: "sync_role", Status: StatusFail,
			Found: fmt.Sprintf("role %q cannot log in to database %q: %s", name, r.database, strings.Join(why, "; ")),
			Fix:   strings.Join(fixes, " ")})
	} else {
		v.report.add(Check{ID: "sync_role", Status: StatusOK,
			Found: fmt.Sprintf("role %q can log in to database %q (its password is not checked here)", name, r.database)})
	}

	// Nothing beyond reading.
	var powers []string
	for _, p := range []struct {
		on   bool
		name string
	}{{r.super, "SUPERUSER"}, {r.repl, "REPLICATION"}, {r.createRole, "CREATEROLE"}, {r.createDB, "CREATEDB"}, {r.bypassRLS, "BYPASSRLS"}} {
		if p.on {
			powers = append(powers, p.name)
		}
	}
	if len(powers) > 0 {
		v.report.add(Check{ID: "sync_role_attributes", Status: StatusFail,
			Found: fmt.Sprintf("role %q has %s; the sync nodes' role must only read the published tables", name, strings.Join(powers, ", ")),
			Fix:   fmt.Sprintf("ALTER ROLE %s NOSUPERUSER NOREPLICATION NOCREATEROLE NOCREATEDB NOBYPASSRLS;", r.quoted)})
	} else {
		v.report.add(Check{ID: "sync_role_attributes", Status: StatusOK,
			Found: fmt.Sprintf("role %q is not a superuser and has no REPLICATION, CREATEROLE, CREATEDB or BYPASSRLS", name)})
	}
	if r.readOnly {
		v.report.add(Check{ID: "sync_read_only", Status: StatusOK,
			Found: fmt.Sprintf("role %q has default_transaction_read_only = on", name)})
	} else {
		v.report.add(Check{ID: "sync_read_only", Status: StatusWarn,
			Found: fmt.Sprintf("role %q's sessions are not read-only by default (walcast sync asks for read-only sessions itself; any other client using the role does not)", name),
			Fix:   fmt.Sprintf("ALTER ROLE %s SET default_transaction_read_only = on;", r.quoted)})
	}

	for _, t := range v.tables {
		v.checkSyncTable(ctx, t, name, r)
	}
}

// checkSyncTable checks that the sync role can read published table t (its
// schema, and every published column, the tenant column named) and cannot
// write to it.
func (v *verifier) checkSyncTable(ctx context.Context, t pubTable, name string, r syncRole) {
	var usage, sel, allCols, hasTenant, tenantSel bool
	var quotedSchema string
	err := v.conn.QueryRow(ctx, `SELECT quote_ident($3::text), has_schema_privilege($1::oid, $3::text, 'USAGE'), has_table_privilege($1::oid, $2::oid, 'SELECT'),
			NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = $2::oid AND a.attnum > 0 AND NOT a.attisdropped
			            AND NOT has_column_privilege($1::oid, $2::oid, a.attnum, 'SELECT')),
			EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = $2::oid AND a.attname = $4::text AND a.attnum > 0 AND NOT a.attisdropped),
			COALESCE((SELECT has_column_privilege($1::oid, $2::oid, a.attnum, 'SELECT') FROM pg_attribute a
			          WHERE a.attrelid = $2::oid AND a.attname = $4::text AND a.attnum > 0 AND NOT a.attisdropped), false)`,
		r.oid, t.oid, t.schema, v.cfg.TenantColumn).Scan(&quotedSchema, &usage, &sel, &allCols, &hasTenant, &tenantSel)
	if err != nil {
		v.cannot("sync_select", err)
		return
	}
	switch {
	case !usage:
		v.report.add(Check{ID: "sync_select", Subject: t.display(), Status: StatusFail,
			Found: fmt.Sprintf("role %q lacks USAGE on schema %q, so it cannot read %s", name, t.schema, t.display()),
			Fix:   fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s; GRANT SELECT ON %s TO %s;", quotedSchema, r.quoted, t.quoted, r.quoted)})
	case !sel && !allCols:
		found := fmt.Sprintf("role %q cannot SELECT %s; its snapshots are refused", name, t.display())
		if hasTenant && !tenantSel {
			found = fmt.Sprintf("role %q cannot SELECT %s (nor its tenant column %q); its snapshots are refused", name, t.display(), v.cfg.TenantColumn)
		}
		v.report.add(Check{ID: "sync_select", Subject: t.display(), Status: StatusFail, Found: found,
			Fix: fmt.Sprintf("GRANT SELECT ON %s TO %s;", t.quoted, r.quoted)})
	default:
		found := fmt.Sprintf("role %q can SELECT %s", name, t.display())
		if hasTenant {
			found += fmt.Sprintf(" and its tenant column %q", v.cfg.TenantColumn)
		}
		v.report.add(Check{ID: "sync_select", Subject: t.display(), Status: StatusOK, Found: found})
	}

	var ins, upd, del, trunc bool
	err = v.conn.QueryRow(ctx, `SELECT has_any_column_privilege($1::oid, $2::oid, 'INSERT'), has_any_column_privilege($1::oid, $2::oid, 'UPDATE'),
			has_table_privilege($1::oid, $2::oid, 'DELETE'), has_table_privilege($1::oid, $2::oid, 'TRUNCATE')`, r.oid, t.oid).
		Scan(&ins, &upd, &del, &trunc)
	if err != nil {
		v.cannot("sync_no_write", err)
		return
	}
	var privs []string
	for _, p := range []struct {
		on   bool
		name string
	}{{ins, "INSERT"}, {upd, "UPDATE"}, {del, "DELETE"}, {trunc, "TRUNCATE"}} {
		if p.on {
			privs = append(privs, p.name)
		}
	}
	if len(privs) == 0 {
		v.report.add(Check{ID: "sync_no_write", Subject: t.display(), Status: StatusOK,
			Found: fmt.Sprintf("role %q cannot write to %s", name, t.display())})
		return
	}
	var owner, public bool
	_ = v.conn.QueryRow(ctx, `SELECT c.relowner = $1::oid, has_table_privilege('public', $2::oid, $3::text) FROM pg_class c WHERE c.oid = $2::oid`,
		r.oid, t.oid, strings.Join(privs, ", ")).Scan(&owner, &public)
	list := strings.Join(privs, ", ")
	fix := fmt.Sprintf("REVOKE %s ON %s FROM %s;", list, t.quoted, r.quoted)
	switch {
	case r.super:
		fix = fmt.Sprintf("ALTER ROLE %s NOSUPERUSER;", r.quoted)
	case owner:
		fix = fmt.Sprintf("ALTER TABLE %s OWNER TO another_role;  -- the owner can always write; the sync role must not own the table", t.quoted)
	case public:
		fix += fmt.Sprintf(" REVOKE %s ON %s FROM PUBLIC;", list, t.quoted)
	default:
		fix += fmt.Sprintf("  -- if it still can, it holds them through a role it is a member of: REVOKE that role FROM %s (psql: \\du %s)", r.quoted, name)
	}
	v.report.add(Check{ID: "sync_no_write", Subject: t.display(), Status: StatusFail,
		Found: fmt.Sprintf("role %q can %s %s; the sync nodes' role must only read it", name, list, t.display()),
		Fix:   fix})
}
