// Package otlptest is a real OTLP/HTTP trace receiver for tests: an HTTP
// server on loopback that accepts POST /v1/traces in protobuf, decodes the
// spans and keeps them. It must not be imported by non-test code.
package otlptest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// Span is a span as received.
type Span struct {
	Name    string
	Service string         // the resource's service.name
	Attrs   map[string]any // string, int64, float64 or bool values
}

// Receiver collects the spans exported to it.
type Receiver struct {
	srv *httptest.Server

	mu    sync.Mutex // guards the following fields
	spans []Span
	bad   []string // requests refused, for Check
}

// NewReceiver starts a receiver, closed when the test ends.
func NewReceiver(t testing.TB) *Receiver {
	r := &Receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

// URL is the value for OTEL_EXPORTER_OTLP_ENDPOINT.
func (r *Receiver) URL() string { return r.srv.URL }

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	var msg collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &msg)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" || err != nil || len(body) == 0 {
		r.bad = append(r.bad, req.Method+" "+req.URL.Path+" "+req.Header.Get("Content-Type"))
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	for _, rs := range msg.ResourceSpans {
		var service string
		for _, kv := range rs.Resource.GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				sp := Span{Name: s.Name, Service: service, Attrs: map[string]any{}}
				for _, kv := range s.Attributes {
					sp.Attrs[kv.Key] = value(kv.Value)
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	}
	return v.String()
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Check fails the test if any request was not a protobuf POST to
// /v1/traces.
func (r *Receiver) Check(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.bad {
		t.Errorf("OTLP receiver refused %s", b)
	}
}
