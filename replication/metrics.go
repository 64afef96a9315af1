package replication

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// instruments are the synchronous instruments the writer and Run record to.
type instruments struct {
	appendDuration metric.Float64Histogram
	batchSize      metric.Int64Histogram
	reconnects     metric.Int64Counter
}

// recordBatch records one journal append; called by the writer only.
func (r *Replicator) recordBatch(ctx context.Context, took time.Duration, entries int) {
	if r.inst == nil {
		return
	}
	r.inst.appendDuration.Record(ctx, took.Seconds())
	r.inst.batchSize.Record(ctx, int64(entries))
}

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
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
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
	r.inst = &instruments{appendDuration: appendDuration, batchSize: batchSize, reconnects: reconnectsByCause}
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
		o.ObserveInt64(reconnects, int64(st.Reconnects.Load()))
		return nil
	}, role, lag, delay, gen, txs, changes, batches, reconnects)
	return err
}
