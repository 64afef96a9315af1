package journaltest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Backup copies every table of the journal schema in the database at url
// into a backup schema and returns a function that restores them: the
// journal's tables get back exactly the rows they held at the backup, as a
// restore of a database backup would give them (sequences of the journal
// are columns of its meta row, so the copy is the whole state). Tests use
// it for "the journal database was restored from a backup".
func Backup(ctx context.Context, url, schema string) (restore func(context.Context) error, err error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename", schema)
	if err != nil {
		return nil, err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	if len(tables) == 0 {
		return nil, fmt.Errorf("journaltest: schema %q has no tables", schema)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1 || '_backup_%'", schema).Scan(&n); err != nil {
		return nil, err
	}
	bk := fmt.Sprintf("%s_backup_%d", schema, n+1)
	q := func(s, t string) string { return pgx.Identifier{s, t}.Sanitize() }
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL REPEATABLE READ")
	b.Queue("CREATE SCHEMA " + pgx.Identifier{bk}.Sanitize())
	for _, t := range tables {
		b.Queue("CREATE TABLE " + q(bk, t) + " AS TABLE " + q(schema, t))
	}
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("journaltest: backup: %w", err)
	}
	return func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		for _, t := range tables {
			b.Queue("LOCK TABLE " + q(schema, t) + " IN ACCESS EXCLUSIVE MODE")
		}
		for _, t := range tables {
			b.Queue("DELETE FROM " + q(schema, t))
			b.Queue("INSERT INTO " + q(schema, t) + " TABLE " + q(bk, t))
		}
		b.Queue("COMMIT")
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("journaltest: restore: %w", err)
		}
		return nil
	}, nil
}
