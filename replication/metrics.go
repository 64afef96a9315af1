package replication

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// RegisterMetrics exports the replicator's state and counters through meter
// (DESIGN §8). Values are read at collection time; the hot path only bumps
// atomics.
func (r *Replicator) RegisterMetrics(meter metric.Meter) error {
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
		o.ObserveInt64(gen, s.Generation)
		st := r.Stats()
		o.ObserveInt64(txs, int64(st.Transactions.Load()))
		o.ObserveInt64(changes, int64(st.Changes.Load()))
		o.ObserveInt64(batches, int64(st.Batches.Load()))
		o.ObserveInt64(reconnects, int64(st.Reconnects.Load()))
		return nil
	}, role, lag, gen, txs, changes, batches, reconnects)
	return err
}
