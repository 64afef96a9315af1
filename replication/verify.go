package replication

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Status is the outcome of one preflight check.
type Status string

// Check outcomes, ordered from best to worst.
const (
	StatusOK   Status = "ok"
	StatusWarn Status = "warn"
	StatusFail Status = "fail"
)

// Check is one line of a preflight report. Its JSON field names are part of
// `walcast verify --json` and are stable.
type Check struct {
	ID      string `json:"id"`                // stable check name, e.g. "wal_level"
	Subject string `json:"subject,omitempty"` // what it is about when there are many, e.g. a table
	Status  Status `json:"status"`
	Found   string `json:"found"`         // what was found, in words
	Fix     string `json:"fix,omitempty"` // for warn and fail: SQL or a setting, ready to paste
	// Blocking marks a failure that makes replication impossible; `run`
	// refuses to start on it (DESIGN §4.12).
	Blocking bool `json:"blocking,omitempty"`
}

// Report is the result of Verify.
type Report struct {
	Target        string  `json:"target"` // user@host:port/database, no secrets
	Publication   string  `json:"publication"`
	Slot          string  `json:"slot"`
	ServerVersion string  `json:"serverVersion"`
	Checks        []Check `json:"checks"`
	Summary       Summary `json:"summary"`
}

// Summary counts checks by status.
type Summary struct {
	OK   int `json:"ok"`
	Warn int `json:"warn"`
	Fail int `json:"fail"`
}

// Failed reports whether any check failed.
func (r *Report) Failed() bool { return r.Summary.Fail > 0 }

// Blocking returns the failed checks that make replication impossible.
func (r *Report) Blocking() []Check {
	var out []Check
	for _, c := range r.Checks {
		if c.Status == StatusFail && c.Blocking {
			out = append(out, c)
		}
	}
	return out
}

func (r *Report) add(c Check) {
	r.Checks = append(r.Checks, c)
	switch c.Status {
	case StatusOK:
		r.Summary.OK++
	case StatusWarn:
		r.Summary.Warn++
	case StatusFail:
		r.Summary.Fail++
	}
}

// VerifyConfig names what to check.
type VerifyConfig struct {
	DatabaseURL   string // libpq URL or DSN of the source database
	Publication   string // required
	Slot          string // default "walcast"
	JournalSchema string // default "walcast"
	// JournalURL is the journal's database when it is not the source's
	// (walcast run --journal-url); empty means the source database, run's
	// default. Only a journal in the source database can be published.
	JournalURL   string
	TenantColumn string // optional
	// LagWarnBytes is the slot lag above which the slot check warns;
	// default 1 GiB.
	LagWarnBytes int64
	// SyncRole, when set, is the role sync nodes read snapshots as
	// (`walcast sync --database-url`, setup.sql -v sync_role=…); verify
	// checks that it can log in and read every published table, and
	// nothing more (verify_sync.go).
	SyncRole string
}

func (c *VerifyConfig) setDefaults() {
	if c.Slot == "" {
		c.Slot = "walcast"
	}
	if c.JournalSchema == "" {
		c.JournalSchema = "walcast"
	}
	if c.LagWarnBytes == 0 {
		c.LagWarnBytes = 1 << 30
	}
}

