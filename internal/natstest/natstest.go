// Package natstest runs a real NATS server inside the test process: a random
// loopback port, no logs, no signal handlers, JetStream enabled with its store
// in a temporary directory. It can be restarted on the same port so tests can
// exercise client reconnects.
package natstest

import (
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is an embedded NATS server owned by one test.
type Server struct {
	mu   sync.Mutex // guards the following fields
	opts server.Options
	srv  *server.Server

	log serverLog // what the server logged at warning level and above, across restarts
}

// serverLog keeps the warnings and errors a server logs (its notices,
// debug and trace lines are dropped), so a test can check that a server
// reported no fault.
type serverLog struct {
	mu    sync.Mutex // guards lines
	lines []string
}

// maxLogLines bounds serverLog: later lines are dropped.
const maxLogLines = 10000

func (l *serverLog) add(level, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) < maxLogLines {
		l.lines = append(l.lines, level+" "+fmt.Sprintf(format, v...))
	}
}

func (l *serverLog) Noticef(format string, v ...any) { l.add("[INF]", format, v...) }
func (l *serverLog) Debugf(string, ...any)           {}
func (l *serverLog) Tracef(string, ...any)           {}
func (l *serverLog) Warnf(format string, v ...any)   { l.add("[WRN]", format, v...) }
func (l *serverLog) Errorf(format string, v ...any)  { l.add("[ERR]", format, v...) }
func (l *serverLog) Fatalf(format string, v ...any)  { l.add("[FTL]", format, v...) }

// Logged returns the warnings and errors the server logged so far, across
// restarts, each prefixed with its level ("[WRN]", "[ERR]", "[FTL]").
func (s *Server) Logged() []string {
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	return append([]string(nil), s.log.lines...)
}

// StoreDir is the server's store directory (JetStream keeps its data
// under StoreDir/jetstream), the same across restarts.
func (s *Server) StoreDir() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.StoreDir
}

// Start runs a NATS server for the test; it is shut down and its store
// removed when the test ends. configure, when given, adjusts the options
// (max payload, authorization) before the first start.
func Start(t testing.TB, configure ...func(*server.Options)) *Server {
	t.Helper()
	dir, err := os.MkdirTemp("", "walcast-natstest-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{opts: server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		NoLog:     true,
		NoSigs:    true,
		JetStream: true,
		StoreDir:  dir,
	}}
	for _, f := range configure {
		f(&s.opts)
	}
	if err := s.start(); err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		os.RemoveAll(dir)
	})
	return s
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	opts := s.opts
	srv, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("natstest: %w", err)
	}
	srv.SetLogger(&s.log, false, false)
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return fmt.Errorf("natstest: server not ready within 10s")
	}
	// Later starts reuse the port the first one picked, so clients reconnect.
	if addr, ok := srv.Addr().(*net.TCPAddr); ok {
		s.opts.Port = addr.Port
	}
	s.srv = srv
	return nil
}

// URL is the client URL of the server, stable across restarts.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("nats://%s:%d", s.opts.Host, s.opts.Port)
}

// Server returns the running server, or nil while it is shut down.
func (s *Server) Server() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Shutdown stops the server and waits for it to finish. It is idempotent.
func (s *Server) Shutdown() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Restart shuts the server down and starts it again on the same port with the
// same JetStream store. Connected clients see a disconnect and may reconnect.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Shutdown()
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
}
