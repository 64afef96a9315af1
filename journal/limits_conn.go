package journal

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultCallTimeout is Config.CallTimeout's default.
//
// Every limit on a journal connection derives from it (see limitsFor), so an
// operator turns one knob. 30 s is far above any healthy journal call (an
// append's round trip is milliseconds, a read's a few more) yet short enough
// that a journal that stopped answering ends the replication session — and
// with it the slot's advisory lock — well within a minute, so a standby can
// take over.
const DefaultCallTimeout = 30 * time.Second

// limits are the time limits of journal connections, all derived from
// Config.CallTimeout.
type limits struct {
	call    time.Duration // client deadline of a call; no-progress limit of any call
	lock    time.Duration // lock_timeout: below call, so a lock wait reports itself
	connect time.Duration // dial + TLS + authentication
	// Keepalives: the first probe after keepIdle of silence, then every
	// keepInterval, keepCount unanswered probes end the connection: a peer
	// that vanished is noticed after about call.
	keepIdle, keepInterval time.Duration
	keepCount              int
}

func limitsFor(call time.Duration) limits {
	if call <= 0 {
		call = DefaultCallTimeout
	}
	l := limits{call: call, lock: call / 2, keepCount: 3}
	l.connect = min(call, 10*time.Second)
	l.keepIdle = max(call/4, time.Second)
	l.keepInterval = max(call/4, time.Second)
	return l
}

func millis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

func seconds(d time.Duration) string { return strconv.FormatInt(int64(max(d/time.Second, 1)), 10) }

// durableCommit are the synchronous_commit values under which COMMIT returns
// only once the journal database has flushed the commit to its own disk.
var durableCommit = map[string]bool{"on": true, "local": true, "remote_write": true, "remote_apply": true}

// applyLimits sets the session settings and the dialer of every journal
// connection (the pool's, in both modes, and the LISTEN connection):
//
//   - synchronous_commit is forced to "on" unless the URL asks for another
//     value that still flushes locally (local, remote_write, remote_apply):
//     a journal commit must be durable before its position is acknowledged
//     to the source, whatever the journal database's or role's default.
//   - statement_timeout (call; 0 in append mode, see appendParams),
//     lock_timeout (call/2) and idle_in_transaction_session_timeout (call)
//     bound the server's side of a call even when the client is gone;
//     tcp_keepalives_* make the server notice a vanished client (and release
//     its locks) after about call. A value the URL sets (options or a
//     parameter) is kept.
//   - tcp_user_timeout (PostgreSQL 12+) and client_connection_check_interval
//     (14+) are set after connecting, where the server knows them.
//   - The dialer enables TCP keepalives with the same timing and, on Linux,
//     TCP_USER_TIMEOUT = call (unacknowledged data for that long fails the
//     connection); it wraps the connection in a progress watchdog (see
//     watchConn). A caller's own DialFunc (Config.ConnConfig) is kept and
//     wrapped.
//   - The connect timeout is the URL's connect_timeout, else min(call, 10 s).
func applyLimits(cfg *pgx.ConnConfig, l limits, fromURL bool) {
	rp := cfg.RuntimeParams
	setDefault := func(k, v string) {
		if _, ok := rp[k]; !ok {
			rp[k] = v
		}
	}
	if !durableCommit[strings.ToLower(rp["synchronous_commit"])] {
		rp["synchronous_commit"] = "on"
	}
	setDefault("statement_timeout", millis(l.call))
	setDefault("lock_timeout", millis(l.lock))
	setDefault("idle_in_transaction_session_timeout", millis(l.call))
	setDefault("tcp_keepalives_idle", seconds(l.keepIdle))
	setDefault("tcp_keepalives_interval", seconds(l.keepInterval))
	setDefault("tcp_keepalives_count", strconv.Itoa(l.keepCount))

	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = l.connect
	}
	dial := cfg.DialFunc
	if fromURL || dial == nil {
		d := &net.Dialer{
			Timeout:         cfg.ConnectTimeout,
			KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: l.keepIdle, Interval: l.keepInterval, Count: l.keepCount},
			Control:         tcpUserTimeoutControl(l.call),
		}
		dial = d.DialContext
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &watchConn{Conn: c}, nil
	}

	after := cfg.AfterConnect
	userTimeout, checkInterval := rp["tcp_user_timeout"], rp["client_connection_check_interval"]
	cfg.AfterConnect = func(ctx context.Context, pc *pgconn.PgConn) error {
		if after != nil {
			if err := after(ctx, pc); err != nil {
				return err
			}
		}
		var set []string
		v := serverMajor(pc.ParameterStatus("server_version"))
		if v >= 12 && userTimeout == "" {
			set = append(set, "SET tcp_user_timeout = "+millis(l.call))
		}
		if v >= 14 && checkInterval == "" {
			// A backend whose client vanished stops its statement (and
			// releases the meta row lock) within this, not when the
			// statement would have finished.
			set = append(set, "SET client_connection_check_interval = "+millis(max(l.call/6, time.Second)))
		}
		if len(set) == 0 {
			return nil
		}
		ctx, cancel := context.WithTimeout(ctx, l.call)
		defer cancel()
		return pc.Exec(ctx, strings.Join(set, "; ")).Close()
	}
}

