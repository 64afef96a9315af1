package sync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// State: a subscription with "snapshot":true first gets the topic's current
// rows, read from the source database, then every change after them
// (docs/sync.md, "State, then changes", has the protocol and the argument
// for correctness). The steps, per snapshot:
//
//  1. H0: the journal horizon, taken before anything else.
//  2. In one REPEATABLE READ READ ONLY transaction on the source, bounded
//     by ReadTimeout: a LOCK of the table in ACCESS SHARE mode (before
//     any snapshot: a TRUNCATE, not MVCC-safe, cannot then commit between
//     S and the read; given up after lockTimeout and retried, so it never
//     queues in front of the application's DDL for long), S =
//     pg_current_snapshot() and L = pg_current_wal_insert_lsn() (the first
//     statement to fix the transaction's snapshot), the table's columns
//     from the catalogs, then its rows, scoped to the tenant, read at the
//     database's pace into a spool (spool.go). COMMIT as soon as the last
//     row is spooled: no transaction or lock is held while clients read.
//  3. The rows are sent from the spool at each client's pace; snapshots of
//     the same scope that start while the spool is read, or moments after,
//     share it (each with its own id, the same S, L and H0).
//  4. The journal from a little before H0 on, in the member's scope: an
//     entry whose transaction is visible in S is already in the rows and is
//     skipped; any other is delivered. This ends at the first entry whose
//     commit LSN is past L (every later one is invisible in S), or once the
//     replicator has journaled everything up to L and the read has caught
//     up.
//  5. snapshot-end with the cursor of that position, and the member joins
//     the ordinary catch-up and live path from there.

// StateConfig configures snapshots ("snapshot":true subscriptions and GET
// /v1/snapshot). Without SourceURL the node serves none. What a snapshot
// may read of a table — its published columns, row filter and tenant
// column — is not configured here: it comes from the journal's catalog,
// which walcast run writes (scope.go).
type StateConfig struct {
	// SourceURL is the source database (--database-url), read with a
	// read-only role; the node's sessions are read-only too.
	SourceURL string
	// MaxConcurrent source reads run at once on this node; more wait
	// (default 8). It is also the size of the source connection pool.
	MaxConcurrent int
	// PerSocket is how many snapshots one socket reads at once; its others
	// wait (default 1).
	PerSocket int
	// PerClient is how many snapshots one client address, and one token
	// subject, have in progress at once (from the wait for a read to the
	// snapshot-end), on every socket and GET /v1/snapshot together; more
	// wait (default MaxConcurrent/2, at least 1), so no client takes
	// every read slot.
	PerClient int
	// Timeout bounds one snapshot, from its start to its snapshot-end, the
	// client's reading included (default 10m).
	Timeout time.Duration
	// ReadTimeout bounds the source transaction of one read of a table,
	// BEGIN to COMMIT (default 30s): a table that cannot be read into the
	// spool within it is refused with a message naming
	// --snapshot-read-timeout. It is also the session's statement_timeout
	// and idle_in_transaction_session_timeout.
	ReadTimeout time.Duration
	// SpoolBytes bounds the bytes of rows spooled on this node at once,
	// every snapshot together, in memory and files (default 1 GiB). A read
	// that would pass it fails, and its snapshots are refused with a
	// message naming --snapshot-spool-bytes.
	SpoolBytes int64
	// SpoolDir is where spools larger than a few hundred KiB are written
	// (default os.TempDir()); files are unlinked as soon as they are made.
	SpoolDir string
	// PageRows is the rows fetched at once (default 500).
	PageRows int
	// Rate (snapshots per second) and Burst bound the snapshots each client
	// asks for, kept per client address and per token subject alike, as
	// the GET /v1/changes budgets are: a "snapshot":true subscription that
	// would read the rows (no cursor, or one the journal can no longer
	// serve) and each GET /v1/snapshot take one; beyond them the
	// subscription is refused with error rate-limited (429 over HTTP).
	// A snapshot the node starts for a member because of the member's own
	// position (its cursor found pruned, or too far behind, during its
	// catch-up) takes one too, and waits for it rather than being
	// refused; one it starts for an event of the topic (a truncate, a
	// resync entry) does not. 0 means unlimited.
	Rate  float64
	Burst int
}

