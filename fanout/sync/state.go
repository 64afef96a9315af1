package sync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// State: a subscription with "snapshot":true first gets the topic's current
// rows, read from the source database, then every change after them
// (docs/sync.md, "State, then changes", has the protocol and the argument
// for correctness). The steps, per snapshot:
//
//  1. H0: the journal horizon, taken before anything else.
//  2. In one REPEATABLE READ READ ONLY transaction on the source: a
//     LOCK of the table in ACCESS SHARE mode (before any snapshot: a
//     TRUNCATE, not MVCC-safe, cannot then commit between S and the read),
//     S = pg_current_snapshot() and L = pg_current_wal_insert_lsn() (the
//     first statement to fix the transaction's snapshot), the table's
//     columns from the catalogs, then its rows, scoped to the socket's
//     tenant, fetched in pages from a cursor and queued on the socket at
//     its pace.
//  3. The journal from a little before H0 on, in the member's scope: an
//     entry whose transaction is visible in S is already in the rows and is
//     skipped; any other is delivered. This ends at the first entry whose
//     commit LSN is past L (every later one is invisible in S), or once the
//     replicator has journaled everything up to L and the read has caught
//     up.
//  4. snapshot-end with the cursor of that position, and the member joins
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
	// MaxConcurrent snapshots read at once on this node; more wait
	// (default 8). It is also the size of the source connection pool.
	MaxConcurrent int
	// PerSocket is how many snapshots one socket reads at once; its others
	// wait (default 1).
	PerSocket int
	// Timeout bounds one snapshot, from its BEGIN to its snapshot-end
	// (default 10m): a REPEATABLE READ transaction holds back vacuum on the
	// source while it lasts. It is also each statement's statement_timeout.
	Timeout time.Duration
	// PageRows is the rows fetched and held at once (default 500).
	PageRows int
	// Rate (snapshots per second) and Burst bound the snapshots each client
	// asks for, kept per client address and per token subject alike, as
	// the GET /v1/changes budgets are: a "snapshot":true subscription that
	// would read the rows (no cursor, or one the journal can no longer
	// serve) and each GET /v1/snapshot take one. Beyond them the
	// subscription is refused with error rate-limited (429 over HTTP).
	// Snapshots the node starts itself (answering a resync) are not
	// charged. 0 means unlimited.
	Rate  float64
	Burst int
}

// Snapshot defaults.
const (
	DefaultMaxConcurrentSnapshots = 8
	DefaultSnapshotTimeout        = 10 * time.Minute
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
)

func (c *StateConfig) setDefaults() {
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = DefaultMaxConcurrentSnapshots
	}
	if c.PerSocket <= 0 {
		c.PerSocket = 1
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultSnapshotTimeout
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

// stateSource is the node's side of snapshots: how to reach the source and
// the node-wide concurrency bound. Each snapshot opens its own connection
// (it holds it for the snapshot's whole transaction, so a pool would save
// only the connect) and closes it when done.
type stateSource struct {
	cfg  StateConfig
	conn *pgx.ConnConfig
	sem  chan struct{} // one token per snapshot reading
	ids  atomic.Int64

	active atomic.Int64 // snapshots reading now
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
	cc, err := pgx.ParseConfig(cfg.SourceURL)
	if err != nil {
		return nil, fmt.Errorf("sync: --database-url does not parse: %w (fix: a libpq URL or DSN of the source database)", err)
	}
	for k, v := range sourceSettings {
		cc.RuntimeParams[k] = v
	}
	cc.RuntimeParams["statement_timeout"] = strconv.FormatInt(cfg.Timeout.Milliseconds(), 10)
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 10 * time.Second
	}
	st := &stateSource{cfg: cfg, conn: cc, sem: make(chan struct{}, cfg.MaxConcurrent)}
	conn, err := st.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("sync: %w", err)
	}
	_ = conn.Close(ctx)
	return st, nil
}

