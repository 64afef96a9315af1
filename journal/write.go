package journal

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcast/walcast/decoder"
)

type appendOpts struct {
	force          bool // journal even at or below the watermark (resync)
	resetWatermark bool // set the watermark to the last transaction's EndLSN even if lower
	source         *Source
	// epoch, when non-zero, starts a new epoch at the batch's first seq
	// (a resync that resets the history); epochReason is recorded with it.
	epoch       int64
	epochReason string
	// snapshots are progress records written with the batch (see
	// AppendSnapshot).
	snapshots []SnapshotProgress
	// requests are snapshot requests recorded in the same transaction
	// (a bootstrap's --snapshot initial, a resync's re-snapshot).
	requests []SnapshotRequest
	// tables, when non-nil, replaces the recorded publication tables
	// (RecordPublishedTables).
	tables *[]Table
}

// entityState is the journal's per-entity bookkeeping (table entity_seqs).
type entityState struct {
	seq      int64 // last entitySeq assigned
	tenanted bool  // a change of the entity has carried (or lacked) a tenant
}

// appendCache is what this process knows of the meta row after its own last
// append. Guarded by Journal.appendMu.
type appendCache struct {
	valid     bool
	gen       int64
	watermark int64
	next      int64                  // next_seq
	epoch     int64                  // the journal's epoch
	epochSeq  int64                  // the epoch's first seq
	entities  map[string]entityState // entity_seqs
	buf       []byte                 // COPY encoding buffer, reused
	chunk     *chunkBuilder          // its column buffers, reused
	// highNext and highWM are next_seq and the watermark after this
	// process's newest committed append; unlike the rest they survive an
	// invalidation, so a meta row found below them means the journal was
	// rewound under this process (ErrJournalRewound).
	highNext, highWM int64
}

// ErrJournalRewound: the journal's meta row is behind what this process
// itself committed — the journal database was restored from a backup or
// failed over to a replica that lacks the tail. Appending on would journal
// new changes after a hole; the replicator must start over, and its resume
// checks find the lost range (the slot is ahead of the watermark).
var ErrJournalRewound = errors.New("the journal is behind what this process committed to it (restored from a backup, or failed over and lost its tail)")

// querier is what lookups need of a connection.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// errStale: an optimistic append found the meta row changed since this
// process's last append; it was rolled back and is retried under the lock.
var errStale = errors.New("journal state changed since the last append")

// append is the one write path, in one Postgres transaction that holds the
// meta row lock from before its first row is written until it commits.
//
// The steady state — this process appended last, under the same generation
// — is optimistic and takes one round trip: the batch is numbered from the
// cached next_seq and encoded, then one query string carries "BEGIN; lock
// the meta row if generation, next_seq and watermark are what the cache says
// (fail otherwise); COPY …; <bookkeeping>; COMMIT". A failed statement stops
// the query string (the server drops the COPY data), so a fenced or stale
// appender writes nothing; the append then runs again pessimistically —
// BEGIN and SELECT … FOR UPDATE of the meta row first, in their own round
// trip — which is also the path when the cache is cold, and where a stale
// generation is reported as ErrFenced. A batch larger than j.oneShotBytes is
// streamed instead of encoded first (a spilled transaction is never held in
// memory) and its bookkeeping and COMMIT take one more round trip.
//
// Because the lock is taken before seqs are written and released only by
// commit, a committed append's seqs start exactly at the next_seq the
// previous committed append left, and it becomes visible after that one:
// seq order is commit order, with no gaps.
func (j *Journal) append(ctx context.Context, op string, gen int64, txs []*decoder.Transaction, o appendOpts) (res AppendResult, err error) {
	if gen < 1 {
		return AppendResult{}, &Error{Op: op, Err: fmt.Errorf("%w (generation %d was never acquired)", ErrFenced, gen), Fix: "call Acquire before appending"}
	}
	j.appendMu.Lock()
	defer j.appendMu.Unlock()

	conn, err := j.pool.acquire(ctx)
	if err != nil {
		return AppendResult{}, opErr(op, err, "")
	}
	defer j.pool.release(conn) // closes it if still in a transaction

	optimistic := j.cache.valid && j.cache.gen == gen
	for {
		res, err = j.appendOnce(ctx, conn, gen, txs, o, optimistic)
		if err != nil && conn.PgConn().TxStatus() != 'I' && !conn.IsClosed() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_, _ = conn.Exec(rctx, "ROLLBACK")
			cancel()
		}
		if err == nil {
			return res, nil
		}
		j.cache.valid = false // the outcome may be ambiguous: reload next time
		j.keys.reset()        // and it may hold keys of the batch that failed
		j.recent.reset()      // and of what it committed, if it did
		if errors.Is(err, errStale) && optimistic {
			optimistic = false
			continue
		}
		if errors.Is(err, ErrFenced) {
			return AppendResult{}, fencedErr(op, gen)
		}
		if errors.Is(err, ErrJournalRewound) {
			return AppendResult{}, opErr(op, err, "nothing was written; walcast run starts over and, finding the slot ahead of the journal, stops with the fix (--recreate-lost-slot journals a resync and starts a new epoch)")
		}
		return AppendResult{}, opErr(op, err, "")
	}
}

