package journal

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reads from a standby (Config.ReadURL).
//
// A physical standby replays the journal server's WAL in order, and every
// append commits its entries and the meta row's next_seq in one
// transaction, after the one before it (doc.go, Ordering). A read on the
// standby therefore sees the journal as it was at some earlier moment: a
// consistent prefix, never a different history. It is never wrong, only
// short, and everything below decides what a short answer may and may not
// be taken to mean:
//
//   - Entries above the standby's horizon do not exist for it. A read
//     that must see a seq the caller already knows exists (Query.AtLeast,
//     a cursor's own position, the seq EntryAt is asked for, the end of a
//     FirstSeqInvisible range) and finds the standby's horizon below it
//     waits up to ReadMaxWait for the standby to replay it, then is made
//     on the journal's server (a fallback, counted by reason). So a
//     cursor ahead of the standby never gets ResyncAhead from it, and
//     EntryAt never says ErrNoEntry of an entry the standby has not
//     replayed yet.
//   - A cursor of another epoch than the standby's may be one the standby
//     has not replayed yet: such a read is made on the journal's server,
//     which alone says ResyncEpoch.
//   - The retained floor and the newest resync entry only ever move up
//     within an epoch, so the standby's are at or below the server's:
//     ResyncPruned and ResyncEntry from the standby hold on the server
//     too, and ErrNoEntry for a seq at or below the standby's horizon
//     means the entry was pruned there, hence on the server as well. The
//     standby may still serve entries the server has already pruned: they
//     are the same entries.
//   - A read the standby fails (it is down, a recovery conflict cancelled
//     the query, its schema is older than the server's) is made on the
//     journal's server.
//
// Migrations, appends and what they read (tenant lookups, fencing), the
// publisher's reads (ReadAfter, TxnRest, the published position), LISTEN (a
// standby cannot listen), Epoch, State, Watermark, Source,
// LastEntitySeq, EntityBaseline, the catalog and snapshot bookkeeping
// always go to the journal's server: writers need the newest state, and
// readers base correctness decisions on these, where a standby's older
// answer would not be one they can check.
//
// The standby must be one server: reads through a balancer over several
// standbys could see the journal go back between two reads.

// DefaultReadMaxWait is Config.ReadMaxWait's default.
const DefaultReadMaxWait = time.Second

// Reasons a read made for the standby was made on the journal's server.
const (
	FallbackBehind = "behind" // the standby had not replayed a seq the read must see within ReadMaxWait
	FallbackEpoch  = "epoch"  // the read's cursor is of another epoch than the standby's
	FallbackError  = "error"  // the standby failed the read
)

// FallbackReasons lists the fallback reasons, for metrics.
var FallbackReasons = []string{FallbackBehind, FallbackEpoch, FallbackError}

type replica struct {
	pool    *connPool
	maxWait time.Duration

	reads, waits, caughtUp atomic.Int64
	behind, epoch, failed  atomic.Int64 // fallbacks by reason
	lastErr                atomic.Pointer[error]
}

// ReplicaStats counts the reads meant for the standby.
type ReplicaStats struct {
	Reads int64 // reads made on the standby
	// Waits counts reads that found the standby behind a seq they must
	// see and waited for it; CaughtUp those of them it then served.
	Waits, CaughtUp int64
	// Fallbacks are reads made on the journal's server instead, by reason
	// (FallbackReasons).
	Fallbacks map[string]int64
	// LastError is the standby's newest failure (FallbackError), if any.
	LastError error
}

// ReplicaStats returns the standby's counters; false without one.
func (j *Journal) ReplicaStats() (ReplicaStats, bool) {
	r := j.replica
	if r == nil {
		return ReplicaStats{}, false
	}
	s := ReplicaStats{Reads: r.reads.Load(), Waits: r.waits.Load(), CaughtUp: r.caughtUp.Load(),
		Fallbacks: map[string]int64{FallbackBehind: r.behind.Load(), FallbackEpoch: r.epoch.Load(), FallbackError: r.failed.Load()}}
	if e := r.lastErr.Load(); e != nil {
		s.LastError = *e
	}
	return s, true
}

// HasReplica reports whether reads go to a standby (Config.ReadURL).
func (j *Journal) HasReplica() bool { return j.replica != nil }

