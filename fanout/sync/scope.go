package sync

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// Scope: what a snapshot may read of a table comes from one place, the
// journal's catalog (journal/catalog.go), which walcast run writes for
// every published table as it changes. The node has no flag of its own
// for the publication or the tenant column: a node could only disagree
// with walcast run, and a disagreement would leak rows (another tenant's,
// or columns and rows the publication leaves out). So:
//
//   - A table with no catalog entry, or whose newest entry says it left
//     the publication, does not exist for clients: the refusal is the one
//     a missing table gets, word for word, so it tells nothing about
//     tables that are not published.
//   - The SELECT reads the entry's columns only, under the entry's row
//     filter, scoped by the entry's tenant column exactly as the journal
//     scopes changes (DESIGN §5).
//   - Inside the snapshot's transaction (after the table is locked) the
//     live table is checked against the entry: the same relation and the
//     same columns, or the snapshot is refused as retryable — the stream
//     has the entry's shape, and rows of another would not fit it.
//   - A table whose tenant column the publication leaves out cannot be
//     scoped: its snapshots are refused. A row whose tenant cannot be known
//     (a value the journal could not store as a tenant) is never sent: the
//     scoped SELECT leaves it out, and should one reach the encoder anyway
//     it is dropped there. Both are counted in
//     walcast.sync.snapshot.tenant_unknown (what = table, row) and logged
//     once per window.

// scope is stateSource's link to the catalog; set by useCatalog when the
// node opens state.
type scope struct {
	j    *journal.Journal
	warn func(key, msg string, args ...any) // Node.warnEvery

	// Fail-closed events (metrics.go): snapshots refused because their
	// table's rows cannot be scoped, and rows dropped because their tenant
	// could not be known.
	unknownTables, unknownRows atomic.Int64
}

// useCatalog makes st read table scope from j's catalog and report rows it
// withholds through warn.
func (st *stateSource) useCatalog(j *journal.Journal, warn func(key, msg string, args ...any)) {
	st.j, st.warn = j, warn
}

// refusedMissing is the refusal of a table a client may not know about.
func refusedMissing(entity string) error {
	return refused("table %s does not exist in the source database", entity)
}

// refusedChanged is the refusal of a table whose live shape no longer
// matches its catalog entry: walcast run records the change within seconds,
// so it is worth retrying.
func refusedChanged(entity string) error {
	return refused("table %s changed in the source database and the stream has not caught up with the change yet; subscribe again in a few seconds", entity)
}

// loadStateTable builds schema.table's scoped SELECT from the table's
// newest catalog entry and checks, in the snapshot's transaction tx (after
// its lock), that the live table is still the one the entry describes.
func (st *stateSource) loadStateTable(ctx context.Context, tx pgx.Tx, schema, table, tenant string) (*stateTable, error) {
	entity := decoder.EntityName(schema, table)
	if st.j == nil {
		return nil, errors.New("snapshots need the journal's catalog, and this node has none")
	}
	e, ok, err := st.j.Catalog(ctx, journal.Table{Schema: schema, Name: table})
	if err != nil {
		return nil, fmt.Errorf("read the catalog entry of %s: %w", entity, err)
	}
	if !ok || !e.Published {
		return nil, refusedMissing(entity)
	}
	var relid uint32
	var kind string
	var estimate float64
	err = tx.QueryRow(ctx, `SELECT c.oid, c.relkind::text, c.reltuples::float8
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		schema, table).Scan(&relid, &kind, &estimate)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, refusedMissing(entity)
	}
	if err != nil {
		return nil, err
	}
	if relid != e.RelID {
		return nil, refusedChanged(entity)
	}
	var shape *string
	if err := tx.QueryRow(ctx, journal.SourceShapeSQL, relid).Scan(&shape); err != nil {
		return nil, err
	}
	if shape == nil || *shape != e.TableShape {
		return nil, refusedChanged(entity)
	}
	if e.TenantUnscoped {
		st.unknownTables.Add(1)
		st.warn("scope-unscoped:"+entity, "snapshot refused: the publication leaves the table's tenant column out, so no row's tenant can be known",
			"table", entity, "tenant_column", e.TenantColumn, "fix", "add the tenant column to the publication's column list (walcast run's log has the SQL)")
		return nil, refused("the rows of %s cannot be scoped to a tenant, so this node serves none of them; the operator must publish its tenant column", entity)
	}
	if len(e.Columns) == 0 {
		return nil, refused("table %s has no published columns", entity)
	}
	t := &stateTable{entity: entity, estimate: max(0, int64(estimate))}
	cols := make([]string, len(e.Columns))
	tenantCol := ""
	for i, c := range e.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
		if e.TenantColumn != "" && c.Name == e.TenantColumn {
			tenantCol = cols[i]
		}
	}
	if e.TenantColumn != "" && tenantCol == "" {
		// An entry that names a tenant column it does not publish is
		// unscoped whatever its flag says: fail closed.
		st.unknownTables.Add(1)
		return nil, refused("the rows of %s cannot be scoped to a tenant, so this node serves none of them; the operator must publish its tenant column", entity)
	}
	from := pgx.Identifier{schema, table}.Sanitize()
	if kind == "r" {
		from = "ONLY " + from
	}
	var conds []string
	if e.RowFilter != "" {
		conds = append(conds, "("+e.RowFilter+")")
	}
	// Scoped as the journal scopes changes (DESIGN §5): the tenant's rows
	// and rows with no tenant; an unscoped reader only the latter. The
	// text form compared is the one the decoder hoists into "tenant".
	if tenantCol != "" {
		if tenant == "" {
			conds = append(conds, tenantCol+" IS NULL")
		} else {
			conds = append(conds, "("+tenantCol+" IS NULL OR "+tenantCol+"::text = $1)")
			t.args = []any{tenant}
		}
	}
	t.sql = "SELECT " + strings.Join(cols, ", ") + " FROM " + from
	if len(conds) > 0 {
		t.sql += " WHERE " + strings.Join(conds, " AND ")
	}
	t.enc = decoder.NewRowEncoder(schema, table, e.ColumnInfos(), e.TenantColumn)
	// A row whose tenant the journal could not carry (not valid text) is
	// encoded without one and never sent (rowVisible): count it and say so
	// once per window. The scoped SELECT already leaves such rows out (a
	// token's tenant is valid text); this is the second line.
	t.enc.Guard(0, func(reason string) {
		if reason != decoder.ReasonTenantNotUTF8 {
			return
		}
		st.unknownRows.Add(1)
		st.warn("scope-withheld:"+entity, "snapshot row withheld: its tenant cannot be known", "table", entity, "reason", reason,
			"fix", "store the tenant column's values as valid UTF-8 text")
	})
	return t, nil
}