// Snapshot defaults.
const (
	DefaultMaxConcurrentSnapshots = 8
	DefaultSnapshotTimeout        = 10 * time.Minute
	DefaultSnapshotReadTimeout    = 30 * time.Second
	DefaultSnapshotSpoolBytes     = 1 << 30
	DefaultSnapshotPageRows       = 500
	// snapshotLookback is how many journal entries before H0 the filtered
	// read starts at least when the source snapshot has transactions in
	// progress, so a transaction journaled just before H0 but not yet
	// visible to the snapshot (a commit record is written, and can be
	// decoded and journaled, before the transaction leaves the proc array)
	// is delivered, not lost. snapshotXidLookback is how far before H0 the
	// journal is searched for the first entry of any of those transactions
	// (one index range scan, no envelopes), which moves the start earlier
	// when needed — a commit held back longer, e.g. waiting for a
	// synchronous standby.
	snapshotLookback    = 1000
	snapshotXidLookback = 100000
	// lockTimeout is how long a read waits for its table's ACCESS SHARE
	// lock (the session's lock_timeout) before it gives up and tries
	// again, lockAttempts times in all with a growing pause between: a
	// migration waiting for an ACCESS EXCLUSIVE lock queues behind the
	// node's lock request at most this long, and the application's
	// queries behind the migration with it.
	lockTimeout  = 2 * time.Second
	lockAttempts = 4
)

func (c *StateConfig) setDefaults() {
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = DefaultMaxConcurrentSnapshots
	}
	if c.PerSocket <= 0 {
		c.PerSocket = 1
	}
	if c.PerClient <= 0 {
		c.PerClient = max(1, c.MaxConcurrent/2)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultSnapshotTimeout
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = DefaultSnapshotReadTimeout
	}
	if c.SpoolBytes <= 0 {
		c.SpoolBytes = DefaultSnapshotSpoolBytes
	}
	if c.SpoolDir == "" {
		c.SpoolDir = os.TempDir()
	}
	if c.PageRows <= 0 {
		c.PageRows = DefaultSnapshotPageRows
	}
}

// sourceSettings are the session settings the replication connection uses
// (DESIGN §4.7): row text forms depend on them, and a row must be encoded
// from the same text an insert of it would be.
var sourceSettings = map[string]string{
	"TimeZone":                      "UTC",
	"DateStyle":                     "ISO",
	"IntervalStyle":                 "iso_8601",
	"extra_float_digits":            "3",
	"bytea_output":                  "hex",
	"default_transaction_read_only": "on",
	"application_name":              "walcast sync (snapshots)",
}

// stateSource is the node's side of snapshots: a pool of source
// connections (at most MaxConcurrent, one per read in progress), the
// node-wide bound on reads, and the spools being read or shared. It owns
// the fills' goroutines (Close waits for them).
type stateSource struct {
	cfg  StateConfig
	pool *pgxpool.Pool
	sem  chan struct{} // one token per source read in progress
	ids  atomic.Int64

	ctx    context.Context // ends with close
	cancel context.CancelFunc
	wg     sync.WaitGroup // fills and the spool sweep

	spools spools
	spoolStats

	active atomic.Int64 // source reads in progress
	queued atomic.Int64 // source reads waiting for a slot
	rows   atomic.Int64 // row frames sent, all snapshots

	scope // the catalog that scopes snapshots (scope.go)
}

// openState checks the source when one is configured: it connects once,
// so a wrong URL or password fails `walcast sync` at start.
func openState(ctx context.Context, cfg StateConfig) (*stateSource, error) {
	if cfg.SourceURL == "" {
		return nil, nil
	}
	cfg.setDefaults()
	pc, err := pgxpool.ParseConfig(cfg.SourceURL)
	if err != nil {
		return nil, fmt.Errorf("sync: --database-url does not parse: %w (fix: a libpq URL or DSN of the source database)", err)
	}
	cc := pc.ConnConfig
	for k, v := range sourceSettings {
		cc.RuntimeParams[k] = v
	}
	ms := strconv.FormatInt(cfg.ReadTimeout.Milliseconds(), 10)
	cc.RuntimeParams["statement_timeout"] = ms
	cc.RuntimeParams["idle_in_transaction_session_timeout"] = ms
	cc.RuntimeParams["lock_timeout"] = strconv.FormatInt(lockTimeout.Milliseconds(), 10)
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 10 * time.Second
	}
	pc.MaxConns = int32(cfg.MaxConcurrent)
	pc.MinConns = 0
	pc.MaxConnIdleTime = time.Minute
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("sync: --database-url: %w", err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("sync: cannot reach the source database (--database-url): %w (fix: check the URL, the network and the role's password; the role needs SELECT on the published tables, see deploy/postgres/setup.sql)", err)
	}
	conn.Release()
	st := &stateSource{cfg: cfg, pool: pool, sem: make(chan struct{}, cfg.MaxConcurrent)}
	st.ctx, st.cancel = context.WithCancel(context.Background())
	st.wg.Add(1)
	go st.sweep()
	return st, nil
}

// sweep frees spools past their share window until close.
func (st *stateSource) sweep() {
	defer st.wg.Done()
	t := time.NewTicker(spoolShareWindow / 2)
	defer t.Stop()
	for {
		select {
		case <-st.ctx.Done():
			return
		case now := <-t.C:
			st.sweepSpools(now)
		}
	}
}

// close ends every read, waits for them and closes the pool. The node
// calls it after its sockets are gone.
func (st *stateSource) close() {
	if st == nil {
		return
	}
	st.cancel()
	st.wg.Wait()
	st.sweepSpools(time.Now().Add(spoolShareWindow))
	st.pool.Close()
}

