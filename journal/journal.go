package journal

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
)

// DefaultSchema is the schema the journal lives in unless Config.Schema says
// otherwise.
const DefaultSchema = "walcast"

// MinSecretLen is the shortest cursor secret accepted, in bytes.
const MinSecretLen = 16

// Config configures a Journal. The zero value is not usable: set URL or Pool.
type Config struct {
	// URL is a libpq URL or DSN of the journal database. Ignored when
	// ConnConfig is set.
	URL string
	// ConnConfig, when set, is used (copied) for every connection instead of
	// parsing URL: for callers that set TLS or a dialer themselves.
	ConnConfig *pgx.ConnConfig
	// MaxConns bounds the journal's pool of connections (the LISTEN
	// connection of Wait comes on top). Default 8.
	MaxConns int
	// Schema holds the journal's tables; default DefaultSchema. Any name is
	// safe: it is always quoted.
	Schema string
	// CallTimeout limits every journal call; default DefaultCallTimeout.
	// A call other than an append fails when it takes longer; any call,
	// appends included, fails when no byte moves on its connection for
	// that long (an append of a huge transaction may take longer in all,
	// as long as it keeps streaming). The session settings derive from it:
	// statement_timeout (not for appends), lock_timeout (half of it),
	// idle_in_transaction_session_timeout, TCP keepalives and
	// tcp_user_timeout; connecting is limited to min(CallTimeout, 10 s)
	// unless the URL sets connect_timeout. See applyLimits.
	CallTimeout time.Duration

	// CursorSecret is the HMAC-SHA256 key cursors are signed with, at least
	// MinSecretLen bytes. Empty means this process issues and reads no
	// cursors (a replicator that only appends); Changes then fails with
	// ErrNoCursorSecret.
	CursorSecret []byte
	// PreviousCursorSecrets are rotated-out secrets. A cursor that verifies
	// under one of them is answered with a resync (ResyncSecretRotated)
	// instead of an error, so rotating the secret costs clients a refetch, not
	// an error page. A cursor that verifies under no known secret is rejected
	// as tampered: keep a secret here for as long as clients may hold cursors
	// signed with it.
	PreviousCursorSecrets [][]byte
	// RejectForeignJournal makes an authentic cursor issued by a different
	// journal an error (ErrForeignJournal) instead of a resync. Set it when
	// several journals share one cursor secret and a client presenting
	// another journal's cursor is a misconfiguration rather than a journal
	// that was recreated.
	RejectForeignJournal bool
}

// Journal is an open journal. Its methods are safe for concurrent use.
type Journal struct {
	pool    *connPool
	connCfg *pgx.ConnConfig
	limits  limits
	schema  string
	sql     statements
	id      [16]byte
	channel string // NOTIFY channel

	secrets       [][]byte // [0] is current; nil when no secret configured
	rejectForeign bool

	// appendMu serializes this process's appends and guards the following
	// fields. (The meta row lock serializes appends across processes.)
	appendMu     sync.Mutex
	cache        appendCache
	keys         keyTenants // keycache.go
	recent       recentLog  // this process's newest appends, for ReadAfter (recent.go); has its own lock
	oneShotBytes int        // batches encoding larger are streamed (tests lower it)

	lmu      sync.Mutex // guards the following fields
	closed   bool
	listener *listener // started by the first Wait; stopped by Close
}

