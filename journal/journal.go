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
	// ReadOnly opens an existing journal without creating or migrating
	// it, for commands that only read (walcast types, tail, snapshot
	// status): a journal that is missing, or at another schema version
	// than this walcast's, is an error saying what to run, and nothing is
	// written to the database.
	ReadOnly bool
	// ReadURL, when set, is a libpq URL or DSN of a physical standby of
	// the journal's server: the reads that serve readers (Changes,
	// EntryAt, EntityProgress, Entities, FirstSeqInvisible,
	// FirstSeqAfterLSN) go there, everything else (migrations, appends,
	// LISTEN, the epoch, watermark and meta reads a reader bases
	// correctness decisions on) to URL. See replica.go for what a lagging
	// standby may and may not answer. Ignored when ReadConnConfig is set.
	ReadURL string
	// ReadConnConfig is ReadURL for callers that build the connection
	// configuration themselves.
	ReadConnConfig *pgx.ConnConfig
	// ReadMaxWait is how long a read that must see a seq the standby has
	// not replayed yet waits for it before it is made on the journal's
	// server instead; default DefaultReadMaxWait, negative: no wait.
	ReadMaxWait time.Duration

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
	replica *replica // nil without Config.ReadURL (replica.go)
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
	open := j.migrate
	if cfg.ReadOnly {
		open = j.checkSchema
	}
	if err := open(ctx); err != nil {
		j.Close()
		return nil, err
	}
	if cfg.ReadURL != "" || cfg.ReadConnConfig != nil {
		if err := j.openReplica(ctx, cfg, lim); err != nil {
			j.Close()
			return nil, err
		}
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
		if j.replica != nil {
			j.replica.pool.close(true)
		}
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
	if j.replica != nil {
		j.replica.pool.close(abort)
	}
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
	meta, retention, entitySeqs, entries, chunks, published, migrations, epochs, snapshots, publicationTables, catalog string
}

func newStatements(schema string) statements {
	q := func(t string) string { return pgx.Identifier{schema, t}.Sanitize() }
	return statements{
		meta:              q("meta"),
		retention:         q("retention"),
		entitySeqs:        q("entity_seqs"),
		entries:           q("entries"),
		chunks:            q("chunks"),
		published:         q("published"),
		migrations:        q("migrations"),
		epochs:            q("epochs"),
		snapshots:         q("snapshots"),
		publicationTables: q("publication_tables"),
		catalog:           q("catalog"),
	}
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
