package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// stream runs the receive loop (this goroutine: the only one that touches
// conn) and the journal writer (one goroutine it owns) until ctx ends or
// either fails; cats, the session's catalog writer, runs on a goroutine it
// owns too.
func (r *Replicator) stream(ctx context.Context, conn *pgconn.PgConn, gen int64, statusEvery time.Duration, cats *catalogWriter) error {
	cat := &catalogLookup{r: r, ctx: ctx}
	defer cat.close()
	dec := decoder.New(decoder.Config{
		SkipRelations: r.skipRelations, MessagePrefix: r.cfg.MessagePrefix, TenantColumn: r.cfg.TenantColumn,
		OnQuarantine: func(reason string) { r.quarantined.add(reason, 1) }, MaxEnvelopeBytes: r.cfg.MaxEnvelopeBytes,
		MemoryBudget: r.cfg.decoderBudget(), SpillDir: r.cfg.SpillDir, Counters: r.decoded,
		ControlPrefix: snapshotPrefix, OnControlDropped: func(reason string) { r.controlsDropped.add(reason, 1) },
		ArrayElement: cat.arrayElement, KeyColumns: cat.keyColumns, Unscoped: cat.unscoped,
		MaxTransactionBytes: r.cfg.MaxTransactionBytes, OnTransactionQuarantine: r.transactionQuarantined,
	})
	q := newBoundedQueue(r.cfg.QueueMaxChanges, r.cfg.QueueMaxBytes)
	wake := &waker{}
	writerDone := make(chan error, 1)
	go func() { writerDone <- r.writer(ctx, q, gen, wake) }()

	// The snapshot worker runs for the session: its watermarks are matched
	// by this session's loop only.
	snaps := newSnapshotter(r, gen)
	sctx, stopSnaps := context.WithCancel(ctx)
	snapsDone := make(chan struct{})
	go func() {
		defer close(snapsDone)
		snaps.runWorker(sctx)
	}()
	// The catalog writer too: a Relation message nudges it.
	catsDone := make(chan struct{})
	go func() {
		defer close(catsDone)
		cats.run(sctx)
	}()

	loop := &streamLoop{r: r, conn: conn, dec: dec, q: q, wake: wake, writerDone: writerDone, statusEvery: statusEvery,
		snaps: &snapWindows{s: snaps}, cats: cats}
	if r.skipRelations != nil {
		loop.advanceSlack = ownWALSlack
	}
	r.cov.setWake(wake.wake)
	err := loop.run(ctx)
	r.cov.setWake(nil)
	stopSnaps()
	<-snapsDone
	<-catsDone

	// Stop the writer: it finishes the batch in flight (journaled batches are
	// durable and will be acknowledged below) and drops what is queued, which
	// Postgres resends after the restart because it was never acknowledged.
	q.close()
	werr := loop.writerErr
	if !loop.writerExited {
		werr = <-writerDone
	}
	for _, it := range q.drain() {
		it.release()
	}
	if derr := dec.Close(); derr != nil && err == nil {
		err = derr
	}
	if err == nil && werr != nil {
		err = werr
	}
	// Final status update with what is durable, when the connection still
	// works (graceful shutdown).
	if conn.IsClosed() {
		return err
	}
	wm := decoder.LSN(r.watermark.Load())
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second) // a source that stopped answering must not hold up shutdown
	defer cancel()
	if serr := sendStatus(sctx, conn, wm, false); serr == nil && ctx.Err() != nil {
		r.log.Info("stopped; final status update sent", "watermark", wm.String())
	}
	return err
}

// ownWALSlack bounds the WAL one watermark advance writes when the journal
// lives in the source database (the meta row's update and commit, a page
// image after a checkpoint, the standby snapshot that follows): while the
// source is idle the slot is confirmed to within this of the server's end,
// and no closer, so that walcast's own writes never feed themselves.
const ownWALSlack = 32 << 10

