package telemetry

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/walcast/walcast/internal/telemetry/otlptest"
)

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestTargetInfo: the resource reaches Prometheus as target_info with the
// service name (walcast by default) and version.
func TestTargetInfo(t *testing.T) {
	for _, tc := range []struct {
		opts []Option
		want []string
	}{
		{nil, []string{`service_name="walcast"`}},
		{[]Option{WithService("walcast", "1.2.3")}, []string{`service_name="walcast"`, `service_version="1.2.3"`}},
	} {
		m, err := NewMetrics(tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		c, err := m.Meter("test").Int64Counter("walcast.test")
		if err != nil {
			t.Fatal(err)
		}
		c.Add(context.Background(), 1)
		body := scrape(t, m)
		var info string
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, "target_info{") {
				info = l
			}
		}
		for _, w := range tc.want {
			if !strings.Contains(info, w) {
				t.Errorf("target_info %q lacks %s; scrape:\n%s", info, w, body)
			}
		}
		if err := m.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTracingExportsOTLP: with an endpoint, spans reach an OTLP/HTTP
// receiver by Shutdown, with walcast's resource.
func TestTracingExportsOTLP(t *testing.T) {
	rcv := otlptest.NewReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL())
	tr, err := NewTracing(context.Background(), true, nil, WithService("walcast", "test"))
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Enabled() {
		t.Fatal("tracing not enabled")
	}
	_, span := tr.TracerProvider().Tracer("test").Start(context.Background(), "walcast.test.span")
	span.End()
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	rcv.Check(t)
	spans := rcv.Spans()
	if len(spans) != 1 || spans[0].Name != "walcast.test.span" || spans[0].Service != "walcast" {
		t.Fatalf("received %+v, want one walcast.test.span of service walcast", spans)
	}
}

// TestTracingDisabled: without an endpoint there is no exporter and nothing
// is recorded.
func TestTracingDisabled(t *testing.T) {
	tr, err := NewTracing(context.Background(), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, span := tr.TracerProvider().Tracer("test").Start(context.Background(), "x")
	if tr.Enabled() || span.IsRecording() {
		t.Fatal("disabled tracing records spans")
	}
	span.End()
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestHealthz: /healthz answers ok until a health function set with
// SetHealth reports false, then 503 with its detail (a sync node whose NATS
// connection closed for good must be replaced by its orchestrator).
func TestHealthz(t *testing.T) {
	m, err := NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := Listen("127.0.0.1:0", m, func() (bool, string) { return true, "ready" })
	if err != nil {
		t.Fatal(err)
	}
	var broken atomic.Bool
	srv.SetHealth(func() (bool, string) { return !broken.Load(), "NATS connection closed for good" })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, slog.New(slog.DiscardHandler)) }()
	defer func() { cancel(); <-done }()
	get := func() (int, string) {
		resp, err := http.Get("http://" + srv.Addr() + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	if code, body := get(); code != 200 || body != "ok" {
		t.Fatalf("healthy: %d %q", code, body)
	}
	broken.Store(true)
	if code, body := get(); code != 503 || body != "NATS connection closed for good" {
		t.Fatalf("unhealthy: %d %q", code, body)
	}
}