func (j *Journal) appendOnce(ctx context.Context, conn *pgx.Conn, gen int64, txs []*decoder.Transaction, o appendOpts, optimistic bool) (AppendResult, error) {
	var res AppendResult
	var wm, nextSeq int64
	if optimistic {
		wm, nextSeq = j.cache.watermark, j.cache.next
	} else {
		var curGen int64
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		var epoch, epochSeq int64
		b.Queue("SELECT m.generation, m.watermark, m.next_seq, m.epoch, coalesce((SELECT first_seq FROM " + j.sql.epochs +
			" WHERE epoch = m.epoch), 1) FROM " + j.sql.meta + " m FOR UPDATE OF m").QueryRow(func(r pgx.Row) error {
			return r.Scan(&curGen, &wm, &nextSeq, &epoch, &epochSeq)
		})
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			return res, err
		}
		if curGen != gen {
			return res, ErrFenced
		}
		if !o.resetWatermark && (nextSeq < j.cache.highNext || wm < j.cache.highWM) {
			return res, fmt.Errorf("%w: next seq %d and watermark %s, after this process committed up to seq %d and watermark %s",
				ErrJournalRewound, nextSeq, decoder.LSN(wm), j.cache.highNext-1, decoder.LSN(j.cache.highWM))
		}
		if !j.cache.valid || j.cache.next != nextSeq || j.cache.entities == nil || j.cache.epoch != epoch {
			j.keys.reset()   // another appender may have written since
			j.recent.reset() // (and the recent log would not end at the horizon)
			if err := j.loadEntities(ctx, conn); err != nil {
				return res, err
			}
		}
		j.cache.epoch, j.cache.epochSeq = epoch, epochSeq
	}

	// Replays: keep transactions strictly above the running watermark.
	kept := make([]*decoder.Transaction, 0, len(txs))
	newWM := wm
	for _, t := range txs {
		if t.EndLSN > math.MaxInt64 {
			return res, fmt.Errorf("commit end LSN %s does not fit the journal's bigint", t.EndLSN)
		}
		if !o.force && int64(t.EndLSN) <= newWM {
			res.Skipped++
			continue
		}
		kept = append(kept, t)
		if o.resetWatermark || int64(t.EndLSN) > newWM {
			newWM = int64(t.EndLSN)
		}
	}
	res.Transactions = len(kept)

	resolve, err := j.lookupTenants(ctx, conn, kept, j.cache.entities, &j.keys)
	if err != nil {
		return res, err
	}
	src := &copySource{txs: kept, next: nextSeq, base: j.cache.entities, dirty: map[string]entityState{}, resolve: resolve, keys: &j.keys, buf: j.cache.buf[:0], chunk: j.cache.chunk}
	j.cache.chunk = nil // given back below only if this append succeeds
	if j.recent.wanted(nextSeq) {
		n := 0
		for _, t := range kept {
			n += t.Len()
		}
		src.keep = newRecentBatch(n) // nil: a larger append is not kept
	}
	reuse := false
	defer func() {
		// Reuse the encoding buffer only after a successful append: after a
		// failed COPY, pgx's reader goroutine may still be reading it.
		if reuse && cap(src.buf) <= 2*j.oneShotBytes+2*chunkBytes {
			j.cache.buf = src.buf[:0]
		}
		if reuse && src.chunk != nil && src.chunk.capacity() <= 4*chunkBytes {
			j.cache.chunk = src.chunk // empty: its last row was encoded
		}
	}()
	// A batch that encodes within j.oneShotBytes is encoded before sending, so
	// the bookkeeping statement (which needs the batch's totals) and COMMIT
	// can follow the COPY in the same query string: the whole append is one
	// round trip. A larger batch streams (a spilled transaction is never
	// held in memory) and the bookkeeping follows in a second round trip.
	oneShot := src.prefill(j.oneShotBytes)
	if src.err != nil {
		return res, src.err
	}
	copySQL := "COPY " + j.sql.chunks + " (" + strings.Join(chunkColumns, ", ") + ") FROM STDIN (FORMAT binary)"
	if optimistic {
		// Lock the meta row and check it is what the cache says before any
		// row is written; on a mismatch the division fails and the rest of
		// the query string, COPY data included, is discarded by the server.
		copySQL = "BEGIN; SELECT 1 / count(*)::integer FROM (SELECT 1 FROM " + j.sql.meta +
			" WHERE generation = " + strconv.FormatInt(gen, 10) + " AND next_seq = " + strconv.FormatInt(nextSeq, 10) +
			" AND watermark = " + strconv.FormatInt(wm, 10) + " FOR UPDATE) l; " + copySQL
	}
	if oneShot {
		copySQL += "; " + j.finishSQL(src, o, gen, nextSeq, wm, newWM) + "; COMMIT"
	}
	_, err = conn.PgConn().CopyFrom(ctx, src, copySQL)
	src.abandon()
	if err == nil && !oneShot {
		err = conn.PgConn().Exec(ctx, j.finishSQL(src, o, gen, nextSeq, wm, newWM)+"; COMMIT").Close()
	}
	if err != nil {
		var pgErr *pgconn.PgError
		switch {
		case src.err != nil:
			return res, fmt.Errorf("%w (COPY aborted: %v)", src.err, err)
		case errors.As(err, &pgErr) && pgErr.Code == "22012" && optimistic:
			return res, errStale // the meta row moved since this process's last append
		case errors.As(err, &pgErr) && pgErr.Code == "22012":
			return res, fmt.Errorf("meta row changed under its lock (a bug): %w", err)
		}
		return res, err
	}
	if st := conn.PgConn().TxStatus(); st != 'I' {
		return res, fmt.Errorf("commit did not end the transaction (status %q)", st)
	}
	written := src.next - nextSeq

	if j.cache.entities == nil {
		j.cache.entities = map[string]entityState{}
	}
	for e, st := range src.dirty {
		j.cache.entities[e] = st
	}
	j.cache.valid, j.cache.gen, j.cache.watermark, j.cache.next = true, gen, newWM, src.next
	j.cache.highNext, j.cache.highWM = src.next, newWM
	if o.epoch != 0 {
		j.cache.epoch, j.cache.epochSeq = o.epoch, nextSeq
	}
	res.Watermark = decoder.LSN(newWM)
	res.Entries = int(written)
	if written == 0 && o.epoch != 0 {
		j.recent.reset()
	}
	if written > 0 {
		res.FirstSeq, res.LastSeq = nextSeq, src.next-1
		// Before the wake-up: the publisher it wakes reads them from
		// memory (recent.go).
		var kept []Entry
		var held int
		if src.keep != nil {
			kept, held = src.keep.done()
		}
		j.recent.add(nextSeq, src.next, kept, held, j.cache.epoch, j.cache.epochSeq)
		// Waiters in this process (the publisher beside the replicator)
		// learn of the commit now, not a NOTIFY round trip later.
		j.wakeLocal(src.next-1, o.epoch)
	}
	res.TenantUnknown = src.unknown
	res.Moved = src.moved
	reuse = true
	return res, nil
}