// Verify connects to the source database and runs the preflight checks of
// DESIGN §7. A check that cannot run (for example for lack of a privilege) is
// reported as a warning saying so; it does not stop the others. The error is
// non-nil only when Verify could not connect or the configuration is unusable;
// it is then an *Error with a code and a fix.
func Verify(ctx context.Context, cfg VerifyConfig) (*Report, error) {
	cfg.setDefaults()
	if cfg.Publication == "" {
		return nil, &Error{Code: CodeConfig, Op: "verify", Err: errors.New("no publication given"),
			Fix: "pass --publication NAME (or set WALCAST_PUBLICATION)"}
	}
	pcfg, err := ParseConnConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, ClassifyConnectError("source database", err)
	}
	conn, err := pgx.ConnectConfig(ctx, pcfg)
	if err != nil {
		return nil, ClassifyConnectError("source database", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	v := &verifier{cfg: cfg, conn: conn, pcfg: pcfg.Config.Copy(),
		report: &Report{Target: describeTarget(&pcfg.Config), Publication: cfg.Publication, Slot: cfg.Slot}}
	if err := v.run(ctx); err != nil {
		return nil, err
	}
	return v.report, nil
}

// ParseConnConfig parses a libpq URL or DSN, applying walcast's defaults: a
// 10 s connect timeout when none is given, and the application name.
func ParseConnConfig(dsn string) (*pgx.ConnConfig, error) {
	if strings.TrimSpace(dsn) == "" {
		return nil, &Error{Code: CodeConfig, Op: "connect to the source database", Err: errors.New("no database URL given"),
			Fix: "pass --database-url postgres://user:password@host:5432/dbname (or set WALCAST_DATABASE_URL)"}
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "walcast"
	}
	return cfg, nil
}

type verifier struct {
	cfg    VerifyConfig
	conn   *pgx.Conn
	pcfg   *pgconn.Config
	report *Report

	q         quoted // names quoted by the server for pasteable SQL
	serverNum int    // server_version_num
	role      string
	superuser bool
	pub       *publication
	tables    []pubTable
}

// quoted holds identifiers and literals quoted by the server's own
// quote_ident and quote_literal, so every SQL fix pastes as printed.
type quoted struct {
	pub, role, schema, slot, slotLit string
}

type publication struct {
	allTables                  bool
	insert, update, del, trunc bool
	viaRoot                    bool
}

// pubTable is a published table. Quoted is "schema"."table" quoted by the
// server's quote_ident, so SQL built from it pastes.
type pubTable struct {
	oid    uint32
	schema string
	name   string
	quoted string
	kind   byte // pg_class.relkind
}

func (t pubTable) display() string { return t.schema + "." + t.name }

func (v *verifier) run(ctx context.Context) error {
	var version string
	err := v.conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('server_version_num')::int,
		current_user, r.rolsuper FROM pg_roles r WHERE r.rolname = current_user`).Scan(&version, &v.serverNum, &v.role, &v.superuser)
	if err != nil {
		return &Error{Code: CodeInternal, Op: "verify: read server version", Err: err}
	}
	v.report.ServerVersion = version
	err = v.conn.QueryRow(ctx, `SELECT quote_ident($1), quote_ident(current_user), quote_ident($2), quote_ident($3), quote_literal($3)`,
		v.cfg.Publication, v.cfg.JournalSchema, v.cfg.Slot).Scan(&v.q.pub, &v.q.role, &v.q.schema, &v.q.slot, &v.q.slotLit)
	if err != nil {
		return &Error{Code: CodeInternal, Op: "verify: quote names", Err: err}
	}

	v.checkWalLevel(ctx)
	v.checkSlotCapacity(ctx)
	v.checkWalSenders(ctx)
	v.checkReplicationRole(ctx)
	if v.checkPublication(ctx) {
		v.loadTables(ctx)
		v.checkSelect(ctx)
		v.checkReplicaIdentity(ctx)
		v.checkJournalNotPublished(ctx)
		v.checkPartitions(ctx)
		if v.cfg.TenantColumn != "" {
			v.checkTenantColumn(ctx)
		}
	}
	if v.cfg.SyncRole != "" {
		v.checkSyncRole(ctx)
	}
	v.checkJournalSchema(ctx)
	v.checkSlot(ctx)
	v.checkWalKeepSize(ctx)
	v.checkTLS(ctx)
	return nil
}

// cannot reports a check that could not run, with the reason.
func (v *verifier) cannot(id string, err error) {
	fix := "run verify as a role that can read the catalog views involved"
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		fix = "grant the role pg_read_all_settings and pg_read_all_stats, or run verify as a superuser, to check this"
	}
	v.report.add(Check{ID: id, Status: StatusWarn, Found: "could not check: " + err.Error(), Fix: fix})
}

func (v *verifier) checkWalLevel(ctx context.Context) {
	var level string
	if err := v.conn.QueryRow(ctx, `SELECT current_setting('wal_level')`).Scan(&level); err != nil {
		v.cannot("wal_level", err)
		return
	}
	if level == "logical" {
		v.report.add(Check{ID: "wal_level", Status: StatusOK, Found: "wal_level = logical"})
		return
	}
	v.report.add(Check{ID: "wal_level", Status: StatusFail, Blocking: true,
		Found: fmt.Sprintf("wal_level = %s; logical decoding needs logical", level),
		Fix:   "ALTER SYSTEM SET wal_level = logical;  -- then restart PostgreSQL (a reload is not enough). On Amazon RDS/Aurora set rds.logical_replication = 1 in the parameter group; on Cloud SQL set the flag cloudsql.logical_decoding = on; on Azure set wal_level = logical in server parameters."})
}

func (v *verifier) checkSlotCapacity(ctx context.Context) {
	var max, used int
	var ours bool
	err := v.conn.QueryRow(ctx, `SELECT current_setting('max_replication_slots')::int,
		(SELECT count(*) FROM pg_replication_slots)::int,
		EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, v.cfg.Slot).Scan(&max, &used, &ours)
	if err != nil {
		v.cannot("max_replication_slots", err)
		return
	}
	found := fmt.Sprintf("%d of max_replication_slots = %d in use", used, max)
	switch {
	case ours:
		v.report.add(Check{ID: "max_replication_slots", Status: StatusOK, Found: found + fmt.Sprintf("; slot %q already exists", v.cfg.Slot)})
	case used >= max:
		v.report.add(Check{ID: "max_replication_slots", Status: StatusFail, Blocking: true,
			Found: found + "; no free slot for walcast",
			Fix:   fmt.Sprintf("ALTER SYSTEM SET max_replication_slots = %d;  -- then restart PostgreSQL; or drop an unused slot: SELECT pg_drop_replication_slot('name');", max+2)})
	default:
		v.report.add(Check{ID: "max_replication_slots", Status: StatusOK, Found: found})
	}
}

