package bus

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ConnStatus says in words which NATS server nc is connected to, for the
// body of /readyz: "nats: connected to nats://10.0.0.7:4222 (server nats-1,
// cluster walcast, 2 reconnects)", or "nats: RECONNECTING (3 reconnects)"
// while it is not. The URL never carries a password.
func ConnStatus(nc *nats.Conn) string {
	reconnects := nc.Stats().Reconnects
	if !nc.IsConnected() {
		return fmt.Sprintf("nats: %s (%d reconnects)", nc.Status(), reconnects)
	}
	name, cluster := nc.ConnectedServerName(), nc.ConnectedClusterName()
	if cluster == "" {
		cluster = "none"
	}
	return fmt.Sprintf("nats: connected to %s (server %s, cluster %s, %d reconnects)",
		nc.ConnectedUrlRedacted(), name, cluster, reconnects)
}

// RegisterConnMetrics exports the state of nc through meter (DESIGN §8):
//
//   - walcast.nats.connected: 1 while connected, 0 otherwise;
//   - walcast.nats.reconnects: reconnects since the process connected
//     (a failover to another server of a cluster is one);
//   - walcast.nats.server.info: 1, while connected, with the server's url
//     (password redacted), server_name, server_id and cluster as
//     attributes — which server of a cluster the process uses.
//
// The caller unregisters the returned registration when nc goes away.
func RegisterConnMetrics(meter metric.Meter, nc *nats.Conn) (metric.Registration, error) {
	connected, err := meter.Int64ObservableGauge("walcast.nats.connected",
		metric.WithDescription("1 while the NATS connection is up, 0 while it is disconnected or reconnecting"))
	if err != nil {
		return nil, err
	}
	reconnects, err := meter.Int64ObservableCounter("walcast.nats.reconnects",
		metric.WithDescription("NATS reconnects (a failover to another server of the cluster is one)"))
	if err != nil {
		return nil, err
	}
	info, err := meter.Int64ObservableGauge("walcast.nats.server.info",
		metric.WithDescription("1 for the NATS server the process is connected to (url, server_name, server_id, cluster); absent while disconnected"))
	if err != nil {
		return nil, err
	}
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(reconnects, int64(nc.Stats().Reconnects))
		if !nc.IsConnected() {
			o.ObserveInt64(connected, 0)
			return nil
		}
		o.ObserveInt64(connected, 1)
		o.ObserveInt64(info, 1, metric.WithAttributes(
			attribute.String("url", nc.ConnectedUrlRedacted()),
			attribute.String("server_name", nc.ConnectedServerName()),
			attribute.String("server_id", nc.ConnectedServerId()),
			attribute.String("cluster", nc.ConnectedClusterName())))
		return nil
	}, connected, reconnects, info)
}
