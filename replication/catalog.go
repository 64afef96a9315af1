package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// The catalog (journal/catalog.go) is written here: at the start of every
// session for every published table, and again whenever the publication's
// tables, a table's columns, replica identity, column list or row filter
// change — noticed by polling every publicationPoll and, sooner, by a
// Relation message (pgoutput sends one before the first change after any
// change of the relation's shape). One loader, loadSourceTable, reads a
// table from the source's catalogs for the catalog and for snapshots alike.

// sourceColumn is one published column of a source table.
type sourceColumn struct {
	num        int16
	name       string
	oid        uint32
	typ        string // format_type(atttypid, atttypmod)
	collate    string // quoted collation when not the type's default, else ""
	baseSchema string // the end of the type's chain of domains, for a type at or above 10000
	baseName   string
	elem       decoder.ArrayElement // elements of an array outside pg_catalog
	notNull    bool
}

// sourceTable is what the source's catalogs say of a published table.
type sourceTable struct {
	schema, name string
	relid        uint32
	ident        byte // relreplident: d, f, i or n
	kind         byte // relkind: r or p
	cols         []sourceColumn
	pk, ri       []int16 // attnums of the primary key and of the replica identity index
	filter       string  // the publication's row filter, "" for none
	// hasTenant says the table has a column named the tenant column,
	// published or not.
	hasTenant bool
	shape     string // journal.SourceShapeSQL's digest
}

var (
	errNoSourceTable = errors.New("table does not exist in the source database")
	errNotPublished  = errors.New("table is not in the publication")
)

// loadSourceTable reads schema.table's published columns (the column list
// of publication pub), their types, its replica identity and row filter
// from the source's catalogs over conn. It returns errNoSourceTable or
// errNotPublished (wrapped) when there is nothing to read. tenantColumn
// ("" for none) is only looked for, to set hasTenant.
func loadSourceTable(ctx context.Context, conn *pgx.Conn, pub, schema, table, tenantColumn string) (*sourceTable, error) {
	t := &sourceTable{schema: schema, name: table}
	var ident, kind string
	err := conn.QueryRow(ctx, `SELECT c.oid, c.relreplident::text, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2`, schema, table).Scan(&t.relid, &ident, &kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%s: %w", decoder.EntityName(schema, table), errNoSourceTable)
	}
	if err != nil {
		return nil, err
	}
	t.ident, t.kind = ident[0], kind[0]
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return nil, err
	}
	var attnames []string
	var filter *string
	q := `SELECT NULL::text[], NULL::text FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3`
	if version >= 150000 {
		q = `SELECT attnames, rowfilter FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3`
	}
	err = conn.QueryRow(ctx, q, pub, schema, table).Scan(&attnames, &filter)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%s: %w", decoder.EntityName(schema, table), errNotPublished)
	}
	if err != nil {
		return nil, err
	}
	if filter != nil {
		t.filter = *filter
	}
	published := map[string]bool{}
	for _, a := range attnames {
		published[a] = true
	}
	rows, err := conn.Query(ctx, `SELECT a.attnum, a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod),
			CASE WHEN a.attcollation NOT IN (0, 100) THEN quote_ident(cn.nspname) || '.' || quote_ident(co.collname) ELSE '' END,
			a.attnotnull
		FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum`, t.relid)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var a sourceColumn
		if err := rows.Scan(&a.num, &a.name, &a.oid, &a.typ, &a.collate, &a.notNull); err != nil {
			rows.Close()
			return nil, err
		}
		if tenantColumn != "" && a.name == tenantColumn {
			t.hasTenant = true
		}
		if len(published) > 0 && !published[a.name] {
			continue
		}
		t.cols = append(t.cols, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// The base type of each non-built-in column type, as pgoutput's Type
	// message names it (logicalrep_write_typ: getBaseType).
	for i := range t.cols {
		a := &t.cols[i]
		if a.oid < 10000 {
			continue
		}
		oid := a.oid
		for depth := 0; depth < 32; depth++ {
			var typtype string
			var base uint32
			if err := conn.QueryRow(ctx, `SELECT t.typtype::text, t.typbasetype, n.nspname, t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = $1`,
				oid).Scan(&typtype, &base, &a.baseSchema, &a.baseName); err != nil {
				return nil, err
			}
			if typtype != "d" {
				break
			}
			oid = base
		}
	}
	// The elements of arrays outside pg_catalog (arrays of domains), which
	// pgoutput does not describe (decoder.Config.ArrayElement).
	for i := range t.cols {
		a := &t.cols[i]
		if a.oid < 10000 || a.baseSchema == "pg_catalog" || !strings.HasPrefix(a.baseName, "_") {
			continue
		}
		e, ok, err := lookupArrayElement(ctx, conn, a.oid)
		if err != nil {
			return nil, err
		}
		if ok {
			a.elem = e
		}
	}
	if err := conn.QueryRow(ctx, `SELECT coalesce((SELECT indkey::int2[] FROM pg_index WHERE indrelid = $1 AND indisprimary), '{}'),
		coalesce((SELECT indkey::int2[] FROM pg_index WHERE indrelid = $1 AND indisreplident), '{}')`, t.relid).Scan(&t.pk, &t.ri); err != nil {
		return nil, err
	}
	var shape *string
	if err := conn.QueryRow(ctx, journal.SourceShapeSQL, t.relid).Scan(&shape); err != nil {
		return nil, err
	}
	if shape != nil {
		t.shape = *shape
	}
	return t, nil
}