func (v *verifier) checkWalSenders(ctx context.Context) {
	var max, used int
	var oursActive bool
	err := v.conn.QueryRow(ctx, `SELECT current_setting('max_wal_senders')::int,
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')::int,
		EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active)`, v.cfg.Slot).Scan(&max, &used, &oursActive)
	if err != nil {
		v.cannot("max_wal_senders", err)
		return
	}
	found := fmt.Sprintf("%d of max_wal_senders = %d in use", used, max)
	if used >= max && !oursActive {
		v.report.add(Check{ID: "max_wal_senders", Status: StatusFail, Blocking: true,
			Found: found + "; walcast's replication connection would be refused",
			Fix:   fmt.Sprintf("ALTER SYSTEM SET max_wal_senders = %d;  -- then restart PostgreSQL", max+2)})
		return
	}
	v.report.add(Check{ID: "max_wal_senders", Status: StatusOK, Found: found})
}

func (v *verifier) checkReplicationRole(ctx context.Context) {
	var repl, rds bool
	err := v.conn.QueryRow(ctx, `SELECT r.rolreplication,
		COALESCE((SELECT pg_has_role(current_user, 'rds_replication', 'member')
		          WHERE EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication')), false)
		FROM pg_roles r WHERE r.rolname = current_user`).Scan(&repl, &rds)
	if err != nil {
		v.cannot("replication_privilege", err)
		return
	}
	switch {
	case v.superuser:
		v.report.add(Check{ID: "replication_privilege", Status: StatusOK, Found: fmt.Sprintf("role %q is a superuser", v.role)})
	case repl:
		v.report.add(Check{ID: "replication_privilege", Status: StatusOK, Found: fmt.Sprintf("role %q has REPLICATION", v.role)})
	case rds:
		v.report.add(Check{ID: "replication_privilege", Status: StatusOK, Found: fmt.Sprintf("role %q is a member of rds_replication", v.role)})
	default:
		v.report.add(Check{ID: "replication_privilege", Status: StatusFail, Blocking: true,
			Found: fmt.Sprintf("role %q has neither REPLICATION nor superuser; it cannot open a replication connection", v.role),
			Fix:   fmt.Sprintf("ALTER ROLE %s WITH REPLICATION;  -- on Amazon RDS: GRANT rds_replication TO %s;", v.q.role, v.q.role)})
	}
}

