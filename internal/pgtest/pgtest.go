// Package pgtest gives tests a real, private PostgreSQL server.
//
// A cluster is created with initdb in a temporary directory, configured with
// wal_level=logical, and started on a free loopback port with its unix socket
// in the same directory. When the test process runs as root the server runs as
// the unprivileged "postgres" user, because PostgreSQL refuses to run as root.
//
// Most tests call [NewDatabase], which returns the URL of a fresh database on
// one cluster shared by the whole test binary; packages that use it must call
// [Main] from TestMain so the shared cluster is stopped and removed at exit.
// Tests that need a differently configured server (wal_level=replica, few
// replication slots) call [Start] for a private cluster of their own.
//
// When WALCAST_TEST_DATABASE_URL is set, [NewDatabase] creates its databases
// on that existing server instead; restarts are then unavailable.
//
// The package never skips a test: missing PostgreSQL binaries fail the test
// with the command that installs them.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDatabaseURL names the environment variable that points the harness at an
// existing server (a superuser URL) instead of starting one.
const EnvDatabaseURL = "WALCAST_TEST_DATABASE_URL"

// InstallHint is the command that installs the PostgreSQL server binaries on
// Debian, the platform CI runs on.
const InstallHint = "apt-get update && apt-get install -y postgresql-15"

// Options configure a cluster. The zero value is a logical-replication-ready
// server with room for many slots.
type Options struct {
	// WalLevel defaults to "logical".
	WalLevel string
	// Settings are extra postgresql.conf parameters; they override defaults.
	Settings map[string]string
	// NextXid, when non-zero, moves the new cluster's transaction id
	// counter to this 64-bit value (epoch<<32 | xid) before the test uses
	// it: see [Cluster.SetNextXid].
	NextXid uint64
}

// Cluster is a PostgreSQL server owned by a test. Its methods are safe for
// concurrent use.
type Cluster struct {
	bindir  string
	dir     string // owns data/ and the unix socket
	datadir string
	port    int
	cred    *syscall.Credential

	// external is set when the cluster is a server the harness did not start.
	external *url.URL

	mu     sync.Mutex // guards the following fields
	proc   *exec.Cmd
	exited chan error // receives the postmaster's exit status once
}

// FindBinDir locates the directory holding initdb and postgres. It prefers
// PostgreSQL 15, then the newest version installed.
func FindBinDir() (string, error) {
	if dir := os.Getenv("WALCAST_TEST_PG_BINDIR"); dir != "" {
		return dir, nil
	}
	var candidates []string
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		candidates = append(candidates, filepath.Dir(p))
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	for _, m := range matches {
		if versionOf(m) == 15 {
			candidates = append([]string{m}, candidates...)
		}
	}
	candidates = append(candidates, matches...)
	for _, dir := range candidates {
		if isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("pgtest: PostgreSQL server binaries (initdb, postgres) not found in PATH or /usr/lib/postgresql/*/bin; install them with: %s (or set %s to an existing server)", InstallHint, EnvDatabaseURL)
}

func versionOf(bindir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(bindir)))
	return v
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// Start creates and starts a private cluster, removed when the test ends.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	c, err := NewCluster(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Destroy() })
	return c
}

