package journal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Retention bounds the journal. Zero fields are unbounded; the newest entry
// is always kept whatever the bounds.
type Retention struct {
	MaxRows  int64         // retained entries
	MaxBytes int64         // retained envelope bytes
	MaxAge   time.Duration // by commitTime, against the local clock
	// BatchSize is the most entries one prune transaction deletes; default
	// 5000. Appends never wait for pruning (they lock different rows), and
	// readers only ever see whole batches disappear.
	BatchSize int
}

// PruneResult reports what Prune deleted.
type PruneResult struct {
	Rows, Bytes int64
	Floor       int64 // the floor afterwards
	Batches     int
}

// Prune deletes the oldest entries, one bounded batch per transaction, until
// the journal is within r, and moves the floor with them. Concurrent Prune
// calls (even from several processes) are serialized by the retention row.
func (j *Journal) Prune(ctx context.Context, r Retention) (PruneResult, error) {
	if r.BatchSize <= 0 {
		r.BatchSize = 5000
	}
	var total PruneResult
	for {
		if err := ctx.Err(); err != nil {
			return total, opErr("journal.Prune", err, "")
		}
		n, bytes, floor, err := j.pruneBatch(ctx, r)
		if err != nil {
			return total, opErr("journal.Prune", err, "")
		}
		total.Floor = floor
		if n == 0 {
			return total, nil
		}
		total.Rows += n
		total.Bytes += bytes
		total.Batches++
	}
}

var errStop = errors.New("stop")

func (j *Journal) pruneBatch(ctx context.Context, r Retention) (n, bytes, floor int64, err error) {
	err = j.inTx(ctx, pgx.TxOptions{}, func(ctx context.Context, tx pgx.Tx) error {
		var prunedBytes, horizon, appendedBytes int64
		if err := tx.QueryRow(ctx, "SELECT floor, pruned_bytes FROM "+j.sql.retention+" FOR UPDATE").Scan(&floor, &prunedBytes); err != nil {
			return err
		}
		// No lock on meta: appends only move these forward, and an append
		// racing this batch adds rows above the horizon read here.
		if err := tx.QueryRow(ctx, "SELECT next_seq - 1, appended_bytes FROM "+j.sql.meta).Scan(&horizon, &appendedBytes); err != nil {
			return err
		}
		rows := horizon - floor + 1
		size := appendedBytes - prunedBytes
		if horizon <= floor { // at most one entry: always kept
			return errStop
		}
		cutoff := time.Time{}
		if r.MaxAge > 0 {
			cutoff = time.Now().Add(-r.MaxAge)
		}
		over := func() bool {
			return (r.MaxRows > 0 && rows > r.MaxRows) || (r.MaxBytes > 0 && size > r.MaxBytes)
		}
		if !over() && cutoff.IsZero() {
			return errStop
		}
		// Walk the oldest entries (never the newest) and decide how far to cut.
		// seq is contiguous: the batch is exactly [floor, floor+BatchSize).
		upto := min(floor+int64(r.BatchSize)-1, horizon-1)
		q, err := tx.Query(ctx, "SELECT seq, size, commit_time FROM "+j.entriesIn("$1::bigint - 1", "$2::bigint", "size", "commit_time")+
			" e ORDER BY seq", floor, upto)
		if err != nil {
			return err
		}
		// Cut the longest prefix whose every entry is over a bound; stop at
		// the first entry that is not (commit times need not be monotonic
		// across a source clock step, and a prefix is all the floor can
		// describe).
		last := floor - 1
		stopped := false
		var seq, sz int64
		var ct time.Time
		_, err = pgx.ForEachRow(q, []any{&seq, &sz, &ct}, func() error {
			if stopped || last != seq-1 { // a hole cannot happen: seq is contiguous
				stopped = true
				return nil
			}
			if !over() && (cutoff.IsZero() || !ct.Before(cutoff)) {
				stopped = true
				return nil
			}
			last = seq
			rows--
			size -= sz
			bytes += sz
			return nil
		})
		if err != nil {
			return err
		}
		if last < floor {
			return errStop
		}
		// Chunks wholly below the new floor go; a chunk the floor cuts
		// stays until a later pass passes its end (reads never go below
		// the floor).
		if _, err := tx.Exec(ctx, "DELETE FROM "+j.sql.chunks+" WHERE last_seq <= $1", last); err != nil {
			return err
		}
		n = last - floor + 1
		floor = last + 1
		_, err = tx.Exec(ctx, "UPDATE "+j.sql.retention+" SET floor = $1, pruned_bytes = pruned_bytes + $2", floor, bytes)
		return err
	})
	if errors.Is(err, errStop) {
		return 0, 0, floor, nil
	}
	if err != nil {
		return 0, 0, 0, fmt.Errorf("prune: %w", err)
	}
	return n, bytes, floor, nil
}

// RunRetention prunes every interval (default one minute) until ctx ends,
// then returns ctx's error. The caller owns it: run it in a goroutine it
// cancels and waits for. A failed pass is retried at the next tick; the last
// error is returned through onError when it is non-nil.
func (j *Journal) RunRetention(ctx context.Context, r Retention, interval time.Duration, onError func(error)) error {
	if interval <= 0 {
		interval = time.Minute
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := j.Prune(ctx, r); err != nil && ctx.Err() == nil && onError != nil {
			onError(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
