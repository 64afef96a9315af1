package publish

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
)

// CoveredFunc reports a source WAL position up to which the journal holds
// every committed change, waiting for at until ctx ends
// (replication.Replicator.Covered).
type CoveredFunc func(ctx context.Context, at decoder.LSN) (decoder.LSN, error)

// coveredWait bounds how long one request waits for its position, and
// coveredInFlight how many wait at once (more are not answered; the asker
// times out and asks again later).
const (
	coveredWait     = 2 * time.Second
	coveredInFlight = 16
)

// ServeCovered answers bus.CoveredSubject requests on nc with covered. A
// request whose body is not a WAL position is not answered, and neither is
// one while covered reports that this process is not streaming (a standby),
// so the active replicator's answer is the one the asker gets. Unsubscribe
// the returned subscription to stop.
func ServeCovered(nc *nats.Conn, prefix string, covered CoveredFunc) (*nats.Subscription, error) {
	slots := make(chan struct{}, coveredInFlight)
	return nc.Subscribe(bus.CoveredSubject(prefix), func(m *nats.Msg) {
		var at decoder.LSN
		if m.Reply == "" || len(m.Data) > 32 || at.UnmarshalText(m.Data) != nil {
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			return
		}
		go func() {
			defer func() { <-slots }()
			ctx, cancel := context.WithTimeout(context.Background(), coveredWait)
			defer cancel()
			got, err := covered(ctx, at)
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return
			}
			b, _ := got.MarshalText()
			_ = m.Respond(b)
		}()
	})
}
