// Package telemetry wires OpenTelemetry metrics to a Prometheus endpoint,
// traces to an OTLP/HTTP collector when one is configured, and serves the
// operational HTTP endpoints of walcast's long-running commands: /metrics,
// /healthz and /readyz.
//
// It reads no flags and no environment itself: commands decide (NewTracing
// takes whether OTEL_EXPORTER_OTLP_ENDPOINT is set). The OTLP exporter then
// reads the standard OTEL_EXPORTER_OTLP_* variables.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ServiceName is the default service.name of walcast's telemetry.
const ServiceName = "walcast"

// Option configures NewMetrics and NewTracing.
type Option func(*options)

type options struct {
	service, version string
}

// WithService sets the service.name and service.version resource attributes
// (Prometheus: target_info{service_name, service_version}). version "" is
// left out. The default name is ServiceName.
func WithService(name, version string) Option {
	return func(o *options) { o.service, o.version = name, version }
}

// newResource describes the process: the SDK's defaults (telemetry.sdk.*)
// with walcast's service name and version.
func newResource(opts []Option) (*resource.Resource, error) {
	o := options{service: ServiceName}
	for _, opt := range opts {
		opt(&o)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", o.service)}
	if o.version != "" {
		attrs = append(attrs, attribute.String("service.version", o.version))
	}
	return resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
}

// Metrics owns a meter provider whose readings are exported for Prometheus.
type Metrics struct {
	provider *sdkmetric.MeterProvider
	registry *prometheus.Registry
}

// NewMetrics creates a meter provider exporting to a private Prometheus
// registry (so tests and several commands in one process never collide).
// Its resource becomes target_info, with service_name "walcast" unless
// WithService says otherwise.
func NewMetrics(opts ...Option) (*Metrics, error) {
	res, err := newResource(opts)
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	return &Metrics{provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res)), registry: reg}, nil
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
	ln     net.Listener
	srv    *http.Server
	health Readiness // nil: /healthz answers ok while the process serves
}

// SetHealth makes /healthz answer 503 with h's detail while h reports false
// (a process that cannot recover and should be replaced). Call it before
// Serve.
func (s *Server) SetHealth(h Readiness) { s.health = h }

// Listen binds addr and prepares the endpoints; Serve starts answering.
// Binding first lets a command fail at start-up with a clear error when the
// port is taken.
func Listen(addr string, m *Metrics, ready Readiness) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s for /metrics, /healthz and /readyz: %w (choose another --http-listen)", addr, err)
	}
	s := &Server{ln: ln}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if s.health != nil {
			if ok, detail := s.health(); !ok {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, detail)
				return
			}
		}
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
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 60 * time.Second, MaxHeaderBytes: 16 << 10}
	return s, nil
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

// Tracing owns the tracer provider of a command: an OTLP/HTTP exporter
// behind a batching span processor when enabled, a no-op provider (no
// exporter, nothing recorded) otherwise.
type Tracing struct {
	provider trace.TracerProvider
	sdk      *sdktrace.TracerProvider // nil when disabled
}

// NewTracing sets up tracing. enabled is whether the operator configured an
// OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); the exporter reads that and the other
// standard OTEL_EXPORTER_OTLP_* variables itself, sending to
// <endpoint>/v1/traces. Export failures are logged to log at most once a
// minute (they never stop the command). Call Shutdown on exit to send what
// is buffered.
func NewTracing(ctx context.Context, enabled bool, log *slog.Logger, opts ...Option) (*Tracing, error) {
	if !enabled {
		return &Tracing{provider: noop.NewTracerProvider()}, nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	res, err := newResource(opts)
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP trace exporter: %w (check OTEL_EXPORTER_OTLP_ENDPOINT)", err)
	}
	otel.SetErrorHandler(&rateLimitedErrors{log: log, every: time.Minute})
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{provider: tp, sdk: tp}, nil
}

// TracerProvider is the provider to trace with.
func (t *Tracing) TracerProvider() trace.TracerProvider { return t.provider }

// Enabled reports whether spans are exported.
func (t *Tracing) Enabled() bool { return t.sdk != nil }

// Shutdown exports buffered spans and stops the exporter; a no-op when
// tracing is disabled.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.sdk == nil {
		return nil
	}
	return t.sdk.Shutdown(ctx)
}

// rateLimitedErrors logs OpenTelemetry's internal errors (a collector that
// cannot be reached) at most once per interval, counting the rest.
type rateLimitedErrors struct {
	log   *slog.Logger
	every time.Duration

	mu         sync.Mutex // guards the following fields
	last       time.Time
	suppressed int
}

func (h *rateLimitedErrors) Handle(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.last.IsZero() && time.Since(h.last) < h.every {
		h.suppressed++
		return
	}
	h.log.Warn("opentelemetry: exporting telemetry failed; retrying", "err", err, "suppressed", h.suppressed, "next_report_after", h.every)
	h.last, h.suppressed = time.Now(), 0
}
