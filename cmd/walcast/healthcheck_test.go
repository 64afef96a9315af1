package main

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/walcast/walcast/internal/telemetry"
)

// TestHealthcheck checks `walcast healthcheck` against the real endpoints
// walcast run and sync serve, listening on a wildcard address as they do in
// a container.
func TestHealthcheck(t *testing.T) {
	metrics, err := telemetry.NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := telemetry.Listen("0.0.0.0:0", metrics, func() (bool, string) { return false, "reconnecting: test" })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = srv.Serve(ctx, slog.New(slog.DiscardHandler))
	}()
	defer wg.Wait()
	defer cancel()
	_, port, _ := net.SplitHostPort(srv.Addr())
	listen := "0.0.0.0:" + port

	code, out, errOut := walcast(t, map[string]string{"WALCAST_HTTP_LISTEN": listen}, "healthcheck")
	if code != 0 || out != "http://127.0.0.1:"+port+"/healthz: ok\n" {
		t.Fatalf("healthy: exit %d %q %q", code, out, errOut)
	}
	code, out, errOut = walcast(t, nil, "healthcheck", "--http-listen", ":"+port, "--path", "readyz")
	if code != 1 || !strings.Contains(errOut, "503 Service Unavailable: reconnecting: test") {
		t.Fatalf("not ready: exit %d %q %q", code, out, errOut)
	}
	code, _, errOut = walcast(t, nil, "healthcheck", "--url", "http://127.0.0.1:"+port+"/healthz")
	if code != 0 {
		t.Fatalf("--url: exit %d %q", code, errOut)
	}

	// Nothing listening: a free port from a listener closed right away.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	code, _, errOut = walcast(t, nil, "healthcheck", "--http-listen", dead)
	if code != 1 || !strings.Contains(errOut, "connection refused") {
		t.Fatalf("nothing listening: exit %d %q", code, errOut)
	}
	code, _, errOut = walcast(t, nil, "healthcheck", "--http-listen", "no-port")
	if code != 2 || !strings.Contains(errOut, "--http-listen") {
		t.Fatalf("bad address: exit %d %q", code, errOut)
	}
}