// defaultOneShotBytes is the largest encoded batch sent in one round trip.
// The encoded batch is held whole until it is sent (and its buffer kept
// for the next append), beside the batch's transactions and the recent
// log's copy of it; a larger batch streams in copyChunk pieces and pays
// one more round trip, small against sending a MiB. At 16 MiB the buffer
// of a batch of small transactions (half the queue's 16 MiB) held 10 MB.
const defaultOneShotBytes = 1 << 20

// finishSQL is the statement that completes an append after its COPY: it
// updates the meta row, upserts the entity sequences and notifies. (It still
// fails with division_by_zero should the meta row not be what the append was
// built on — impossible under the lock — and an error stops the query
// string, so the COMMIT after it would never run.) Data-modifying CTEs run whether or not they
// are read. It is sent as a simple query after the COPY data, so values are
// inlined: numbers formatted by strconv, text as hex (decode(…, 'hex')),
// which no setting or input can turn into SQL.
func (j *Journal) finishSQL(src *copySource, o appendOpts, gen, nextSeq, wm, newWM int64) string {
	var b strings.Builder
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	b.WriteString("WITH u AS (UPDATE " + j.sql.meta + " SET watermark = " + i(newWM) + ", next_seq = " + i(src.next) +
		", appended_bytes = appended_bytes + " + i(src.bytes) + ", resync_seq = greatest(resync_seq, " + i(src.resyncSeq) + ")")
	if o.source != nil {
		b.WriteString(", system_id = " + textLit(o.source.SystemID) + ", timeline = " + i(int64(o.source.Timeline)) + ", slot = " + textLit(o.source.Slot))
	}
	if o.epoch != 0 {
		b.WriteString(", epoch = " + i(o.epoch))
	}
	if o.tables != nil {
		b.WriteString(", publication_recorded = true")
	}
	b.WriteString(" WHERE generation = " + i(gen) + " AND next_seq = " + i(nextSeq) + " AND watermark = " + i(wm) + " RETURNING epoch)")
	if o.epoch != 0 {
		// Epochs that began at or after this seq belong to a history the
		// journal no longer has (none survive a restore, but a table is
		// cheap to keep exact).
		b.WriteString(", ed AS (DELETE FROM " + j.sql.epochs + " WHERE first_seq >= " + i(nextSeq) + ")" +
			", ei AS (INSERT INTO " + j.sql.epochs + " (epoch, first_seq, reason) VALUES (" + i(o.epoch) + ", " + i(nextSeq) + ", " + textLit(o.epochReason) + "))")
	}
	// Entities this process knows get a plain UPDATE (cheaper than an
	// upsert's speculative insertion); new ones an INSERT that still
	// tolerates a row it did not know of.
	var upd, ins []string
	for e, st := range src.dirty {
		row := "(" + textLit(e) + "," + i(st.seq) + "," + strconv.FormatBool(st.tenanted) + ")"
		if _, known := src.base[e]; known {
			upd = append(upd, row)
		} else {
			ins = append(ins, row)
		}
	}
	if len(upd) > 0 {
		b.WriteString(", e AS (UPDATE " + j.sql.entitySeqs + " AS s SET last_seq = v.seq, tenanted = s.tenanted OR v.tenanted FROM (VALUES " +
			strings.Join(upd, ",") + ") AS v(entity, seq, tenanted) WHERE s.entity = v.entity)")
	}
	if len(ins) > 0 {
		b.WriteString(", n AS (INSERT INTO " + j.sql.entitySeqs + " AS s (entity, last_seq, tenanted) VALUES " + strings.Join(ins, ",") +
			" ON CONFLICT (entity) DO UPDATE SET last_seq = excluded.last_seq, tenanted = s.tenanted OR excluded.tenanted)")
	}
	for n, p := range o.snapshots {
		if int64(p.EndLSN) <= wm && !o.force {
			continue // its transaction was skipped as a replay
		}
		b.WriteString(", s" + i(int64(n)) + " AS (" + j.snapshotProgressSQL(p) + ")")
	}
	if len(o.requests) > 0 {
		b.WriteString(", rq AS (" + j.snapshotRequestsSQL(o.requests) + ")")
	}
	if o.tables != nil {
		b.WriteString(j.publishedTablesSQL(*o.tables))
	}
	b.WriteString(" SELECT 1 / (SELECT count(*)::integer FROM u)")
	if src.next > nextSeq {
		// The payload names the epoch too (parseNotification): a new one
		// tells waiters that seqs started again.
		b.WriteString(", pg_notify(" + textLit(j.channel) + ", '" + i(src.next-1) + " ' || (SELECT epoch FROM u))")
	}
	return b.String()
}

// textLit renders s as an SQL expression of type text that is safe whatever
// s holds and whatever standard_conforming_strings says.
func textLit(s string) string {
	return "convert_from(decode('" + hex.EncodeToString([]byte(s)) + "', 'hex'), 'UTF8')"
}

func (j *Journal) loadEntities(ctx context.Context, q querier) error {
	rows, err := q.Query(ctx, "SELECT entity, last_seq, tenanted FROM "+j.sql.entitySeqs)
	if err != nil {
		return err
	}
	m := map[string]entityState{}
	var e string
	var st entityState
	_, err = pgx.ForEachRow(rows, []any{&e, &st.seq, &st.tenanted}, func() error { m[e] = st; return nil })
	if err != nil {
		return err
	}
	j.cache.entities = m
	return nil
}