// Open connects to the journal database, creates or migrates the schema and
// returns the journal. Two processes may open the same journal at once.
func Open(ctx context.Context, cfg Config) (*Journal, error) {
	const op = "journal.Open"
	if cfg.Schema == "" {
		cfg.Schema = DefaultSchema
	}
	if len(cfg.Schema) > 63 {
		return nil, opErr(op, fmt.Errorf("schema name %q is longer than 63 bytes", cfg.Schema), "choose a shorter --journal-schema")
	}
	if strings.IndexByte(cfg.Schema, 0) >= 0 {
		return nil, opErr(op, errors.New("schema name contains a NUL byte"), "choose another --journal-schema")
	}
	var secrets [][]byte
	if len(cfg.CursorSecret) > 0 {
		secrets = append(secrets, append([]byte(nil), cfg.CursorSecret...))
		for _, s := range cfg.PreviousCursorSecrets {
			secrets = append(secrets, append([]byte(nil), s...))
		}
		for _, s := range secrets {
			if len(s) < MinSecretLen {
				return nil, opErr(op, fmt.Errorf("cursor secret is %d bytes, want at least %d", len(s), MinSecretLen),
					"set --cursor-secret to a random string of at least 32 characters (e.g. openssl rand -hex 32)")
			}
		}
	} else if len(cfg.PreviousCursorSecrets) > 0 {
		return nil, opErr(op, errors.New("previous cursor secrets given without a current one"), "set --cursor-secret")
	}

	connCfg := cfg.ConnConfig
	fromURL := connCfg == nil
	if connCfg == nil {
		var err error
		connCfg, err = pgx.ParseConfig(cfg.URL)
		if err != nil {
			return nil, opErr(op, fmt.Errorf("parse journal URL: %w", err), "check --journal-url (a libpq URL or DSN)")
		}
	} else {
		connCfg = connCfg.Copy()
	}
	// JIT compilation costs tens of milliseconds and never pays off for the
	// journal's short, indexed statements.
	if connCfg.RuntimeParams == nil {
		connCfg.RuntimeParams = map[string]string{}
	}
	connCfg.RuntimeParams["jit"] = "off"
	lim := limitsFor(cfg.CallTimeout)
	applyLimits(connCfg, lim, fromURL)
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 8
	}
	j := &Journal{
		pool:          newConnPool(connCfg, lim, cfg.MaxConns),
		connCfg:       connCfg,
		limits:        lim,
		schema:        cfg.Schema,
		sql:           newStatements(cfg.Schema),
		secrets:       secrets,
		rejectForeign: cfg.RejectForeignJournal,
		oneShotBytes:  defaultOneShotBytes,
		keys:          keyTenants{max: keyCacheBytes},
	}
	sum := sha256.Sum256([]byte(cfg.Schema))
	j.channel = "walcast_journal_" + hex.EncodeToString(sum[:12])
	if err := j.migrate(ctx); err != nil {
		j.Close()
		return nil, err
	}
	return j, nil
}

// Close stops the journal's listener, if any, and closes its connections.
// Calls in flight finish first (their connections are closed on release).
// It is idempotent.
func (j *Journal) Close() { j.close(false) }

// CloseNow is Close that also breaks the connections of calls in flight:
// they fail at once (an append whose COMMIT was in flight has an unknown
// outcome, which replays make harmless). For a shutdown that must not wait
// for an unresponsive journal database. Safe to call after or with Close.
func (j *Journal) CloseNow() { j.close(true) }

func (j *Journal) close(abort bool) {
	if abort {
		// Break calls in flight even when Close already ran.
		j.pool.close(true)
	}
	j.lmu.Lock()
	if j.closed {
		j.lmu.Unlock()
		return
	}
	j.closed = true
	l := j.listener
	j.listener = nil
	j.lmu.Unlock()
	if l != nil {
		l.stop()
	}
	j.pool.close(abort)
}

// ID is the journal id: random, created with the schema, and part of every
// cursor and message id the journal issues.
func (j *Journal) ID() [16]byte { return j.id }

// Epochs (DESIGN §5). A journal's history is what its entries say, seq by
// seq; readers remember positions in it (cursors, sync nodes' positions,
// JetStream's dedup window). When the journal's history may differ from
// what readers saw — it was restored from a backup, its database failed
// over and lost a tail, or the source's slot was lost and recreated — seqs
// that readers already saw are assigned again to other changes. Every such
// reset is journaled as a resync entry that starts a new epoch: a random
// non-zero value (never the successor of the old one, which a restored
// journal could assign a second time). A journal's first epoch is 0.
// Cursors carry the epoch they were issued in and any other epoch gets a
// resync; NATS message ids carry the epoch of their entry, so the same seq
// in two epochs is two messages.

// EpochHex formats an epoch as 16 lower-case hex digits, as in NATS message
// ids and the Walcast-Epoch header.
func EpochHex(e int64) string {
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[e&0xf]
		e >>= 4
	}
	return string(b[:])
}

// newEpoch returns a random epoch: positive, non-zero.
func newEpoch() (int64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, err
	}
	e := int64(binary.BigEndian.Uint64(b[:]) >> 1)
	if e == 0 {
		e = 1
	}
	return e, nil
}

// Schema is the schema the journal lives in.
func (j *Journal) Schema() string { return j.schema }