// dropEmpty closes and leaves out the transactions whose every change was
// dropped (journal tables, messages of other prefixes): they are never
// journaled. Their end positions are covered by the next idle keepalive
// advance, so they pin no WAL. It filters txs in place.
func dropEmpty(txs []*decoder.Transaction) []*decoder.Transaction {
	kept := txs[:0]
	for _, tx := range txs {
		if tx.Len() == 0 {
			_ = tx.Close() // a spilled one whose changes all aborted still has a file
			continue
		}
		kept = append(kept, tx)
	}
	return kept
}

func sendStatus(ctx context.Context, conn *pgconn.PgConn, wm decoder.LSN, reply bool) error {
	// Write, flush and apply are all set explicitly: pglogrepl would copy the
	// write position into a zero flush position, and the server's live
	// position must never be sent (DESIGN §4.4).
	p := pglogrepl.LSN(wm)
	return pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: p, WALFlushPosition: p, WALApplyPosition: p,
		ClientTime: time.Now(), ReplyRequested: reply,
	})
}

// streamLoop is the receive side of a session.
type streamLoop struct {
	r           *Replicator
	conn        *pgconn.PgConn
	dec         *decoder.Decoder
	q           *queue
	wake        *waker
	deadline    time.Time // the socket's read deadline as the loop last set it; zero: set it again
	writerDone  chan error
	statusEvery time.Duration

	writerExited bool
	writerErr    error

	// advanceSlack is how far the server's WAL end may run ahead of the
	// watermark, while idle, before a keepalive's position is journaled:
	// ownWALSlack when the journal lives in the source database, else 0.
	advanceSlack decoder.LSN

	snaps *snapWindows   // the loop's side of snapshots
	cats  *catalogWriter // nudged by Relation messages

	// Batched reads (SO_RCVLOWAT) while far behind the server: behind is
	// set when a transaction committed more than catchUpLag before it was
	// decoded, cleared by a batched read that waited its lowatWait (or a
	// recent commit); lowat says the socket's option is raised, noLowat that
	// the socket refused it.
	behind, lowat, noLowat bool

	sentWM      decoder.LSN
	nextStatus  time.Time
	lastAdvance time.Time
	lastRecv    time.Time
	txs         []*decoder.Transaction
}

// Batched reads while catching up (streamLoop.run).
const (
	catchUpLag     = time.Second           // age of a decoded commit from which reads are batched
	recvBatchBytes = 8 << 10               // bytes a batched read waits for: pgconn's read buffer
	lowatWait      = 20 * time.Millisecond // longest a batched read waits for them
)