// stateTable is what a snapshot reads of its table.
type stateTable struct {
	entity   string
	sql      string // the SELECT; $1 is the tenant when tenantArg
	args     []any
	enc      *decoder.RowEncoder
	estimate int64
}

// errSnapshotRefused is a snapshot the node will not serve as asked (a
// table it cannot read); its message is for the client.
type errSnapshotRefused struct{ msg string }

func (e *errSnapshotRefused) Error() string { return e.msg }

func refused(format string, args ...any) error {
	return &errSnapshotRefused{fmt.Sprintf(format, args...)}
}

// stateSink receives a snapshot's frames as JSON payloads, in order. send
// waits for room (a snapshot is paced by its reader and never drops) and
// fails once the reader has gone. It must not keep payload after it
// returns: the caller reuses the buffer.
type stateSink interface {
	send(ctx context.Context, payload []byte) error
}

// stateResult is where a snapshot ended: the rows sent and the position
// (in epoch) the changes continue after.
type stateResult struct {
	id, rows   int64
	epoch, pos int64
	// held: with a view, the keys of the rows the client holds once it
	// has applied the snapshot (view.go).
	held *rowSet
}

// errSnapshotRestart: the journal's history moved under the snapshot (an
// epoch change or a resync entry); it must start over.
var errSnapshotRestart = errors.New("the journal was reset during the snapshot")

// errSnapshotViewRestart: a change after a filtered snapshot's rows could
// not be judged (or filled) under its view (view.go); read the rows again,
// which then hold it. It is an errSnapshotRestart.
var errSnapshotViewRestart error = viewRestart{}

type viewRestart struct{}

func (viewRestart) Error() string {
	return "a change after the rows could not be judged under the subscription's filter"
}
func (viewRestart) Is(target error) bool { return target == errSnapshotRestart }

// readState runs one snapshot of q's topic (steps 1–4 above), sending
// snapshot-begin, the rows and the changes that follow them up to the
// returned position to sink. The rows come from a spool, shared with every
// snapshot of the same scope that overlaps it. The caller sends
// snapshot-end.
//
// With a view v the rows and changes are those of the view (its filter
// and columns), and res.held records the keys the client is sent.
func (n *Node) readState(ctx context.Context, q journal.Query, v *view, reason string, sink stateSink) (stateResult, error) {
	st := n.state
	topic := q.Entities[0]
	ctx, cancel := context.WithTimeout(ctx, st.cfg.Timeout)
	defer cancel()

	res := stateResult{id: st.ids.Add(1)}
	var fills *snapshotFills
	if v != nil {
		res.held, fills = n.newRows(v), newSnapshotFills(v)
	}
	key := spoolKey{entity: topic, tenant: q.Tenant, epoch: n.epoch.Load()}
	if st.j != nil {
		// The catalog version joins the key; the fill checks the entry
		// itself (loadStateTable), so a failed read here only forgoes
		// sharing with a spool of another version.
		schema, table, _ := decoder.SplitEntity(topic)
		if e, ok, err := st.j.Catalog(ctx, journal.Table{Schema: schema, Name: table}); err == nil && ok {
			key.catalog = e.Version
		} else if err != nil {
			key.catalog = -res.id // this snapshot's own: shared with none
		}
	}
	sp := st.attach(key, func(fctx context.Context, sp *spool) {
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			defer sp.cancel()
			n.fill(fctx, sp, q)
		}()
	})
	defer st.detach(sp)
	select {
	case <-sp.ready:
	case <-ctx.Done():
		return res, ctx.Err()
	}
	if sp.head.entity == "" { // the read failed before the rows
		sp.mu.Lock()
		err := sp.err
		sp.mu.Unlock()
		return res, err
	}
	h := sp.head
	res.epoch = h.epoch
	begin, _ := json.Marshal(struct {
		T          string `json:"t"`
		Topic      string `json:"topic"`
		Entity     string `json:"entity"`
		SnapshotID int64  `json:"snapshotId"`
		Rows       int64  `json:"rows"`
		Reason     string `json:"reason,omitempty"`
	}{"snapshot-begin", topic, h.entity, res.id, h.estimate, reason})
	if err := sink.send(ctx, begin); err != nil {
		return res, err
	}
	tq, _ := json.Marshal(topic)
	var rowBuf []byte
	cur := spoolCursor{sp: sp}
	for {
		body, err := cur.next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return res, err
		}
		if v != nil {
			if body, err = viewRow(v, res.held, fills.fill(body), &n.stats); err != nil {
				return res, err
			}
			if body == nil {
				continue
			}
		}
		p := rowBuf[:0] // send does not keep it: one buffer serves every row
		p = append(p, `{"t":"row","topic":`...)
		p = append(p, tq...)
		p = append(p, `,"row":`...)
		p = append(p, body...)
		p = append(p, '}')
		rowBuf = p
		if err := sink.send(ctx, p); err != nil {
			return res, err
		}
		res.rows++
		st.rows.Add(1)
	}
	slot := ""
	if src, err := n.j.Source(ctx); err == nil {
		slot = src.Slot
	}
	var err error
	res.pos, err = n.followAfterState(ctx, q, res.epoch, h.h0, h.snap, h.walAt, slot, v, res.held, fills, sink)
	return res, err
}