// appendParams are the settings that differ on append-mode connections. An
// append streams a batch with COPY, and a batch holding one huge spilled
// transaction may legitimately take longer than any fixed statement_timeout
// — which would then fail it on every retry and stop replication for good.
// An append is bounded instead by progress: the watchdog fails it when no
// byte moves for CallTimeout, lock_timeout bounds its wait for the meta row,
// and idle_in_transaction_session_timeout and the keepalives end a session
// whose client vanished.
var appendParams = map[string]string{"statement_timeout": "0"}

func serverMajor(v string) int {
	end := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(v)
	}
	n, _ := strconv.Atoi(v[:end])
	return n
}

// errStalled is returned by a watched connection's Read or Write when nothing
// moved for the watchdog's limit. It is a timeout (net.Error), so pgconn
// treats it as a broken connection: the call fails and the connection is
// closed.
type errStalled struct{ limit time.Duration }

func (e errStalled) Error() string {
	return fmt.Sprintf("journal connection made no progress for %s (journal database unresponsive?)", e.limit)
}
func (e errStalled) Timeout() bool   { return true }
func (e errStalled) Temporary() bool { return false }
func (e errStalled) Unwrap() error   { return os.ErrDeadlineExceeded }

// watchConn wraps a journal connection's socket. While armed (a pool
// connection checked out for a call) every Read and Write must make progress
// within limit: each byte moved in either direction pushes both deadlines
// out, so a long COPY that streams steadily is never cut, while a server
// that stops answering — a lock wait past lock_timeout's reach, a stopped
// backend, a blackholed network — fails the call after limit. Deadlines set
// by pgconn itself (context cancellation) are kept and win when earlier.
// Close may be called from any goroutine (Journal.CloseNow).
type watchConn struct {
	net.Conn

	mu         sync.Mutex // guards the following fields
	limit      time.Duration
	userRead   time.Time // deadlines set through SetDeadline & co.
	userWrite  time.Time
	progressed time.Time // latest byte moved, or arm time
}

func (c *watchConn) arm(limit time.Duration) {
	c.mu.Lock()
	c.limit, c.progressed = limit, time.Now()
	c.mu.Unlock()
}

func (c *watchConn) disarm() {
	c.mu.Lock()
	c.limit = 0
	r, w := c.userRead, c.userWrite
	c.mu.Unlock()
	_ = c.Conn.SetReadDeadline(r)
	_ = c.Conn.SetWriteDeadline(w)
}

// lastProgress is when a byte last moved on an armed connection (zero when
// disarmed).
func (c *watchConn) lastProgress() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.limit == 0 {
		return time.Time{}
	}
	return c.progressed
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// refresh applies the deadlines; progress marks a byte moved now.
func (c *watchConn) refresh(progress bool) (limit time.Duration, ours time.Time) {
	c.mu.Lock()
	now := time.Now()
	if progress {
		c.progressed = now
	}
	limit = c.limit
	r, w := c.userRead, c.userWrite
	if limit > 0 {
		ours = c.progressed.Add(limit)
		r, w = earliest(r, ours), earliest(w, ours)
	}
	c.mu.Unlock()
	_ = c.Conn.SetReadDeadline(r)
	_ = c.Conn.SetWriteDeadline(w)
	return limit, ours
}

func (c *watchConn) check(n int, err error, user func() time.Time) (int, error) {
	limit, ours := c.refresh(n > 0)
	if err != nil && limit > 0 && errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(ours) {
		if u := user(); u.IsZero() || ours.Before(u) {
			return n, errStalled{limit}
		}
	}
	return n, err
}

func (c *watchConn) Read(p []byte) (int, error) {
	c.refresh(false)
	n, err := c.Conn.Read(p)
	return c.check(n, err, func() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.userRead })
}

func (c *watchConn) Write(p []byte) (int, error) {
	c.refresh(false)
	n, err := c.Conn.Write(p)
	return c.check(n, err, func() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.userWrite })
}

func (c *watchConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.userRead, c.userWrite = t, t
	c.mu.Unlock()
	_, _ = c.refresh(false)
	return nil
}

func (c *watchConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.userRead = t
	c.mu.Unlock()
	_, _ = c.refresh(false)
	return nil
}

func (c *watchConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.userWrite = t
	c.mu.Unlock()
	_, _ = c.refresh(false)
	return nil
}

// watched returns the watchdog under a pgx connection (below TLS, if any).
func watched(c *pgx.Conn) *watchConn {
	nc := c.PgConn().Conn()
	if t, ok := nc.(*tls.Conn); ok {
		nc = t.NetConn()
	}
	w, _ := nc.(*watchConn)
	return w
}

// callCtx bounds a journal call by the call timeout, unless ctx ends sooner.
func (j *Journal) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, j.limits.call)
}

// CallTimeout is the limit of each journal call (Config.CallTimeout with its
// default applied).
func (j *Journal) CallTimeout() time.Duration { return j.limits.call }