// openReplica connects to the standby once and checks that it holds this
// journal.
func (j *Journal) openReplica(ctx context.Context, cfg Config, lim limits) error {
	const op = "journal.Open"
	rc := cfg.ReadConnConfig
	fromURL := rc == nil
	if rc == nil {
		var err error
		if rc, err = pgx.ParseConfig(cfg.ReadURL); err != nil {
			return opErr(op, fmt.Errorf("parse journal read URL: %w", err), "check --journal-read-url (a libpq URL or DSN of a physical standby of the journal's server)")
		}
	} else {
		rc = rc.Copy()
	}
	if rc.RuntimeParams == nil {
		rc.RuntimeParams = map[string]string{}
	}
	rc.RuntimeParams["jit"] = "off"
	applyLimits(rc, lim, fromURL)
	wait := cfg.ReadMaxWait
	if wait == 0 {
		wait = DefaultReadMaxWait
	}
	r := &replica{pool: newConnPool(rc, lim, max(cfg.MaxConns, 8)), maxWait: max(wait, 0)}
	j.replica = r
	var id [16]byte
	err := j.queryRowOn(ctx, r.pool, "SELECT journal_id FROM "+j.sql.meta, nil, &id)
	if err != nil {
		return opErr(op, fmt.Errorf("journal read server (--journal-read-url): %w", err),
			"point --journal-read-url at a physical standby of the journal's server that has replayed the journal schema "+j.schema+" (or leave it empty to read from --journal-url)")
	}
	if id != j.id {
		return opErr(op, fmt.Errorf("the journal read server holds another journal (id %x, want %x)", id, j.id),
			"point --journal-read-url at a physical standby of the server --journal-url names")
	}
	// A physical standby has its primary's system identifier; a logical
	// copy or a restored clone does not. Only a check where both servers
	// let the role call pg_control_system() (managed services may not).
	var a, b int64
	if j.queryRow(ctx, "SELECT system_identifier FROM pg_control_system()", nil, &a) == nil &&
		j.queryRowOn(ctx, r.pool, "SELECT system_identifier FROM pg_control_system()", nil, &b) == nil && a != b {
		return opErr(op, fmt.Errorf("the journal read server is not a physical standby of the journal's server (system identifier %d, want %d)", b, a),
			"point --journal-read-url at a streaming standby of the server --journal-url names: a logical copy does not carry the journal's migrations and is inconsistent while it copies tables")
	}
	return nil
}

// readAt runs read on the standby, or on the journal's server when there
// is none or when the standby's answer cannot be used as it is. read
// returns its answer with the horizon and epoch it saw in the same
// snapshot. The answer is short when that horizon is below need; then
// the read waits up to ReadMaxWait for the standby to replay need and
// runs again there, and, still short, runs on the journal's server. An
// answer of another epoch than wantEpoch (when wantEpoch >= 0) is read on
// the journal's server at once, and so is one the standby failed.
func readAt[T any](ctx context.Context, j *Journal, need, wantEpoch int64, read func(context.Context, *connPool) (T, int64, int64, error)) (T, error) {
	r := j.replica
	if r == nil {
		v, _, _, err := read(ctx, j.pool)
		return v, err
	}
	r.reads.Add(1)
	v, h, e, err := read(ctx, r.pool)
	switch {
	case err != nil && ctx.Err() != nil:
		return v, err
	case err != nil:
		r.failed.Add(1)
		r.lastErr.Store(&err)
	case wantEpoch >= 0 && e != wantEpoch:
		r.epoch.Add(1)
	case h >= need:
		return v, nil
	default:
		r.waits.Add(1)
		if r.waitFor(ctx, j, need) {
			v, h, e, err = read(ctx, r.pool)
			if err == nil && h >= need && (wantEpoch < 0 || e == wantEpoch) {
				r.caughtUp.Add(1)
				return v, nil
			}
		}
		if err := ctx.Err(); err != nil {
			var zero T
			return zero, err
		}
		r.behind.Add(1)
	}
	v, _, _, err = read(ctx, j.pool)
	return v, err
}

// replayPoll is how often a read waiting for the standby checks its
// horizon.
const replayPoll = 20 * time.Millisecond

// waitFor waits until the standby's horizon reaches need, at most
// maxWait, and reports whether it did.
func (r *replica) waitFor(ctx context.Context, j *Journal, need int64) bool {
	if r.maxWait <= 0 {
		return false
	}
	deadline := time.Now().Add(r.maxWait)
	for {
		var h int64
		if err := j.queryRowOn(ctx, r.pool, "SELECT next_seq - 1 FROM "+j.sql.meta, nil, &h); err != nil {
			return false
		}
		if h >= need {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		t := time.NewTimer(min(replayPoll, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// queryRowOn is queryRow on pool p.
func (j *Journal) queryRowOn(ctx context.Context, p *connPool, sql string, args []any, dest ...any) error {
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	c, err := p.acquire(ctx)
	if err != nil {
		return err
	}
	defer p.release(c)
	return c.QueryRow(ctx, sql, args...).Scan(dest...)
}