// errLockBusy: the table's lock was not granted within lockTimeout.
var errLockBusy = errors.New("lock not granted within lock_timeout")

// fill reads sp's rows from the source into the spool (steps 1–2 above)
// and ends it, on a goroutine the stateSource owns. ctx ends when the
// last snapshot using sp leaves, or the node closes.
func (n *Node) fill(ctx context.Context, sp *spool, q journal.Query) {
	st := n.state
	headSet := false
	err := func() error {
		st.queued.Add(1)
		select {
		case st.sem <- struct{}{}:
			st.queued.Add(-1)
		case <-ctx.Done():
			st.queued.Add(-1)
			return ctx.Err()
		}
		st.active.Add(1)
		defer func() {
			st.active.Add(-1)
			<-st.sem
		}()
		rctx, cancel := context.WithTimeout(ctx, st.cfg.ReadTimeout)
		defer cancel()
		h0, err := n.currentHorizon(rctx, q)
		if err != nil {
			return fmt.Errorf("journal horizon: %w", err)
		}
		conn, err := st.pool.Acquire(rctx)
		if err != nil {
			return st.classify(rctx, ctx, q.Entities[0], fmt.Errorf("cannot reach the source database (--database-url): %w", err))
		}
		defer conn.Release()
		pause := 250 * time.Millisecond
		for attempt := 1; ; attempt++ {
			err = n.readInto(rctx, conn.Conn(), sp, q, h0, &headSet)
			if !errors.Is(err, errLockBusy) || headSet {
				break
			}
			if attempt == lockAttempts {
				return refused("table %s stayed locked by another transaction (a migration or other DDL holding or waiting for an ACCESS EXCLUSIVE lock) through %d attempts of %s each; the snapshot was not read, so the application's DDL was not held up; subscribe again once the DDL is done", q.Entities[0], lockAttempts, lockTimeout)
			}
			select {
			case <-time.After(pause):
			case <-rctx.Done():
				return st.classify(rctx, ctx, q.Entities[0], rctx.Err())
			}
			pause *= 2
		}
		if err != nil {
			return st.classify(rctx, ctx, q.Entities[0], err)
		}
		return nil
	}()
	sp.finish(err)
	if !headSet {
		close(sp.ready)
	}
}

// readInto runs one source transaction of a fill: LOCK, S and L, the
// table, the rows into sp, COMMIT. It sets sp.head and closes sp.ready
// (and *headSet) once the table is known, so snapshots send rows while
// the rest is read. errLockBusy: the lock was not granted in lockTimeout
// and nothing was read.
func (n *Node) readInto(ctx context.Context, conn *pgx.Conn, sp *spool, q journal.Query, h0 int64, headSet *bool) error {
	st := n.state
	schema, table, _ := decoder.SplitEntity(q.Entities[0])
	tx, snap, walAt, at, err := beginSnapshot(ctx, conn, pgx.Identifier{schema, table}.Sanitize())
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	t, err := st.loadStateTable(ctx, tx, schema, table, q.Tenant)
	if err != nil {
		return err
	}
	sp.head = spoolHead{entity: t.entity, estimate: t.estimate, h0: h0, epoch: sp.key.epoch, snap: snap, walAt: walAt}
	*headSet = true
	close(sp.ready)
	if _, err := tx.Exec(ctx, "DECLARE walcast_state NO SCROLL CURSOR FOR "+t.sql, t.args...); err != nil {
		return err
	}
	fetch := "FETCH FORWARD " + strconv.Itoa(st.cfg.PageRows) + " FROM walcast_state"
	for {
		b := decoder.NewTxBuilder(0, walAt, walAt, at)
		rr := tx.Conn().PgConn().ExecParams(ctx, fetch, nil, nil, nil, nil)
		got := 0
		for rr.NextRow() {
			vals := rr.Values()
			if len(vals) != t.enc.Columns() {
				rr.Close()
				return fmt.Errorf("snapshot of %s: %d columns read, %d expected", t.entity, len(vals), t.enc.Columns())
			}
			b.Read(t.enc, walAt, vals) // encodes (copies) the row now
			got++
		}
		if _, err := rr.Close(); err != nil {
			return err
		}
		it := b.Transaction().Changes()
		for it.Next() {
			c := it.Change()
			// The SELECT is scoped already; this is the same rule once
			// more, on the tenant exactly as the decoder hoisted it.
			if !rowVisible(q.Tenant, c.TenantState, c.Tenant) {
				continue
			}
			if err := sp.add(c.Body); err != nil {
				return err
			}
		}
		if err := it.Err(); err != nil {
			return err
		}
		if got < st.cfg.PageRows {
			break
		}
	}
	// The rows are spooled: the transaction and its lock end now, before
	// any client has read them.
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("source database: %w", err)
	}
	return nil
}