func (l *streamLoop) run(ctx context.Context) error {
	now := time.Now()
	l.lastRecv = now
	l.nextStatus = now
	silence := 2 * l.statusEvery
	// Receives wait on the socket's read deadline (a status update due, or
	// the server silent too long), not on a context: pgconn arms a watcher
	// for every receive given a cancellable context, a tenth of a
	// catch-up's CPU. The deadline is set only when it changes; the
	// writer's new watermark (wake) and shutdown move it to now, which
	// ends a blocked receive with a timeout that leaves the connection
	// usable. A deadline computed before later messages moved lastRecv or
	// nextStatus is only early, which costs one more turn of the loop.
	nc := l.conn.Conn()
	interrupt := func() { _ = nc.SetReadDeadline(time.Now()) }
	l.wake.setInterrupt(interrupt)
	stopOnDone := context.AfterFunc(ctx, interrupt)
	defer func() {
		stopOnDone()
		l.wake.setInterrupt(nil)
		_ = nc.SetReadDeadline(time.Time{}) // the connection outlives the loop
		if l.lowat {
			setRecvLowat(nc, 1)
			l.lowat = false
		}
	}()
	l.deadline = time.Time{}
	for {
		if ctx.Err() != nil {
			return nil
		}
		if !l.writerExited {
			select {
			case err := <-l.writerDone:
				l.writerExited, l.writerErr = true, err
			default:
			}
		}
		if l.writerExited {
			if l.writerErr == nil {
				return errors.New("journal writer stopped")
			}
			return l.writerErr
		}
		if l.r.cov.want.Swap(false) {
			// Covered waits: a keepalive tells how far the server has
			// sent, which is journaled once nothing is in flight.
			if err := l.sendStatus(ctx, true); err != nil {
				return err
			}
		}
		if err := l.maybeSendStatus(ctx); err != nil {
			return err
		}
		if time.Since(l.lastRecv) > silence {
			return fmt.Errorf("no message from the server for %s (more than twice the status interval); reconnecting", silence.Round(time.Second))
		}
		if l.q.full() {
			// Back-pressure: stop reading WAL, keep the session alive with
			// status updates until the writer drains the queue. The server
			// does not time us out while our updates keep coming.
			l.waitForRoom(ctx)
			l.lastRecv = time.Now() // silence is ours, not the server's
			continue
		}
		deadline := l.nextStatus
		if d := l.lastRecv.Add(silence); d.Before(deadline) {
			deadline = d
		}
		// While far behind, a read wakes only once recvBatchBytes are
		// waiting: one wake-up and one read per many messages, where a
		// reader as fast as the server otherwise takes a few messages at a
		// time (a third of walcast's CPU in a catch-up). lowatWait bounds
		// what that can add to a change's latency; rounding it keeps the
		// deadline from moving with every message.
		if l.behind != l.lowat && !l.noLowat {
			n := 1
			if l.behind {
				n = recvBatchBytes
			}
			if setRecvLowat(nc, n) {
				l.lowat = l.behind
			} else {
				l.noLowat = true
			}
		}
		if l.lowat {
			if d := l.lastRecv.Truncate(lowatWait / 2).Add(lowatWait); d.Before(deadline) {
				deadline = d
			}
		}
		if !deadline.Equal(l.deadline) {
			if err := nc.SetReadDeadline(deadline); err != nil {
				return classifyStreamError("receive replication stream", err)
			}
			l.deadline = deadline
		}
		if l.wake.take() {
			continue // a new watermark to acknowledge first
		}
		// context.Background exactly: pgconn skips its watcher for it.
		msg, err := l.conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				if l.lowat && !time.Now().Before(l.deadline) {
					l.behind = false // fewer bytes than a batch came in lowatWait: read them
				}
				l.deadline = time.Time{} // an interrupt may have moved it
				continue                 // status due, or woken by a new watermark
			}
			return classifyStreamError("receive replication stream", err)
		}
		l.lastRecv = time.Now()
		if err := l.handle(ctx, msg); err != nil {
			return err
		}
	}
}

func (l *streamLoop) handle(ctx context.Context, msg pgproto3.BackendMessage) error {
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		if len(msg.Data) == 0 {
			return errors.New("empty CopyData from server")
		}
		switch msg.Data[0] {
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(msg.Data[1:])
			if err != nil {
				return fmt.Errorf("parse XLogData: %w", err)
			}
			if x.ServerWALEnd > 0 {
				l.r.serverEnd.Store(uint64(x.ServerWALEnd))
			}
			// The decoder only borrows WALData for the call, so the receive
			// buffer is never copied.
			if err := l.dec.Decode(decoder.LSN(x.WALStart), x.WALData); err != nil {
				return err
			}
			if len(x.WALData) > 0 && x.WALData[0] == 'R' && l.cats != nil {
				l.cats.nudge() // a relation's shape may have changed: record it
			}
			l.txs = l.dec.Committed(l.txs[:0])
			if len(l.txs) > 0 {
				// XLogData's WAL end is the message's own position in
				// logical replication, so how far behind the stream is
				// shows in the commit times instead.
				l.behind = time.Since(l.txs[len(l.txs)-1].CommitTime) > catchUpLag
				var progress map[*decoder.Transaction]*journal.SnapshotProgress
				l.txs, progress = l.snaps.process(l.txs)
				if kept := dropEmpty(l.txs); len(kept) > 0 {
					l.q.pushWith(kept, progress)
				}
				clear(l.txs)
			}
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
			if err != nil {
				return fmt.Errorf("parse keepalive: %w", err)
			}
			end := decoder.LSN(k.ServerWALEnd)
			l.r.serverEnd.Store(uint64(end))
			if l.dec.Idle() && l.q.idle() {
				// Everything the server sent before end is journaled (or
				// was not ours): covered, with nothing written.
				l.r.cov.advance(end)
			}
			// Confirm the keepalive's position only when nothing is decoded
			// but unjournaled: journal it as the watermark first, so the
			// slot never runs ahead of the journal (DESIGN §4.4, §4.6).
			// At most one such advance per half status interval; and when
			// the journal lives in the source database, only past
			// advanceSlack bytes: each advance is WAL of its own, which must
			// not bring another advance, or an idle source would never be
			// idle. A keepalive that asks for a reply gets the advance
			// whatever the gap: a server shutting down asks, and waits for
			// the slot to confirm everything it sent (the shutdown
			// checkpoint) before it can stop; otherwise the server asks only
			// when our replies are late, which our status interval avoids.
			slack := l.advanceSlack
			if k.ReplyRequested {
				slack = 0
			}
			if end > decoder.LSN(l.r.watermark.Load())+slack && l.dec.Idle() && l.q.idle() &&
				time.Since(l.lastAdvance) >= l.statusEvery/2 {
				l.q.pushAdvance(end)
				l.lastAdvance = time.Now()
			}
			if k.ReplyRequested {
				return l.sendStatus(ctx, false)
			}
		}
	case *pgproto3.CopyDone:
		return errors.New("the server ended the replication stream")
	case *pgproto3.ErrorResponse:
		return classifyStreamError("replication stream", pgconn.ErrorResponseToPgError(msg))
	}
	return nil
}

