package sync

import (
	"go.opentelemetry.io/otel/metric"

	"github.com/walcast/walcast/fanout/bus"
)

// RegisterNATSMetrics exports the node's NATS connection through meter:
// whether it is up, its reconnects and which server of the cluster it uses
// (bus.RegisterConnMetrics). The caller unregisters it before Close.
func (n *Node) RegisterNATSMetrics(meter metric.Meter) (metric.Registration, error) {
	return bus.RegisterConnMetrics(meter, n.nc)
}
