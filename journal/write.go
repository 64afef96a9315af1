package journal

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
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

// ErrUnencodable is in the chain of an append error caused by a change the
// journal cannot encode as an entry (its body is not a JSON object, its LSN
// does not fit): the same input fails the same way, so the replicator
// quarantines it rather than retrying forever.
var ErrUnencodable = errors.New("change cannot be journaled as-is")

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
	src := &copySource{txs: kept, next: nextSeq, base: j.cache.entities, dirty: map[string]entityState{}, resolve: resolve, keys: &j.keys, buf: j.cache.buf[:0]}
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
		if reuse && cap(src.buf) <= j.oneShotBytes+2*copyChunk {
			j.cache.buf = src.buf[:0]
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

// copySource streams a batch's changes as COPY binary data (an io.Reader),
// building each row's envelope as it goes, so a spilled transaction is never
// materialised.
type copySource struct {
	txs     []*decoder.Transaction
	ti      int
	cur     *decoder.Transaction
	it      *decoder.ChangeIter
	next    int64                            // seq of the next row
	base    map[string]entityState           // before the batch (read only)
	dirty   map[string]entityState           // changed in the batch
	resolve map[string]map[string]*tenantRes // nil when no change needs resolving
	// keys learns the tenant of every key written for a tenanted entity;
	// a failed append resets it (append). Nil in tests of the encoding.
	keys *keyTenants
	// keep gathers the rows for the recent log (recent.go); nil in tests
	// of the encoding.
	keep *recentBatch

	chunk     *chunkBuilder // entries not yet encoded as a chunk row
	buf       []byte        // encoded, not yet read
	off       int
	started   bool
	finished  bool
	env       []byte // scratch for one envelope
	bytes     int64
	unknown   int
	moved     int // deletes written for rows that changed tenant
	resyncSeq int64
	err       error

	// mu is held by every Read. pgconn.CopyFrom can return on a server or
	// connection error while its reader goroutine is still inside Read (or
	// about to call it); abandon takes mu once CopyFrom has returned, so no
	// Read touches the source, its buffer or its transactions afterwards.
	mu        sync.Mutex
	abandoned bool
}

const copyChunk = 64 << 10

var errAbandoned = errors.New("journal: COPY source read after the COPY ended")

// abandon stops the source for good; see mu.
func (s *copySource) abandon() {
	s.mu.Lock()
	s.abandoned = true
	s.mu.Unlock()
}

// Read implements io.Reader for pgconn.CopyFrom.
func (s *copySource) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.abandoned {
		return 0, errAbandoned
	}
	if s.off == len(s.buf) {
		if s.err != nil {
			return 0, s.err
		}
		if s.finished {
			return 0, io.EOF
		}
		s.fill()
		if s.off == len(s.buf) && s.err != nil {
			return 0, s.err
		}
	}
	n := copy(p, s.buf[s.off:])
	s.off += n
	return n, nil
}

// prefill encodes rows until the batch ends (true) or limit bytes are
// buffered (false); Read then serves them first.
func (s *copySource) prefill(limit int) bool {
	s.encodeUntil(limit)
	return s.finished && s.err == nil
}

// fill replaces buf with about copyChunk bytes of rows.
func (s *copySource) fill() {
	s.buf, s.off = s.buf[:0], 0
	s.encodeUntil(copyChunk)
}

// encodeUntil appends rows to buf until it holds limit bytes or the batch
// ends (appending the trailer and setting finished).
func (s *copySource) encodeUntil(limit int) {
	if !s.started {
		s.started = true
		s.buf = append(s.buf, "PGCOPY\n\xff\r\n\x00"...)
		s.buf = binary.BigEndian.AppendUint32(s.buf, 0) // flags
		s.buf = binary.BigEndian.AppendUint32(s.buf, 0) // header extension
	}
	for len(s.buf) < limit && !s.finished {
		if s.it == nil {
			if s.ti >= len(s.txs) {
				if s.chunk != nil {
					s.buf = s.chunk.row(s.buf)
				}
				s.buf = binary.BigEndian.AppendUint16(s.buf, 0xffff) // trailer
				s.finished = true
				return
			}
			s.cur = s.txs[s.ti]
			s.ti++
			s.it = s.cur.Changes()
		}
		if s.it.Next() {
			if s.err = s.encode(s.it.Change()); s.err != nil {
				s.buf = s.buf[:0]
				return
			}
			continue
		}
		if err := s.it.Err(); err != nil {
			s.err = fmt.Errorf("read transaction %d: %w", s.cur.Xid, err)
			s.buf = s.buf[:0]
			return
		}
		s.it = nil
	}
}