// maybeSendStatus sends a status update when the watermark moved or one is
// due. When one is due and nothing is in flight it asks the server to reply,
// so a keepalive with the server's position comes back and an idle slot
// advances past WAL of unpublished tables.
func (l *streamLoop) maybeSendStatus(ctx context.Context) error {
	wm := decoder.LSN(l.r.watermark.Load())
	due := !time.Now().Before(l.nextStatus)
	if wm == l.sentWM && !due {
		return nil
	}
	return l.sendStatus(ctx, due && l.dec.Idle() && l.q.idle())
}

func (l *streamLoop) sendStatus(ctx context.Context, reply bool) error {
	wm := decoder.LSN(l.r.watermark.Load())
	if err := sendStatus(ctx, l.conn, wm, reply); err != nil {
		return fmt.Errorf("send status update: %w", err)
	}
	l.sentWM = wm
	l.nextStatus = time.Now().Add(l.statusEvery)
	l.deadline = time.Time{} // set again before the next receive, whatever the send did to it
	return nil
}

// waitForRoom blocks until the queue has room, a status update is due, the
// writer stops or ctx ends.
func (l *streamLoop) waitForRoom(ctx context.Context) {
	t := time.NewTimer(time.Until(l.nextStatus))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-l.q.room():
	case <-t.C:
	case err := <-l.writerDone:
		l.writerExited, l.writerErr = true, err
	}
}

// writer journals queued transactions in group-committed batches under
// generation gen, publishing each new watermark to the loop.
func (r *Replicator) writer(ctx context.Context, q *queue, gen int64, wake *waker) error {
	// Appends are not cancelled by shutdown: the batch in flight completes so
	// it can be acknowledged by the final status update.
	actx := context.WithoutCancel(ctx)
	for {
		batch, ok := q.take(r.cfg.BatchMaxTxns, r.cfg.BatchMaxChanges, r.cfg.BatchMaxDelay)
		if !ok {
			return nil
		}
		start := time.Now()
		wm := decoder.LSN(r.watermark.Load())
		sctx, span := r.tracer.Start(actx, spanJournalAppend)
		res, err := r.appendBatch(sctx, gen, batch)
		if err != nil && refusedByJournal(err) {
			res, err = r.appendIsolated(sctx, gen, batch, err)
		}
		endBatchSpan(span, gen, res, err)
		if err == nil && res.Entries > 0 {
			r.recordBatch(ctx, start, time.Since(start), res.Entries, batch, wm)
		}
		if err == nil && r.log.Enabled(ctx, slog.LevelDebug) {
			r.log.Debug("journal batch", "items", len(batch), "transactions", res.Transactions, "skipped", res.Skipped,
				"entries", res.Entries, "watermark", res.Watermark.String(), "took", time.Since(start))
		}
		for _, it := range batch {
			it.release()
		}
		q.done(len(batch))
		if err != nil {
			return err
		}
		if decoder.LSN(r.watermark.Load()) < res.Watermark {
			r.watermark.Store(uint64(res.Watermark))
		}
		wake.wake()
	}
}

