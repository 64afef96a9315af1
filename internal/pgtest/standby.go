package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartStandby starts a physical streaming hot standby of c: a base backup
// taken with pg_basebackup -R (WAL streamed alongside, so the backup is
// consistent on its own), started with hot_standby on, its own data
// directory and port, and stopped and removed when the test ends. It returns
// once the standby accepts read-only connections and has replayed
// everything c had written when the backup started.
//
// The returned Cluster is the standby: URL, Exec and Restart work on it as
// on any cluster; writes fail as on any hot standby. PauseReplay and
// ResumeReplay hold its replay back so a test can produce lag on purpose.
//
// c must be a harness-started cluster: its pg_hba.conf trusts replication
// connections of the "postgres" superuser from 127.0.0.1 and it allows 32
// WAL senders (init), which is all a base backup and a standby need.
func (c *Cluster) StartStandby(t testing.TB) *Cluster {
	t.Helper()
	s, err := c.NewStandby()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy() })
	return s
}

// NewStandby is StartStandby for callers without a testing.TB. The caller
// must call Destroy on the standby (before or after the primary's).
func (c *Cluster) NewStandby() (*Cluster, error) {
	if c.external != nil {
		return nil, errors.New("pgtest: a standby needs a harness-started primary; unset " + EnvDatabaseURL)
	}
	dir, err := os.MkdirTemp("", "walcast-pgtest-standby-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: temp dir: %w", err)
	}
	if c.cred != nil {
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: chown %s: %w", dir, err)
		}
	}
	s := &Cluster{bindir: c.bindir, dir: dir, datadir: filepath.Join(dir, "data"), cred: c.cred}
	// -R writes standby.signal and primary_conninfo; -X stream copies the
	// WAL written during the backup; -c fast does not wait for a
	// scheduled checkpoint.
	cmd := exec.Command(filepath.Join(c.bindir, "pg_basebackup"), "-D", s.datadir, "-R", "-X", "stream", "-c", "fast", "--no-sync",
		"-d", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=walcast_test_standby", c.port))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: pg_basebackup: %w\n%s", err, out)
	}
	// The backup carries the primary's postgresql.conf; lines appended
	// later win. The socket goes to the standby's own directory.
	conf := "\n# walcast test harness: standby\n" +
		"hot_standby = on\n" +
		"unix_socket_directories = " + quoteConf(dir) + "\n" +
		// Replay waits for conflicting standby queries rather than
		// cancelling them: tests read on the standby while the primary
		// vacuums.
		"max_standby_streaming_delay = -1\n" +
		"hot_standby_feedback = on\n" +
		"wal_receiver_status_interval = 1s\n"
	if err := appendFile(filepath.Join(s.datadir, "postgresql.conf"), conf); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		s.port, err = freePort()
		if err == nil {
			err = s.writePort()
		}
		if err == nil {
			err = s.start()
		}
		if err == nil {
			break
		}
		if attempt == 3 {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.CatchUp(ctx, c); err != nil {
		s.Destroy()
		return nil, err
	}
	return s, nil
}

// PauseReplay stops the standby's replay (pg_wal_replay_pause) and returns
// once it has stopped: from then on its queries see the primary as of one
// point while WAL keeps arriving, until ResumeReplay.
func (c *Cluster) PauseReplay(ctx context.Context) error {
	if err := c.Exec(ctx, "postgres", "SELECT pg_wal_replay_pause()"); err != nil {
		return err
	}
	return c.pollStandby(ctx, "replay to pause", "SELECT pg_get_wal_replay_pause_state() = 'paused'")
}

// ResumeReplay lets a paused standby replay again (pg_wal_replay_resume).
func (c *Cluster) ResumeReplay(ctx context.Context) error {
	return c.Exec(ctx, "postgres", "SELECT pg_wal_replay_resume()")
}

// ReplayLSN is the standby's replay position (pg_last_wal_replay_lsn).
func (c *Cluster) ReplayLSN(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return "", fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	var lsn *string
	if err := conn.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn()::text").Scan(&lsn); err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	if lsn == nil {
		return "", errors.New("pgtest: pg_last_wal_replay_lsn() is NULL: the server is not a standby")
	}
	return *lsn, nil
}

// CatchUp waits until the standby c has replayed everything primary had
// written when CatchUp was called. Replay must not be paused.
func (c *Cluster) CatchUp(ctx context.Context, primary *Cluster) error {
	pc, err := pgx.Connect(ctx, primary.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: connect to the primary: %w", err)
	}
	var target string
	err = pc.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&target)
	pc.Close(ctx)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return c.pollStandby(ctx, "replay to reach "+target,
		"SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)", target)
}

// pollStandby runs a boolean query on c until it returns true, 20 ms apart.
func (c *Cluster) pollStandby(ctx context.Context, what, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	for {
		var ok bool
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			err = conn.QueryRow(ctx, sql, args...).Scan(&ok)
			conn.Close(context.WithoutCancel(ctx))
		}
		if err == nil && ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: waiting for %s: %w (last error: %v); standby log:\n%s", what, ctx.Err(), last, c.Log())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
