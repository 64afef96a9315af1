package journal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
)

// The catalog (DESIGN §5, "The catalog") is what readers may see of each
// published table: its published columns (the publication's column list,
// in attribute order) with their types, nullability and key flags, its
// replica identity, its tenant column, and the publication's row filter.
// walcast run writes it; sync nodes scope snapshots by it and never by
// flags of their own.
//
// Versions: every change walcast run notices is a new row with the next
// version of that table; an unchanged table writes nothing. The newest
// version is the truth. Older versions are kept for people reading the
// history (when did the column list change?) up to CatalogKeepVersions
// per table; older ones are deleted in the transaction that writes a new
// one. A table that leaves the publication gets a version with Published
// false, so "no longer published" is as explicit as any other change.

// CatalogKeepVersions is how many versions of one table the catalog keeps.
const CatalogKeepVersions = 32

// Replica identity settings, as CatalogEntry.ReplicaIdentity names them.
const (
	IdentityDefault = "default"
	IdentityFull    = "full"
	IdentityIndex   = "index"
	IdentityNothing = "nothing"
)

// CatalogColumn is one published column.
type CatalogColumn struct {
	Name string `json:"name"`
	// TypeOID is the column's type; BaseSchema and BaseName name the end
	// of its chain of domains for a type at or above 10000, as pgoutput's
	// Type message does (empty for built-in types).
	TypeOID    uint32 `json:"typeOid"`
	BaseSchema string `json:"baseSchema,omitempty"`
	BaseName   string `json:"baseName,omitempty"`
	// Element describes the elements of an array type outside pg_catalog
	// (decoder.ArrayElement); empty when none or unknown.
	ElementSchema string `json:"elementSchema,omitempty"`
	ElementName   string `json:"elementName,omitempty"`
	ElementDelim  byte   `json:"elementDelim,omitempty"`
	NotNull       bool   `json:"notNull,omitempty"`
	// Key marks the replica identity's columns (every column under FULL),
	// as pgoutput's Relation message flags them: they make an envelope's
	// key. PrimaryKey marks the primary key's.
	Key        bool `json:"key,omitempty"`
	PrimaryKey bool `json:"primaryKey,omitempty"`
}

// ColumnInfo is the column as decoder.NewRowEncoder takes it.
func (c CatalogColumn) ColumnInfo() decoder.ColumnInfo {
	return decoder.ColumnInfo{Name: c.Name, TypeOID: c.TypeOID, BaseSchema: c.BaseSchema, BaseName: c.BaseName, Key: c.Key, PrimaryKey: c.PrimaryKey,
		Element: decoder.ArrayElement{Schema: c.ElementSchema, Name: c.ElementName, Delim: c.ElementDelim}}
}

// CatalogEntry is one version of one table's catalog entry.
type CatalogEntry struct {
	Table
	// Version counts the table's versions from 1; set by RecordCatalog.
	Version int64
	// Published is false in the version that records the table leaving
	// the publication; the other fields then repeat the last version's.
	Published bool
	// RelID is the relation's oid: a table dropped and created again under
	// the same name is another table.
	RelID uint32
	// ReplicaIdentity is one of the Identity constants.
	ReplicaIdentity string
	// TenantColumn is walcast run's --tenant-column when the table has that
	// column, "" when it has none (or none is configured).
	TenantColumn string
	// TenantUnscoped says the table has the tenant column but the
	// publication's column list leaves it out: no row's tenant can be
	// known, so its changes are quarantined and no reader gets its rows.
	TenantUnscoped bool
	// RowFilter is the publication's row filter (pg_publication_tables'
	// text), "" for none.
	RowFilter string
	// Columns are the published columns, in attribute order.
	Columns []CatalogColumn
	// TableShape is SourceShape of the table when the entry was read: it
	// changes with any column of the table, published or not, so a reader
	// can tell cheaply that the live table is no longer what the entry
	// describes.
	TableShape string
	// Generation is the fencing generation of the replicator that wrote it;
	// RecordedAt when.
	Generation int64
	RecordedAt time.Time
}

// KeyColumns names the replica identity's columns, in attribute order.
func (e *CatalogEntry) KeyColumns() []string {
	var k []string
	for _, c := range e.Columns {
		if c.Key {
			k = append(k, c.Name)
		}
	}
	return k
}

