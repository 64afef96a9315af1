package journal

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The journal's schema: every migration since the first, applied in order
// on Open. The storage form of the entries themselves is in chunks.go.

// migrations are applied in order, each once, under an advisory lock. Never
// edit a released migration; append a new one. %[1]s is the quoted schema.
var migrations = []string{
	1: `
CREATE TABLE %[1]s.meta (
	singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
	journal_id     uuid        NOT NULL,
	created_at     timestamptz NOT NULL DEFAULT now(),
	system_id      text        NOT NULL DEFAULT '',
	timeline       integer     NOT NULL DEFAULT 0,
	slot           text        NOT NULL DEFAULT '',
	generation     bigint      NOT NULL DEFAULT 0,
	watermark      bigint      NOT NULL DEFAULT 0,
	next_seq       bigint      NOT NULL DEFAULT 1,
	resync_seq     bigint      NOT NULL DEFAULT 0,
	appended_bytes bigint      NOT NULL DEFAULT 0
);
COMMENT ON TABLE %[1]s.meta IS 'walcast journal: identity, source, fencing generation, watermark (commit end LSN as bigint), sequence allocator. Locked by every append.';
CREATE TABLE %[1]s.retention (
	singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
	floor        bigint NOT NULL DEFAULT 1,
	pruned_bytes bigint NOT NULL DEFAULT 0
);
CREATE TABLE %[1]s.published (
	singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
	seq       bigint NOT NULL DEFAULT 0
);
CREATE TABLE %[1]s.entity_seqs (
	entity   text PRIMARY KEY,
	last_seq bigint NOT NULL,
	tenanted boolean NOT NULL DEFAULT false
);
CREATE TABLE %[1]s.entries (
	seq            bigint      PRIMARY KEY,
	entity         text        NOT NULL,
	entity_seq     bigint      NOT NULL,
	tenant         text,
	tenant_unknown boolean     NOT NULL,
	op             text        NOT NULL,
	key_hash       bigint,
	key            text,
	lsn            bigint      NOT NULL,
	commit_lsn     bigint      NOT NULL,
	xid            bigint      NOT NULL,
	commit_time    timestamptz NOT NULL,
	size           integer     NOT NULL,
	envelope       text        NOT NULL
);
-- The primary key on seq is the only index every append pays for; reads by
-- entity scan a bounded seq window instead of an entity index (see
-- scanWindow). REPLICA IDENTITY FULL keeps pruning legal should a FOR ALL
-- TABLES publication cover this table.
ALTER TABLE %[1]s.entries REPLICA IDENTITY FULL;
CREATE INDEX entries_key_hash ON %[1]s.entries (key_hash, seq) WHERE key_hash IS NOT NULL;
COMMENT ON COLUMN %[1]s.entries.key_hash IS 'set only for entities that carry tenants: finds the newest change of a key to route a key-only delete';
`,
	2: `
ALTER TABLE %[1]s.meta ADD COLUMN epoch bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN %[1]s.meta.epoch IS 'the current epoch: changes (to a random value) whenever the history readers saw may differ from the journal''s, so cursors and message ids of another epoch resync';
CREATE TABLE %[1]s.epochs (
	epoch      bigint      PRIMARY KEY,
	first_seq  bigint      NOT NULL,
	started_at timestamptz NOT NULL DEFAULT now(),
	reason     text        NOT NULL DEFAULT ''
);
COMMENT ON TABLE %[1]s.epochs IS 'walcast journal: every epoch, from its first seq (the entries from first_seq up to the next epoch''s first_seq belong to it)';
INSERT INTO %[1]s.epochs (epoch, first_seq, reason) VALUES (0, 1, 'journal created');
`,
	3: `
CREATE TABLE %[1]s.snapshots (
	id               bigserial   PRIMARY KEY,
	table_schema     text        NOT NULL,
	table_name       text        NOT NULL,
	where_sql        text        NOT NULL DEFAULT '',
	chunk_size       integer     NOT NULL DEFAULT 4096 CHECK (chunk_size BETWEEN 1 AND 100000),
	status           text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'done', 'cancelled', 'failed')),
	cancel_requested boolean     NOT NULL DEFAULT false,
	last_key         text[],
	rows             bigint      NOT NULL DEFAULT 0,
	chunks           bigint      NOT NULL DEFAULT 0,
	error            text        NOT NULL DEFAULT '',
	requested_at     timestamptz NOT NULL DEFAULT now(),
	started_at       timestamptz,
	updated_at       timestamptz,
	finished_at      timestamptz
);
CREATE INDEX snapshots_open ON %[1]s.snapshots (id) WHERE status IN ('pending', 'running');
COMMENT ON TABLE %[1]s.snapshots IS 'walcast snapshots: one row per request (INSERT (table_schema, table_name[, where_sql, chunk_size]) to ask for one, from any transaction); the active walcast run takes them in id order; last_key, rows and chunks advance in the journal transaction that carries each chunk';
`,
	4: `
ALTER TABLE %[1]s.meta ADD COLUMN publication_recorded boolean NOT NULL DEFAULT false;
ALTER TABLE %[1]s.snapshots ADD COLUMN estimated_rows bigint;
COMMENT ON COLUMN %[1]s.snapshots.estimated_rows IS 'the table''s row estimate (pg_class.reltuples) when the snapshot started, for walcast snapshot status''s ETA';
CREATE TABLE %[1]s.publication_tables (
	table_schema text NOT NULL,
	table_name   text NOT NULL,
	PRIMARY KEY (table_schema, table_name)
);
COMMENT ON TABLE %[1]s.publication_tables IS 'walcast: the publication''s tables as walcast run last recorded them (--snapshot-new-tables snapshots a table that appears in the publication and not here)';
`,
	5: `
ALTER TABLE %[1]s.snapshots ADD COLUMN shape text NOT NULL DEFAULT '';
COMMENT ON COLUMN %[1]s.snapshots.shape IS 'a digest of what the publication sent of a row (columns, types, row filter) when the last journaled chunk was read: a snapshot resumed under another shape starts over';
`,
	6: `
ALTER TABLE %[1]s.published
	ADD COLUMN epoch      bigint NOT NULL DEFAULT 0,
	ADD COLUMN stream     text   NOT NULL DEFAULT '',
	ADD COLUMN stream_seq bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN %[1]s.published.stream IS 'JetStream mode: the stream (name@created) the published position was saved against; empty when unknown (core NATS, or saved before this column): then stream_seq and epoch mean nothing';
COMMENT ON COLUMN %[1]s.published.stream_seq IS 'JetStream mode: the stream''s last sequence when it held every entry up to seq and none after; with no other writer the stream stores entry seq+k at stream_seq+k';
COMMENT ON COLUMN %[1]s.published.epoch IS 'JetStream mode: the journal epoch of the entries the publisher read when it saved the position';
`,
	7: `
CREATE TABLE %[1]s.catalog (
	table_schema     text        NOT NULL,
	table_name       text        NOT NULL,
	version          bigint      NOT NULL CHECK (version > 0),
	published        boolean     NOT NULL,
	relid            bigint      NOT NULL,
	replica_identity text        NOT NULL,
	tenant_column    text,
	tenant_unscoped  boolean     NOT NULL DEFAULT false,
	row_filter       text,
	columns          jsonb       NOT NULL,
	table_shape      text        NOT NULL DEFAULT '',
	generation       bigint      NOT NULL,
	recorded_at      timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (table_schema, table_name, version)
);
COMMENT ON TABLE %[1]s.catalog IS 'walcast catalog: per published table, what readers may see of it (published columns with types, nullability and key flags, replica identity, tenant column, row filter), one row per version as walcast run noticed it change; the newest version is the truth, older ones are kept up to a bound (journal/catalog.go)';
`,
	8: `
ALTER TABLE %[1]s.entries ADD COLUMN xid8 bigint;
COMMENT ON COLUMN %[1]s.entries.xid8 IS 'the source transaction''s full 64-bit id (xid8; xid holds the 32 bits pgoutput and the envelope carry); 0 for an entry of no transaction (xid 0); NULL when unknown (entries journaled before this column existed): sync nodes compare them by xid alone, as before';
`,
	9: migrationChunks,
}