// quarantineAfter is how many times the journal must refuse one transaction
// (the batch it came in, then alone) before it is journaled as quarantine
// entries.
const quarantineAfter = 3

// refusedByJournal reports whether err is the journal refusing what it was
// given, an outcome the same input repeats (data exceptions such as invalid
// byte sequences, program limits such as index row size, an envelope the
// journal cannot encode), as opposed to a connection, timeout or fencing
// failure, which a retry may cure and which must never quarantine anything.
func refusedByJournal(err error) bool {
	if errors.Is(err, journal.ErrUnencodable) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "54": // data_exception, program_limit_exceeded
		return true
	}
	return false
}

// appendIsolated journals a batch the journal refused (cause) one item at a
// time, so that one bad transaction cannot hold back the others: a
// transaction refused quarantineAfter times in all is journaled as
// quarantine entries instead (DESIGN §5 Limits), logged with its position and
// counted. Anything else that fails ends the session as usual.
func (r *Replicator) appendIsolated(ctx context.Context, gen int64, batch []queueItem, cause error) (journal.AppendResult, error) {
	var total journal.AppendResult
	for i := range batch {
		it := batch[i : i+1]
		var res journal.AppendResult
		err := cause
		for try := 1; try < quarantineAfter; try++ {
			if res, err = r.appendBatch(ctx, gen, it); err == nil || !refusedByJournal(err) {
				break
			}
		}
		if err != nil && refusedByJournal(err) && it[0].tx != nil {
			tx := it[0].tx
			r.log.Error("the journal refused a transaction "+strconv.Itoa(quarantineAfter)+" times; journaling its changes as quarantine entries so the stream goes on",
				"xid", tx.Xid, "commit_lsn", tx.CommitLSN.String(), "end_lsn", tx.EndLSN.String(), "changes", tx.Len(), "cause", err,
				"fix", "each entry keeps the change's bytes in quarantine.raw; report the cause as a walcast bug, and refetch the rows by key from the source if consumers need them")
			q := decoder.QuarantineTransaction(tx, decoder.ReasonAppendFailed, err.Error())
			// A snapshot chunk's progress goes with its quarantine entries:
			// without it the chunk would be read, refused and quarantined
			// again and again.
			res, err = r.appendBatch(ctx, gen, []queueItem{{tx: q, snap: it[0].snap}})
			if err == nil {
				r.quarantined.add(decoder.ReasonAppendFailed, uint64(res.Entries))
			}
		}
		if err != nil {
			return total, err
		}
		if total.FirstSeq == 0 {
			total.FirstSeq = res.FirstSeq
		}
		if res.LastSeq != 0 {
			total.LastSeq = res.LastSeq
		}
		total.Transactions += res.Transactions
		total.Skipped += res.Skipped
		total.Entries += res.Entries
		total.Moved += res.Moved
		total.Watermark = max(total.Watermark, res.Watermark)
	}
	return total, nil
}