// ColumnInfos are the columns as decoder.NewRowEncoder takes them.
func (e *CatalogEntry) ColumnInfos() []decoder.ColumnInfo {
	infos := make([]decoder.ColumnInfo, len(e.Columns))
	for i, c := range e.Columns {
		infos[i] = c.ColumnInfo()
	}
	return infos
}

// sameAs reports whether e and o describe the table alike (all but the
// version, generation and time).
func (e *CatalogEntry) sameAs(o *CatalogEntry) bool {
	return e.Table == o.Table && e.Published == o.Published && e.RelID == o.RelID && e.ReplicaIdentity == o.ReplicaIdentity &&
		e.TenantColumn == o.TenantColumn && e.TenantUnscoped == o.TenantUnscoped && e.RowFilter == o.RowFilter &&
		e.TableShape == o.TableShape && slices.Equal(e.Columns, o.Columns)
}

// SourceShapeSQL computes a table's shape in the source database, $1 being
// its oid: a digest of every column it has (name and type, in attribute
// order; generated columns, which pgoutput never sends, left out). The
// replicator stores it in CatalogEntry.TableShape; a reader runs the same
// statement in its own transaction and compares, so one definition serves
// both. NULL when the table does not exist.
const SourceShapeSQL = `SELECT md5(string_agg(a.attname || ':' || a.atttypid::text, ',' ORDER BY a.attnum))
	FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''`

// errCatalogRace: a newer version of the table's entry was written
// between the read and the write; nothing was written. The writer reads
// again.
var errCatalogRace = errors.New("catalog version written concurrently")

// RecordCatalog writes e as the table's newest version unless the newest
// version already says the same; it reports the version that is now the
// newest and whether it wrote it. Fenced like Append: a replicator whose
// generation is no longer current writes nothing and gets ErrFenced.
func (j *Journal) RecordCatalog(ctx context.Context, gen int64, e CatalogEntry) (version int64, wrote bool, err error) {
	const op = "journal.RecordCatalog"
	if e.Columns == nil {
		e.Columns = []CatalogColumn{}
	}
	cols, err := json.Marshal(e.Columns)
	if err != nil {
		return 0, false, opErr(op, err, "")
	}
	var tenant, filter *string
	if e.TenantColumn != "" {
		tenant = &e.TenantColumn
	}
	if e.RowFilter != "" {
		filter = &e.RowFilter
	}
	// An unchanged entry is found by a plain read, which writes nothing:
	// the row lock below would (DESIGN §5: nothing is written while the
	// source is idle).
	if last, ok, err := j.Catalog(ctx, e.Table); err != nil {
		return 0, false, err
	} else if ok && last.sameAs(&e) {
		return last.Version, false, nil
	}
	err = j.inTx(ctx, pgx.TxOptions{}, func(ctx context.Context, tx pgx.Tx) error {
		// The meta row's generation, shared-locked: Acquire (which bumps
		// it) waits for this write, and this write sees its result.
		var cur int64
		if err := tx.QueryRow(ctx, "SELECT generation FROM "+j.sql.meta+" FOR SHARE").Scan(&cur); err != nil {
			return err
		}
		if cur != gen {
			return ErrFenced
		}
		last, ok, err := j.latestCatalog(ctx, tx, e.Schema, e.Name)
		if err != nil {
			return err
		}
		if ok && last.sameAs(&e) {
			version = last.Version
			return nil
		}
		version = last.Version + 1
		tag, err := tx.Exec(ctx, "INSERT INTO "+j.sql.catalog+` (table_schema, table_name, version, published, relid, replica_identity,
			tenant_column, tenant_unscoped, row_filter, columns, table_shape, generation)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT DO NOTHING`,
			e.Schema, e.Name, version, e.Published, int64(e.RelID), e.ReplicaIdentity, tenant, e.TenantUnscoped, filter, string(cols), e.TableShape, gen)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errCatalogRace
		}
		wrote = true
		_, err = tx.Exec(ctx, "DELETE FROM "+j.sql.catalog+" WHERE table_schema = $1 AND table_name = $2 AND version <= $3",
			e.Schema, e.Name, version-CatalogKeepVersions)
		return err
	})
	switch {
	case errors.Is(err, ErrFenced):
		return 0, false, fencedErr(op, gen)
	case err != nil:
		return 0, false, opErr(op, err, "")
	}
	return version, wrote, nil
}

