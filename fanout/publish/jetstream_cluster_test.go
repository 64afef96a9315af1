package publish

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/telemetry"
)

// TestJetStreamClusterR3Faults: a 3-node NATS cluster with an R3 stream.
// While changes are journaled, the node the publisher is connected to is
// shut down and restarted (the publisher fails over to another node), and
// the stream's leader is made to step down. The stream ends holding every
// journal entry exactly once, in seq order.
func TestJetStreamClusterR3Faults(t *testing.T) {
	f := newPubFixture(t)
	nodes, urls, nc, p := r3Publisher(t, f)
	metrics, err := telemetry.NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.RegisterMetrics(metrics.Meter("walcast/publish")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	const total = 1500
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the write load
		defer wg.Done()
		for i := 1; i <= total; i++ {
			f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
			if i%10 == 0 {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	waitUntil(t, "publishing under way", 60*time.Second, func() bool { return p.Stats().Published >= 200 })

	// The node the publisher talks to goes away, and comes back.
	var victim *natstest.Server
	for _, n := range nodes {
		if n.URL() == nc.ConnectedUrl() {
			victim = n
		}
	}
	if victim == nil {
		t.Fatalf("publisher connected to %q, not a cluster node", nc.ConnectedUrl())
	}
	victim.Shutdown()
	time.Sleep(time.Second)
	if err := func() error { victim.Restart(t); return nil }(); err != nil {
		t.Fatal(err)
	}

	// The stream's leader steps down (a leader election).
	admin, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	waitUntil(t, "a stream leader stepdown", 30*time.Second, func() bool {
		_, err := admin.Request("$JS.API.STREAM.LEADER.STEPDOWN.WALCAST", nil, 5*time.Second)
		return err == nil
	})
	wg.Wait()
	waitUntil(t, "every entry stored", 150*time.Second, func() bool { return p.Stats().Published == total })
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	var info *jetstream.StreamInfo
	waitUntil(t, "the stream's info after the faults", 30*time.Second, func() bool {
		ictx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		s, err := js.Stream(ictx, "WALCAST")
		if err != nil {
			return false
		}
		info, err = s.Info(ictx)
		return err == nil
	})
	if info.Config.Replicas != 3 {
		t.Fatalf("stream replicas %d", info.Config.Replicas)
	}
	checkExactlyOnce(t, streamSeqs(t, strings.Join(urls, ","), "WALCAST"), total)

	// The JetStream metrics after the faults: every entry acknowledged,
	// no lag, and a commit-to-ack latency for each entry acknowledged to the
	// publisher (not those whose acknowledgement a failover lost: the
	// reconcile found them in the stream).
	body := scrapeMetrics(t, metrics)
	for _, want := range []string{
		fmt.Sprintf("walcast_jetstream_acked %d\n", total),
		"walcast_jetstream_lag 0\n",
		`walcast_jetstream_ack_latency_seconds_bucket{le="+Inf"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %q in /metrics", want)
		}
	}
	if n := metricValue(t, body, "walcast_jetstream_commit_to_ack_seconds_count"); n < total/2 || n > total {
		t.Errorf("walcast_jetstream_commit_to_ack_seconds_count %v for %d entries", n, total)
	}
	// At least the start's (a failover between two batches fails none).
	if n := metricValue(t, body, "walcast_jetstream_reconciles_total"); n < 1 {
		t.Errorf("walcast_jetstream_reconciles_total %v: want at least the start's", n)
	}
	if t.Failed() {
		t.Log(body)
	}
}

// scrapeMetrics returns the Prometheus text of m.
func scrapeMetrics(t *testing.T, m *telemetry.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// metricValue is the value of the unlabelled sample name in body.
func metricValue(t *testing.T, body, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics:\n%s", name, body)
	return 0
}

// logWriter sends the publisher's log to the test's.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// r3Publisher starts a three-node cluster and a publisher, connected to
// every node (urls), of f's journal to an R3 stream on it.
func r3Publisher(t *testing.T, f *pubFixture) ([]*natstest.Server, []string, *nats.Conn, *Publisher) {
	t.Helper()
	nodes := natstest.StartCluster(t, 3)
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.URL()
	}
	nc, err := bus.ConnectNATS(bus.NATSConfig{URL: strings.Join(urls, ","), Name: "publisher"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	log := slog.New(slog.NewTextHandler(logWriter{t}, nil))
	return nodes, urls, nc, New(Config{JetStream: &JetStreamConfig{Stream: "WALCAST", Replicas: 3}, BatchSize: 100, Logger: log}, f.j, nc)
}
