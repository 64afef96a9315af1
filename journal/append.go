package journal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcast/walcast/decoder"
)

// Acquire makes the caller the journal's appender: it bumps the fencing
// generation and returns the new one, which every later Append, Advance,
// AppendResync and SetSource must present. Any appender holding an older
// generation is refused from then on.
//
// An append of the old appender that holds the meta row's lock is given
// acquireWait to commit; past that its session is terminated (its
// transaction rolls back: it was never acknowledged), because an old
// appender that is frozen mid-append — SIGSTOP, a hung host — would
// otherwise keep the new one out until the server's idle timeouts end it.
// The caller must hold the slot's lock (so the old appender's replication
// session is gone) before it calls Acquire.
func (j *Journal) Acquire(ctx context.Context) (int64, error) {
	const op = "journal.Acquire"
	for attempt := 1; ; attempt++ {
		var gen int64
		err := j.inTx(ctx, pgx.TxOptions{}, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = "+strconv.FormatInt(acquireWait.Milliseconds(), 10)); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "UPDATE "+j.sql.meta+" SET generation = generation + 1 RETURNING generation").Scan(&gen)
		})
		if err == nil {
			// Appends of an older generation of this process (if any)
			// are fenced; what they left in memory is forgotten.
			j.recent.reset()
			return gen, nil
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" || attempt == 3 {
			return 0, opErr(op, err, "")
		}
		// The old appender holds the meta row and has not let go: fence it.
		var ended int
		err = j.queryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_locks
			WHERE relation = $1::regclass AND granted AND mode IN ('RowShareLock', 'RowExclusiveLock') AND pid <> pg_backend_pid()`,
			[]any{j.sql.meta}, &ended)
		if err != nil {
			return 0, opErr(op, fmt.Errorf("end the old appender's session, which holds the journal's meta row: %w", err),
				"grant the journal role pg_signal_backend, or run every walcast run for this journal as the same role")
		}
	}
}

// acquireWait is how long Acquire lets an old appender's append finish.
var acquireWait = 2 * time.Second

// Generation returns the current fencing generation.
func (j *Journal) Generation(ctx context.Context) (int64, error) {
	var gen int64
	if err := j.queryRow(ctx, "SELECT generation FROM "+j.sql.meta, nil, &gen); err != nil {
		return 0, opErr("journal.Generation", err, "")
	}
	return gen, nil
}

func fencedErr(op string, gen int64) error {
	return &Error{Op: op, Err: fmt.Errorf("%w (generation %d is no longer current)", ErrFenced, gen),
		Fix: "another walcast run took over this journal; this process must stop replicating and restart as a standby"}
}

// AppendResult reports what an append did.
type AppendResult struct {
	// Watermark is the journal watermark after the append.
	Watermark decoder.LSN
	// FirstSeq and LastSeq bound the contiguous seqs assigned, in the order
	// the changes were given; both are 0 when no entry was written.
	FirstSeq, LastSeq int64
	// Entries is the number of entries written (LastSeq-FirstSeq+1, or 0).
	Entries int
	// Transactions is the number of source transactions journaled (including
	// empty ones, which only advance the watermark); Skipped the number
	// skipped as replays (commit end LSN at or below the watermark).
	Transactions, Skipped int
	// TenantUnknown counts key-only changes whose tenant could not be
	// resolved (DESIGN §5); they are delivered to no tenant-scoped reader.
	TenantUnknown int
	// Moved counts updates that moved a row to another tenant, each
	// journaled after a delete of the row in its old tenant (DESIGN §5);
	// those deletes are among Entries.
	Moved int
}

// Append journals a batch of committed source transactions, in commit order,
// in one Postgres transaction: it assigns contiguous seqs and per-entity
// contiguous entitySeqs, writes every change with COPY, advances the
// watermark to the greatest commit end LSN journaled and notifies waiting
// readers. In the steady state (this process appended last) that is one
// round trip. A batch is encoded in memory up to 16 MiB; beyond that it is
// streamed from the transactions' iterators, so a spilled transaction is
// never materialised.
//
// Transactions whose EndLSN is at or below the watermark (or at or below an
// earlier transaction of the same batch) are replays and are skipped. An
// empty transaction above the watermark writes no entry but advances it.
//
// gen must be the current fencing generation (Acquire); otherwise the error
// wraps ErrFenced and nothing is written, even when Acquire races the append.
// On an error nothing is written — except that when the connection is lost
// while COMMIT is in flight the outcome is unknown; appending the same
// transactions again is always safe, since journaled ones are then skipped
// as replays. The caller keeps ownership of the transactions (it closes
// them).
//
// Time limits (Config.CallTimeout): an append has no limit on its total
// duration — a batch holding a huge spilled transaction may stream for
// minutes — but it fails when no byte moves on its connection for
// CallTimeout, when it waits longer than lock_timeout (CallTimeout/2) for the
// meta row, or when connecting or waiting for a connection takes longer than
// CallTimeout. ctx may impose a shorter limit.
func (j *Journal) Append(ctx context.Context, gen int64, txs []*decoder.Transaction) (AppendResult, error) {
	return j.append(withAppendMode(ctx), "journal.Append", gen, txs, appendOpts{})
}

// Advance moves the watermark to lsn without writing an entry, when lsn is
// above it: for positions the replicator may confirm although no published
// change was there (a keepalive while nothing is in flight), so that the slot
// never runs ahead of the watermark. Fenced like Append.
func (j *Journal) Advance(ctx context.Context, gen int64, lsn decoder.LSN) (AppendResult, error) {
	tx := decoder.NewTransaction(0, lsn, lsn, time.Time{}, nil)
	return j.append(withAppendMode(ctx), "journal.Advance", gen, []*decoder.Transaction{tx}, appendOpts{})
}

// Bootstrap records the replication source and moves the watermark to start
// (when start is above it) in one journal transaction, so a journal never
// has one without the other: the first start of a replicator, or a restart
// after a first start that journaled nothing. It writes no entry. Fenced
// like Append; it returns the watermark afterwards.
//
// Snapshot requests given (walcast run --snapshot initial) are recorded in
// the same transaction, and tables (the publication's) as the recorded
// publication tables (RecordPublishedTables), so a crash cannot leave a
// fresh journal without them.
func (j *Journal) Bootstrap(ctx context.Context, gen int64, src Source, start decoder.LSN, tables []Table, reqs ...SnapshotRequest) (decoder.LSN, error) {
	tx := decoder.NewTransaction(0, start, start, time.Time{}, nil)
	o := appendOpts{source: &src, requests: reqs}
	if tables != nil {
		o.tables = &tables
	}
	res, err := j.append(withAppendMode(ctx), "journal.Bootstrap", gen, []*decoder.Transaction{tx}, o)
	if err != nil {
		return 0, err
	}
	return res.Watermark, nil
}

// AppendStalled reports whether an append is in flight and, if so, how long
// its connection has gone without moving a byte (0 while it streams). A
// healthy append moves bytes within milliseconds; a value growing past a few
// seconds means the journal database has stopped answering, and the append
// will fail once it reaches CallTimeout. For readiness checks.
func (j *Journal) AppendStalled() (inFlight bool, stalled time.Duration) {
	in, last := j.pool.appendProgress()
	if !in || last.IsZero() {
		return in, 0
	}
	return true, time.Since(last)
}

// Resync describes a resync entry (DESIGN §4.2, §5).
type Resync struct {
	// Reason is an operator-facing explanation carried in the envelope.
	Reason string
	// Watermark is the position the new stream starts from. When
	// ResetWatermark is set it replaces the watermark even if lower (a
	// restored or promoted source, whose LSNs can lie behind the old ones);
	// otherwise the watermark is kept.
	Watermark      decoder.LSN
	ResetWatermark bool
	// NewEpoch starts a new epoch with this entry even when the watermark
	// is kept (ResetWatermark always does): for a history that may differ
	// from what readers saw though the source did not move (a journal
	// restored from a backup). Readers of another epoch get a resync.
	NewEpoch bool
	// Source, when non-nil, is recorded in the same transaction.
	Source *Source
	// Snapshots are snapshot requests recorded in the same transaction:
	// after a reset, a re-snapshot of every published table lets
	// consumers rebuild from the stream alone.
	Snapshots []SnapshotRequest
	// Time is the envelope's commitTime; zero means now.
	Time time.Time
}

// AppendResync journals an op:"resync" envelope (entity "", no tenant). Every
// cursor from before it gets ResyncRequired from Changes. Fenced like Append.
func (j *Journal) AppendResync(ctx context.Context, gen int64, r Resync) (AppendResult, error) {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	r.Time = r.Time.UTC()
	wm := r.Watermark
	if !r.ResetWatermark {
		cur, err := j.Watermark(ctx)
		if err != nil {
			return AppendResult{}, err
		}
		wm = cur
	}
	lsn, _ := wm.MarshalText()
	var body bytes.Buffer
	body.WriteString(`{"lsn":"`)
	body.Write(lsn)
	body.WriteString(`","commitLsn":"`)
	body.Write(lsn)
	body.WriteString(`","xid":0,"commitTime":"`)
	body.WriteString(r.Time.Format("2006-01-02T15:04:05.000000Z07:00"))
	body.WriteString(`","op":"resync","reason":`)
	reason, _ := json.Marshal(r.Reason)
	body.Write(reason)
	body.WriteString(`}`)
	tx := decoder.NewTransaction(0, wm, wm, r.Time, []decoder.Change{{LSN: wm, Op: decoder.OpResync, Body: body.Bytes()}})
	o := appendOpts{force: true, resetWatermark: r.ResetWatermark, source: r.Source, requests: r.Snapshots}
	if r.ResetWatermark || r.NewEpoch {
		// The history after this entry may differ from what readers saw:
		// a new epoch starts with it.
		e, err := newEpoch()
		if err != nil {
			return AppendResult{}, opErr("journal.AppendResync", err, "")
		}
		o.epoch, o.epochReason = e, r.Reason
	}
	return j.append(withAppendMode(ctx), "journal.AppendResync", gen, []*decoder.Transaction{tx}, o)
}