var (
	seqPrefix       = []byte(`{"seq":`)
	entitySeqInfix  = []byte(`,"entitySeq":`)
	tenantUnknownKV = []byte(`,"tenantUnknown":true}`)
)

// pgEpoch is PostgreSQL's timestamp epoch, in Unix microseconds.
const pgEpoch = 946684800 * 1000000

// encode appends one change's rows in COPY binary format, columns as
// entryColumns: one row, or two for an update that moved its row to
// another tenant (moved).
func (s *copySource) encode(c *decoder.Change) error {
	t := s.cur
	body := c.Body
	if len(body) < 3 || body[0] != '{' || body[1] != '"' || body[len(body)-1] != '}' {
		return fmt.Errorf("%w: change at %s in transaction %d: body is not a JSON object starting with a field", ErrUnencodable, c.LSN, t.Xid)
	}
	if c.LSN > math.MaxInt64 {
		return fmt.Errorf("%w: change LSN %s does not fit the journal's bigint", ErrUnencodable, c.LSN)
	}
	st, ok := s.dirty[c.Entity]
	if !ok {
		st = s.base[c.Entity]
	}
	if c.TenantState != decoder.TenantNone || c.Tenanted {
		st.tenanted = true
	}

	// The key's previous tenant, when the change needs it (priorKey).
	var prior *tenantRes
	pk := priorKey(c)
	if pk != nil && s.resolve != nil {
		prior = s.resolve[c.Entity][string(pk)]
	}

	var tenant []byte
	hasTenant, unknown := false, false
	var suffix []byte // replaces the body's closing brace when non-nil
	switch c.TenantState {
	case decoder.TenantKnown:
		tenant, hasTenant = []byte(c.Tenant), true
	case decoder.TenantUnresolved:
		switch {
		case prior == nil || !prior.found:
			unknown = true
			s.unknown++
			suffix = tenantUnknownKV
		case prior.tenant != nil:
			tenant, hasTenant = []byte(*prior.tenant), true
			q, _ := json.Marshal(*prior.tenant)
			suffix = append(append([]byte(`,"tenant":`), q...), '}')
		}
	}

	if c.Op == decoder.OpUpdate && !unknown && c.Key != nil {
		// Did the row change tenant? Its old tenant is in the old row
		// (FULL, or an identity holding the tenant column), else it is the
		// tenant of the newest change of its old key.
		var old *string
		oldKnown := false
		switch {
		case c.OldTenantState == decoder.TenantKnown:
			v := c.OldTenant
			old, oldKnown = &v, true
		case c.OldTenantState == decoder.TenantNone:
			oldKnown = c.Tenanted // zero for changes built without the old row's state
		case prior != nil && prior.found:
			old, oldKnown = prior.tenant, true
		}
		if oldKnown && ((old != nil) != hasTenant || (old != nil && *old != string(tenant))) {
			oldKey := c.OldKey
			if oldKey == nil {
				oldKey = c.Key
			}
			if err := s.encodeMoved(c, &st, oldKey, old); err != nil {
				return err
			}
			s.learn(c.Entity, oldKey, old)
		}
	}

	seq := s.next
	s.next++
	st.seq++
	s.dirty[c.Entity] = st
	if c.Op == decoder.OpResync {
		s.resyncSeq = seq
	}
	if !unknown && c.Key != nil && st.tenanted {
		var v *string
		if hasTenant {
			x := string(tenant)
			v = &x
		}
		s.learn(c.Entity, c.Key, v)
	}

	e := append(s.env[:0], seqPrefix...)
	e = strconv.AppendInt(e, seq, 10)
	e = append(e, entitySeqInfix...)
	e = strconv.AppendInt(e, st.seq, 10)
	e = append(e, ',')
	if suffix == nil {
		e = append(e, body[1:]...)
	} else {
		e = append(e, body[1:len(body)-1]...)
		e = append(e, suffix...)
	}
	s.env = e
	s.row(c, seq, st, c.Op, c.Key, tenant, hasTenant, unknown, e)
	return nil
}

// learn records the tenant (nil: none) of the newest change of a key of a
// tenanted entity so far: for the batch's later changes that look it up,
// and for later appends (keys).
func (s *copySource) learn(entity string, key []byte, tenant *string) {
	if s.keys != nil {
		t := keyTenant{has: tenant != nil}
		if tenant != nil {
			t.tenant = *tenant
		}
		s.keys.put(entity, key, t)
	}
	if s.resolve == nil {
		return
	}
	if r := s.resolve[entity][string(key)]; r != nil {
		r.found, r.tenant = true, tenant
	}
}

// movedKV marks the delete an update's move to another tenant is journaled
// with (see encodeMoved).
var movedKV = []byte(`,"moved":"tenant"}`)