// statements holds the SQL with the schema's quoted name spliced in.
type statements struct {
	meta, retention, entitySeqs, entries, published, migrations, epochs, snapshots, publicationTables, catalog string
	entriesIdent                                                                                               pgx.Identifier
}

func newStatements(schema string) statements {
	q := func(t string) string { return pgx.Identifier{schema, t}.Sanitize() }
	return statements{
		meta:              q("meta"),
		retention:         q("retention"),
		entitySeqs:        q("entity_seqs"),
		entries:           q("entries"),
		published:         q("published"),
		migrations:        q("migrations"),
		epochs:            q("epochs"),
		snapshots:         q("snapshots"),
		publicationTables: q("publication_tables"),
		catalog:           q("catalog"),
		entriesIdent:      pgx.Identifier{schema, "entries"},
	}
}

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
}

// advisoryClass is the first key of the migration advisory lock ("walc").
const advisoryClass = 0x77616c63

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

// Source identifies the replication source the journal follows. The
// replicator compares it with IDENTIFY_SYSTEM and its slot before resuming
// (DESIGN §4.6). The zero value means "not recorded yet".
type Source struct {
	SystemID string // IDENTIFY_SYSTEM systemid
	Timeline int32  // IDENTIFY_SYSTEM timeline
	Slot     string // replication slot name
}

// State is a consistent snapshot of the journal's bookkeeping.
type State struct {
	JournalID  [16]byte
	Source     Source
	Generation int64
	Epoch      int64       // current epoch (Epoch)
	EpochSeq   int64       // first seq of the current epoch
	Watermark  decoder.LSN // last journaled commit end LSN
	Horizon    int64       // newest assigned seq; 0 when empty
	Floor      int64       // oldest retained seq (Horizon+1 when nothing was ever appended)
	ResyncSeq  int64       // seq of the newest resync entry; 0 if none
	Published  int64       // newest seq the publisher reported (SetPublished)
	Rows       int64       // retained entries
	Bytes      int64       // retained envelope bytes
}

// State reads the journal's bookkeeping in one snapshot.
func (j *Journal) State(ctx context.Context) (State, error) {
	var s State
	var wm int64
	err := j.queryRow(ctx, `SELECT m.journal_id, m.system_id, m.timeline, m.slot, m.generation, m.epoch,
		coalesce((SELECT first_seq FROM `+j.sql.epochs+` WHERE epoch = m.epoch), 1), m.watermark,
		m.next_seq - 1, r.floor, m.resync_seq, p.seq, m.next_seq - r.floor, m.appended_bytes - r.pruned_bytes
		FROM `+j.sql.meta+` m, `+j.sql.retention+` r, `+j.sql.published+` p`, nil,
		&s.JournalID, &s.Source.SystemID, &s.Source.Timeline, &s.Source.Slot, &s.Generation, &s.Epoch, &s.EpochSeq, &wm,
		&s.Horizon, &s.Floor, &s.ResyncSeq, &s.Published, &s.Rows, &s.Bytes)
	if err != nil {
		return State{}, opErr("journal.State", err, "")
	}
	s.Watermark = decoder.LSN(wm)
	return s, nil
}

// Watermark returns the commit end LSN of the newest journaled source
// transaction: the position the replicator may acknowledge and resume from.
func (j *Journal) Watermark(ctx context.Context) (decoder.LSN, error) {
	var wm int64
	if err := j.queryRow(ctx, "SELECT watermark FROM "+j.sql.meta, nil, &wm); err != nil {
		return 0, opErr("journal.Watermark", err, "")
	}
	return decoder.LSN(wm), nil
}

// Source returns the recorded replication source.
func (j *Journal) Source(ctx context.Context) (Source, error) {
	var s Source
	if err := j.queryRow(ctx, "SELECT system_id, timeline, slot FROM "+j.sql.meta, nil, &s.SystemID, &s.Timeline, &s.Slot); err != nil {
		return Source{}, opErr("journal.Source", err, "")
	}
	return s, nil
}

// SetSource records the replication source. Like Append it is refused with
// ErrFenced unless gen is the current generation.
func (j *Journal) SetSource(ctx context.Context, gen int64, s Source) error {
	const op = "journal.SetSource"
	tag, err := j.exec(ctx, "UPDATE "+j.sql.meta+" SET system_id = $2, timeline = $3, slot = $4 WHERE generation = $1 AND $1 > 0",
		gen, s.SystemID, s.Timeline, s.Slot)
	if err != nil {
		return opErr(op, err, "")
	}
	if tag.RowsAffected() == 0 {
		return fencedErr(op, gen)
	}
	return nil
}

