// Package telemetry wires OpenTelemetry metrics to a Prometheus endpoint and
// serves the operational HTTP endpoints of walcast's long-running commands:
// /metrics, /healthz and /readyz.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Metrics owns a meter provider whose readings are exported for Prometheus.
type Metrics struct {
	provider *sdkmetric.MeterProvider
	registry *prometheus.Registry
}

// NewMetrics creates a meter provider exporting to a private Prometheus
// registry (so tests and several commands in one process never collide).
func NewMetrics() (*Metrics, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	return &Metrics{provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp)), registry: reg}, nil
}

// Meter returns a meter for instrumentation scope name.
func (m *Metrics) Meter(name string) metric.Meter { return m.provider.Meter(name) }

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// Shutdown flushes and stops the meter provider.
func (m *Metrics) Shutdown(ctx context.Context) error { return m.provider.Shutdown(ctx) }

// Readiness reports whether the process is ready and says why, in words, for
// the body of /readyz.
type Readiness func() (ready bool, detail string)

// Server serves /metrics, /healthz and /readyz.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Listen binds addr and prepares the endpoints; Serve starts answering.
// Binding first lets a command fail at start-up with a clear error when the
// port is taken.
func Listen(addr string, m *Metrics, ready Readiness) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s for /metrics, /healthz and /readyz: %w (choose another --http-listen)", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, detail := ready()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, detail)
	})
	return &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve answers until ctx ends, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context, log *slog.Logger) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil {
		log.Warn("http server shutdown", "err", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