func (r *Replicator) appendBatch(ctx context.Context, gen int64, batch []queueItem) (journal.AppendResult, error) {
	if len(batch) == 1 && batch[0].tx == nil {
		return r.j.Advance(ctx, gen, batch[0].advance)
	}
	txs := make([]*decoder.Transaction, 0, len(batch))
	var adv decoder.LSN
	var newest time.Time
	var progress []journal.SnapshotProgress
	for _, it := range batch {
		if it.snap != nil {
			progress = append(progress, *it.snap)
		}
		if it.tx != nil {
			txs = append(txs, it.tx)
			if it.tx.CommitTime.After(newest) {
				newest = it.tx.CommitTime
			}
		} else if it.advance > adv {
			adv = it.advance
		}
	}
	if err := r.xids.widen(txs); err != nil {
		return journal.AppendResult{}, err
	}
	prev := decoder.LSN(r.watermark.Load()) // the journal's watermark: this writer is its only appender
	var res journal.AppendResult
	var err error
	if len(progress) > 0 {
		res, err = r.j.AppendSnapshot(ctx, gen, txs, progress)
	} else {
		res, err = r.j.Append(ctx, gen, txs)
	}
	if err != nil {
		return res, err
	}
	r.countJournaled(prev, txs)
	if !newest.IsZero() {
		r.delay.Store(int64(time.Since(newest)))
	}
	r.stats.Batches.Add(1)
	r.stats.Transactions.Add(uint64(res.Transactions))
	r.stats.Changes.Add(uint64(res.Entries))
	r.stats.TenantMoves.Add(uint64(res.Moved))
	if adv > res.Watermark {
		return r.j.Advance(ctx, gen, adv)
	}
	return res, nil
}

// catalogLookup answers the decoder's questions about the source's catalog
// that pgoutput leaves open (an array of a domain's element type, the
// primary key of a REPLICA IDENTITY FULL relation) on a connection of its
// own, opened at the first question and kept for the session. It runs on
// the receive loop, once per type or relation per session, each question
// bounded by catalogLookupTimeout.
type catalogLookup struct {
	r      *Replicator
	ctx    context.Context
	conn   *pgx.Conn
	warned map[uint32]bool // relations logged as unscoped (unscoped)
}

const catalogLookupTimeout = 30 * time.Second

func (c *catalogLookup) open(ctx context.Context) (*pgx.Conn, error) {
	if c.conn != nil && !c.conn.IsClosed() {
		return c.conn, nil
	}
	conn, err := (&snapshotter{r: c.r}).connect(ctx)
	if err != nil {
		return nil, err
	}
	c.conn = conn
	return conn, nil
}

func (c *catalogLookup) close() {
	if c.conn != nil {
		closeSourceConn(c.ctx, c.conn)
	}
}

// arrayElement describes the element of array type oid. A catalog that
// cannot be read (a source that takes only replication connections, say)
// is no reason to stop the stream: the elements are then carried as
// strings of their text, as without the lookup, and the log says why.
func (c *catalogLookup) arrayElement(oid uint32) (decoder.ArrayElement, bool, error) {
	ctx, cancel := context.WithTimeout(c.ctx, catalogLookupTimeout)
	defer cancel()
	conn, err := c.open(ctx)
	var e decoder.ArrayElement
	ok := false
	if err == nil {
		if e, ok, err = lookupArrayElement(ctx, conn, oid); err != nil {
			closeSourceConn(c.ctx, conn)
			c.conn = nil
		}
	}
	if err != nil {
		if c.ctx.Err() != nil {
			return e, false, c.ctx.Err()
		}
		c.r.log.Warn("cannot read the element type of an array type from the source's catalog; its elements are carried as strings",
			"type_oid", oid, "cause", err, "fix", "let walcast's role open ordinary connections to the source database (pg_hba.conf), then restart walcast")
		return decoder.ArrayElement{}, false, nil
	}
	return e, ok, nil
}

// keyColumns names relID's primary-key columns, nil when it has none or
// they cannot be read now (a quarantine entry then carries the whole
// identity, as before: the decoder's contract for a nil answer).
func (c *catalogLookup) keyColumns(relID uint32, _, _ string) []string {
	ctx, cancel := context.WithTimeout(c.ctx, catalogLookupTimeout)
	defer cancel()
	conn, err := c.open(ctx)
	if err != nil {
		return nil
	}
	var cols []string
	if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(a.attname::text ORDER BY k.ord), '{}') FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1 AND i.indisprimary`, relID).Scan(&cols); err != nil {
		closeSourceConn(c.ctx, conn)
		c.conn = nil
		return nil
	}
	if len(cols) == 0 {
		return nil
	}
	return cols
}