// checkPublication reports whether the publication exists.
func (v *verifier) checkPublication(ctx context.Context) bool {
	p := &publication{}
	err := v.conn.QueryRow(ctx, `SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot
		FROM pg_publication WHERE pubname = $1`, v.cfg.Publication).
		Scan(&p.allTables, &p.insert, &p.update, &p.del, &p.trunc, &p.viaRoot)
	if errors.Is(err, pgx.ErrNoRows) {
		var db string
		_ = v.conn.QueryRow(ctx, `SELECT current_database()`).Scan(&db)
		v.report.add(Check{ID: "publication", Status: StatusFail, Blocking: true,
			Found: fmt.Sprintf("publication %q does not exist in database %q", v.cfg.Publication, db),
			Fix: fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE schema.table1, schema.table2;  -- or FOR TABLES IN SCHEMA public (not FOR ALL TABLES while the journal lives in this database)",
				v.q.pub)})
		return false
	}
	if err != nil {
		v.cannot("publication", err)
		return false
	}
	v.pub = p
	var missing []string
	for _, a := range []struct {
		on   bool
		name string
	}{{p.insert, "insert"}, {p.update, "update"}, {p.del, "delete"}, {p.trunc, "truncate"}} {
		if !a.on {
			missing = append(missing, a.name)
		}
	}
	scope := "selected tables"
	if p.allTables {
		scope = "all tables"
	}
	if len(missing) > 0 {
		v.report.add(Check{ID: "publication", Status: StatusFail,
			Found: fmt.Sprintf("publication %q (%s) does not publish %s; those changes would never reach walcast", v.cfg.Publication, scope, strings.Join(missing, ", ")),
			Fix:   fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate');", v.q.pub)})
		return true
	}
	v.report.add(Check{ID: "publication", Status: StatusOK,
		Found: fmt.Sprintf("publication %q (%s) publishes insert, update, delete and truncate", v.cfg.Publication, scope)})
	return true
}

func (v *verifier) loadTables(ctx context.Context) {
	rows, err := v.conn.Query(ctx, `SELECT c.oid, n.nspname, c.relname,
			quote_ident(n.nspname) || '.' || quote_ident(c.relname), c.relkind
		FROM pg_publication_tables pt
		JOIN pg_namespace n ON n.nspname = pt.schemaname
		JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
		WHERE pt.pubname = $1
		ORDER BY n.nspname, c.relname`, v.cfg.Publication)
	if err != nil {
		v.cannot("published_tables", err)
		return
	}
	v.tables, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (pubTable, error) {
		var t pubTable
		var kind string
		err := r.Scan(&t.oid, &t.schema, &t.name, &t.quoted, &kind)
		if len(kind) > 0 {
			t.kind = kind[0]
		}
		return t, err
	})
	if err != nil {
		v.cannot("published_tables", err)
		return
	}
	if len(v.tables) == 0 {
		v.report.add(Check{ID: "published_tables", Status: StatusWarn,
			Found: fmt.Sprintf("publication %q publishes no tables yet; walcast would stream nothing", v.cfg.Publication),
			Fix:   fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE schema.table;", v.q.pub)})
		return
	}
	v.report.add(Check{ID: "published_tables", Status: StatusOK, Found: fmt.Sprintf("%d published tables", len(v.tables))})
}

func (v *verifier) checkSelect(ctx context.Context) {
	if v.superuser || len(v.tables) == 0 {
		return
	}
	for _, t := range v.tables {
		var ok bool
		if err := v.conn.QueryRow(ctx, `SELECT has_table_privilege($1::oid, 'SELECT')`, t.oid).Scan(&ok); err != nil {
			v.cannot("select_privilege", err)
			return
		}
		if ok {
			v.report.add(Check{ID: "select_privilege", Subject: t.display(), Status: StatusOK, Found: "role can SELECT " + t.display()})
			continue
		}
		v.report.add(Check{ID: "select_privilege", Subject: t.display(), Status: StatusFail, Blocking: true,
			Found: fmt.Sprintf("role %q cannot SELECT %s", v.role, t.display()),
			Fix:   fmt.Sprintf("GRANT SELECT ON %s TO %s;", t.quoted, v.q.role)})
	}
}

// identity describes a relation's replica identity for one table.
type identity struct {
	replident byte     // d, n, f, i
	hasPK     bool     // for d
	indexOK   bool     // for i: an index marked indisreplident that still qualifies
	indexWhy  string   // for i: why it does not qualify
	cols      []string // columns of the identity (PK or index); all columns for f
}

// identityOf reads the replica identity of relation oid.
func (v *verifier) identityOf(ctx context.Context, oid uint32) (identity, error) {
	var id identity
	var ri string
	var pkCols []string
	err := v.conn.QueryRow(ctx, `SELECT c.relreplident,
			EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
			COALESCE((SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_index i
			          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(i.indkey)
			          WHERE i.indrelid = c.oid AND i.indisprimary), '{}')
		FROM pg_class c WHERE c.oid = $1`, oid).Scan(&ri, &id.hasPK, &pkCols)
	if err != nil {
		return id, err
	}
	id.replident = ri[0]
	switch id.replident {
	case 'd':
		id.cols = pkCols
	case 'i':
		// PostgreSQL requires the index to be unique, immediate, not partial,
		// on plain NOT NULL columns only, and valid; an index that stopped
		// qualifying (or was dropped) leaves the table with no identity.
		var unique, immediate, valid, partial, exprs, nullable bool
		var cols []string
		err := v.conn.QueryRow(ctx, `SELECT i.indisunique, i.indimmediate, i.indisvalid, i.indpred IS NOT NULL,
				i.indexprs IS NOT NULL OR 0 = ANY(i.indkey::int2[]),
				EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) AND NOT a.attnotnull),
				COALESCE((SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a
				          WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)), '{}')
			FROM pg_index i WHERE i.indrelid = $1 AND i.indisreplident`, oid).
			Scan(&unique, &immediate, &valid, &partial, &exprs, &nullable, &cols)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			id.indexWhy = "its replica identity index no longer exists"
		case err != nil:
			return id, err
		case !unique:
			id.indexWhy = "its replica identity index is not unique"
		case !immediate:
			id.indexWhy = "its replica identity index is deferrable"
		case partial:
			id.indexWhy = "its replica identity index is partial"
		case exprs:
			id.indexWhy = "its replica identity index uses expressions"
		case nullable:
			id.indexWhy = "its replica identity index covers a nullable column"
		case !valid:
			id.indexWhy = "its replica identity index is invalid"
		default:
			id.indexOK = true
			id.cols = cols
		}
	}
	return id, nil
}

// leaves returns the tables whose replica identity governs UPDATE and DELETE
// on t: t itself, or for a partitioned table every leaf partition.
func (v *verifier) leaves(ctx context.Context, t pubTable) ([]pubTable, error) {
	if t.kind != 'p' {
		return []pubTable{t}, nil
	}
	rows, err := v.conn.Query(ctx, `SELECT c.oid, n.nspname, c.relname, quote_ident(n.nspname) || '.' || quote_ident(c.relname), c.relkind
		FROM pg_partition_tree($1::regclass) pt
		JOIN pg_class c ON c.oid = pt.relid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE pt.isleaf ORDER BY n.nspname, c.relname`, t.oid)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (pubTable, error) {
		var p pubTable
		var kind string
		err := r.Scan(&p.oid, &p.schema, &p.name, &p.quoted, &kind)
		p.kind = kind[0]
		return p, err
	})
}