// encodeMoved appends the entry that takes a row out of its old tenant when
// update c moves it to another (DESIGN §5): a delete of the old key in the
// old tenant (nil: none), journaled just before the update with its own seq
// and entitySeq, and marked "moved":"tenant". It is shaped as a key-only
// delete — key and before both the old key — with the update's position,
// transaction and entity, and says nothing of the new tenant.
func (s *copySource) encodeMoved(c *decoder.Change, st *entityState, oldKey []byte, old *string) error {
	body := c.Body
	// The body is `{"lsn":…,"commitTime":"…","entity":"…","op":"update",…}`;
	// the entity is a JSON string, in which `,"` cannot occur, so the first
	// `,"op":"` after `,"entity":` is the op's.
	i := bytes.Index(body, entityKey)
	var k int
	if i >= 0 {
		k = bytes.Index(body[i:], opKey)
	}
	if i < 0 || k < 0 {
		return fmt.Errorf("%w: update at %s in transaction %d: body has no entity and op", ErrUnencodable, c.LSN, s.cur.Xid)
	}
	seq := s.next
	s.next++
	st.seq++
	e := append(s.env[:0], seqPrefix...)
	e = strconv.AppendInt(e, seq, 10)
	e = append(e, entitySeqInfix...)
	e = strconv.AppendInt(e, st.seq, 10)
	e = append(e, ',')
	e = append(e, body[1:i+k]...)
	e = append(e, `,"op":"delete","key":`...)
	e = append(e, oldKey...)
	e = append(e, `,"before":`...)
	e = append(e, oldKey...)
	var tenant []byte
	if old != nil {
		tenant = []byte(*old)
		q, _ := json.Marshal(*old)
		e = append(e, `,"tenant":`...)
		e = append(e, q...)
	}
	e = append(e, movedKV...)
	s.env = e
	s.moved++
	s.row(c, seq, *st, decoder.OpDelete, oldKey, tenant, old != nil, false, e)
	return nil
}

var (
	entityKey = []byte(`,"entity":`)
	opKey     = []byte(`,"op":"`)
)

// row adds one entry with envelope e to the current chunk, first encoding
// the chunk as a COPY row if it is full.
func (s *copySource) row(c *decoder.Change, seq int64, st entityState, op decoder.Op, key, tenant []byte, hasTenant, unknown bool, e []byte) {
	t := s.cur
	s.bytes += int64(len(e))
	if s.chunk == nil {
		s.chunk = newChunkBuilder()
	}
	k := s.chunk
	if k.full() {
		s.buf = k.row(s.buf)
	}
	if k.n == 0 {
		k.first = seq
	}
	k.n++
	k.bytes += len(e)
	k.entity.text([]byte(c.Entity))
	k.entitySeq.int8(st.seq)
	if hasTenant {
		k.tenant.text(tenant)
	} else {
		k.tenant.null()
	}
	k.unknown.bool(unknown)
	k.op.text([]byte(op))
	// Only entities that carry tenants need their keys found again (to
	// route a key-only delete, to see a row change tenant); indexing the
	// others' keys would tax every append for nothing.
	if key != nil && st.tenanted {
		k.keyHash.int8(keyHash(c.Entity, key))
	} else {
		k.keyHash.null()
	}
	if key != nil {
		k.key.text(key)
	} else {
		k.key.null()
	}
	k.lsn.int8(int64(c.LSN))
	k.commitLSN.int8(int64(t.EndLSN))
	k.xid.int8(int64(t.Xid))
	k.commitTime.int8(t.CommitTime.UnixMicro() - pgEpoch)
	k.size.int4(int32(len(e)))
	k.envelope.text(e)
	if x, ok := xid8(t); ok {
		k.xid8.int8(x)
	} else {
		k.xid8.null() // unknown
	}
	if s.keep != nil {
		s.keep.add(rowEntry(c, t, seq, st.seq, op, tenant, hasTenant, unknown), e)
	}
}

// xid8 is the entries.xid8 value of t's rows: its 64-bit xid, 0 for an
// entry of no transaction (xid 0), and false (NULL) when the full xid is
// not known or does not extend the 32-bit one.
func xid8(t *decoder.Transaction) (int64, bool) {
	switch {
	case t.Xid == 0:
		return 0, true
	case t.Xid8 == 0 || uint32(t.Xid8) != t.Xid || t.Xid8 > math.MaxInt64:
		return 0, false
	}
	return int64(t.Xid8), true
}

func appendInt8(b []byte, v int64) []byte {
	b = binary.BigEndian.AppendUint32(b, 8)
	return binary.BigEndian.AppendUint64(b, uint64(v))
}