// identity returns the attnums of the replica identity's columns, flagged
// as pgoutput's Relation message flags them: the primary key under
// DEFAULT, the index's columns under USING INDEX, every published column
// under FULL, none under NOTHING.
func (t *sourceTable) identity() map[int16]bool {
	id := map[int16]bool{}
	switch t.ident {
	case 'd':
		for _, n := range t.pk {
			id[n] = true
		}
	case 'i':
		for _, n := range t.ri {
			id[n] = true
		}
	case 'f':
		for _, a := range t.cols {
			id[a.num] = true
		}
	}
	return id
}

// columnInfos are the published columns as decoder.NewRowEncoder takes
// them.
func (t *sourceTable) columnInfos() []decoder.ColumnInfo {
	identity := t.identity()
	primary := map[int16]bool{}
	for _, n := range t.pk {
		primary[n] = true
	}
	infos := make([]decoder.ColumnInfo, len(t.cols))
	for i, a := range t.cols {
		infos[i] = decoder.ColumnInfo{Name: a.name, TypeOID: a.oid, BaseSchema: a.baseSchema, BaseName: a.baseName, Key: identity[a.num],
			PrimaryKey: primary[a.num], Element: a.elem}
	}
	return infos
}

// unscoped reports whether the table has the tenant column but the
// publication's column list leaves it out: then no row's tenant can be
// known.
func (t *sourceTable) unscoped(tenantColumn string) bool {
	if !t.hasTenant {
		return false
	}
	for _, a := range t.cols {
		if a.name == tenantColumn {
			return false
		}
	}
	return true
}

// catalogEntry is the table's catalog entry under tenantColumn.
func (t *sourceTable) catalogEntry(tenantColumn string) journal.CatalogEntry {
	e := journal.CatalogEntry{Table: journal.Table{Schema: t.schema, Name: t.name}, Published: true, RelID: t.relid,
		RowFilter: t.filter, TableShape: t.shape, Columns: make([]journal.CatalogColumn, len(t.cols))}
	switch t.ident {
	case 'd':
		e.ReplicaIdentity = journal.IdentityDefault
	case 'f':
		e.ReplicaIdentity = journal.IdentityFull
	case 'i':
		e.ReplicaIdentity = journal.IdentityIndex
	default:
		e.ReplicaIdentity = journal.IdentityNothing
	}
	if t.hasTenant {
		e.TenantColumn = tenantColumn
		e.TenantUnscoped = t.unscoped(tenantColumn)
	}
	for i, info := range t.columnInfos() {
		e.Columns[i] = journal.CatalogColumn{Name: info.Name, TypeOID: info.TypeOID, BaseSchema: info.BaseSchema, BaseName: info.BaseName,
			ElementSchema: info.Element.Schema, ElementName: info.Element.Name, ElementDelim: info.Element.Delim,
			NotNull: t.cols[i].notNull, Key: info.Key, PrimaryKey: info.PrimaryKey}
	}
	return e
}

// unscopedFix is the SQL that publishes table's tenant column col
// alongside the columns published now.
func unscopedFix(pub string, t *sourceTable, col string) string {
	cols := make([]string, 0, len(t.cols)+1)
	for _, a := range t.cols {
		cols = append(cols, pgx.Identifier{a.name}.Sanitize())
	}
	cols = append(cols, pgx.Identifier{col}.Sanitize())
	p, tbl := pgx.Identifier{pub}.Sanitize(), pgx.Identifier{t.schema, t.name}.Sanitize()
	return fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s; ALTER PUBLICATION %s ADD TABLE %s (%s);", p, tbl, p, tbl, strings.Join(cols, ", "))
}

// catalogWriter keeps the journal's catalog equal to the source's
// published tables for one session. Its goroutine (run) is owned by the
// session's stream; nudge may be called from any goroutine.
type catalogWriter struct {
	r    *Replicator
	gen  int64
	wake chan struct{} // capacity 1: a pass is due

	// seen holds, owned by the goroutine making passes, each published
	// table's fingerprint (catalogFingerprintSQL) as last recorded: a
	// pass loads and records only the tables whose fingerprint changed.
	seen map[journal.Table]string
}