func (v *verifier) checkReplicaIdentity(ctx context.Context) {
	for _, pt := range v.tables {
		leaves, err := v.leaves(ctx, pt)
		if err != nil {
			v.cannot("replica_identity", err)
			return
		}
		for _, t := range leaves {
			id, err := v.identityOf(ctx, t.oid)
			if err != nil {
				v.cannot("replica_identity", err)
				return
			}
			c := Check{ID: "replica_identity", Subject: t.display()}
			fullFix := fmt.Sprintf("ALTER TABLE %s REPLICA IDENTITY FULL;  -- or add a primary key: ALTER TABLE %s ADD PRIMARY KEY (column);", t.quoted, t.quoted)
			switch id.replident {
			case 'f':
				c.Status, c.Found = StatusOK, t.display()+": REPLICA IDENTITY FULL"
			case 'd':
				if id.hasPK {
					c.Status, c.Found = StatusOK, t.display()+": primary key ("+strings.Join(id.cols, ", ")+")"
				} else {
					c.Status, c.Found, c.Fix = StatusFail,
						t.display()+": no primary key and REPLICA IDENTITY DEFAULT; UPDATE and DELETE on it fail once it is published", fullFix
				}
			case 'n':
				c.Status, c.Found, c.Fix = StatusFail,
					t.display()+": REPLICA IDENTITY NOTHING; UPDATE and DELETE on it fail once it is published", fullFix
			case 'i':
				if id.indexOK {
					c.Status, c.Found = StatusOK, t.display()+": REPLICA IDENTITY USING INDEX ("+strings.Join(id.cols, ", ")+")"
				} else {
					c.Status, c.Found, c.Fix = StatusFail,
						t.display()+": REPLICA IDENTITY USING INDEX, but "+id.indexWhy+"; UPDATE and DELETE on it fail",
						fmt.Sprintf("ALTER TABLE %s REPLICA IDENTITY FULL;  -- or REPLICA IDENTITY USING INDEX on a unique, non-partial index over NOT NULL columns, or ALTER TABLE %s REPLICA IDENTITY DEFAULT with a primary key", t.quoted, t.quoted)
				}
			}
			v.report.add(c)
		}
	}
}