// SetPublished records that every entry up to seq has been published. It
// never moves the position backwards. It forgets the stream position
// (SetPublishedStream): whatever was published with it was not counted in
// a stream.
//
// Its commit does not wait for the disk (synchronous_commit off for this
// transaction only): the position is only where a restarted publisher
// resumes, and republished copies carry the same message ids, so a
// position lost with a server crash costs at most a few hundred
// milliseconds of republishing — while waiting for the flush held the
// publisher, and every change behind it, for a disk flush several times a
// second under a steady load.
func (j *Journal) SetPublished(ctx context.Context, seq int64) error {
	sql := "BEGIN; SET LOCAL synchronous_commit = off; UPDATE " + j.sql.published + " SET seq = greatest(seq, " +
		strconv.FormatInt(seq, 10) + "), epoch = 0, stream = '', stream_seq = 0; COMMIT"
	if _, err := j.exec(ctx, sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		return opErr("journal.SetPublished", err, "")
	}
	return nil
}

// Published returns the position last recorded with SetPublished (0 if none).
func (j *Journal) Published(ctx context.Context) (int64, error) {
	var seq int64
	if err := j.queryRow(ctx, "SELECT seq FROM "+j.sql.published, nil, &seq); err != nil {
		return 0, opErr("journal.Published", err, "")
	}
	return seq, nil
}

// StreamPosition is a published position in JetStream mode: how far the
// journal was stored in a stream, and where in the stream. The stream
// held every entry up to Seq, and nothing after it, when its last
// sequence was StreamSeq; with no other writer, and entries stored in
// seq order after their predecessors (Nats-Expected-Last-Sequence), entry
// Seq+k is then stored at StreamSeq+k. So a stream whose messages are all
// gone still tells, by its last sequence, how many entries after Seq it
// stored.
type StreamPosition struct {
	Seq   int64 // every entry up to Seq is stored in the stream
	Epoch int64 // the journal epoch of the entries read when it was saved
	// Stream identifies the stream (the publisher's choice: its name and
	// creation time); "" when no stream position is known (a journal of
	// an older walcast, or one last saved with SetPublished).
	Stream    string
	StreamSeq uint64 // the stream's last sequence with Seq stored
}

// SetPublishedStream records p as the published position, with the stream
// position it was stored at. Unlike SetPublished it may move Seq
// backwards: the caller states what the stream holds (after a journal
// epoch change, entries after the new epoch's first seq are published
// again). Like SetPublished its commit does not wait for the disk: a
// position lost with a server crash leaves the one saved before it, which
// was true when saved, and the count from there stays exact.
func (j *Journal) SetPublishedStream(ctx context.Context, p StreamPosition) error {
	if p.Stream == "" || p.StreamSeq > math.MaxInt64 {
		return opErr("journal.SetPublishedStream", fmt.Errorf("invalid stream position %+v", p), "")
	}
	sql := "BEGIN; SET LOCAL synchronous_commit = off; UPDATE " + j.sql.published +
		" SET seq = $1, epoch = $2, stream = $3, stream_seq = $4; COMMIT"
	if _, err := j.exec(ctx, sql, pgx.QueryExecModeSimpleProtocol, p.Seq, p.Epoch, p.Stream, int64(p.StreamSeq)); err != nil {
		return opErr("journal.SetPublishedStream", err, "")
	}
	return nil
}

// PublishedStream returns the position last recorded, with the stream
// position SetPublishedStream saved with it (Stream "" when none is
// known).
func (j *Journal) PublishedStream(ctx context.Context) (StreamPosition, error) {
	var p StreamPosition
	var streamSeq int64
	if err := j.queryRow(ctx, "SELECT seq, epoch, stream, stream_seq FROM "+j.sql.published, nil,
		&p.Seq, &p.Epoch, &p.Stream, &streamSeq); err != nil {
		return StreamPosition{}, opErr("journal.PublishedStream", err, "")
	}
	if p.Stream != "" {
		p.StreamSeq = uint64(streamSeq)
	}
	return p, nil
}
