package replication

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// spanJournalAppend names the span of one journal batch (DESIGN §8): never
// one per change.
const spanJournalAppend = "walcast.journal.append"

// SetTracerProvider makes the writer trace every journal batch with a span
// from tp (attributes walcast.transactions, walcast.entries,
// walcast.watermark, walcast.generation). Call it before Run; without it
// nothing is traced.
func (r *Replicator) SetTracerProvider(tp trace.TracerProvider) {
	r.tracer = tp.Tracer("github.com/walcast/walcast/replication")
}

// endBatchSpan records what a journal batch did on its span and ends it.
func endBatchSpan(span trace.Span, gen int64, res journal.AppendResult, err error) {
	if span.IsRecording() {
		span.SetAttributes(
			attribute.Int("walcast.transactions", res.Transactions),
			attribute.Int("walcast.entries", res.Entries),
			attribute.String("walcast.watermark", res.Watermark.String()),
			attribute.Int64("walcast.generation", gen),
		)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "journal append failed")
		}
	}
	span.End()
}

// ChangeCounts returns the changes decoded and journaled so far, by entity
// and op, across sessions. A transaction spilled to disk is never re-read to
// be counted: the decoder's counts of what it wrote to the file are used
// (decoder.Transaction.CountChanges), except for a streamed transaction with
// more than 4096 (subtransaction, entity, op) groups, which only
// walcast.journal.changes (every entry) counts.
func (r *Replicator) ChangeCounts() (decoded, journaled *decoder.Counters) {
	return r.decoded, r.journaled
}

// countJournaled counts by entity and op the changes of the transactions an
// append journaled, given the watermark before it: like the journal, it
// skips transactions at or below the running watermark (replays). Called by
// the writer only.
func (r *Replicator) countJournaled(wm decoder.LSN, txs []*decoder.Transaction) {
	for _, tx := range txs {
		if tx.EndLSN <= wm {
			continue
		}
		wm = tx.EndLSN
		tx.CountChanges(r.countJournaledRun)
	}
}

func (r *Replicator) countJournaledRun(entity string, op decoder.Op, n int) {
	if op == decoder.OpMessage {
		// Message prefixes are unbounded: past MaxMessageEntities they
		// count under decoder.OtherEntity, as the decoded counts do.
		r.journaled.Message(entity).Add(op, uint64(n))
		return
	}
	r.journaled.Add(entity, op, uint64(n))
}

// instruments are the synchronous instruments the writer and Run record to.
type instruments struct {
	appendDuration metric.Float64Histogram
	batchSize      metric.Int64Histogram
	decodeDelay    metric.Float64Histogram
	queueWait      metric.Float64Histogram
	reconnects     metric.Int64Counter
}

// recordBatch records one journal append that started at start, took took
// and wrote entries, of batch (taken from the queue at start; wm is the
// watermark before it); called by the writer only.
//
// Besides the append itself, it records where the batch's oldest new
// transaction spent its time before the append: from its commit on the
// source (the source's clock) to its decoding (walcast.replication.decode.delay:
// the server's WAL flush and send, and the receive and decode here), and
// from then to the start of the append (walcast.journal.queue.wait: the
// appends ahead of it). With the append's duration they split a change's
// time from commit to journal; samples are one per batch, never per change.
func (r *Replicator) recordBatch(ctx context.Context, start time.Time, took time.Duration, entries int, batch []queueItem, wm decoder.LSN) {
	if r.inst == nil {
		return
	}
	r.inst.appendDuration.Record(ctx, took.Seconds())
	r.inst.batchSize.Record(ctx, int64(entries))
	for _, it := range batch {
		// Replays (at or below the watermark) are not journaled, and a
		// snapshot chunk's commit time is the snapshot's.
		if it.tx == nil || it.snap != nil || it.tx.EndLSN <= wm || it.tx.CommitTime.IsZero() {
			continue
		}
		r.inst.decodeDelay.Record(ctx, max(0, it.at.Sub(it.tx.CommitTime).Seconds()))
		r.inst.queueWait.Record(ctx, max(0, start.Sub(it.at).Seconds()))
		return
	}
}

