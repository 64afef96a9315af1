// Package replication owns the replication connection: it takes the advisory
// lock that makes one walcast the active replicator of a slot (others wait as
// standbys), checks where the stream must resume, creates the slot, streams
// pgoutput through the decoder into the journal and acknowledges to Postgres
// only what the journal holds (persist-before-ack). It also runs the
// preflight checks of `walcast verify`.
//
// It must not publish to NATS or serve clients: that is fanout's job, driven
// by the journal.
package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/backoff"
	"github.com/walcast/walcast/journal"
)

// healthySession is how long a session must stream before its failure
// counts as a fresh start for the reconnect backoff.
const healthySession = 10 * time.Second

// closeTimeout bounds the clean close of the replication connection.
const closeTimeout = 5 * time.Second

// ErrSlotHeld is returned by Run when another replicator holds the slot's
// lock and Config.Standby is false.
var ErrSlotHeld = errors.New("another walcast run holds the replication slot")

// Config configures a Replicator. Zero fields take the defaults noted.
type Config struct {
	DatabaseURL   string // source database (required)
	Publication   string // required
	Slot          string // default "walcast"
	TenantColumn  string
	MessagePrefix string // default "walcast."
	// MaxEnvelopeBytes bounds one change's envelope; a larger change is
	// journaled as a quarantine entry (decoder.Config.MaxEnvelopeBytes;
	// default decoder.DefaultMaxEnvelopeBytes, 64 MiB).
	MaxEnvelopeBytes int
	// Standby makes Run wait while another instance holds the slot; when
	// false Run returns ErrSlotHeld instead.
	Standby bool
	// RecreateLostSlot lets Run recreate a lost or vanished slot, journaling a
	// resync entry; otherwise such a gap stops Run with a CodeSlotLost error.
	RecreateLostSlot bool

	// Snapshots (DESIGN §4; replication/snapshot.go). SnapshotInitial
	// requests a snapshot of every published table when the journal is
	// fresh (in the transaction that bootstraps it). SnapshotNewTables
	// snapshots a table once it appears in the publication while walcast
	// runs (checked every publicationPoll).
	// ResnapshotAfterResync requests a snapshot of every published table
	// with the resync entry of --recreate-lost-slot, so consumers rebuild
	// from the stream alone. SnapshotParallel is how many tables are read
	// at once (default 2); SnapshotMaxRowsPerSecond caps the rows read per
	// second over all of them (0: no cap); SnapshotChunkSize is the chunk
	// size of the snapshots walcast requests itself (0: the journal's
	// default).
	SnapshotInitial          bool
	SnapshotNewTables        bool
	ResnapshotAfterResync    bool
	SnapshotParallel         int
	SnapshotMaxRowsPerSecond int
	SnapshotChunkSize        int

	// A journal batch closes at BatchMaxTxns transactions (default 1000),
	// BatchMaxChanges changes (default 20000), or when the queue is empty —
	// after waiting up to BatchMaxDelay for more (default 0: no wait; what
	// queues while one append commits forms the next batch, which is group
	// commit without added latency).
	BatchMaxTxns    int
	BatchMaxChanges int
	BatchMaxDelay   time.Duration
	// QueueMaxBytes bounds the memory held by transactions decoded but not
	// yet journaled — queued, or in the batch being appended — in bytes, as
	// decoder.Transaction.MemBytes counts them (default MemoryBudget/4); past
	// it the loop stops reading WAL but keeps sending status updates. A
	// spilled transaction counts about a kilobyte: its changes are in its
	// file. A single transaction is always admitted to an empty queue,
	// whatever its size. A journal batch takes at most half of it, so the
	// next batch can be decoded while one is appended.
	QueueMaxBytes int64
	// QueueMaxChanges also bounds the changes queued (default 100000).
	// Bytes are what run out; this only caps the journal's backlog for a
	// stream of tiny changes.
	QueueMaxChanges int

	// MemoryBudget (default 64 MiB) is the resident memory the pipeline's
	// changes may take, Go's collector headroom included: the decoder holds
	// in-progress transactions of up to a sixth of it in encoded bytes
	// before it spills the largest to a file in SpillDir, and the queue
	// takes a quarter (QueueMaxBytes' default). With QueueMaxBytes at its
	// default the process stays under MemoryBudget + MemoryOverhead
	// resident (see MemoryOverhead for what it covers and how it was
	// measured).
	MemoryBudget int64
	SpillDir     string
	// MaxTransactionBytes bounds the bytes in-progress transactions hold in
	// memory and SpillDir together (decoder.Config.MaxTransactionBytes;
	// default decoder.DefaultMaxTransactionBytes, 8 GiB): past it the
	// largest is journaled at its commit as quarantine entries telling
	// consumers to refetch the tables it touched, so that no transaction
	// can fill the disk and halt replication.
	MaxTransactionBytes int64

	// StandbyPoll is how often a standby retries the lock (default 1s).
	StandbyPoll time.Duration
	// BackoffBase and BackoffMax bound reconnect delays (defaults 500ms, 30s).
	BackoffBase, BackoffMax time.Duration
	// StatusInterval caps the interval between standby status updates
	// (default 10s); it is further capped at 75% of wal_sender_timeout.
	StatusInterval time.Duration

	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Slot == "" {
		c.Slot = "walcast"
	}
	if c.MessagePrefix == "" {
		c.MessagePrefix = "walcast."
	}
	if c.SnapshotParallel <= 0 {
		c.SnapshotParallel = 2
	}
	c.SnapshotParallel = min(c.SnapshotParallel, MaxSnapshotParallel)
	if c.BatchMaxTxns <= 0 {
		c.BatchMaxTxns = 1000
	}
	if c.BatchMaxChanges <= 0 {
		c.BatchMaxChanges = 20000
	}
	if c.BatchMaxDelay < 0 {
		c.BatchMaxDelay = 0
	}
	if c.QueueMaxChanges <= 0 {
		c.QueueMaxChanges = 100000
	}
	if c.MemoryBudget <= 0 {
		c.MemoryBudget = defaultMemoryBudget
	}
	if c.QueueMaxBytes <= 0 {
		c.QueueMaxBytes = c.MemoryBudget / queueBudgetShare
	}
	if c.StandbyPoll <= 0 {
		c.StandbyPoll = time.Second
	}
	if c.BackoffBase <= 0 {
		c.BackoffBase = 500 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 30 * time.Second
	}
	if c.StatusInterval <= 0 {
		c.StatusInterval = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Role is what a replicator is doing, for /readyz, logs and metrics.
type Role string

// Roles.
const (
	RoleStarting     Role = "starting"
	RoleStandby      Role = "standby"      // waiting for the slot's lock
	RoleActive       Role = "active"       // holds the lock and streams
	RoleReconnecting Role = "reconnecting" // between sessions, backing off
	RoleStopped      Role = "stopped"
)

// State is a snapshot of a replicator's state.
type State struct {
	Role       Role
	Since      time.Time
	Generation int64
	Watermark  decoder.LSN // last journaled (and acknowledgeable) position
	ServerEnd  decoder.LSN // server's WAL end from the latest keepalive
	LastError  string
}

// Replicator streams one slot into one journal. Create it with New and call
// Run once.
type Replicator struct {
	cfg Config
	j   *journal.Journal
	log *slog.Logger

	watermark       atomic.Uint64 // journaled position, shared by loop and writer
	serverEnd       atomic.Uint64
	cov             coverage     // covered.go
	delay           atomic.Int64 // ns from the newest commit of the last batch to its journal commit
	stats           Stats
	inst            *instruments // nil until RegisterMetrics
	tracer          trace.Tracer // no-op unless SetTracerProvider
	decoded         *decoder.Counters
	journaled       *decoder.Counters
	quarantined     reasonCounts // changes journaled as quarantine entries, by reason
	controlsDropped reasonCounts // control messages dropped by the decoder, by reason

	// Snapshots (walcast.snapshot.* metrics): chunks journaled, chunks
	// read again (snapshot.go, high), snapshots being read now.
	snapChunks, snapRereads, snapRunning atomic.Int64

	// skipRelations are the journal's own tables in the source database
	// (nil when the journal lives elsewhere); set by session before the
	// stream starts, read by the stream of that session.
	skipRelations map[uint32]bool
	// xids widens journaled xids to 64 bits (xid.go); set by session
	// before the stream starts (session owns its refresh goroutine), read
	// by the journal writer of the same replication session.
	xids *xidClock

	mu    sync.Mutex // guards the following fields
	state State
}

// Stats are cumulative counters, read with Stats().
type Stats struct {
	Transactions atomic.Uint64 // source transactions journaled
	Changes      atomic.Uint64 // entries journaled
	Batches      atomic.Uint64 // journal appends
	Reconnects   atomic.Uint64 // sessions ended by an error and retried
	TenantMoves  atomic.Uint64 // updates that moved a row to another tenant (journaled after a delete in the old one)
}

// New validates cfg and returns a Replicator writing to j.
func New(cfg Config, j *journal.Journal) (*Replicator, error) {
	cfg.setDefaults()
	if cfg.Publication == "" {
		return nil, &Error{Code: CodeConfig, Op: "configure replication", Err: errors.New("no publication given"),
			Fix: "pass --publication NAME (or set WALCAST_PUBLICATION)"}
	}
	if err := ValidateSlotName(cfg.Slot); err != nil {
		return nil, &Error{Code: CodeConfig, Op: "configure replication", Err: err, Fix: "choose a --slot of lower-case letters, digits and underscores"}
	}
	if _, err := ParseConnConfig(cfg.DatabaseURL); err != nil {
		return nil, ClassifyConnectError("source database", err)
	}
	r := &Replicator{cfg: cfg, j: j, log: cfg.Logger.With("slot", cfg.Slot), tracer: noop.Tracer{},
		decoded: decoder.NewCounters(), journaled: decoder.NewCounters()}
	r.state = State{Role: RoleStarting, Since: time.Now()}
	return r, nil
}

// State returns the replicator's current state.
func (r *Replicator) State() State {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.state
	s.Watermark = decoder.LSN(r.watermark.Load())
	s.ServerEnd = decoder.LSN(r.serverEnd.Load())
	return s
}

// Stats returns the replicator's counters.
func (r *Replicator) Stats() *Stats { return &r.stats }

func (r *Replicator) setRole(role Role, gen int64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state.Role != role {
		r.state.Since = time.Now()
	}
	r.state.Role = role
	if gen != 0 {
		r.state.Generation = gen
	}
	if err != nil {
		r.state.LastError = err.Error()
	}
}

// Run replicates until ctx is cancelled (it then finishes the batch being
// written, sends a final status update and returns nil) or a terminal error:
// ErrSlotHeld when Standby is false, a CodeSlotLost *Error for a gap without
// RecreateLostSlot, or a classified *Error when the very first connection
// fails for a reason retrying cannot fix (authentication, TLS,
// configuration, missing database). Everything else reconnects with
// jittered exponential backoff and a fresh decoder.
func (r *Replicator) Run(ctx context.Context) error {
	defer r.setRole(RoleStopped, 0, nil)
	bo := backoff.New(r.cfg.BackoffBase, r.cfg.BackoffMax)
	everConnected := false
	for {
		streamed, err := r.session(ctx, &everConnected)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("replication session ended")
		}
		if terminal(err, everConnected) {
			r.setRole(RoleStopped, 0, err)
			return err
		}
		if streamed {
			// A session that streamed for a while starts the backoff over; one
			// that fails right after START_REPLICATION (a dropped publication,
			// say) keeps backing off.
			bo.Reset()
		}
		r.stats.Reconnects.Add(1)
		r.countReconnect(err)
		r.setRole(RoleReconnecting, 0, err)
		delay := bo.Next()
		r.log.Warn("replication session ended; reconnecting", "cause", err, "code", string(CodeOf(err)),
			"attempt", bo.Attempt(), "delay", delay.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// terminal decides, in one place, which errors stop Run.
func terminal(err error, everConnected bool) bool {
	if errors.Is(err, ErrSlotHeld) {
		return true
	}
	switch CodeOf(err) {
	case CodeSlotLost:
		return true
	case CodeConfig, CodeTLS, CodeAuth, CodeDatabaseMissing, CodeUnreachable:
		// At start-up these need the operator; once we have streamed, a
		// restart or failover of the server can produce them for a while.
		return !everConnected
	}
	return false
}

// session runs one connection: lock, resume check, stream. streamed reports
// whether it streamed for at least healthySession (so the backoff resets).
func (r *Replicator) session(ctx context.Context, everConnected *bool) (streamed bool, err error) {
	conn, err := connectReplication(ctx, r.cfg.DatabaseURL)
	if err != nil {
		return false, err
	}
	*everConnected = true
	defer func() {
		// Closing sends Terminate; never let an unresponsive source hold the
		// session (and shutdown) open.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		conn.Close(cctx)
	}()

	if err := r.waitForLock(ctx, conn); err != nil {
		return false, err
	}
	// Identify the server only once the lock is ours: a standby may have
	// waited for hours, and resume compares the journal's watermark with
	// the server's WAL position, which must be read after the previous
	// holder's last append (a stale position would make a sound journal
	// look ahead of the server).
	sys, err := identifySystem(ctx, conn)
	if err != nil {
		return false, err
	}
	skip, exact, err := journalRelations(ctx, conn, r.j.Schema(), r.j.ID())
	if err != nil {
		return false, err
	}
	if !exact {
		r.log.Warn("cannot read the journal id in the source database; treating every table of the journal schema as the journal's", "schema", r.j.Schema(),
			"fix", "GRANT SELECT ON "+r.j.Schema()+".meta TO the source role, or keep the journal in another schema")
	}
	r.skipRelations = skip
	gen, err := r.j.Acquire(ctx)
	if err != nil {
		return false, err
	}
	r.log.Info("holding the slot's lock; now the active replicator", "generation", gen, "pid", conn.PID())
	// The catalog is recorded before streaming starts, so that every
	// table published now is described by the time this replicator is
	// active; the session's catalog writer keeps it current (and retries
	// when this first pass fails).
	cats := newCatalogWriter(r, gen)
	if err := cats.record(ctx); err != nil {
		if errors.Is(err, journal.ErrFenced) {
			return false, err
		}
		r.log.Warn("cannot record the published tables in the journal's catalog yet; retrying while streaming", "cause", err)
	}
	start, err := r.resume(ctx, conn, sys, gen)
	if err != nil {
		return false, err
	}
	r.watermark.Store(uint64(start))
	statusEvery, err := r.statusInterval(ctx, conn)
	if err != nil {
		return false, err
	}
	r.xids = &xidClock{r: r}
	if err := r.xids.anchor(ctx, conn); err != nil {
		return false, err
	}
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, pglogrepl.LSN(start),
		pglogrepl.StartReplicationOptions{PluginArgs: pluginArgs(r.cfg.Publication)})
	if err != nil {
		return false, classifyStreamError("start replication", err)
	}
	r.setRole(RoleActive, gen, nil)
	r.log.Info("streaming", "from", start.String(), "status_interval", statusEvery)
	began := time.Now()
	xctx, stopXids := context.WithCancel(ctx)
	xidsDone := make(chan struct{})
	go func() {
		defer close(xidsDone)
		r.xids.run(xctx)
	}()
	err = r.stream(ctx, conn, gen, statusEvery, cats)
	stopXids()
	<-xidsDone
	return time.Since(began) >= healthySession, err
}

// waitForLock takes the slot's advisory lock on conn, waiting as a standby
// while another session holds it (unless Standby is false).
func (r *Replicator) waitForLock(ctx context.Context, conn *pgconn.PgConn) error {
	ok, err := tryLock(ctx, conn, r.cfg.Slot)
	if err != nil || ok {
		return err
	}
	if !r.cfg.Standby {
		return fmt.Errorf("%w %q (--standby=false)", ErrSlotHeld, r.cfg.Slot)
	}
	r.setRole(RoleStandby, 0, nil)
	r.log.Info("standby: another walcast run holds the slot; waiting to take over", "poll", r.cfg.StandbyPoll)
	t := time.NewTicker(r.cfg.StandbyPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		ok, err := tryLock(ctx, conn, r.cfg.Slot)
		if err != nil || ok {
			return err
		}
	}
}

// statusInterval is the time between status updates: StatusInterval, capped
// at 75% of the server's wal_sender_timeout (DESIGN §4.8).
func (r *Replicator) statusInterval(ctx context.Context, conn *pgconn.PgConn) (time.Duration, error) {
	res, err := conn.Exec(ctx, "SELECT setting FROM pg_settings WHERE name = 'wal_sender_timeout'").ReadAll()
	if err != nil {
		return 0, fmt.Errorf("read wal_sender_timeout: %w", err)
	}
	d := r.cfg.StatusInterval
	if len(res) == 1 && len(res[0].Rows) == 1 {
		ms, _ := strconv.Atoi(string(res[0].Rows[0][0]))
		if t := time.Duration(ms) * time.Millisecond * 3 / 4; ms > 0 && t < d {
			d = t
		}
	}
	return d, nil
}

// resume checks where the stream must resume (DESIGN §4.6) and returns the
// position to start from, creating the slot on a fresh journal and handling a
// gap as DESIGN §4.2 says.
func (r *Replicator) resume(ctx context.Context, conn *pgconn.PgConn, sys SystemInfo, gen int64) (decoder.LSN, error) {
	st, err := r.j.State(ctx)
	if err != nil {
		return 0, err
	}
	src, wm := st.Source, st.Watermark
	slot, err := readSlot(ctx, conn, r.cfg.Slot)
	if err != nil {
		return 0, err
	}
	if slot.Exists {
		if slot.SlotType != "logical" || slot.Plugin != "pgoutput" {
			return 0, &Error{Code: CodeConfig, Op: "check slot " + r.cfg.Slot,
				Err: fmt.Errorf("slot is a %s slot with plugin %q; walcast needs a logical pgoutput slot", slot.SlotType, slot.Plugin),
				Fix: "run with another --slot, or drop this one: SELECT pg_drop_replication_slot('" + r.cfg.Slot + "');"}
		}
		if slot.Database != sys.DBName {
			return 0, &Error{Code: CodeConfig, Op: "check slot " + r.cfg.Slot,
				Err: fmt.Errorf("slot belongs to database %q, not %q", slot.Database, sys.DBName),
				Fix: "point --database-url at that database, or run with another --slot"}
		}
	}
	cur := journal.Source{SystemID: sys.SystemID, Timeline: sys.Timeline, Slot: r.cfg.Slot}

	// A journal that records a source but has never journaled anything or
	// held a watermark was cut off in its first start by an older walcast,
	// which recorded the source and the starting watermark in two commits:
	// nothing was lost, because nothing was ever acknowledged from it, so it
	// starts afresh.
	interrupted := src.SystemID != "" && wm == 0 && st.Horizon == 0
	if interrupted {
		r.log.Warn("the journal records a source but no watermark (a first start that was interrupted); starting afresh",
			"system_id", src.SystemID, "timeline", src.Timeline)
	}
	if src.SystemID == "" || interrupted {
		// A fresh journal: start where the slot is, creating it if needed.
		start := slot.ConfirmedFlush
		if !slot.Exists || slot.WalStatus == "lost" {
			if slot.Exists {
				if err := pglogrepl.DropReplicationSlot(ctx, conn, r.cfg.Slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
					return 0, classifyStreamError("drop lost slot", err)
				}
			}
			if start, err = createSlot(ctx, conn, r.cfg.Slot); err != nil {
				return 0, classifyStreamError("create slot", err)
			}
			r.log.Info("created replication slot", "consistent_point", start.String())
		}
		// Source, watermark, the publication's tables and --snapshot
		// initial's requests in one commit: a crash cannot leave one
		// without the others.
		tables, err := publishedTables(ctx, conn, r.cfg.Publication)
		if err != nil {
			return 0, err
		}
		var reqs []journal.SnapshotRequest
		if r.cfg.SnapshotInitial {
			reqs = r.snapshotRequests(tables)
			r.log.Info("snapshot initial: every published table will be snapshotted", "tables", len(tables))
		}
		return r.j.Bootstrap(ctx, gen, cur, start, tables, reqs...)
	}

	var gap string
	fix := "restart with --recreate-lost-slot: walcast recreates the slot, journals a resync entry, and clients refetch their state; nothing is streamed until then"
	switch {
	case src.SystemID != sys.SystemID:
		gap = fmt.Sprintf("the source's system identifier changed from %s to %s (a restored backup or a different server)", src.SystemID, sys.SystemID)
	case src.Timeline != sys.Timeline:
		gap = fmt.Sprintf("the source's timeline changed from %d to %d (a promoted standby)", src.Timeline, sys.Timeline)
	case wm > sys.XLogPos:
		// The watermark is a position this server produced and flushed, so
		// it can never lie ahead of its WAL: the journal holds another
		// history (restored from a newer backup, or another source's), or
		// the source was restored from an older backup that kept its system
		// identifier and timeline. Resuming would wait silently for WAL
		// that may never match, or skip everything up to the watermark.
		gap = fmt.Sprintf("the journal watermark %s is ahead of the source's current WAL position %s (the journal holds a different or newer history than this server, or the source was restored from an older backup)", wm, sys.XLogPos)
		fix = "check that --journal-url and --journal-schema point at this source's journal and --database-url at the right server; if both are right, restart with --recreate-lost-slot: walcast recreates the slot, journals a resync entry that resets the watermark, and clients refetch their state"
	case !slot.Exists:
		gap = fmt.Sprintf("slot %q vanished", r.cfg.Slot)
	case slot.WalStatus == "lost":
		gap = fmt.Sprintf("slot %q is lost: Postgres removed WAL it still needed (max_slot_wal_keep_size)", r.cfg.Slot)
	case slot.ConfirmedFlush > wm:
		gap = fmt.Sprintf("slot %q has confirmed %s, beyond the journal watermark %s", r.cfg.Slot, slot.ConfirmedFlush, wm)
	}
	if gap == "" {
		if src != cur {
			if err := r.j.SetSource(ctx, gen, cur); err != nil {
				return 0, err
			}
		}
		return wm, nil
	}
	if !r.cfg.RecreateLostSlot {
		return 0, &Error{Code: CodeSlotLost, Op: "resume replication",
			Err: fmt.Errorf("changes may have been lost: %s", gap),
			Fix: fix}
	}
	if slot.Exists {
		if err := pglogrepl.DropReplicationSlot(ctx, conn, r.cfg.Slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
			return 0, classifyStreamError("drop lost slot", err)
		}
	}
	start, err := createSlot(ctx, conn, r.cfg.Slot)
	if err != nil {
		return 0, classifyStreamError("create slot", err)
	}
	rs := journal.Resync{Reason: gap, Watermark: start, ResetWatermark: true, Source: &cur}
	if r.cfg.ResnapshotAfterResync {
		tables, err := publishedTables(ctx, conn, r.cfg.Publication)
		if err != nil {
			return 0, err
		}
		rs.Snapshots = r.snapshotRequests(tables)
		r.log.Warn("resync: every published table will be snapshotted again, so consumers can rebuild from the stream", "tables", len(tables))
	}
	if _, err := r.j.AppendResync(ctx, gen, rs); err != nil {
		return 0, err
	}
	r.log.Warn("resync: recreated the slot and journaled a resync entry; clients will refetch", "reason", gap, "from", start.String())
	return start, nil
}

// classifyStreamError gives errors from the replication protocol a code.
func classifyStreamError(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "55006": // object_in_use: the slot is active for another PID
			return &Error{Code: CodeSlotHeld, Op: op, Err: err,
				Fix: "another process is streaming from this slot; walcast retries until it is released (a previous walsender may still be shutting down)"}
		case "42704": // undefined_object: publication or slot missing
			return &Error{Code: CodePublicationMissing, Op: op, Err: err,
				Fix: "create the publication (see `walcast verify`), or check --publication and --slot"}
		case "42501":
			return &Error{Code: CodePrivilege, Op: op, Err: err, Fix: "ALTER ROLE … WITH REPLICATION; and GRANT SELECT on the published tables (see `walcast verify`)"}
		case "55000":
			return &Error{Code: CodeWalLevel, Op: op, Err: err, Fix: "set wal_level = logical and restart PostgreSQL (see `walcast verify`)"}
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// WhileActive runs fn each time the replicator becomes active, with a context
// cancelled as soon as it stops being active (standby, reconnecting,
// stopped), and waits for fn to return before watching again. It returns
// when ctx ends. Work that only the active instance may do, like publishing
// the journal to NATS, runs under it.
func (r *Replicator) WhileActive(ctx context.Context, fn func(context.Context)) {
	const poll = 100 * time.Millisecond
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		for r.State().Role != RoleActive {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		actx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			fn(actx)
		}()
		for r.State().Role == RoleActive && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
		cancel()
		<-done
		if ctx.Err() != nil {
			return
		}
	}
}