func newCatalogWriter(r *Replicator, gen int64) *catalogWriter {
	return &catalogWriter{r: r, gen: gen, wake: make(chan struct{}, 1)}
}

// nudge asks for a pass soon (a Relation message arrived). It never
// blocks.
func (w *catalogWriter) nudge() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run makes a pass every publicationPoll, or sooner when nudged, until ctx
// ends. A failed pass is logged once until one succeeds again.
func (w *catalogWriter) run(ctx context.Context) {
	log := w.r.log
	failing := false
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			closeSourceConn(ctx, conn)
		}
	}()
	timer := time.NewTimer(publicationPoll) // the session made the first pass
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-w.wake:
			// A Relation message comes before the change it describes is
			// committed; a moment later the catalogs agree with it.
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		var err error
		if conn == nil || conn.IsClosed() {
			conn, err = (&snapshotter{r: w.r}).connect(ctx)
		}
		if err == nil {
			err = w.pass(ctx, conn)
		}
		if err != nil && conn != nil {
			closeSourceConn(ctx, conn)
			conn = nil
		}
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, journal.ErrFenced):
			return // the session ends on its next append
		case err != nil && !failing:
			log.Warn("cannot record the published tables in the journal's catalog; retrying", "cause", err)
			failing = true
		case err == nil && failing:
			log.Info("recording the published tables in the journal's catalog again")
			failing = false
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(publicationPoll)
	}
}

// record makes one pass on a connection of its own.
func (w *catalogWriter) record(ctx context.Context) error {
	conn, err := (&snapshotter{r: w.r}).connect(ctx)
	if err != nil {
		return err
	}
	defer closeSourceConn(ctx, conn)
	return w.pass(ctx, conn)
}

// catalogFingerprintSQL lists the publication's tables ($1) with a digest
// of everything their catalog entries are made of — the relation, its
// replica identity, its columns (names, types, NOT NULL), its primary key
// and identity index, the published columns and the row filter — so that a
// pass costs one query while nothing changed. %s is the published-columns
// expression (pg_publication_tables.attnames from PostgreSQL 15 on).
const catalogFingerprintSQL = `SELECT pt.schemaname, pt.tablename, md5(concat_ws('|', c.oid::text, c.relreplident::text, %s, coalesce(%s, ''),
		(SELECT string_agg(a.attname || ':' || a.atttypid::text || ':' || a.attnotnull::text, ',' ORDER BY a.attnum) FROM pg_attribute a
			WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
		(SELECT string_agg(i.indkey::text || ':' || i.indisprimary::text || ':' || i.indisreplident::text, ',' ORDER BY i.indexrelid) FROM pg_index i
			WHERE i.indrelid = c.oid AND (i.indisprimary OR i.indisreplident))))
	FROM pg_publication_tables pt JOIN pg_namespace n ON n.nspname = pt.schemaname JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
	WHERE pt.pubname = $1 ORDER BY 1, 2`

