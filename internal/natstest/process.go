package natstest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// childEnv names the configuration file of a NATS server the test binary
// runs as a child process (StartProcessCluster).
const childEnv = "WALCAST_NATSTEST_SERVER_CONFIG"

// ServeIfChild runs a NATS server and never returns when the process is a
// child started by StartProcessCluster; otherwise it returns at once. Test
// binaries that use StartProcessCluster call it first thing in TestMain.
func ServeIfChild() {
	conf := os.Getenv(childEnv)
	if conf == "" {
		return
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		fmt.Fprintf(os.Stderr, "natstest child: %v\n", err)
		os.Exit(2)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "natstest child: %v\n", err)
		os.Exit(2)
	}
	s.ConfigureLogger()
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		fmt.Fprintln(os.Stderr, "natstest child: the server did not get ready within 30s")
		os.Exit(2)
	}
	s.WaitForShutdown()
	os.Exit(0)
}

// ProcServer is a NATS server in a child process — the test binary run
// again (ServeIfChild) with the real nats-server code and a config file —
// so that a test can kill it (SIGKILL) and pause it (SIGSTOP), which an
// in-process server cannot.
type ProcServer struct {
	Name string
	conf string // config file
	port int    // client port

	mu   sync.Mutex // guards the following fields
	cmd  *exec.Cmd
	done chan struct{}
	log  bytes.Buffer
}

// StartProcessCluster runs n NATS servers as child processes routed to
// each other as one cluster ("walcast-test") with JetStream (each its own
// store), on loopback ports kept across restarts. Servers ping their routes
// and clients every second and drop them after 3 missed pings, so a paused
// server is cut off within seconds. The caller's TestMain must call
// ServeIfChild. They are killed when the test ends, and their logs printed
// if it failed.
func StartProcessCluster(t testing.TB, n int) []*ProcServer {
	t.Helper()
	ports := freePorts(t, 2*n)
	var routes []string
	for i := 0; i < n; i++ {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[n+i]))
	}
	dir := t.TempDir()
	servers := make([]*ProcServer, n)
	for i := range servers {
		name := fmt.Sprintf("n%d", i+1)
		conf := filepath.Join(dir, name+".conf")
		body := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
ping_interval: "1s"
ping_max: 3
jetstream {
  store_dir: %q
}
cluster {
  name: walcast-test
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, name, ports[i], filepath.Join(dir, name+"-store"), ports[n+i], strings.Join(routes, ", "))
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		s := &ProcServer{Name: name, conf: conf, port: ports[i]}
		s.Start(t)
		servers[i] = s
		t.Cleanup(func() {
			s.Kill(t)
			if t.Failed() {
				t.Logf("NATS server %s log:\n%s", s.Name, s.Log())
			}
		})
	}
	for _, s := range servers {
		s.waitReady(t)
	}
	return servers
}

func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// URL is the server's client URL, the same across restarts.
func (s *ProcServer) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

// Log is what the server logged, across its restarts.
func (s *ProcServer) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

type lockedWriter struct{ s *ProcServer }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.s.log.Write(b)
}

// Start starts the server (again, after Kill) with the same ports and
// store, and returns once it accepts connections.
func (s *ProcServer) Start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+s.conf)
	cmd.Stdout, cmd.Stderr = lockedWriter{s}, lockedWriter{s}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	s.waitReady(t)
}

// waitReady waits until the client port accepts connections.
func (s *ProcServer) waitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", s.port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		s.mu.Lock()
		done := s.done
		s.mu.Unlock()
		select {
		case <-done:
			t.Fatalf("NATS server %s exited at start:\n%s", s.Name, s.Log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("NATS server %s did not accept connections within 30s:\n%s", s.Name, s.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill ends the server with SIGKILL (after SIGCONT, should it be paused)
// and waits for the process to exit. It is idempotent.
func (s *ProcServer) Kill(t testing.TB) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-done
}

// Pause stops the process (SIGSTOP): its sockets stay open, nothing is
// read or answered, as with a hung host.
func (s *ProcServer) Pause(t testing.TB) {
	t.Helper()
	s.signal(t, syscall.SIGSTOP)
	// A signal is delivered asynchronously: wait until the process is
	// stopped, so nothing it does after Pause returns can be seen.
	s.mu.Lock()
	pid := s.cmd.Process.Pid
	s.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatalf("NATS server %s: %v", s.Name, err)
		}
		// pid (comm) state …: the state follows the last ')'.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("NATS server %s did not stop within 10 s of SIGSTOP", s.Name)
		}
		time.Sleep(time.Millisecond)
	}
}

// Resume continues a paused process (SIGCONT).
func (s *ProcServer) Resume(t testing.TB) { s.signal(t, syscall.SIGCONT) }

func (s *ProcServer) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		t.Fatalf("NATS server %s is not running", s.Name)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to NATS server %s: %v", sig, s.Name, err)
	}
}