// standbyAttempts bounds how often beginSnapshot takes a standby's
// snapshot again because replay moved while it was taken.
const standbyAttempts = 50

// beginSnapshot opens the read's transaction: the table's ACCESS SHARE
// lock, then S and L (see the top of this file). On a hot standby
// (xids.go has why it differs) there is no WAL insert position: S comes
// with the replay position R read just before the transaction (no
// statement of the transaction may run before S is fixed) and, as L, the
// received position read with S; S is taken again, up to
// standbyAttempts times, until the replay position read with it equals
// R, so that no commit replayed between the two is left in doubt.
// errLockBusy: the lock was not granted in lockTimeout and nothing was
// read.
func beginSnapshot(ctx context.Context, conn *pgx.Conn, table string) (tx pgx.Tx, snap pgSnapshot, walAt decoder.LSN, at time.Time, err error) {
	for attempt := 1; ; attempt++ {
		var preRecovery bool
		var preReplay *string
		if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text").Scan(&preRecovery, &preReplay); err != nil {
			return nil, pgSnapshot{}, 0, time.Time{}, fmt.Errorf("source database: %w", err)
		}
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return nil, pgSnapshot{}, 0, time.Time{}, fmt.Errorf("source database: %w", err)
		}
		fail := func(err error) (pgx.Tx, pgSnapshot, decoder.LSN, time.Time, error) {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return nil, pgSnapshot{}, 0, time.Time{}, err
		}
		// The table is locked (ACCESS SHARE, what the SELECT takes anyway)
		// before the snapshot is fixed, LOCK being a statement that takes
		// none: TRUNCATE is not MVCC-safe, so one committing between S and
		// the read would leave the rows empty though S predates it (the
		// changes then no longer rebuild the table as of the snapshot-end).
		// Held from before S, the lock makes such a TRUNCATE wait for the
		// rows, or S wait for it. The session's lock_timeout bounds the
		// wait. (On a standby the TRUNCATE's lock is replayed: replay waits
		// for the read, up to max_standby_streaming_delay.)
		if _, err := tx.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS SHARE MODE"); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
				return fail(errLockBusy)
			}
			return fail(err)
		}
		// The first statement that takes a snapshot fixes the
		// transaction's: S is the snapshot every row below is read in.
		var snapText, lsnText string
		var recovery bool
		var postReplay *string
		if err := tx.QueryRow(ctx, `SELECT pg_current_snapshot()::text, r,
			(CASE WHEN r THEN coalesce(greatest(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()), pg_last_wal_replay_lsn()) ELSE pg_current_wal_insert_lsn() END)::text,
			pg_last_wal_replay_lsn()::text, now()
			FROM (SELECT pg_is_in_recovery() AS r) x`).Scan(&snapText, &recovery, &lsnText, &postReplay, &at); err != nil {
			return fail(fmt.Errorf("source snapshot: %w", err))
		}
		if recovery != preRecovery {
			// Promoted between the two: which rules S follows is unknown.
			if attempt < standbyAttempts {
				_ = tx.Rollback(context.WithoutCancel(ctx))
				continue
			}
			return fail(errors.New("the source database was promoted while the snapshot was taken"))
		}
		snap, err := parseSnapshot(snapText)
		if err != nil {
			return fail(err)
		}
		if err := walAt.UnmarshalText([]byte(lsnText)); err != nil {
			return fail(fmt.Errorf("source WAL position %q: %w", lsnText, err))
		}
		if recovery {
			if preReplay == nil || postReplay == nil {
				return fail(errors.New("the source standby reports no replay position"))
			}
			if *preReplay != *postReplay && attempt < standbyAttempts {
				_ = tx.Rollback(context.WithoutCancel(ctx))
				continue
			}
			snap.standby = true
			if err := snap.replayed.UnmarshalText([]byte(*preReplay)); err != nil {
				return fail(fmt.Errorf("source replay position %q: %w", *preReplay, err))
			}
		}
		return tx, snap, walAt, at, nil
	}
}

// rowVisible is DESIGN §5's tenancy rule for one row.
func rowVisible(scope string, state decoder.TenantState, tenant string) bool {
	switch state {
	case decoder.TenantNone:
		return true
	case decoder.TenantKnown:
		return scope != "" && tenant == scope
	}
	return false
}

