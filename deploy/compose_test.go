package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
)

// TestComposeSystem runs what compose.yaml describes, without Docker: the
// postgres service's init script against a real PostgreSQL, then the
// walcast services with exactly their environment, only the host names
// (postgres, nats) and the published ports pointed at the test's servers.
// It checks that verify passes, that one run replica is active and the other
// a standby that takes over when the active one stops, that a write reaches
// the journal, and that the sync node comes up ready.
func TestComposeSystem(t *testing.T) {
	c := loadCompose(t)
	cluster := pgtest.Shared(t)
	dbURL := pgtest.NewDatabase(t)
	db := strings.TrimPrefix(mustParseURL(t, dbURL).Path, "/")
	ns := natstest.Start(t)

	pg := c.Services["postgres"]
	initEnv := map[string]string{
		"PATH":          cluster.BinDir() + string(os.PathListSeparator) + os.Getenv("PATH"),
		"PGHOST":        "127.0.0.1",
		"PGPORT":        mustParseURL(t, dbURL).Port(),
		"POSTGRES_USER": pg.Environment["POSTGRES_USER"],
		"POSTGRES_DB":   db,
		"SETUP_SQL":     "postgres/setup.sql",
	}
	for k, v := range pg.Environment {
		if strings.HasPrefix(k, "SETUP_") {
			initEnv[k] = v
		}
	}
	cmd := exec.Command("sh", "compose/initdb.sh")
	cmd.Env = envList(initEnv)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("compose/initdb.sh: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		// The role is cluster-wide; the database (and its slot) go with
		// the test.
		_ = cluster.Exec(context.Background(), "postgres", "DROP ROLE IF EXISTS "+pg.Environment["SETUP_ROLE"])
	})

	// Point the services' URLs at the test's servers.
	local := func(env map[string]string) map[string]string {
		out := maps.Clone(env)
		for k, v := range out {
			switch {
			case strings.HasPrefix(v, "postgres://"):
				u := mustParseURL(t, v)
				if u.Hostname() != "postgres" {
					t.Fatalf("%s=%s: want the compose service postgres", k, v)
				}
				u.Host = "127.0.0.1:" + mustParseURL(t, dbURL).Port()
				u.Path = "/" + db
				out[k] = u.String()
			case strings.HasPrefix(v, "nats://"):
				if mustParseURL(t, v).Hostname() != "nats" {
					t.Fatalf("%s=%s: want the compose service nats", k, v)
				}
				out[k] = ns.URL()
			case k == "WALCAST_HTTP_LISTEN" || k == "WALCAST_LISTEN":
				out[k] = "127.0.0.1:0"
			}
		}
		return out
	}

	runA, runB := c.Services["walcast-run-a"], c.Services["walcast-run-b"]
	verifyEnv := local(runA.Environment)
	out, err := runCLI(verifyEnv, "verify")
	if err != nil {
		t.Fatalf("walcast verify with the compose environment: %v\n%s", err, out)
	}

	a := startService(t, "walcast-run-a", runA.Command, local(runA.Environment))
	waitFor(t, "walcast-run-a to be active", 30*time.Second, func() bool { return strings.HasPrefix(a.get("/readyz"), "active") })
	b := startService(t, "walcast-run-b", runB.Command, local(runB.Environment))
	waitFor(t, "walcast-run-b to stand by", 30*time.Second, func() bool { return strings.HasPrefix(b.get("/readyz"), "standby") })

	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	journaled := func(customer string) bool {
		var n int
		err := conn.QueryRow(context.Background(), `SELECT count(*) FROM walcast.entries WHERE envelope::jsonb -> 'after' ->> 'customer' = $1`, customer).Scan(&n)
		return err == nil && n == 1
	}
	if _, err := conn.Exec(context.Background(), `INSERT INTO orders (customer, total) VALUES ('acme', 42)`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the insert to be journaled", 20*time.Second, func() bool { return journaled("acme") })

	sy := c.Services["walcast-sync"]
	s := startService(t, "walcast-sync", sy.Command, local(sy.Environment))
	waitFor(t, "walcast-sync to be ready", 30*time.Second, func() bool { return s.status("/readyz") == http.StatusOK })

	// The series the services export are the ones the dashboard test
	// derives from the source (which checks its derivation rules).
	exported := exportedMetrics(t)
	for _, svc := range []*service{a, s} {
		for _, line := range strings.Split(svc.get("/metrics"), "\n") {
			name, _, _ := strings.Cut(line, " ")
			name, _, _ = strings.Cut(name, "{")
			if strings.HasPrefix(name, "walcast_") && !exported[name] {
				t.Errorf("%s exports %s, which exportedMetrics does not derive from the source", svc.name, name)
			}
		}
	}
	if m := a.get("/metrics"); !strings.Contains(m, `walcast_replication_role{role="active"} 1`) || !strings.Contains(m, "walcast_journal_changes_total 1") {
		t.Errorf("walcast-run-a metrics after one journaled insert:\n%s", m)
	}

	// docker compose stop walcast-run-a: SIGTERM; the standby takes over.
	a.stop(t)
	waitFor(t, "walcast-run-b to take over", 30*time.Second, func() bool { return strings.HasPrefix(b.get("/readyz"), "active") })
	if _, err := conn.Exec(context.Background(), `INSERT INTO orders (customer, total) VALUES ('globex', 7)`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the insert after takeover to be journaled", 20*time.Second, func() bool { return journaled("globex") })
}

func mustParseURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func envList(env map[string]string) []string {
	var out []string
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// runCLI runs walcast with only env as its environment (plus PATH and HOME).
func runCLI(env map[string]string, args ...string) (string, error) {
	cmd := exec.Command(walcastBin, args...)
	cmd.Env = append(envList(env), "PATH="+os.Getenv("PATH"), "HOME="+os.Getenv("HOME"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// service is a walcast process started like a compose service.
type service struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}

	mu   sync.Mutex // guards the following fields
	logs strings.Builder
	http string // the /metrics, /healthz, /readyz address from the start-up log
}

func startService(t *testing.T, name string, command []string, env map[string]string) *service {
	t.Helper()
	s := &service{name: name, done: make(chan struct{})}
	s.cmd = exec.Command(walcastBin, command...)
	s.cmd.Env = append(envList(env), "PATH="+os.Getenv("PATH"), "HOME="+os.Getenv("HOME"), "TMPDIR="+t.TempDir())
	pr, pw := io.Pipe()
	s.cmd.Stderr, s.cmd.Stdout = pw, pw
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var rec struct {
				HTTP string `json:"http"`
			}
			s.mu.Lock()
			s.logs.WriteString(sc.Text() + "\n")
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.HTTP != "" {
				s.http = rec.HTTP
			}
			s.mu.Unlock()
		}
	}()
	go func() {
		_ = s.cmd.Wait()
		pw.Close()
		close(s.done)
	}()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
		wg.Wait()
		if t.Failed() {
			s.mu.Lock()
			t.Logf("%s log:\n%s", name, s.logs.String())
			s.mu.Unlock()
		}
	})
	return s
}

func (s *service) addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.http
}

// get returns the body of path on the service's HTTP endpoint, "" when it
// cannot be read.
func (s *service) get(path string) string {
	body, _ := s.fetch(path)
	return body
}

func (s *service) status(path string) int {
	_, code := s.fetch(path)
	return code
}

func (s *service) fetch(path string) (string, int) {
	addr := s.addr()
	if addr == "" {
		return "", 0
	}
	if host, port, err := net.SplitHostPort(addr); err == nil && (host == "0.0.0.0" || host == "::") {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		return "", 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}

// stop sends SIGTERM, as docker compose stop does, and waits for a clean
// exit.
func (s *service) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not stop within 30s of SIGTERM", s.name)
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("%s exited %d after SIGTERM", s.name, code)
	}
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