func (v *verifier) checkJournalNotPublished(ctx context.Context) {
	if v.cfg.JournalURL != "" && !sameDatabase(v.cfg.DatabaseURL, v.cfg.JournalURL) {
		v.report.add(Check{ID: "journal_not_published", Status: StatusOK,
			Found: fmt.Sprintf("the journal lives in another database (--journal-url); tables of a schema %q here are data like any other", v.cfg.JournalSchema)})
		return
	}
	var published []pubTable
	for _, t := range v.tables {
		if t.schema == v.cfg.JournalSchema {
			published = append(published, t)
		}
	}
	// Publishing the journal is refused (blocking): walcast skips its own
	// tables by OID, but Postgres would still decode and send every journal
	// write back to it — as much WAL traffic again as the changes themselves.
	switch {
	case v.pub.allTables:
		v.report.add(Check{ID: "journal_not_published", Status: StatusFail, Blocking: true,
			Found: fmt.Sprintf("publication %q is FOR ALL TABLES and the journal (schema %q) lives in this database, so every journal write would be decoded and streamed back to walcast", v.cfg.Publication, v.cfg.JournalSchema),
			Fix:   fmt.Sprintf("publish only application schemas: DROP PUBLICATION %s; CREATE PUBLICATION %s FOR TABLES IN SCHEMA public;  -- or keep the journal in another database (--journal-url)", v.q.pub, v.q.pub)})
	case len(published) > 0:
		names := make([]string, len(published))
		for i, t := range published {
			names[i] = t.quoted
		}
		v.report.add(Check{ID: "journal_not_published", Status: StatusFail, Blocking: true,
			Found: fmt.Sprintf("publication %q publishes walcast's own journal tables (%s): every journal write would be decoded again", v.cfg.Publication, strings.Join(names, ", ")),
			Fix:   fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s;", v.q.pub, strings.Join(names, ", "))})
	default:
		v.report.add(Check{ID: "journal_not_published", Status: StatusOK,
			Found: fmt.Sprintf("journal schema %q is not published", v.cfg.JournalSchema)})
	}
}

// sameDatabase reports whether two connection strings name the same
// database on the same server (host, port and database name; a string that
// does not parse is taken to be the same, the cautious answer).
func sameDatabase(a, b string) bool {
	ca, err1 := pgx.ParseConfig(a)
	cb, err2 := pgx.ParseConfig(b)
	if err1 != nil || err2 != nil {
		return true
	}
	return ca.Host == cb.Host && ca.Port == cb.Port && ca.Database == cb.Database
}

func (v *verifier) checkPartitions(ctx context.Context) {
	if v.pub.viaRoot {
		return
	}
	for _, t := range v.tables {
		if t.kind != 'p' {
			continue
		}
		v.report.add(Check{ID: "partition_root", Subject: t.display(), Status: StatusWarn,
			Found: fmt.Sprintf("%s is partitioned and publication %q has publish_via_partition_root = false: its changes arrive under each partition's name, not %s", t.display(), v.cfg.Publication, t.display()),
			Fix:   fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true);", v.q.pub)})
	}
	// A publication of individual partitions lists the leaves; find the roots
	// they belong to.
	rows, err := v.conn.Query(ctx, `SELECT DISTINCT quote_ident(n.nspname) || '.' || quote_ident(r.relname), n.nspname || '.' || r.relname
		FROM pg_publication_tables pt
		JOIN pg_namespace ln ON ln.nspname = pt.schemaname
		JOIN pg_class l ON l.relnamespace = ln.oid AND l.relname = pt.tablename
		JOIN LATERAL pg_partition_root(l.oid) AS root(oid) ON root.oid IS NOT NULL AND root.oid <> l.oid
		JOIN pg_class r ON r.oid = root.oid JOIN pg_namespace n ON n.oid = r.relnamespace
		WHERE pt.pubname = $1`, v.cfg.Publication)
	if err != nil {
		v.cannot("partition_root", err)
		return
	}
	roots, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var s [2]string
		return s, r.Scan(&s[0], &s[1])
	})
	if err != nil {
		v.cannot("partition_root", err)
		return
	}
	for _, r := range roots {
		v.report.add(Check{ID: "partition_root", Subject: r[1], Status: StatusWarn,
			Found: fmt.Sprintf("partitions of %s are published with publish_via_partition_root = false: changes arrive under each partition's name", r[1]),
			Fix:   fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true);", v.q.pub)})
	}
}

func (v *verifier) checkTenantColumn(ctx context.Context) {
	col := v.cfg.TenantColumn
	for _, t := range v.tables {
		var has bool
		if err := v.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1 AND attname = $2 AND attnum > 0 AND NOT attisdropped)`,
			t.oid, col).Scan(&has); err != nil {
			v.cannot("tenant_column", err)
			return
		}
		if !has {
			continue // not a tenanted table
		}
		if v.serverNum >= 150000 && !v.checkTenantPublished(ctx, t, col) {
			continue
		}
		leaves, err := v.leaves(ctx, t)
		if err != nil {
			v.cannot("tenant_column", err)
			return
		}
		for _, l := range leaves {
			id, err := v.identityOf(ctx, l.oid)
			if err != nil {
				v.cannot("tenant_column", err)
				return
			}
			if id.replident == 'f' || contains(id.cols, col) {
				v.report.add(Check{ID: "tenant_column", Subject: l.display(), Status: StatusOK,
					Found: fmt.Sprintf("%s: replica identity includes %q; deletes carry their tenant", l.display(), col)})
				continue
			}
			if id.replident == 'n' || (id.replident == 'd' && !id.hasPK) || (id.replident == 'i' && !id.indexOK) {
				continue // already failed under replica_identity
			}
			v.report.add(Check{ID: "tenant_column", Subject: l.display(), Status: StatusWarn,
				Found: fmt.Sprintf("%s: replica identity lacks tenant column %q, so a DELETE carries no tenant; walcast routes it by the last journaled change of the same key, or to no tenant when none is retained", l.display(), col),
				Fix:   fmt.Sprintf("ALTER TABLE %s REPLICA IDENTITY FULL;", l.quoted)})
		}
	}
}

// checkTenantPublished checks that the publication sends table t's tenant
// column: a column list that leaves it out makes no row's tenant knowable
// (PostgreSQL 15+ column lists), which fails and blocks walcast run. It
// reports false when it failed t, so that no further tenant check of t runs.
func (v *verifier) checkTenantPublished(ctx context.Context, t pubTable, col string) bool {
	var attnames []string
	var rowfilter *string
	err := v.conn.QueryRow(ctx, `SELECT attnames::text[], rowfilter FROM pg_publication_tables
		WHERE pubname = $1 AND schemaname = $2 AND tablename = $3`, v.cfg.Publication, t.schema, t.name).Scan(&attnames, &rowfilter)
	if errors.Is(err, pgx.ErrNoRows) {
		return true // published through its partitions: their rows are checked there
	}
	if err != nil {
		v.cannot("tenant_column", err)
		return false
	}
	if !contains(attnames, col) {
		var quotedCols []string
		for _, a := range append(attnames, col) {
			var q string
			if err := v.conn.QueryRow(ctx, `SELECT quote_ident($1)`, a).Scan(&q); err != nil {
				v.cannot("tenant_column", err)
				return false
			}
			quotedCols = append(quotedCols, q)
		}
		// Blocking: walcast run refuses to start rather than carry the
		// table's rows unscoped (while running, its changes are
		// quarantined: decoder.Config.Unscoped).
		v.report.add(Check{ID: "tenant_column", Subject: t.display(), Status: StatusFail, Blocking: true,
			Found: fmt.Sprintf("%s: publication %q's column list leaves out tenant column %q, so no row's tenant can be known (its changes would be quarantined and reach no reader)", t.display(), v.cfg.Publication, col),
			Fix:   fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s; ALTER PUBLICATION %s ADD TABLE %s (%s);", v.q.pub, t.quoted, v.q.pub, t.quoted, strings.Join(quotedCols, ", "))})
		return false
	}
	if rowfilter != nil {
		v.report.add(Check{ID: "tenant_row_filter", Subject: t.display(), Status: StatusOK,
			Found: fmt.Sprintf("%s: published WHERE %s; rows outside the filter reach no reader, and an UPDATE that moves a row out arrives as a DELETE routed like any other (see tenant_column)", t.display(), *rowfilter)})
	}
	return true
}

func (v *verifier) checkJournalSchema(ctx context.Context) {
	var exists, usage, create, dbCreate bool
	err := v.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1),
		COALESCE((SELECT has_schema_privilege(oid, 'USAGE') FROM pg_namespace WHERE nspname = $1), false),
		COALESCE((SELECT has_schema_privilege(oid, 'CREATE') FROM pg_namespace WHERE nspname = $1), false),
		has_database_privilege(current_database(), 'CREATE')`, v.cfg.JournalSchema).Scan(&exists, &usage, &create, &dbCreate)
	if err != nil {
		v.cannot("journal_schema", err)
		return
	}
	qs := v.q.schema
	switch {
	case exists && usage && create:
		v.report.add(Check{ID: "journal_schema", Status: StatusOK, Found: fmt.Sprintf("journal schema %q exists and role %q can use it (when the journal lives in this database)", v.cfg.JournalSchema, v.role)})
	case exists:
		v.report.add(Check{ID: "journal_schema", Status: StatusWarn,
			Found: fmt.Sprintf("journal schema %q exists but role %q lacks USAGE or CREATE on it; `walcast run` cannot keep its journal here", v.cfg.JournalSchema, v.role),
			Fix:   fmt.Sprintf("GRANT USAGE, CREATE ON SCHEMA %s TO %s;  -- or use --journal-url for another database", qs, v.q.role)})
	case dbCreate:
		v.report.add(Check{ID: "journal_schema", Status: StatusOK, Found: fmt.Sprintf("journal schema %q will be created on first run", v.cfg.JournalSchema)})
	default:
		v.report.add(Check{ID: "journal_schema", Status: StatusWarn,
			Found: fmt.Sprintf("journal schema %q does not exist and role %q cannot create schemas in this database", v.cfg.JournalSchema, v.role),
			Fix:   fmt.Sprintf("CREATE SCHEMA %s AUTHORIZATION %s;  -- or use --journal-url for another database", qs, v.q.role)})
	}
}

func (v *verifier) checkSlot(ctx context.Context) {
	var (
		plugin, slotType, walStatus, db, curDB string
		temporary                              bool
		activePID                              *int32
		lag                                    *int64
	)
	err := v.conn.QueryRow(ctx, `SELECT COALESCE(s.plugin, ''), s.slot_type, COALESCE(s.wal_status, ''), COALESCE(s.database, ''),
			current_database(), s.temporary, s.active_pid,
			(pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint
		FROM pg_replication_slots s WHERE s.slot_name = $1`, v.cfg.Slot).
		Scan(&plugin, &slotType, &walStatus, &db, &curDB, &temporary, &activePID, &lag)
	if errors.Is(err, pgx.ErrNoRows) {
		v.report.add(Check{ID: "slot", Status: StatusOK, Found: fmt.Sprintf("slot %q does not exist yet; `walcast run` creates it", v.cfg.Slot)})
		return
	}
	if err != nil {
		v.cannot("slot", err)
		return
	}
	lit := v.q.slotLit
	dropFix := fmt.Sprintf("SELECT pg_drop_replication_slot(%s);  -- or run walcast with another --slot", lit)
	switch {
	case slotType != "logical":
		v.report.add(Check{ID: "slot", Status: StatusFail, Blocking: true,
			Found: fmt.Sprintf("slot %q is a %s slot, not a logical one", v.cfg.Slot, slotType), Fix: dropFix})
	case plugin != "pgoutput":
		v.report.add(Check{ID: "slot", Status: StatusFail, Blocking: true,
			Found: fmt.Sprintf("slot %q uses output plugin %q; walcast needs pgoutput", v.cfg.Slot, plugin), Fix: dropFix})
	case db != curDB:
		v.report.add(Check{ID: "slot", Status: StatusFail, Blocking: true,
			Found: fmt.Sprintf("slot %q belongs to database %q, not %q", v.cfg.Slot, db, curDB), Fix: "point --database-url at database " + "\"" + strings.ReplaceAll(db, "\"", "\"\"") + "\"" + ", or run walcast with another --slot"})
	case walStatus == "lost":
		v.report.add(Check{ID: "slot", Status: StatusFail, Blocking: true,
			Found: fmt.Sprintf("slot %q is lost: Postgres removed WAL it still needed (max_slot_wal_keep_size), so changes were missed", v.cfg.Slot),
			Fix:   "run `walcast run --recreate-lost-slot` to recreate it and tell clients to resync, or " + dropFix})
	case walStatus == "unreserved":
		v.report.add(Check{ID: "slot", Status: StatusWarn,
			Found: fmt.Sprintf("slot %q is about to lose WAL it needs (wal_status = unreserved)", v.cfg.Slot),
			Fix:   "start `walcast run` now so the slot catches up, or raise max_slot_wal_keep_size: ALTER SYSTEM SET max_slot_wal_keep_size = '100GB'; SELECT pg_reload_conf();"})
	case temporary:
		v.report.add(Check{ID: "slot", Status: StatusFail, Blocking: true,
			Found: fmt.Sprintf("slot %q is temporary and disappears with its session", v.cfg.Slot), Fix: "run walcast with another --slot"})
	default:
		found := fmt.Sprintf("slot %q uses pgoutput, wal_status %s", v.cfg.Slot, walStatus)
		if lag != nil {
			found += fmt.Sprintf(", %s behind", formatBytes(*lag))
		}
		if activePID != nil {
			found += fmt.Sprintf(", in use by pid %d", *activePID)
		} else {
			found += ", inactive"
		}
		c := Check{ID: "slot", Status: StatusOK, Found: found}
		if lag != nil && *lag > v.cfg.LagWarnBytes {
			c.Status = StatusWarn
			c.Fix = "start `walcast run` so the slot catches up; a slot left behind holds WAL on the server's disk"
		}
		v.report.add(c)
	}
	if v.serverNum >= 170000 {
		var failover bool
		if err := v.conn.QueryRow(ctx, `SELECT failover FROM pg_replication_slots WHERE slot_name = $1`, v.cfg.Slot).Scan(&failover); err != nil {
			v.cannot("slot_failover", err)
			return
		}
		if failover {
			v.report.add(Check{ID: "slot_failover", Status: StatusOK, Found: fmt.Sprintf("slot %q is a failover slot", v.cfg.Slot)})
		} else {
			v.report.add(Check{ID: "slot_failover", Status: StatusWarn,
				Found: fmt.Sprintf("slot %q is not a failover slot: after a failover to a standby it is gone and walcast must resync", v.cfg.Slot),
				Fix:   fmt.Sprintf("ALTER_REPLICATION_SLOT %s (FAILOVER true)  -- on a replication connection; also set sync_replication_slots = on on the standby", v.q.slot)})
		}
	}
}

func (v *verifier) checkWalKeepSize(ctx context.Context) {
	var setting string
	if err := v.conn.QueryRow(ctx, `SELECT current_setting('max_slot_wal_keep_size')`).Scan(&setting); err != nil {
		v.cannot("max_slot_wal_keep_size", err)
		return
	}
	if setting == "-1" {
		v.report.add(Check{ID: "max_slot_wal_keep_size", Status: StatusWarn,
			Found: "max_slot_wal_keep_size = -1 (unbounded): if walcast stops for long, the slot keeps WAL until the server's disk fills",
			Fix:   "ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf();  -- size it below your free WAL disk; past it the slot is lost and walcast resyncs instead of the database going down"})
		return
	}
	v.report.add(Check{ID: "max_slot_wal_keep_size", Status: StatusOK, Found: "max_slot_wal_keep_size = " + setting})
}

func (v *verifier) checkTLS(ctx context.Context) {
	if isLocalHost(v.pcfg.Host) {
		v.report.add(Check{ID: "tls", Status: StatusOK, Found: "local connection (" + v.pcfg.Host + "); TLS not needed"})
		return
	}
	var ssl bool
	var version *string
	err := v.conn.QueryRow(ctx, `SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl, &version)
	if err != nil {
		v.cannot("tls", err)
		return
	}
	if !ssl {
		v.report.add(Check{ID: "tls", Status: StatusWarn,
			Found: "the connection to " + v.pcfg.Host + " is not encrypted: passwords and row data cross the network in clear",
			Fix:   "add sslmode=verify-full&sslrootcert=/path/to/ca.pem to the database URL (and ssl = on on the server)"})
		return
	}
	found := "connection encrypted"
	if version != nil {
		found += " (" + *version + ")"
	}
	if v.pcfg.TLSConfig != nil && v.pcfg.TLSConfig.InsecureSkipVerify {
		v.report.add(Check{ID: "tls", Status: StatusWarn,
			Found: found + ", but the server's certificate is not verified (sslmode=require or prefer)",
			Fix:   "use sslmode=verify-full&sslrootcert=/path/to/ca.pem in the database URL"})
		return
	}
	v.report.add(Check{ID: "tls", Status: StatusOK, Found: found})
}

func isLocalHost(host string) bool {
	if host == "" || strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func contains(xs []string, x string) bool {
	for _, s := range xs {
		if s == x {
			return true
		}
	}
	return false
}

func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d bytes", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
