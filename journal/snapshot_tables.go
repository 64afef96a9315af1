package journal

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
)

// Table names a source table.
type Table struct{ Schema, Name string }

// Entity is the table's entity name.
func (t Table) Entity() string { return decoder.EntityName(t.Schema, t.Name) }

// snapshotRequestsSQL inserts reqs into the snapshots table: a
// data-modifying statement for finishSQL's WITH list, values inlined as
// there.
func (j *Journal) snapshotRequestsSQL(reqs []SnapshotRequest) string {
	var b strings.Builder
	b.WriteString("INSERT INTO " + j.sql.snapshots + " (table_schema, table_name, where_sql, chunk_size) VALUES ")
	for n, r := range reqs {
		cs := r.ChunkSize
		if cs <= 0 {
			cs = DefaultSnapshotChunkSize
		}
		cs = min(cs, MaxSnapshotChunkSize)
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(" + textLit(r.Schema) + "," + textLit(r.Table) + "," + textLit(r.Where) + "," + strconv.Itoa(cs) + ")")
	}
	return b.String()
}

// publishedTablesSQL is the WITH list entries (each starting with ", ")
// that make the recorded publication tables equal tables: the rows not in
// it are deleted, the new ones inserted (two disjoint sets, so the
// statements cannot interfere). finishSQL marks the set recorded in the
// meta row's UPDATE.
func (j *Journal) publishedTablesSQL(tables []Table) string {
	var vals strings.Builder
	for n, t := range tables {
		if n > 0 {
			vals.WriteByte(',')
		}
		vals.WriteString("(" + textLit(t.Schema) + "," + textLit(t.Name) + ")")
	}
	if len(tables) == 0 {
		return ", ptd AS (DELETE FROM " + j.sql.publicationTables + ")"
	}
	return ", ptd AS (DELETE FROM " + j.sql.publicationTables + " WHERE (table_schema, table_name) NOT IN (VALUES " + vals.String() + "))" +
		", pti AS (INSERT INTO " + j.sql.publicationTables + " (table_schema, table_name) VALUES " + vals.String() + " ON CONFLICT DO NOTHING)"
}

// PublishedTables returns the publication's tables as last recorded
// (Bootstrap, RecordPublishedTables), and whether a set was ever recorded.
func (j *Journal) PublishedTables(ctx context.Context) (tables []Table, recorded bool, err error) {
	const op = "journal.PublishedTables"
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	c, err := j.pool.acquire(ctx)
	if err != nil {
		return nil, false, opErr(op, err, "")
	}
	defer j.pool.release(c)
	if err := c.QueryRow(ctx, "SELECT publication_recorded FROM "+j.sql.meta).Scan(&recorded); err != nil {
		return nil, false, opErr(op, err, "")
	}
	rows, err := c.Query(ctx, "SELECT table_schema, table_name FROM "+j.sql.publicationTables+" ORDER BY 1, 2")
	if err != nil {
		return nil, false, opErr(op, err, "")
	}
	var t Table
	if _, err := pgx.ForEachRow(rows, []any{&t.Schema, &t.Name}, func() error { tables = append(tables, t); return nil }); err != nil {
		return nil, false, opErr(op, err, "")
	}
	return tables, recorded, nil
}

// RecordPublishedTables records tables as the publication's tables and,
// in the same journal transaction, the snapshot requests reqs (for the
// tables that are new to it). Fenced like Append.
func (j *Journal) RecordPublishedTables(ctx context.Context, gen int64, tables []Table, reqs []SnapshotRequest) error {
	wm, err := j.Watermark(ctx)
	if err != nil {
		return err
	}
	if tables == nil {
		tables = []Table{}
	}
	// An append of no entry at the current watermark: the bookkeeping
	// statement carries the table set and the requests.
	tx := decoder.NewTransaction(0, wm, wm, time.Time{}, nil)
	_, err = j.append(withAppendMode(ctx), "journal.RecordPublishedTables", gen, []*decoder.Transaction{tx}, appendOpts{force: true, tables: &tables, requests: reqs})
	return err
}