func (st *stateSource) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, st.conn)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the source database (--database-url): %w (fix: check the URL, the network and the role's password; the role needs SELECT on the published tables, see deploy/postgres/setup.sql)", err)
	}
	return conn, nil
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
}

// errSnapshotRestart: the journal's history moved under the snapshot (an
// epoch change or a resync entry); it must start over.
var errSnapshotRestart = errors.New("the journal was reset during the snapshot")

// readState runs one snapshot of q's topic (steps 1–3 above), sending
// snapshot-begin, the rows and the changes that follow them up to the
// returned position to sink. The caller sends snapshot-end.
func (n *Node) readState(ctx context.Context, q journal.Query, reason string, sink stateSink) (stateResult, error) {
	st := n.state
	topic := q.Entities[0]
	schema, table, _ := decoder.SplitEntity(topic)
	ctx, cancel := context.WithTimeout(ctx, st.cfg.Timeout)
	defer cancel()

	res := stateResult{id: st.ids.Add(1)}
	res.epoch = n.epoch.Load()
	h0, err := n.currentHorizon(ctx, q)
	if err != nil {
		return res, fmt.Errorf("journal horizon: %w", err)
	}

	conn, err := st.connect(ctx)
	if err != nil {
		return res, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return res, fmt.Errorf("source database: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// The table is locked (ACCESS SHARE, what the SELECT takes anyway)
	// before the snapshot is fixed, LOCK being a statement that takes
	// none: TRUNCATE is not MVCC-safe, so one committing between S and
	// the read would leave the rows empty though S predates it (the
	// changes then no longer rebuild the table as of the snapshot-end).
	// Held from before S, the lock makes such a TRUNCATE wait for the
	// rows, or S wait for it.
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{schema, table}.Sanitize()+" IN ACCESS SHARE MODE"); err != nil {
		return res, st.classify(decoder.EntityName(schema, table), err)
	}
	// The first statement that takes a snapshot fixes the transaction's:
	// S is the snapshot every row below is read in.
	var snapText, lsnText string
	var at time.Time
	if err := tx.QueryRow(ctx, "SELECT pg_current_snapshot()::text, pg_current_wal_insert_lsn()::text, now()").Scan(&snapText, &lsnText, &at); err != nil {
		return res, fmt.Errorf("source snapshot: %w", err)
	}
	snap, err := parseSnapshot(snapText)
	if err != nil {
		return res, err
	}
	var walAt decoder.LSN
	if err := walAt.UnmarshalText([]byte(lsnText)); err != nil {
		return res, fmt.Errorf("source WAL position %q: %w", lsnText, err)
	}
	t, err := st.loadStateTable(ctx, tx, schema, table, q.Tenant)
	if err != nil {
		return res, err
	}
	begin, _ := json.Marshal(struct {
		T          string `json:"t"`
		Topic      string `json:"topic"`
		Entity     string `json:"entity"`
		SnapshotID int64  `json:"snapshotId"`
		Rows       int64  `json:"rows"`
		Reason     string `json:"reason,omitempty"`
	}{"snapshot-begin", topic, t.entity, res.id, t.estimate, reason})
	if err := sink.send(ctx, begin); err != nil {
		return res, err
	}
	if _, err := tx.Exec(ctx, "DECLARE walcast_state NO SCROLL CURSOR FOR "+t.sql, t.args...); err != nil {
		return res, st.classify(t.entity, err)
	}
	fetch := "FETCH FORWARD " + strconv.Itoa(st.cfg.PageRows) + " FROM walcast_state"
	tq, _ := json.Marshal(topic)
	var rowBuf []byte
	for {
		b := decoder.NewTxBuilder(0, walAt, walAt, at)
		rr := tx.Conn().PgConn().ExecParams(ctx, fetch, nil, nil, nil, nil)
		got := 0
		for rr.NextRow() {
			vals := rr.Values()
			if len(vals) != t.enc.Columns() {
				rr.Close()
				return res, fmt.Errorf("snapshot of %s: %d columns read, %d expected", t.entity, len(vals), t.enc.Columns())
			}
			b.Read(t.enc, walAt, vals) // encodes (copies) the row now
			got++
		}
		if _, err := rr.Close(); err != nil {
			return res, st.classify(t.entity, err)
		}
		txn := b.Transaction()
		it := txn.Changes()
		for it.Next() {
			c := it.Change()
			// The SELECT is scoped already; this is the same rule once
			// more, on the tenant exactly as the decoder hoisted it.
			if !rowVisible(q.Tenant, c.TenantState, c.Tenant) {
				continue
			}
			p := rowBuf[:0] // send does not keep it: one buffer serves every row
			p = append(p, `{"t":"row","topic":`...)
			p = append(p, tq...)
			p = append(p, `,"row":`...)
			p = append(p, c.Body...)
			p = append(p, '}')
			rowBuf = p
			if err := sink.send(ctx, p); err != nil {
				return res, err
			}
			res.rows++
			st.rows.Add(1)
		}
		if err := it.Err(); err != nil {
			return res, err
		}
		if got < st.cfg.PageRows {
			break
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("source database: %w", err)
	}
	slot := ""
	if src, err := n.j.Source(ctx); err == nil {
		slot = src.Slot
	}
	res.pos, err = n.followAfterState(ctx, q, res.epoch, h0, snap, walAt, conn, slot, sink)
	return res, err
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

func (st *stateSource) classify(entity string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42501":
			return refused("the sync node's source role may not read %s (%s); fix for the operator: GRANT SELECT ON %s TO the role of --database-url", entity, pgErr.Message, entity)
		case "42P01", "3F000":
			return refused("table %s does not exist in the source database", entity)
		case "57014":
			return refused("the snapshot of %s took longer than the node's --snapshot-timeout", entity)
		}
	}
	return fmt.Errorf("snapshot of %s: %w", entity, err)
}

// followAfterState delivers, after the rows, the journal entries of q's
// scope that the rows do not contain: from a little before h0 on, every
// entry except those of transactions visible in snap. It returns the
// position after which every entry is invisible in snap, so the ordinary
// path can take over from there.
func (n *Node) followAfterState(ctx context.Context, q journal.Query, epoch, h0 int64, snap pgSnapshot, walAt decoder.LSN,
	src *pgx.Conn, slot string, sink stateSink) (int64, error) {
	j := n.j
	tq, _ := json.Marshal(q.Entities[0])
	pos, err := catchUpStart(ctx, j, h0, snap)
	if err != nil {
		return 0, err
	}
	passed := false     // an entry committed after walAt was read: every later one is invisible in snap
	asked := time.Now() // a busy source covers walAt by itself within a second
	for {
		// Whether everything committed up to walAt is journaled, checked
		// before the read that then covers it.
		covered := passed
		if !covered {
			if wm, err := j.Watermark(ctx); err == nil && wm >= walAt {
				covered = true
			} else if slot != "" {
				var confirmed *string
				if err := src.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&confirmed); err == nil && confirmed != nil {
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
		}
		for {
			cq := q
			cq.MaxBytes = n.catchUpPageBytes()
			var err error
			if cq.Cursor, err = j.CursorAt(q, epoch, pos); err != nil {
				return 0, err
			}
			res, err := j.Changes(ctx, cq)
			if err != nil {
				return 0, fmt.Errorf("journal read: %w", err)
			}
			if res.ResyncRequired {
				if pos < h0 && (res.Reason == journal.ResyncPruned || res.Reason == journal.ResyncEntry || res.Reason == journal.ResyncEpoch) {
					// The look-back reached below the retained floor, or
					// behind a resync entry (a slot recreated, a new epoch)
					// that H0 is past: what lies before it is another
					// history. Restarting would meet it again every time
					// (and fail the subscription after three); go on from H0.
					pos = h0
					continue
				}
				return 0, errSnapshotRestart
			}
			if res.Epoch != epoch {
				return 0, errSnapshotRestart
			}
			for _, e := range res.Changes {
				var head struct {
					Xid       uint32      `json:"xid"`
					CommitLSN decoder.LSN `json:"commitLsn"`
				}
				if err := json.Unmarshal(e.Envelope, &head); err != nil {
					return 0, fmt.Errorf("journal entry %d: %w", e.Seq, err)
				}
				if head.CommitLSN > walAt {
					passed = true
				} else if snap.sees(e, head.Xid) {
					continue // in the rows already
				}
				p := make([]byte, 0, len(e.Envelope)+len(tq)+28)
				p = append(p, `{"t":"change","topic":`...)
				p = append(p, tq...)
				p = append(p, `,"change":`...)
				p = append(p, e.Envelope...)
				p = append(p, '}')
				if err := sink.send(ctx, p); err != nil {
					return 0, err
				}
			}
			if pos, err = j.CursorPosition(res.Cursor); err != nil {
				return 0, err
			}
			if !res.More {
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
		_, _ = j.Wait(wctx, pos)
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
// when the socket is closing. t.mu is held.
func (s *socket) startSnapshotLocked(m *member, reason string) bool {
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
		s.runSnapshot(ctx, m, j, reason)
	}()
	return true
}

// snapshotAttempts bounds how often a snapshot starts over because the
// journal was reset under it.
const snapshotAttempts = 3

// acquireSnapshot waits, counted as queued, for one of socketSlots (a
// socket's; nil for none) and then one of the node's. It returns the func
// that releases them, or nil, counting the snapshot cancelled, when ctx
// ends first.
func (n *Node) acquireSnapshot(ctx context.Context, socketSlots *slots) func() {
	st := n.state
	n.stats.snapshotsQueued.Add(1)
	defer n.stats.snapshotsQueued.Add(-1)
	cancelled := func() func() {
		n.snapshotEnded("cancelled", time.Time{})
		return nil
	}
	if socketSlots != nil && !socketSlots.acquire(ctx) {
		return cancelled()
	}
	select {
	case st.sem <- struct{}{}:
	case <-ctx.Done():
		if socketSlots != nil {
			socketSlots.release()
		}
		return cancelled()
	}
	st.active.Add(1)
	return func() {
		st.active.Add(-1)
		<-st.sem
		if socketSlots != nil {
			socketSlots.release()
		}
	}
}

// readStateAgain is readState, started over (as an answer to a resync: the
// client drops what it read at the next snapshot-begin) when the journal
// was reset under it, up to snapshotAttempts times.
func (n *Node) readStateAgain(ctx context.Context, q journal.Query, reason string, sink stateSink) (res stateResult, err error) {
	for range snapshotAttempts {
		if res, err = n.readState(ctx, q, reason, sink); !errors.Is(err, errSnapshotRestart) {
			break
		}
		reason = "resync"
	}
	return res, err
}

// runSnapshot reads m's snapshot (waiting for the socket's and the node's
// snapshot slots), then hands m to the ordinary catch-up path.
func (s *socket) runSnapshot(ctx context.Context, m *member, j *snapJob, reason string) {
	n := s.n
	release := n.acquireSnapshot(ctx, &s.snapSlots)
	if release == nil {
		return
	}
	defer release()
	started := time.Now()
	res, err := n.readStateAgain(ctx, m.q, reason, socketSink{s: s, m: m, j: j})
	if err != nil {
		if ctx.Err() != nil || !m.ownsJob(j) {
			n.snapshotEnded("cancelled", started)
			return // unsubscribed, superseded or closed
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
	s.enqueue(newFrame(snapshotEndPayload(m.topic, cur, res)), nil)
	n.alignEpochLocked(m)
	if m.state == memberCatchingUp {
		s.startCatchUp(m)
	}
}
