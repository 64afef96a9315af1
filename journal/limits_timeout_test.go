package journal

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
)

// show reads a setting on a pooled connection of the given mode.
func show(t *testing.T, j *Journal, appendMode bool, name string) string {
	t.Helper()
	ctx := testCtx(t)
	if appendMode {
		ctx = withAppendMode(ctx)
	}
	c, err := j.pool.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer j.pool.release(c)
	var v string
	if err := c.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestSessionSettingsTimeout: journal sessions never inherit an operator's
// synchronous_commit=off (or unbounded timeouts) from the journal database.
func TestSessionSettingsTimeout(t *testing.T) {
	url := pgtest.NewDatabase(t)
	conn, err := pgx.Connect(testCtx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	var db string
	if err := conn.QueryRow(testCtx(t), "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"synchronous_commit = off", "statement_timeout = 0", "lock_timeout = 0", "idle_in_transaction_session_timeout = 0"} {
		if _, err := conn.Exec(testCtx(t), "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET "+s); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close(testCtx(t))

	j := openAt(t, url, func(c *Config) { c.CallTimeout = 12 * time.Second })
	want := map[string]string{
		"synchronous_commit":                  "on",
		"statement_timeout":                   "12s",
		"lock_timeout":                        "6s",
		"idle_in_transaction_session_timeout": "12s",
		"tcp_user_timeout":                    "12000",
		"tcp_keepalives_idle":                 "3",
		"tcp_keepalives_count":                "3",
		"client_connection_check_interval":    "2s",
	}
	for name, v := range want {
		if got := show(t, j, false, name); got != v {
			t.Errorf("%s = %q, want %q", name, got, v)
		}
	}
	// Append-mode sessions differ only in statement_timeout: an append is
	// bounded by progress instead.
	if got := show(t, j, true, "statement_timeout"); got != "0" {
		t.Errorf("append-mode statement_timeout = %q, want 0", got)
	}
	if got := show(t, j, true, "synchronous_commit"); got != "on" {
		t.Errorf("append-mode synchronous_commit = %q, want on", got)
	}

	// An explicit off in the URL is overridden too; a stronger setting stays.
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	j2 := openAt(t, url+sep+"synchronous_commit=off&lock_timeout=1500")
	if got := show(t, j2, true, "synchronous_commit"); got != "on" {
		t.Errorf("with synchronous_commit=off in the URL: %q, want on", got)
	}
	if got := show(t, j2, false, "lock_timeout"); got != "1500ms" {
		t.Errorf("lock_timeout from the URL: %q, want 1500ms (kept)", got)
	}
	j3 := openAt(t, url+sep+"synchronous_commit=remote_apply")
	if got := show(t, j3, false, "synchronous_commit"); got != "remote_apply" {
		t.Errorf("with synchronous_commit=remote_apply in the URL: %q, want it kept", got)
	}
}

// appendAsync runs an append of one transaction in a goroutine.
func appendAsync(j *Journal, gen int64, end decoder.LSN) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := j.Append(context.Background(), gen, []*decoder.Transaction{mkTx(1, end, testEpoch, chg{entity: "public.t", key: `{"id":1}`})})
		done <- err
	}()
	return done
}

func waitErr(t *testing.T, done <-chan error, within time.Duration) (error, time.Duration) {
	t.Helper()
	start := time.Now()
	select {
	case err := <-done:
		return err, time.Since(start)
	case <-time.After(within):
		t.Fatalf("the append did not return within %s", within)
	}
	return nil, 0
}

// TestAppendMetaRowLockedTimeout: an append waiting for the meta row, held
// by another session, fails within the limit instead of waiting forever.
func TestAppendMetaRowLockedTimeout(t *testing.T) {
	j, gen, url := newJournal(t, func(c *Config) { c.CallTimeout = 2 * time.Second })
	if _, err := j.Append(testCtx(t), gen, []*decoder.Transaction{mkTx(1, 100, testEpoch, chg{entity: "public.t", key: `{"id":1}`})}); err != nil {
		t.Fatal(err)
	}
	locker, err := pgx.Connect(testCtx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	tx, err := locker.Begin(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(testCtx(t), "SELECT * FROM "+j.sql.meta+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	err, took := waitErr(t, appendAsync(j, gen, 200), 15*time.Second)
	if err == nil {
		t.Fatal("the append succeeded while the meta row was locked")
	}
	t.Logf("append failed after %s: %v", took.Round(time.Millisecond), err)
	if took > 4*time.Second {
		t.Fatalf("the append took %s to fail, limit 2s", took)
	}
	_ = tx.Rollback(testCtx(t))
	// The journal works again, and the failed append wrote nothing.
	res, err := j.Append(testCtx(t), gen, []*decoder.Transaction{mkTx(2, 200, testEpoch, chg{entity: "public.t", key: `{"id":2}`})})
	if err != nil || res.FirstSeq != 2 {
		t.Fatalf("append after the lock went: %+v %v", res, err)
	}
}

// appendBackendPID returns the backend pid of the journal's idle
// append-mode connection.
func appendBackendPID(t *testing.T, j *Journal) int {
	t.Helper()
	j.pool.mu.Lock()
	defer j.pool.mu.Unlock()
	for _, ic := range j.pool.idle {
		if ic.append {
			return int(ic.c.PgConn().PID())
		}
	}
	t.Fatal("no idle append-mode connection")
	return 0
}

// TestAppendBackendStoppedTimeout stops the journal's backend (SIGSTOP), so
// the server neither answers nor times anything out: only the client's
// progress watchdog can end the append, and AppendStalled must report it
// meanwhile.
func TestAppendBackendStoppedTimeout(t *testing.T) {
	j, gen, _ := newJournal(t, func(c *Config) { c.CallTimeout = 3 * time.Second })
	if _, err := j.Append(testCtx(t), gen, []*decoder.Transaction{mkTx(1, 100, testEpoch, chg{entity: "public.t", key: `{"id":1}`})}); err != nil {
		t.Fatal(err)
	}
	pid := appendBackendPID(t, j)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	done := appendAsync(j, gen, 200)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if in, stalled := j.AppendStalled(); in && stalled > time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("AppendStalled never reported the stuck append")
		}
		time.Sleep(20 * time.Millisecond)
	}
	err, _ := waitErr(t, done, 15*time.Second)
	var stall errStalled
	if !errors.As(err, &stall) {
		t.Fatalf("append error = %v, want the progress watchdog's", err)
	}
	if in, _ := j.AppendStalled(); in {
		t.Fatal("AppendStalled still reports an append after it failed")
	}
	t.Logf("append failed: %v", err)
}

// TestCloseNowBreaksInFlightTimeout: CloseNow fails a hung append at once,
// long before its own limits.
func TestCloseNowBreaksInFlightTimeout(t *testing.T) {
	j, gen, url := newJournal(t, func(c *Config) { c.CallTimeout = time.Minute })
	locker, err := pgx.Connect(testCtx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	tx, err := locker.Begin(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(testCtx(t), "SELECT * FROM "+j.sql.meta+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	done := appendAsync(j, gen, 100)
	deadline := time.Now().Add(10 * time.Second)
	for in, _ := j.AppendStalled(); !in; in, _ = j.AppendStalled() {
		if time.Now().After(deadline) {
			t.Fatal("the append never got a connection")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	j.CloseNow()
	if err, took := waitErr(t, done, 5*time.Second); err == nil || took > 2*time.Second {
		t.Fatalf("after CloseNow the append returned %v after %s", err, took)
	}
}

// TestBootstrapOneCommitTimeout: Bootstrap writes source and watermark
// together, or neither.
func TestBootstrapOneCommitTimeout(t *testing.T) {
	j, gen, url := newJournal(t)
	src := Source{SystemID: "7300000000000000001", Timeline: 1, Slot: "walcast"}
	if _, err := j.Bootstrap(testCtx(t), gen-1, src, 1000, nil); !errors.Is(err, ErrFenced) {
		t.Fatalf("fenced bootstrap: %v", err)
	}
	// A failure that strikes only the watermark's half fails both: a trigger
	// refusing any watermark change.
	c, err := pgx.Connect(testCtx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(testCtx(t), `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'refused'; END$$;
		CREATE TRIGGER refuse_wm BEFORE UPDATE ON `+j.sql.meta+` FOR EACH ROW WHEN (NEW.watermark <> OLD.watermark) EXECUTE FUNCTION refuse()`); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Bootstrap(testCtx(t), gen, src, 1000, nil); err == nil {
		t.Fatal("bootstrap succeeded past the trigger")
	}
	st, err := j.State(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.Source != (Source{}) || st.Watermark != 0 {
		t.Fatalf("a failed bootstrap left source %+v, watermark %s", st.Source, st.Watermark)
	}
	if _, err := c.Exec(testCtx(t), `DROP TRIGGER refuse_wm ON `+j.sql.meta); err != nil {
		t.Fatal(err)
	}
	wm, err := j.Bootstrap(testCtx(t), gen, src, 1000, nil)
	if err != nil || wm != 1000 {
		t.Fatalf("bootstrap: %s %v", wm, err)
	}
	if st, err = j.State(testCtx(t)); err != nil || st.Source != src || st.Watermark != 1000 || st.Horizon != 0 {
		t.Fatalf("after bootstrap: %+v %v", st, err)
	}
	// The append cache follows: the next append is at 1000+ and fast.
	if res, err := j.Append(testCtx(t), gen, []*decoder.Transaction{mkTx(1, 1100, testEpoch, chg{entity: "public.t", key: `{"id":1}`})}); err != nil || res.Watermark != 1100 {
		t.Fatalf("append after bootstrap: %+v %v", res, err)
	}
}