// pass records the entry of every published table whose fingerprint
// changed since the last pass (all of them on the first), and a Published
// false version for each table the catalog has as published that left the
// publication.
func (w *catalogWriter) pass(ctx context.Context, conn *pgx.Conn) error {
	cfg := &w.r.cfg
	ctx, cancel := context.WithTimeout(ctx, catalogLookupTimeout)
	defer cancel()
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return err
	}
	cols, filter := "''", "NULL::text"
	if version >= 150000 {
		cols, filter = "pt.attnames::text", "pt.rowfilter"
	}
	rows, err := conn.Query(ctx, fmt.Sprintf(catalogFingerprintSQL, cols, filter), cfg.Publication)
	if err != nil {
		return fmt.Errorf("list the tables of publication %q: %w", cfg.Publication, err)
	}
	prints := map[journal.Table]string{}
	var order []journal.Table
	var tbl journal.Table
	var print *string
	if _, err := pgx.ForEachRow(rows, []any{&tbl.Schema, &tbl.Name, &print}, func() error {
		if _, dup := prints[tbl]; !dup {
			order = append(order, tbl)
		}
		prints[tbl] = ""
		if print != nil {
			prints[tbl] = *print
		}
		return nil
	}); err != nil {
		return fmt.Errorf("list the tables of publication %q: %w", cfg.Publication, err)
	}
	if len(order) == 0 {
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", cfg.Publication).Scan(&exists); err != nil {
			return fmt.Errorf("look up publication %q: %w", cfg.Publication, err)
		}
		if !exists {
			return fmt.Errorf("publication %q does not exist; fix: CREATE PUBLICATION %s FOR TABLE …, or run with the --publication that exists", cfg.Publication, pgx.Identifier{cfg.Publication}.Sanitize())
		}
	}
	first := w.seen == nil
	if first {
		w.seen = map[journal.Table]string{}
	}
	setChanged := first || len(w.seen) != len(prints)
	for _, tbl := range order {
		old, had := w.seen[tbl]
		if !had {
			setChanged = true
		}
		if had && old == prints[tbl] {
			continue
		}
		t, err := loadSourceTable(ctx, conn, cfg.Publication, tbl.Schema, tbl.Name, cfg.TenantColumn)
		if errors.Is(err, errNoSourceTable) || errors.Is(err, errNotPublished) {
			continue // dropped or unpublished since listed: the next pass sees it gone
		}
		if err != nil {
			return fmt.Errorf("read %s from the source's catalogs: %w", tbl.Entity(), err)
		}
		if w.r.skipRelations[t.relid] {
			// The journal's own tables are never data (DESIGN §4.10): no
			// reader may see them, whatever the publication says.
			w.seen[tbl] = prints[tbl]
			continue
		}
		e := t.catalogEntry(cfg.TenantColumn)
		v, wrote, err := w.r.j.RecordCatalog(ctx, w.gen, e)
		if err != nil {
			return err
		}
		w.seen[tbl] = prints[tbl]
		if !wrote {
			continue
		}
		if e.TenantUnscoped {
			w.r.log.Error("a published table's tenant column is not in the publication's column list: its changes are quarantined and reach no reader until it is",
				"table", tbl.Entity(), "tenant_column", cfg.TenantColumn, "catalog_version", v, "fix", unscopedFix(cfg.Publication, t, cfg.TenantColumn))
		} else if v > 1 {
			w.r.log.Info("a published table changed; catalog updated", "table", tbl.Entity(), "catalog_version", v)
		}
	}
	if !setChanged {
		return nil
	}
	for t := range w.seen {
		if _, ok := prints[t]; !ok {
			delete(w.seen, t)
		}
	}
	known, err := w.r.j.CatalogTables(ctx)
	if err != nil {
		return err
	}
	for _, e := range known {
		if _, ok := prints[e.Table]; !e.Published || ok {
			continue
		}
		e.Published = false
		if _, _, err := w.r.j.RecordCatalog(ctx, w.gen, e); err != nil {
			return err
		}
		w.r.log.Info("a table left the publication; catalog updated", "table", e.Entity())
	}
	return nil
}

// unscoped answers decoder.Config.Unscoped: whether relID has the tenant
// column while the publication leaves it out, as the source's catalogs
// say now. A catalog that cannot be read is an error: the session ends
// and the message comes again, rather than a tenanted table's rows being
// carried as untenanted by guess. Each such table is logged once per
// session.
func (c *catalogLookup) unscoped(relID uint32, schema, table string) (bool, error) {
	col := c.r.cfg.TenantColumn
	ctx, cancel := context.WithTimeout(c.ctx, catalogLookupTimeout)
	defer cancel()
	conn, err := c.open(ctx)
	if err != nil {
		return false, fmt.Errorf("read whether %s has tenant column %q: %w", decoder.EntityName(schema, table), col, err)
	}
	var has bool
	var attnames []string
	err = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1 AND attname = $2 AND attnum > 0 AND NOT attisdropped),
		coalesce((SELECT attnames FROM pg_publication_tables WHERE pubname = $3 AND schemaname = $4 AND tablename = $5), '{}')`,
		relID, col, c.r.cfg.Publication, schema, table).Scan(&has, &attnames)
	if err != nil {
		closeSourceConn(c.ctx, conn)
		c.conn = nil
		return false, fmt.Errorf("read whether %s has tenant column %q: %w (fix: let walcast's role open ordinary connections to the source database and read its catalogs)",
			decoder.EntityName(schema, table), col, err)
	}
	u := has
	for _, a := range attnames {
		if a == col {
			u = false
		}
	}
	if u && !c.warned[relID] {
		if c.warned == nil {
			c.warned = map[uint32]bool{}
		}
		c.warned[relID] = true
		fix := "add " + col + " to the publication's column list of " + pgx.Identifier{schema, table}.Sanitize()
		if t, err := loadSourceTable(ctx, conn, c.r.cfg.Publication, schema, table, col); err == nil {
			fix = unscopedFix(c.r.cfg.Publication, t, col)
		}
		c.r.log.Error("a published table's tenant column is not in the publication's column list: its changes are quarantined (delivered to no reader) until it is",
			"table", decoder.EntityName(schema, table), "tenant_column", col, "fix", fix)
	}
	return u, nil
}