// stageBuckets are the bucket bounds (seconds) of the stage histograms:
// fine below 10 ms, where a healthy pipeline is, and up to a minute for a
// catch-up.
var stageBuckets = []float64{0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// countReconnect counts a session that ended with err, by its error code.
func (r *Replicator) countReconnect(err error) {
	if r.inst == nil {
		return
	}
	r.inst.reconnects.Add(context.Background(), 1, metric.WithAttributes(attribute.String("cause", string(CodeOf(err)))))
}

// RegisterMetrics exports the replicator's state and counters through meter
// (DESIGN §8). Call it before Run. Gauges and totals are read at collection
// time; the writer records one histogram sample per batch, never per change.
func (r *Replicator) RegisterMetrics(meter metric.Meter) error {
	appendDuration, err := meter.Float64Histogram("walcast.journal.append.duration", metric.WithUnit("s"),
		metric.WithDescription("time to journal one group-committed batch, COPY and watermark included"),
		metric.WithExplicitBucketBoundaries(stageBuckets...))
	if err != nil {
		return err
	}
	decodeDelay, err := meter.Float64Histogram("walcast.replication.decode.delay", metric.WithUnit("s"),
		metric.WithDescription("from a transaction's commit on the source (its clock) to its decoding here; one sample per journal batch, of its oldest new transaction"),
		metric.WithExplicitBucketBoundaries(stageBuckets...))
	if err != nil {
		return err
	}
	queueWait, err := meter.Float64Histogram("walcast.journal.queue.wait", metric.WithUnit("s"),
		metric.WithDescription("from a decoded transaction's queueing to the start of the journal append that writes it; one sample per journal batch, of its oldest new transaction"),
		metric.WithExplicitBucketBoundaries(stageBuckets...))
	if err != nil {
		return err
	}
	batchSize, err := meter.Int64Histogram("walcast.journal.batch.size", metric.WithUnit("{change}"),
		metric.WithDescription("changes per journal batch"),
		metric.WithExplicitBucketBoundaries(1, 10, 100, 1000, 10000, 100000))
	if err != nil {
		return err
	}
	reconnectsByCause, err := meter.Int64Counter("walcast.replication.reconnects.by_cause",
		metric.WithDescription("replication sessions ended by an error and retried, by error code"))
	if err != nil {
		return err
	}
	r.inst = &instruments{appendDuration: appendDuration, batchSize: batchSize, decodeDelay: decodeDelay, queueWait: queueWait, reconnects: reconnectsByCause}
	delay, err := meter.Float64ObservableGauge("walcast.replication.lag.time", metric.WithUnit("s"),
		metric.WithDescription("from the commit of the newest transaction in the last journal batch to that batch's journal commit"))
	if err != nil {
		return err
	}
	role, err := meter.Int64ObservableGauge("walcast.replication.role",
		metric.WithDescription("1 for the replicator's current role (starting, standby, active, reconnecting, stopped), 0 for the others"))
	if err != nil {
		return err
	}
	lag, err := meter.Int64ObservableGauge("walcast.replication.lag",
		metric.WithUnit("By"), metric.WithDescription("server WAL end (latest keepalive) minus the journal watermark"))
	if err != nil {
		return err
	}
	gen, err := meter.Int64ObservableGauge("walcast.replication.generation",
		metric.WithDescription("fencing generation held while active"))
	if err != nil {
		return err
	}
	txs, err := meter.Int64ObservableCounter("walcast.journal.transactions",
		metric.WithDescription("source transactions journaled"))
	if err != nil {
		return err
	}
	changes, err := meter.Int64ObservableCounter("walcast.journal.changes",
		metric.WithDescription("change envelopes journaled"))
	if err != nil {
		return err
	}
	moves, err := meter.Int64ObservableCounter("walcast.journal.tenant_moves",
		metric.WithDescription("updates that moved a row to another tenant, each journaled after a delete of the row in its old tenant (marked moved; counted in walcast.journal.changes)"))
	if err != nil {
		return err
	}
	batches, err := meter.Int64ObservableCounter("walcast.journal.batches",
		metric.WithDescription("group-committed journal appends"))
	if err != nil {
		return err
	}
	reconnects, err := meter.Int64ObservableCounter("walcast.replication.reconnects",
		metric.WithDescription("replication sessions ended by an error and retried"))
	if err != nil {
		return err
	}
	decoded, err := meter.Int64ObservableCounter("walcast.decoded.changes",
		metric.WithDescription("changes decoded from the replication stream, by entity and op (changes of streamed transactions that later abort included)"))
	if err != nil {
		return err
	}
	journaled, err := meter.Int64ObservableCounter("walcast.journaled.changes",
		metric.WithDescription("changes journaled, by entity and op (a streamed transaction with a savepoint per row, past 4096 groups, counts only in walcast.journal.changes)"))
	if err != nil {
		return err
	}
	quarantined, err := meter.Int64ObservableCounter("walcast.quarantined",
		metric.WithDescription("changes journaled as quarantine entries because they could not be carried as-is, by reason (entity-not-utf8, tenant-not-utf8, too-large, malformed, append-failed, transaction-too-large, spill-failed); alert on any increase"))
	if err != nil {
		return err
	}
	controls, err := meter.Int64ObservableCounter("walcast.control_messages.dropped",
		metric.WithDescription("walcast.snapshot logical decoding messages that are not walcast's own watermarks, dropped without being held or journaled, by reason (non-transactional, too-large, not-a-watermark, too-many); any role can emit them"))
	if err != nil {
		return err
	}
	snapChunks, err := meter.Int64ObservableCounter("walcast.snapshot.chunks",
		metric.WithDescription("snapshot chunks journaled (their rows are walcast.journaled.changes with op read)"))
	if err != nil {
		return err
	}
	snapRereads, err := meter.Int64ObservableCounter("walcast.snapshot.rereads",
		metric.WithDescription("snapshot chunks read again because a transaction committed just before their low watermark was not yet visible to their SELECT"))
	if err != nil {
		return err
	}
	snapRunning, err := meter.Int64ObservableGauge("walcast.snapshot.running",
		metric.WithDescription("snapshots being read now (walcast snapshot status shows each one's progress)"))
	if err != nil {
		return err
	}
	roles := []Role{RoleStarting, RoleStandby, RoleActive, RoleReconnecting, RoleStopped}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := r.State()
		for _, ro := range roles {
			v := int64(0)
			if s.Role == ro {
				v = 1
			}
			o.ObserveInt64(role, v, metric.WithAttributes(attribute.String("role", string(ro))))
		}
		l := int64(0)
		if s.ServerEnd > s.Watermark {
			l = int64(s.ServerEnd - s.Watermark)
		}
		o.ObserveInt64(lag, l)
		o.ObserveFloat64(delay, time.Duration(r.delay.Load()).Seconds())
		o.ObserveInt64(gen, s.Generation)
		st := r.Stats()
		o.ObserveInt64(txs, int64(st.Transactions.Load()))
		o.ObserveInt64(changes, int64(st.Changes.Load()))
		o.ObserveInt64(batches, int64(st.Batches.Load()))
		o.ObserveInt64(moves, int64(st.TenantMoves.Load()))
		o.ObserveInt64(reconnects, int64(st.Reconnects.Load()))
		observeByEntity(o, decoded, r.decoded)
		observeByEntity(o, journaled, r.journaled)
		r.quarantined.each(func(reason string, n uint64) {
			o.ObserveInt64(quarantined, int64(n), metric.WithAttributes(attribute.String("reason", reason)))
		})
		r.controlsDropped.each(func(reason string, n uint64) {
			o.ObserveInt64(controls, int64(n), metric.WithAttributes(attribute.String("reason", reason)))
		})
		o.ObserveInt64(snapChunks, r.snapChunks.Load())
		o.ObserveInt64(snapRereads, r.snapRereads.Load())
		o.ObserveInt64(snapRunning, r.snapRunning.Load())
		return nil
	}, role, lag, delay, gen, txs, changes, moves, batches, reconnects, decoded, journaled, quarantined, controls, snapChunks, snapRereads, snapRunning)
	return err
}

// observeByEntity reports c's totals on inst with entity and op attributes.
func observeByEntity(o metric.Observer, inst metric.Int64Observable, c *decoder.Counters) {
	c.Each(func(entity string, op decoder.Op, n uint64) {
		o.ObserveInt64(inst, int64(n), metric.WithAttributes(attribute.String("entity", entity), attribute.String("op", string(op))))
	})
}

// reasonCounts counts quarantined changes by reason (decoder.Reason…), for
// the walcast.quarantined metric. Safe for concurrent use.
type reasonCounts struct {
	mu sync.Mutex // guards m
	m  map[string]uint64
}

func (c *reasonCounts) add(reason string, n uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]uint64)
	}
	c.m[reason] += n
}

// each calls fn for every reason counted, in no particular order.
func (c *reasonCounts) each(fn func(reason string, n uint64)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range c.m {
		fn(k, v)
	}
}

// Quarantined returns the number of changes journaled as quarantine entries
// with reason (decoder.Reason…), for tests and reports.
func (r *Replicator) Quarantined(reason string) uint64 {
	r.quarantined.mu.Lock()
	defer r.quarantined.mu.Unlock()
	return r.quarantined.m[reason]
}
