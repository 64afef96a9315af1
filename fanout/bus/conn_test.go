package bus

import (
	"io"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/telemetry"
)

// scrape returns the Prometheus text of m.
func scrape(t *testing.T, m *telemetry.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var serverInfoRe = regexp.MustCompile(`walcast_nats_server_info\{[^}]*server_name="([^"]+)"[^}]*url="([^"]+)"[^}]*\} 1`)

// TestConnMetricsFollowAFailover: on a 2-node cluster, /metrics and the
// readiness text name the server the connection uses; when it shuts down,
// they show the connection down, then up on the other server with one
// reconnect.
func TestConnMetricsFollowAFailover(t *testing.T) {
	nodes := natstest.StartCluster(t, 2)
	nc, err := ConnectNATS(NATSConfig{URL: nodes[0].URL(), Name: "conn-metrics-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	m, err := telemetry.NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	reg, err := RegisterConnMetrics(m.Meter("walcast/nats"), nc)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()

	body := scrape(t, m)
	for _, want := range []string{"walcast_nats_connected 1", "walcast_nats_reconnects_total 0", `cluster="walcast-test"`} {
		if !strings.Contains(body, want) {
			t.Fatalf("no %q in /metrics:\n%s", want, body)
		}
	}
	if got := serverInfoRe.FindStringSubmatch(body); got == nil || got[1] != "n1" || got[2] != nodes[0].URL() {
		t.Fatalf("walcast_nats_server_info does not name n1 at %s: %v\n%s", nodes[0].URL(), got, body)
	}
	if s := ConnStatus(nc); !strings.HasPrefix(s, "nats: connected to "+nodes[0].URL()+" (server n1, cluster walcast-test, 0 reconnects)") {
		t.Fatalf("status %q", s)
	}

	// The connection learnt n2 from the cluster; shut n1 down and it
	// fails over there.
	waitFor(t, "n2 discovered", func() bool { return len(nc.DiscoveredServers()) > 0 })
	nodes[0].Shutdown()
	waitFor(t, "a failover to n2", func() bool { return nc.IsConnected() && nc.ConnectedServerName() == "n2" })
	body = scrape(t, m)
	for _, want := range []string{"walcast_nats_connected 1", "walcast_nats_reconnects_total 1"} {
		if !strings.Contains(body, want) {
			t.Fatalf("after the failover, no %q in /metrics:\n%s", want, body)
		}
	}
	if got := serverInfoRe.FindAllStringSubmatch(body, -1); len(got) != 1 || got[0][1] != "n2" || got[0][2] != nodes[1].URL() {
		t.Fatalf("after the failover walcast_nats_server_info is %v, want n2 only\n%s", got, body)
	}
	if s := ConnStatus(nc); !strings.Contains(s, "(server n2, cluster walcast-test, 1 reconnects)") {
		t.Fatalf("status after the failover %q", s)
	}

	// With no server left it reports itself down and names none.
	nodes[1].Shutdown()
	waitFor(t, "the connection down", func() bool { return !nc.IsConnected() })
	body = scrape(t, m)
	if !strings.Contains(body, "walcast_nats_connected 0") || strings.Contains(body, "walcast_nats_server_info{") {
		t.Fatalf("with both servers down:\n%s", body)
	}
	if s := ConnStatus(nc); !strings.HasPrefix(s, "nats: RECONNECTING") {
		t.Fatalf("status with both servers down %q", s)
	}
}