// advisoryClass is the first key of the migration advisory lock ("walc").
const advisoryClass = 0x77616c63

// checkSchema is migrate for a read-only Open: it finds the journal at
// exactly this walcast's schema version and reads its id, writing nothing.
func (j *Journal) checkSchema(ctx context.Context) error {
	const op = "journal.Open"
	schemaQ := pgx.Identifier{j.schema}.Sanitize()
	var have *int
	err := j.queryRow(ctx, "SELECT CASE WHEN to_regclass($1) IS NULL THEN NULL ELSE (SELECT coalesce(max(version), 0) FROM "+j.sql.migrations+") END",
		[]any{j.sql.migrations}, &have)
	if err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
			return opErr(op, fmt.Errorf("read journal schema %s: %w", schemaQ, err), migrateFix(err))
		}
		have = nil // the table vanished between the two checks
	}
	want := len(migrations) - 1
	switch {
	case have == nil || *have == 0:
		return &Error{Op: op, Err: fmt.Errorf("%w: schema %s holds no journal", ErrNoJournal, schemaQ),
			Fix: "check --journal-url and --journal-schema; walcast run creates the journal when it first starts"}
	case *have > want:
		return &Error{Op: op, Err: fmt.Errorf("%w: schema %s is at version %d, this walcast knows up to %d", ErrSchemaTooNew, schemaQ, *have, want),
			Fix: "use the walcast version that migrated the journal"}
	case *have < want:
		return &Error{Op: op, Err: fmt.Errorf("%w: schema %s is at version %d, this walcast reads version %d", ErrSchemaTooOld, schemaQ, *have, want),
			Fix: "start this version's walcast run (or walcast sync) once: it migrates the journal; or use the walcast version that runs against it"}
	}
	if err := j.queryRow(ctx, "SELECT journal_id FROM "+j.sql.meta, nil, &j.id); err != nil {
		return opErr(op, fmt.Errorf("read journal id in schema %s: %w", schemaQ, err), migrateFix(err))
	}
	return nil
}