// NewCluster creates and starts a cluster. The caller must call Destroy.
func NewCluster(opts Options) (*Cluster, error) {
	bindir, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	cred, owner, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "walcast-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: temp dir: %w", err)
	}
	c := &Cluster{bindir: bindir, dir: dir, datadir: filepath.Join(dir, "data"), cred: cred}
	if err := c.init(owner, opts); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// A port picked free can be taken before the server binds it; retry.
	for attempt := 1; ; attempt++ {
		c.port, err = freePort()
		if err == nil {
			err = c.writePort()
		}
		if err == nil {
			err = c.start()
		}
		if err == nil && opts.NextXid != 0 {
			if err = c.SetNextXid(opts.NextXid); err != nil {
				c.Destroy()
				return nil, err
			}
		}
		if err == nil {
			return c, nil
		}
		if attempt == 3 {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

// serverCredential returns the identity the server runs as: the current user,
// or the "postgres" user when running as root.
func serverCredential() (*syscall.Credential, *user.User, error) {
	if os.Geteuid() != 0 {
		return nil, nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, nil, fmt.Errorf("pgtest: running as root needs the unprivileged user \"postgres\" to run the server (PostgreSQL refuses root); it comes with the server package: %s", InstallHint)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, u, nil
}

func (c *Cluster) init(owner *user.User, opts Options) error {
	if owner != nil {
		if err := os.Chown(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgtest: chown %s: %w", c.dir, err)
		}
	}
	cmd := exec.Command(filepath.Join(c.bindir, "initdb"), "-D", c.datadir, "-U", "postgres",
		"--auth=trust", "--no-sync", "--encoding=UTF8", "--locale=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}

	settings := map[string]string{
		"wal_level":                 "logical",
		"listen_addresses":          "'127.0.0.1'",
		"unix_socket_directories":   quoteConf(c.dir),
		"max_connections":           "200",
		"max_replication_slots":     "32",
		"max_wal_senders":           "32",
		"fsync":                     "off",
		"full_page_writes":          "off",
		"shared_buffers":            "64MB",
		"wal_sender_timeout":        "60s",
		"logging_collector":         "off",
		"log_min_messages":          "warning",
		"max_slot_wal_keep_size":    "-1",
		"timezone":                  "'UTC'",
		"password_encryption":       "'scram-sha-256'",
		"logical_decoding_work_mem": "64MB",
	}
	if opts.WalLevel != "" {
		settings["wal_level"] = opts.WalLevel
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var conf strings.Builder
	conf.WriteString("\n# walcast test harness\n")
	for _, k := range keys {
		fmt.Fprintf(&conf, "%s = %s\n", k, settings[k])
	}
	if err := appendFile(filepath.Join(c.datadir, "postgresql.conf"), conf.String()); err != nil {
		return err
	}
	// The superuser "postgres" is trusted; every other role must present a
	// password over TCP, so tests can exercise authentication failures.
	hba := strings.Join([]string{
		"local all all trust",
		"local replication all trust",
		"host all postgres 127.0.0.1/32 trust",
		"host replication postgres 127.0.0.1/32 trust",
		"host all all 127.0.0.1/32 scram-sha-256",
		"host replication all 127.0.0.1/32 scram-sha-256",
		"",
	}, "\n")
	return os.WriteFile(filepath.Join(c.datadir, "pg_hba.conf"), []byte(hba), 0o600)
}

func (c *Cluster) writePort() error {
	return appendFile(filepath.Join(c.datadir, "postgresql.conf"), fmt.Sprintf("port = %d\n", c.port))
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return fmt.Errorf("pgtest: %w", err)
	}
	return f.Close()
}

func quoteConf(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start runs the postmaster as a child of the test process. Pdeathsig makes
// the kernel stop it (immediate shutdown) if the test process dies without
// cleaning up, so a crashed test run leaves no server behind.
func (c *Cluster) start() error {
	logf, err := os.OpenFile(filepath.Join(c.dir, "server.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: server log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(c.bindir, "postgres"), "-D", c.datadir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Dir = c.dir
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			conn.Close(ctx)
			break
		}
		select {
		case werr := <-exited:
			return fmt.Errorf("pgtest: postgres exited during start-up (%v); log:\n%s", werr, c.Log())
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGQUIT)
			<-exited
			return fmt.Errorf("pgtest: postgres did not accept connections within 30s (last error: %v); log:\n%s", err, c.Log())
		case <-time.After(20 * time.Millisecond):
		}
	}
	c.mu.Lock()
	c.proc, c.exited = cmd, exited
	c.mu.Unlock()
	return nil
}

// Log returns the server's log so far, for failure messages.
func (c *Cluster) Log() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
	return string(b)
}

// stop shuts the server down: mode "fast" (SIGINT: roll back sessions, clean
// checkpoint) or "immediate" (SIGQUIT: crash-like, recovery on next start).
func (c *Cluster) stop(mode string) error {
	c.mu.Lock()
	proc, exited := c.proc, c.exited
	c.proc, c.exited = nil, nil
	c.mu.Unlock()
	if proc == nil {
		return nil
	}
	sig := syscall.SIGINT
	if mode == "immediate" {
		sig = syscall.SIGQUIT
	}
	_ = proc.Process.Signal(sig)
	select {
	case <-exited:
		return nil
	case <-time.After(60 * time.Second):
		_ = proc.Process.Kill()
		<-exited
		return fmt.Errorf("pgtest: postgres did not stop (%s) within 60s", mode)
	}
}

// Restart stops the server with mode "fast" or "immediate" and starts it again
// on the same port. Existing connections are broken.
func (c *Cluster) Restart(mode string) error {
	if c.external != nil {
		return errors.New("pgtest: Restart needs a harness-started server; unset " + EnvDatabaseURL)
	}
	if mode != "fast" && mode != "immediate" {
		return fmt.Errorf("pgtest: restart mode %q: want fast or immediate", mode)
	}
	if err := c.stop(mode); err != nil {
		return err
	}
	return c.start()
}

// SetNextXid moves the cluster's transaction id counter to next, a 64-bit
// transaction id (xid8: epoch<<32 | xid, as pg_current_xact_id shows it),
// so tests can run where 32-bit xids wrap and epochs change. Its low 32
// bits must be a normal xid (3 or more). The counter continues from next
// (the catalog updates SetNextXid makes after the restart, one transaction
// per database, take the first few xids), whatever came before.
//
// It does what pg_upgrade does to a new cluster: every database is
// frozen (VACUUM FREEZE, so no row depends on an xid the move makes look
// like the future), the server is stopped, pg_resetwal sets the next xid,
// its epoch and the oldest unfrozen xid (-x, -e, -u), the commit log
// (pg_xact) segment holding the new xid is created zero-filled, as
// pg_resetwal's documentation prescribes, and after the restart every
// database's datfrozenxid and every table's relfrozenxid is set to the new
// xid. WAL is reset: replication slots created before are unusable, so call
// it before creating any.
func (c *Cluster) SetNextXid(next uint64) error {
	if c.external != nil {
		return errors.New("pgtest: SetNextXid needs a harness-started server; unset " + EnvDatabaseURL)
	}
	low, epoch := uint32(next), uint32(next>>32)
	if low < 3 {
		return fmt.Errorf("pgtest: next xid %d: its low 32 bits (%d) are not a normal transaction id (3 or more)", next, low)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := c.eachDatabase(ctx, "VACUUM FREEZE"); err != nil {
		return err
	}
	// Once more for the rows eachDatabase itself wrote (template0's
	// ALLOW_CONNECTIONS set and reset).
	if err := c.Exec(ctx, "postgres", "VACUUM FREEZE pg_catalog.pg_database"); err != nil {
		return err
	}
	if err := c.stop("fast"); err != nil {
		return err
	}
	x := strconv.FormatUint(uint64(low), 10)
	cmd := exec.Command(filepath.Join(c.bindir, "pg_resetwal"), "-x", x, "-u", x, "-e", strconv.FormatUint(uint64(epoch), 10), "-D", c.datadir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = c.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: pg_resetwal: %w\n%s", err, out)
	}
	// pg_xact holds 2 bits per xid in 8 KiB pages, 32 pages a segment:
	// segment n covers xids n<<20 to (n+1)<<20 - 1.
	seg := filepath.Join(c.datadir, "pg_xact", fmt.Sprintf("%04X", low>>20))
	if _, err := os.Stat(seg); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(seg, make([]byte, 256<<10), 0o600); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
		if c.cred != nil {
			if err := os.Chown(seg, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				return fmt.Errorf("pgtest: %w", err)
			}
		}
	}
	if err := c.start(); err != nil {
		return err
	}
	// The freeze horizons recorded before the move would now lie ahead of
	// (or 2^31 behind) the counter; start them at the new xid.
	return c.eachDatabase(ctx, "UPDATE pg_class SET relfrozenxid = '"+x+"' WHERE relfrozenxid <> '0';"+
		"UPDATE pg_database SET datfrozenxid = '"+x+"'")
}

// eachDatabase runs sql (simple protocol) in every database, template0
// included (its connections are allowed for the while).
func (c *Cluster) eachDatabase(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT datname, datallowconn FROM pg_database ORDER BY datname")
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	type db struct {
		name  string
		allow bool
	}
	var dbs []db
	for rows.Next() {
		var d db
		if err := rows.Scan(&d.name, &d.allow); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
		dbs = append(dbs, d)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	for _, d := range dbs {
		name := pgx.Identifier{d.name}.Sanitize()
		if !d.allow {
			if _, err := conn.Exec(ctx, "ALTER DATABASE "+name+" ALLOW_CONNECTIONS true"); err != nil {
				return fmt.Errorf("pgtest: %w", err)
			}
		}
		err := func() error {
			dc, err := pgx.Connect(ctx, c.URL(d.name))
			if err != nil {
				return err
			}
			defer dc.Close(ctx)
			_, err = dc.PgConn().Exec(ctx, sql).ReadAll()
			return err
		}()
		if !d.allow {
			if _, aerr := conn.Exec(ctx, "ALTER DATABASE "+name+" ALLOW_CONNECTIONS false"); aerr != nil && err == nil {
				err = aerr
			}
		}
		if err != nil {
			return fmt.Errorf("pgtest: %s in database %s: %w", sql, d.name, err)
		}
	}
	return nil
}

// Destroy stops the server and removes its directory.
func (c *Cluster) Destroy() {
	if c.external != nil {
		return
	}
	_ = c.stop("fast")
	os.RemoveAll(c.dir)
}

// Port is the TCP port the server listens on (127.0.0.1).
func (c *Cluster) Port() int {
	if c.external != nil {
		p, _ := strconv.Atoi(c.external.Port())
		return p
	}
	return c.port
}

// SocketDir is the directory holding the server's unix socket.
func (c *Cluster) SocketDir() string { return c.dir }

// DataDir is the cluster's data directory.
func (c *Cluster) DataDir() string { return c.datadir }

// BinDir is the directory of the server binaries used (pg_recvlogical etc.).
func (c *Cluster) BinDir() string { return c.bindir }

// URL returns a superuser URL for database db over TCP.
func (c *Cluster) URL(db string) string {
	if c.external != nil {
		u := *c.external
		u.Path = "/" + db
		return u.String()
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, url.PathEscape(db))
}

// UserURL returns a URL for database db that logs in as role with password.
func (c *Cluster) UserURL(db, role, password string) string {
	u, _ := url.Parse(c.URL(db))
	u.User = url.UserPassword(role, password)
	return u.String()
}

// TerminateBackend ends the backend with the given pid (pg_terminate_backend)
// and waits until it is gone.
func (c *Cluster) TerminateBackend(ctx context.Context, pid int) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_terminate_backend($1, 10000)", pid).Scan(&ok); err != nil {
		return fmt.Errorf("pgtest: pg_terminate_backend(%d): %w", pid, err)
	}
	if !ok {
		return fmt.Errorf("pgtest: backend %d did not terminate", pid)
	}
	return nil
}

// Exec runs sql as superuser in database db.
func (c *Cluster) Exec(ctx context.Context, db, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, c.URL(db))
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return nil
}

var (
	sharedOnce sync.Once
	shared     *Cluster
	sharedErr  error
	dbCounter  atomic.Int64
)

// Shared returns the cluster shared by the test binary, starting it on first
// use. It is stopped by [Main].
func Shared(t testing.TB) *Cluster {
	t.Helper()
	sharedOnce.Do(func() {
		if raw := os.Getenv(EnvDatabaseURL); raw != "" {
			u, err := url.Parse(raw)
			if err != nil {
				sharedErr = fmt.Errorf("pgtest: %s: %w", EnvDatabaseURL, err)
				return
			}
			shared = &Cluster{external: u}
			return
		}
		shared, sharedErr = NewCluster(Options{})
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// Main runs the tests and then stops the shared cluster. Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
func Main(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		shared.Destroy()
	}
	return code
}

// NewDatabase creates a fresh database on the shared cluster and returns a
// superuser URL for it. The database, its replication slots and its sessions
// are removed when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return Shared(t).NewDatabase(t)
}

// NewDatabase creates a fresh database on c, dropped when the test ends.
func (c *Cluster) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d_%d_%s", os.Getpid(), dbCounter.Add(1), sanitize(t.Name()))
	if len(name) > 63 {
		name = name[:63]
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Exec(ctx, "postgres", "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0"); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		if err := c.DropDatabase(context.Background(), name); err != nil {
			t.Errorf("%v", err)
		}
	})
	return c.URL(name)
}

// DropDatabase drops db after ending its sessions and dropping its slots.
func (c *Cluster) DropDatabase(ctx context.Context, db string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: drop database %s: connect: %w", db, err)
	}
	defer conn.Close(ctx)
	// Slots outlive sessions and block DROP DATABASE; end their walsenders
	// (which are not attached to the database by datname) first.
	const q = `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
	           WHERE database = $1 AND active_pid IS NOT NULL`
	if _, err := conn.Exec(ctx, q, db); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", db, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, db)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: drop slots of %s: %w", db, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", db, err)
	}
	return nil
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// MustExec runs each SQL string on url with the simple protocol (so one string
// may hold several statements), failing the test on the first error.
func MustExec(t testing.TB, url string, sqls ...string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	for _, sql := range sqls {
		if _, err := conn.PgConn().Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("pgtest: %s: %v", sql, err)
		}
	}
}

// MustQueryRow runs a one-row query on url and scans it into dest, failing the
// test on error.
func MustQueryRow(t testing.TB, url, sql string, args []any, dest ...any) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}