// classify turns a failed read of entity into what its snapshots are
// told: rctx is the read's context (bounded by ReadTimeout), ctx the
// fill's.
func (st *stateSource) classify(rctx, ctx context.Context, entity string, err error) error {
	var ref *errSnapshotRefused
	if errors.As(err, &ref) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42501":
			return refused("the sync node's source role may not read %s (%s); fix for the operator: GRANT SELECT ON %s TO the role of --database-url", entity, pgErr.Message, entity)
		case "42P01", "3F000":
			return refused("table %s does not exist in the source database", entity)
		case "57014", "25P03":
			return refused("reading %s from the source took longer than the node's --snapshot-read-timeout (%s); the operator can raise --snapshot-read-timeout, or the client subscribe without a snapshot", entity, st.cfg.ReadTimeout)
		case "55P03":
			return refused("table %s is locked by another transaction (DDL); subscribe again once it is done", entity)
		}
	}
	if ctx.Err() == nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
		return refused("reading %s from the source took longer than the node's --snapshot-read-timeout (%s); the operator can raise --snapshot-read-timeout, or the client subscribe without a snapshot", entity, st.cfg.ReadTimeout)
	}
	return fmt.Errorf("snapshot of %s: %w", entity, err)
}

// followAfterState delivers, after the rows, the journal entries of q's
// scope that the rows do not contain: from a little before h0 on, every
// entry except those of transactions visible in snap. It returns the
// position after which every entry is invisible in snap, so the ordinary
// path can take over from there.
func (n *Node) followAfterState(ctx context.Context, q journal.Query, epoch, h0 int64, snap pgSnapshot, walAt decoder.LSN,
	slot string, v *view, held *rowSet, fills *snapshotFills, sink stateSink) (int64, error) {
	j := n.j
	tq, _ := json.Marshal(q.Entities[0])
	pos, err := catchUpStart(ctx, j, h0, snap)
	if err != nil {
		return 0, err
	}
	passed := false     // an entry committed after walAt was read: every later one is invisible in snap
	asked := time.Now() // a busy source covers walAt by itself within a second
	var waited int64    // the journal server's horizon the last wait returned
	for {
		// Whether everything committed up to walAt is journaled. The
		// journal's own watermark is checked in the read itself (below);
		// the slot and the replicator vouch for the journal's server,
		// whose horizon the reads must then reach (a standby journal,
		// --journal-read-url, may not have replayed it yet).
		covered := passed
		// A standby journal is read at least as far as the server held
		// when the last wait returned: a standby behind it would
		// otherwise answer short at once, and the loop spin on it.
		atLeast := waited
		if !covered && slot != "" {
			var confirmed *string
			qctx, cancel := context.WithTimeout(ctx, time.Second) // a pool busy with reads: ask again later
			err := n.state.pool.QueryRow(qctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&confirmed)
			cancel()
			if err == nil && confirmed != nil {
				var c decoder.LSN
				if c.UnmarshalText([]byte(*confirmed)) == nil && c >= walAt {
					covered = true
				}
			}
		}
		if !covered && time.Since(asked) >= time.Second {
			// An idle source may not move the watermark for long:
			// ask the replicator, which knows without writing.
			asked = time.Now()
			covered = n.askCovered(ctx, walAt)
		}
		if covered && !passed {
			// Covered on the journal's server: read at least as far as
			// it holds now.
			st, err := j.State(ctx)
			if err != nil {
				return 0, fmt.Errorf("journal read: %w", err)
			}
			atLeast = max(atLeast, st.Horizon)
		}
		for {
			cq := q
			cq.MaxBytes = n.catchUpPageBytes()
			cq.AtLeast = atLeast
			var err error
			if cq.Cursor, err = j.CursorAt(q, epoch, pos); err != nil {
				return 0, err
			}
			res, err := j.Changes(ctx, cq)
			n.noteReplica()
			if err != nil {
				return 0, fmt.Errorf("journal read: %w", err)
			}
			if res.ResyncRequired {
				if pos < h0 && !snap.standby && (res.Reason == journal.ResyncPruned || res.Reason == journal.ResyncEntry || res.Reason == journal.ResyncEpoch) {
					// The look-back reached below the retained floor, or
					// behind a resync entry (a slot recreated, a new epoch)
					// that H0 is past: what lies before it is another
					// history. Restarting would meet it again every time
					// (and fail the subscription after three); go on from H0.
					// (Not from a standby's snapshot: its catch-up starts
					// exactly at the first entry it did not see, and
					// skipping to H0 would lose what lies between.)
					pos = h0
					continue
				}
				if snap.standby && res.Reason == journal.ResyncPruned {
					return 0, refused("the journal pruned changes the snapshot source (--database-url, a hot standby) had not replayed yet; " +
						"the operator should check the standby's replay lag; subscribe again")
				}
				return 0, errSnapshotRestart
			}
			if res.Epoch != epoch {
				return 0, errSnapshotRestart
			}
			for _, e := range res.Changes {
				var head struct {
					Xid uint32 `json:"xid"`
				}
				if err := json.Unmarshal(e.Envelope, &head); err != nil {
					return 0, fmt.Errorf("journal entry %d: %w", e.Seq, err)
				}
				if snap.past(e, walAt) {
					passed = true
				} else if !passed && snap.sees(e, head.Xid) {
					continue // in the rows already
				}
				body := e.Envelope
				if v != nil {
					var err error
					if body, err = viewSnapshotChange(v, held, fills.fill(body), &n.stats); err != nil {
						return 0, err
					}
					if body == nil {
						continue
					}
					if len(body) == 0 {
						// A change the view cannot judge (or fill):
						// read the rows again, which then hold it.
						return 0, errSnapshotViewRestart
					}
				}
				p := make([]byte, 0, len(body)+len(tq)+28)
				p = append(p, `{"t":"change","topic":`...)
				p = append(p, tq...)
				p = append(p, `,"change":`...)
				p = append(p, body...)
				p = append(p, '}')
				if err := sink.send(ctx, p); err != nil {
					return 0, err
				}
			}
			if pos, err = j.CursorPosition(res.Cursor); err != nil {
				return 0, err
			}
			if !res.More {
				// Caught up with this read: its watermark says whether
				// everything committed up to walAt is at or below it.
				covered = covered || res.Watermark >= walAt
				break
			}
		}
		if covered || passed {
			return pos, nil
		}
		// Not yet journaled up to walAt: wait for the journal to move (or
		// a moment, for the replicator to confirm an idle source's
		// position).
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		if h, err := j.Wait(wctx, pos); err == nil && h > pos {
			waited = h
		}
		cancel()
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
}

// snapshotEndPayload is {"t":"snapshot-end",…} with the cursor the changes
// continue after.
func snapshotEndPayload(topic, cursor string, r stateResult) []byte {
	b, _ := json.Marshal(struct {
		T          string `json:"t"`
		Topic      string `json:"topic"`
		Entity     string `json:"entity"`
		SnapshotID int64  `json:"snapshotId"`
		Rows       int64  `json:"rows"`
		Cursor     string `json:"cursor"`
	}{"snapshot-end", topic, topic, r.id, r.rows, cursor})
	return b
}

// checkSnapshot says whether claims may take a snapshot of a topic on this
// node: the error code and message to answer with, or "".
func (n *Node) checkSnapshot(claims *Claims) (code, msg string) {
	code, msg = n.snapshotAllowed(claims)
	if code != "" {
		n.snapshotEnded("refused", time.Time{})
	}
	return code, msg
}

func (n *Node) snapshotAllowed(claims *Claims) (code, msg string) {
	if n.state == nil {
		return "snapshot-unavailable", "this node serves no snapshots (it was started without --database-url); subscribe without snapshot"
	}
	if !claims.Snapshot {
		return "forbidden", `the token does not allow snapshots: it needs the claim "snapshot": true`
	}
	return "", ""
}

// snapshotEnded counts a snapshot by outcome (metrics.go) and, when it
// read (started is set), records its duration.
func (n *Node) snapshotEnded(outcome string, started time.Time) {
	n.stats.inc(&n.stats.snapshots, outcome)
	if h := n.stats.snapshotDuration; h != nil && !started.IsZero() {
		h.Record(context.Background(), time.Since(started).Seconds())
	}
}

// snapshotOutcome is the outcome of a snapshot that ended with err while
// its client was still there: refused for a table the node will not read
// as asked, failed for anything else.
func snapshotOutcome(err error) string {
	var ref *errSnapshotRefused
	if errors.As(err, &ref) {
		return "refused"
	}
	return "failed"
}

// socketSink queues a snapshot's frames on a socket, waiting for room:
// snapshot frames are never dropped, and the queue's bound paces the read.
type socketSink struct {
	s *socket
	m *member
	j *snapJob
}

func (k socketSink) send(ctx context.Context, payload []byte) error {
	f := newFrame(payload)
	for {
		if !k.m.ownsJob(k.j) {
			return context.Canceled
		}
		queued, wait := k.s.enqueueReplay(f)
		if queued {
			return nil
		}
		if wait == nil {
			return context.Canceled // the socket is closing
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// snapJob is a member's running snapshot; cancel ends it.
type snapJob struct {
	cancel context.CancelFunc
}

// ownsJob reports whether j is still m's snapshot.
func (m *member) ownsJob(j *snapJob) bool {
	m.t.mu.Lock()
	defer m.t.mu.Unlock()
	return m.job == j && m.state == memberSnapshotting
}

// startSnapshotLocked (re)starts m's snapshot on a goroutine the socket
// owns: m receives nothing else until its snapshot-end. It reports false
// when the socket is closing. t.mu is held. The node starts it for an
// event of the topic (a truncate, a resync entry, an epoch change), so it
// is not charged to the client.
func (s *socket) startSnapshotLocked(m *member, reason string) bool {
	return s.startSnapshot(m, reason, false)
}

// startSnapshot is startSnapshotLocked; with charge the snapshot first
// waits for a token of the client's snapshot budget (a resync the
// member's own position caused: cursorResyncLocked).
func (s *socket) startSnapshot(m *member, reason string, charge bool) bool {
	if m.job != nil {
		m.job.cancel()
		m.job = nil
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return false
	}
	s.wg.Add(1)
	s.mu.Unlock()
	ctx, cancel := context.WithCancel(s.ctx)
	j := &snapJob{cancel: cancel}
	m.job, m.state = j, memberSnapshotting
	go func() {
		defer s.wg.Done()
		defer cancel()
		s.runSnapshot(ctx, m, j, reason, charge)
	}()
	return true
}

// snapshotAttempts bounds how often a snapshot starts over because the
// journal was reset under it.
const snapshotAttempts = 3

// acquireSnapshot waits, counted as queued, for one of socketSlots (a
// socket's; nil for none) and then a snapshot slot of each of keys (the
// client's address and subject, StateConfig.PerClient). The node-wide
// read slots are taken by the reads themselves (fill). It returns the
// func that releases them, or nil, counting the snapshot cancelled, when
// ctx ends first.
func (n *Node) acquireSnapshot(ctx context.Context, socketSlots *slots, keys ...string) func() {
	n.stats.snapshotsQueued.Add(1)
	defer n.stats.snapshotsQueued.Add(-1)
	if socketSlots != nil && !socketSlots.acquire(ctx) {
		n.snapshotEnded("cancelled", time.Time{})
		return nil
	}
	release := n.limits.acquireSnapshotSlot(ctx, keys...)
	if release == nil {
		if socketSlots != nil {
			socketSlots.release()
		}
		n.snapshotEnded("cancelled", time.Time{})
		return nil
	}
	return func() {
		release()
		if socketSlots != nil {
			socketSlots.release()
		}
	}
}

// readStateAgain is readState, started over (as an answer to a resync: the
// client drops what it read at the next snapshot-begin) when the journal
// was reset under it, up to snapshotAttempts times.
func (n *Node) readStateAgain(ctx context.Context, q journal.Query, v *view, reason string, sink stateSink) (res stateResult, err error) {
	for range snapshotAttempts {
		res, err = n.readState(ctx, q, v, reason, sink)
		if err != nil && res.held != nil {
			res.held.forget() // the client drops what it read: so does the node
			res.held = nil
		}
		if !errors.Is(err, errSnapshotRestart) {
			break
		}
		reason = "resync"
	}
	return res, err
}

// runSnapshot reads m's snapshot (waiting for the client's budget with
// charge, and for the socket's and the client's snapshot slots), then
// hands m to the ordinary catch-up path.
func (s *socket) runSnapshot(ctx context.Context, m *member, j *snapJob, reason string, charge bool) {
	n := s.n
	if charge && !n.limits.waitSnapshotToken(ctx, s.limKey[0], s.limKey[1]) {
		n.snapshotEnded("cancelled", time.Time{})
		return
	}
	release := n.acquireSnapshot(ctx, &s.snapSlots, s.limKey[0], s.limKey[1])
	if release == nil {
		return
	}
	defer release()
	started := time.Now()
	res, err := n.readStateAgain(ctx, m.q, m.view, reason, socketSink{s: s, m: m, j: j})
	if err != nil {
		if ctx.Err() != nil || !m.ownsJob(j) || errors.Is(err, context.Canceled) {
			// Unsubscribed, superseded or closed: the sink reports a
			// closing socket as context.Canceled, which can come before
			// the socket's close reaches ctx.
			n.snapshotEnded("cancelled", started)
			return
		}
		n.snapshotEnded(snapshotOutcome(err), started)
		var ref *errSnapshotRefused
		msg := "the snapshot failed; subscribe again to retry"
		if errors.As(err, &ref) {
			msg = ref.msg
		} else {
			n.warnEvery("snapshot", "snapshot failed", "topic", m.topic, "err", err)
		}
		s.enqueue(errorFrame("snapshot-failed", msg+"; the subscription has ended", m.topic), nil)
		n.leave(m)
		return
	}
	t := m.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if m.job != j || m.state != memberSnapshotting {
		n.snapshotEnded("cancelled", started)
		if res.held != nil {
			res.held.forget()
		}
		return
	}
	m.job = nil
	cur, err := n.j.CursorAt(m.q, res.epoch, res.pos)
	if err != nil {
		n.snapshotEnded("failed", started)
		s.enqueue(errorFrame("unavailable", "cannot issue cursors", m.topic), nil)
		return
	}
	n.snapshotEnded("done", started)
	m.pos, m.epoch, m.state = res.pos, res.epoch, memberCatchingUp
	m.mid, m.owesResync, m.unjudged, m.held = false, false, false, nil // the snapshot's position is a transaction boundary
	if m.view != nil {
		m.rows.forget()
		m.rows = res.held
	}
	s.enqueue(newFrame(snapshotEndPayload(m.topic, cur, res)), nil)
	n.alignEpochLocked(m)
	if m.state == memberCatchingUp {
		s.startCatchUp(m)
	}
}