// Catalog returns table's newest catalog entry; ok is false when the
// catalog has none (walcast run never saw the table published).
func (j *Journal) Catalog(ctx context.Context, t Table) (e CatalogEntry, ok bool, err error) {
	const op = "journal.Catalog"
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	c, err := j.pool.acquire(ctx)
	if err != nil {
		return e, false, opErr(op, err, "")
	}
	defer j.pool.release(c)
	e, ok, err = j.latestCatalog(ctx, c, t.Schema, t.Name)
	if err != nil {
		return e, false, opErr(op, err, "")
	}
	return e, ok, nil
}

// CatalogTables returns the newest entry of every table the catalog knows,
// published or not, in name order.
func (j *Journal) CatalogTables(ctx context.Context) ([]CatalogEntry, error) {
	return j.queryCatalog(ctx, "journal.CatalogTables", "SELECT DISTINCT ON (table_schema, table_name) "+catalogColumns+" FROM "+j.sql.catalog+
		" ORDER BY table_schema, table_name, version DESC")
}

// CatalogHistory returns the kept versions of table's entry, oldest first.
func (j *Journal) CatalogHistory(ctx context.Context, t Table) ([]CatalogEntry, error) {
	return j.queryCatalog(ctx, "journal.CatalogHistory", "SELECT "+catalogColumns+" FROM "+j.sql.catalog+
		" WHERE table_schema = $1 AND table_name = $2 ORDER BY version", t.Schema, t.Name)
}

// queryCatalog runs one read of catalog rows (sql selects catalogColumns).
func (j *Journal) queryCatalog(ctx context.Context, op, sql string, args ...any) ([]CatalogEntry, error) {
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	c, err := j.pool.acquire(ctx)
	if err != nil {
		return nil, opErr(op, err, "")
	}
	defer j.pool.release(c)
	rows, err := c.Query(ctx, sql, args...)
	if err != nil {
		return nil, opErr(op, err, "")
	}
	out, err := pgx.CollectRows(rows, scanCatalog)
	if err != nil {
		return nil, opErr(op, err, "")
	}
	return out, nil
}

const catalogColumns = `table_schema, table_name, version, published, relid, replica_identity, tenant_column, tenant_unscoped,
	row_filter, columns::text, table_shape, generation, recorded_at`

func (j *Journal) latestCatalog(ctx context.Context, q querier, schema, table string) (CatalogEntry, bool, error) {
	rows, err := q.Query(ctx, "SELECT "+catalogColumns+" FROM "+j.sql.catalog+
		" WHERE table_schema = $1 AND table_name = $2 ORDER BY version DESC LIMIT 1", schema, table)
	if err != nil {
		return CatalogEntry{}, false, err
	}
	e, err := pgx.CollectExactlyOneRow(rows, scanCatalog)
	if errors.Is(err, pgx.ErrNoRows) {
		return CatalogEntry{}, false, nil
	}
	if err != nil {
		return CatalogEntry{}, false, err
	}
	return e, true, nil
}

func scanCatalog(row pgx.CollectableRow) (CatalogEntry, error) {
	var e CatalogEntry
	var relid int64
	var tenant, filter *string
	var cols string
	if err := row.Scan(&e.Schema, &e.Name, &e.Version, &e.Published, &relid, &e.ReplicaIdentity, &tenant, &e.TenantUnscoped,
		&filter, &cols, &e.TableShape, &e.Generation, &e.RecordedAt); err != nil {
		return e, err
	}
	e.RelID = uint32(relid)
	if tenant != nil {
		e.TenantColumn = *tenant
	}
	if filter != nil {
		e.RowFilter = *filter
	}
	if err := json.Unmarshal([]byte(cols), &e.Columns); err != nil {
		return e, fmt.Errorf("catalog entry of %s version %d: columns: %w", e.Entity(), e.Version, err)
	}
	return e, nil
}