func (j *Journal) migrate(ctx context.Context) error {
	const op = "journal.Open"
	schemaQ := pgx.Identifier{j.schema}.Sanitize()
	err := j.inTx(ctx, pgx.TxOptions{}, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext($2))", advisoryClass, j.schema); err != nil {
			return err
		}
		// Create the schema only when it is missing: CREATE SCHEMA checks the
		// database CREATE privilege even with IF NOT EXISTS, and a role that
		// was given an existing schema (deploy/postgres/setup.sql) need not
		// have it.
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", j.schema).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA "+schemaQ); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+j.sql.migrations+
			" (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"); err != nil {
			return err
		}
		var have int
		if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+j.sql.migrations).Scan(&have); err != nil {
			return err
		}
		want := len(migrations) - 1
		if have > want {
			return &Error{Op: op, Err: fmt.Errorf("%w: schema %s is at version %d, this walcast knows up to %d", ErrSchemaTooNew, schemaQ, have, want),
				Fix: "upgrade walcast to the version that migrated the journal"}
		}
		for v := have + 1; v <= want; v++ {
			if _, err := tx.Exec(ctx, fmt.Sprintf(migrations[v], schemaQ)); err != nil {
				return fmt.Errorf("migration %d: %w", v, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+j.sql.migrations+" (version) VALUES ($1)", v); err != nil {
				return err
			}
		}
		var id [16]byte
		if _, err := rand.Read(id[:]); err != nil {
			return err
		}
		id[6] = id[6]&0x0f | 0x40 // UUID version 4
		id[8] = id[8]&0x3f | 0x80
		for _, s := range []string{
			"INSERT INTO " + j.sql.meta + " (journal_id) VALUES ($1) ON CONFLICT DO NOTHING",
			"INSERT INTO " + j.sql.retention + " DEFAULT VALUES ON CONFLICT DO NOTHING",
			"INSERT INTO " + j.sql.published + " DEFAULT VALUES ON CONFLICT DO NOTHING",
		} {
			args := []any{}
			if strings.Contains(s, "$1") {
				args = append(args, id)
			}
			if _, err := tx.Exec(ctx, s, args...); err != nil {
				return err
			}
		}
		return tx.QueryRow(ctx, "SELECT journal_id FROM "+j.sql.meta).Scan(&j.id)
	})
	if err != nil {
		var je *Error
		if errors.As(err, &je) {
			return err
		}
		return opErr(op, fmt.Errorf("create or migrate journal schema %s: %w", schemaQ, err), migrateFix(err))
	}
	return nil
}
