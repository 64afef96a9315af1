package main

// Process-level fault tests: the test binary re-executes itself as the
// walcast binary (see TestMain), so these run the real `walcast run` code
// path in separate processes that can be killed, stopped and resumed.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/internal/telemetry/otlptest"
	"github.com/walcast/walcast/journal"
	"github.com/walcast/walcast/journal/journaltest"
)

// proc is a walcast process started by a test.
type proc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex // guards the following fields
	logs bytes.Buffer
	http string // address of /readyz, from the start-up log line
	done chan struct{}
	code int
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.Write(b)
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// startWalcast runs the test binary as `walcast args...`.
func startWalcast(t testing.TB, args ...string) *proc {
	t.Helper()
	return startProcess(t, os.Args[0], args...)
}

// startProcess starts the walcast executable exe (this test binary, or
// shippedWalcast's build) with args, as startWalcast does.
func startProcess(t testing.TB, exe string, args ...string) *proc {
	t.Helper()
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command(exe, args...)
	p.cmd.Env = append(os.Environ(), "WALCAST_TEST_EXEC=1")
	pr, pw := io.Pipe()
	p.cmd.Stderr = pw
	p.cmd.Stdout = p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			p.Write(append(append([]byte(nil), line...), '\n'))
			var rec struct {
				Msg  string `json:"msg"`
				HTTP string `json:"http"`
			}
			if json.Unmarshal(line, &rec) == nil && rec.HTTP != "" {
				p.mu.Lock()
				p.http = rec.HTTP
				p.mu.Unlock()
			}
		}
	}()
	go func() {
		err := p.cmd.Wait()
		pw.Close()
		p.mu.Lock()
		p.code = p.cmd.ProcessState.ExitCode()
		if err != nil && p.code == 0 {
			p.code = -1
		}
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("walcast pid %d log:\n%s", p.cmd.Process.Pid, p.log())
		}
	})
	return p
}

// readyz returns the body of /readyz, or "" when it cannot be read.
func (p *proc) readyz() string {
	p.mu.Lock()
	addr := p.http
	p.mu.Unlock()
	if addr == "" {
		return ""
	}
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) exitCode(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("walcast did not exit within %s", timeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.code
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func runArgs(url string, extra ...string) []string {
	return append([]string{"run", "--database-url", url, "--publication", "pub", "--http-listen", "127.0.0.1:0",
		"--embedded-nats-listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug"}, extra...)
}

var cursorSecret = []byte("process-test-cursor-secret-0123")

// journalItems reads every journal entry, resync entries included, straight
// from the entries table (a cursor reader stops at a resync entry by design).
func journalItems(t *testing.T, url string) []journaltest.Item {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT seq, entity, entity_seq, envelope FROM walcast.entries ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	var items []journaltest.Item
	for rows.Next() {
		var it journaltest.Item
		var body string
		if err := rows.Scan(&it.Seq, &it.Entity, &it.EntitySeq, &body); err != nil {
			t.Fatal(err)
		}
		var env decoder.Envelope
		if err := json.Unmarshal([]byte(body), &env); err != nil {
			t.Fatal(err)
		}
		it.ID = fmt.Sprintf("%s:%s:%s", env.Op, env.Entity, env.Key["id"])
		if env.Op == decoder.OpResync {
			it.ID = "resync"
		}
		items = append(items, it)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return items
}

// writer commits single-row inserts until stopped and records what committed.
type writer struct {
	mu   sync.Mutex
	ids  []string
	stop chan struct{}
	done chan struct{}
}

func startWriter(t *testing.T, url string) *writer {
	w := &writer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		ctx := context.Background()
		var conn *pgx.Conn
		for n := 0; ; n++ {
			select {
			case <-w.stop:
				if conn != nil {
					conn.Close(ctx)
				}
				return
			default:
			}
			if conn == nil {
				c, err := pgx.Connect(ctx, url)
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				conn = c
			}
			// Two rows per transaction, then an update of the first.
			tx, err := conn.Begin(ctx)
			if err == nil {
				_, err = tx.Exec(ctx, "INSERT INTO items VALUES ($1, 'v'), ($2, 'v')", 2*n, 2*n+1)
				if err == nil {
					_, err = tx.Exec(ctx, "UPDATE items SET val = 'w' WHERE id = $1", 2*n)
				}
				if err == nil {
					err = tx.Commit(ctx)
				} else {
					_ = tx.Rollback(ctx)
				}
			}
			if err != nil {
				conn.Close(ctx)
				conn = nil
				continue
			}
			w.mu.Lock()
			w.ids = append(w.ids, fmt.Sprintf("insert:public.items:%d", 2*n), fmt.Sprintf("insert:public.items:%d", 2*n+1),
				fmt.Sprintf("update:public.items:%d", 2*n))
			w.mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return w
}

func (w *writer) finish() []string {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.ids...)
}

func setupSource(t *testing.T, url string) *journal.Journal {
	t.Helper()
	execSQL(t, url, `CREATE TABLE items (id int PRIMARY KEY, val text)`, `CREATE PUBLICATION pub FOR TABLE items`)
	j, err := journal.Open(context.Background(), journal.Config{URL: url, CursorSecret: cursorSecret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Close)
	return j
}

func validateJournal(t *testing.T, url string, committed []string) {
	t.Helper()
	var items []journaltest.Item
	deadline := time.Now().Add(60 * time.Second)
	for {
		items = journalItems(t, url)
		if len(items) >= len(committed) {
			break
		}
		if time.Now().After(deadline) {
			v := journaltest.New()
			v.Commit(committed...)
			v.Observe(items...)
			t.Fatalf("after 60s the journal holds %d entries for %d committed changes: %v", len(items), len(committed), v.Check())
		}
		time.Sleep(50 * time.Millisecond)
	}
	v := journaltest.New()
	v.Commit(committed...)
	v.Observe(items...)
	if err := v.Check(); err != nil {
		t.Fatal(err)
	}
}

// slotSampler checks, until stopped, that the slot never confirms beyond the
// journal watermark.
func slotSampler(t *testing.T, url string, j *journal.Journal) (stop func() []string) {
	ctx, cancel := context.WithCancel(context.Background())
	var violations []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		for ctx.Err() == nil {
			var s string
			if err := conn.QueryRow(ctx, `SELECT coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = 'walcast'`).Scan(&s); err == nil {
				c, _ := decoder.ParseLSN(s)
				if wm, err := j.Watermark(ctx); err == nil && c > wm {
					violations = append(violations, fmt.Sprintf("confirmed_flush_lsn %s > watermark %s", c, wm))
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return func() []string {
		cancel()
		<-done
		return violations
	}
}

// TestKill9UnderLoad kills `walcast run` with SIGKILL at random moments, 20
// times, while a writer commits. Every committed change is journaled exactly
// once, in order, and the slot never confirms what the journal lacks.
func TestKill9UnderLoad(t *testing.T) {
	url := pgtest.NewDatabase(t)
	j := setupSource(t, url)
	// An external NATS with a JetStream stream bound to the subjects: kills
	// between journal commit and publish make walcast republish, and the
	// stream drops the copies by Nats-Msg-Id.
	ns := natstest.Start(t)
	js := jetStream(t, ns.URL())
	var stopSampler func() []string
	var w *writer
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	for round := 0; round < 20; round++ {
		p := startWalcast(t, runArgs(url, "--nats-url", ns.URL())...)
		waitUntil(t, "active", 30*time.Second, func() bool { return strings.HasPrefix(p.readyz(), "active") })
		if w == nil {
			// Once the slot exists: changes before it are not ours, and a
			// fresh slot confirms its start before the journal records it.
			w = startWriter(t, url)
			stopSampler = slotSampler(t, url, j)
		}
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-p.done
	}
	p := startWalcast(t, runArgs(url, "--nats-url", ns.URL())...)
	waitUntil(t, "active", 30*time.Second, func() bool { return strings.HasPrefix(p.readyz(), "active") })
	committed := w.finish()
	validateJournal(t, url, committed)
	entries := len(journalItems(t, url))
	waitUntil(t, "every journal entry in the JetStream stream once", 60*time.Second, func() bool {
		info, err := js.StreamInfo("WALCAST")
		return err == nil && info.State.Msgs == uint64(entries)
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.exitCode(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	if v := stopSampler(); len(v) > 0 {
		t.Fatalf("%d samples with the slot ahead of the journal; first: %s", len(v), v[0])
	}
	t.Logf("%d changes journaled exactly once across 20 kill -9 rounds", len(committed))
}

// TestInstancesStartedTogether starts three instances at once: exactly one
// becomes active, the others standby; --standby=false exits 3.
func TestInstancesStartedTogether(t *testing.T) {
	url := pgtest.NewDatabase(t)
	setupSource(t, url)
	var ps []*proc
	for i := 0; i < 3; i++ {
		ps = append(ps, startWalcast(t, runArgs(url)...))
	}
	roles := func() (active, standby int) {
		for _, p := range ps {
			switch r := p.readyz(); {
			case strings.HasPrefix(r, "active"):
				active++
			case strings.HasPrefix(r, "standby"):
				standby++
			}
		}
		return
	}
	waitUntil(t, "one active and two standbys", 30*time.Second, func() bool {
		a, s := roles()
		return a == 1 && s == 2
	})
	// Hold the roles for a while: no flapping.
	for i := 0; i < 10; i++ {
		if a, s := roles(); a != 1 || s != 2 {
			t.Fatalf("roles changed: %d active, %d standby", a, s)
		}
		time.Sleep(50 * time.Millisecond)
	}
	p := startWalcast(t, runArgs(url, "--standby=false")...)
	if code := p.exitCode(t, 30*time.Second); code != exitStandby {
		t.Fatalf("--standby=false with the slot held: exit %d, want %d\n%s", code, exitStandby, p.log())
	}
}

// TestSIGSTOPActiveIsFencedOut stops the active instance until a standby
// takes over, then resumes it: it must not write (fencing) and must step
// down, and the journal stays exact.
func TestSIGSTOPActiveIsFencedOut(t *testing.T) {
	c := pgtest.Start(t, pgtest.Options{Settings: map[string]string{"wal_sender_timeout": "2s"}})
	url := c.NewDatabase(t)
	j := setupSource(t, url)
	a := startWalcast(t, runArgs(url)...)
	waitUntil(t, "a active", 30*time.Second, func() bool { return strings.HasPrefix(a.readyz(), "active") })
	w := startWriter(t, url)
	stopSampler := slotSampler(t, url, j)
	b := startWalcast(t, runArgs(url)...)
	waitUntil(t, "b standby", 30*time.Second, func() bool { return strings.HasPrefix(b.readyz(), "standby") })
	time.Sleep(300 * time.Millisecond)

	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	waitUntil(t, "b to take over", 30*time.Second, func() bool { return strings.HasPrefix(b.readyz(), "active") })
	t.Logf("standby took over %s after SIGSTOP (wal_sender_timeout 2s)", time.Since(stopped).Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a to step down", 30*time.Second, func() bool {
		r := a.readyz()
		return a.exited() || strings.HasPrefix(r, "standby") || strings.HasPrefix(r, "reconnecting")
	})
	time.Sleep(500 * time.Millisecond)
	if strings.HasPrefix(a.readyz(), "active") {
		t.Fatal("the resumed instance became active again while b holds the slot")
	}
	committed := w.finish()
	validateJournal(t, url, committed)
	if v := stopSampler(); len(v) > 0 {
		t.Fatalf("%d samples with the slot ahead of the journal; first: %s", len(v), v[0])
	}
}

// TestLostSlot makes the slot lost while walcast is stopped. Without
// --recreate-lost-slot run stops with the error and its fix; with it, a
// resync entry is journaled and streaming continues.
func TestLostSlot(t *testing.T) {
	c := pgtest.Start(t, pgtest.Options{Settings: map[string]string{
		"max_slot_wal_keep_size": "1MB", "min_wal_size": "32MB", "max_wal_size": "64MB"}})
	url := c.NewDatabase(t)
	setupSource(t, url)
	p := startWalcast(t, runArgs(url)...)
	waitUntil(t, "active", 30*time.Second, func() bool { return strings.HasPrefix(p.readyz(), "active") })
	execSQL(t, url, `INSERT INTO items VALUES (1, 'before')`)
	waitUntil(t, "journaled", 30*time.Second, func() bool { return len(journalItems(t, url)) == 1 })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.exitCode(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	for i := 0; i < 5; i++ {
		execSQL(t, url, fmt.Sprintf(`INSERT INTO items VALUES (%d, 'lost')`, 100+i), `SELECT pg_switch_wal()`)
	}
	execSQL(t, url, `CHECKPOINT`)

	p = startWalcast(t, runArgs(url)...)
	if code := p.exitCode(t, 30*time.Second); code != exitFailed {
		t.Fatalf("lost slot without --recreate-lost-slot: exit %d, want %d\n%s", code, exitFailed, p.log())
	}
	if l := p.log(); !strings.Contains(l, "--recreate-lost-slot") || !strings.Contains(l, "lost") {
		t.Fatalf("the error does not say what happened and what to do:\n%s", l)
	}

	p = startWalcast(t, runArgs(url, "--recreate-lost-slot")...)
	waitUntil(t, "active", 30*time.Second, func() bool { return strings.HasPrefix(p.readyz(), "active") })
	execSQL(t, url, `INSERT INTO items VALUES (2, 'after')`)
	// After the resync, the new change, and (--resnapshot-after-resync, on
	// by default) a snapshot of every published table: it brings back the
	// rows whose inserts were lost with the slot.
	waitUntil(t, "resync, the new change and the re-snapshot", 30*time.Second, func() bool {
		items := journalItems(t, url)
		if len(items) < 3 || items[1].ID != "resync" {
			return false
		}
		have := map[string]bool{}
		for _, it := range items[2:] {
			have[it.ID] = true
		}
		for _, id := range []string{"insert:public.items:2", "read:public.items:1", "read:public.items:100", "read:public.items:104"} {
			if !have[id] {
				return false
			}
		}
		return true
	})
}

// jetStream binds a stream WALCAST to every walcast subject on the server at
// url, deduplicating by Nats-Msg-Id over an hour.
func jetStream(t *testing.T, url string) nats.JetStreamContext {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: "WALCAST", Subjects: []string{"walcast.change.>", "walcast.message.>", "walcast.resync"}, Duplicates: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return js
}

// TestNATSOutageDoesNotHoldBackTheSlot stops NATS under write load: the
// journal and the slot keep advancing, and once NATS is back every change
// is published: a JetStream stream bound to the subjects ends with every
// entry exactly once.
func TestNATSOutageDoesNotHoldBackTheSlot(t *testing.T) {
	url := pgtest.NewDatabase(t)
	j := setupSource(t, url)
	ns := natstest.Start(t)
	js := jetStream(t, ns.URL())
	p := startWalcast(t, runArgs(url, "--nats-url", ns.URL())...)
	waitUntil(t, "active", 30*time.Second, func() bool { return strings.HasPrefix(p.readyz(), "active") })
	w := startWriter(t, url)
	time.Sleep(300 * time.Millisecond)

	ns.Shutdown()
	wmBefore, err := j.Watermark(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	slotBefore := confirmedFlush(t, url)
	time.Sleep(1500 * time.Millisecond)
	waitUntil(t, "the slot to advance while NATS is down", 30*time.Second, func() bool {
		wm, _ := j.Watermark(context.Background())
		return wm > wmBefore && confirmedFlush(t, url) > slotBefore
	})
	ns.Restart(t)
	committed := w.finish()
	validateJournal(t, url, committed)
	entries := len(journalItems(t, url))
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("the journal holds %d entries; the stream: %s", entries, last)
		}
	}()
	waitUntil(t, "every entry published after the outage", 60*time.Second, func() bool {
		info, err := js.StreamInfo("WALCAST")
		if err != nil {
			last = err.Error()
			return false
		}
		last = fmt.Sprintf("%d messages, seqs %d to %d", info.State.Msgs, info.State.FirstSeq, info.State.LastSeq)
		return info.State.Msgs == uint64(entries)
	})
}

func confirmedFlush(t *testing.T, url string) decoder.LSN {
	t.Helper()
	var s string
	pgtest.MustQueryRow(t, url, `SELECT coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = 'walcast'`, nil, &s)
	l, _ := decoder.ParseLSN(s)
	return l
}

// TestMetricsEndpoint scrapes /metrics of an active instance: the documented
// series are there, the role is active, and changes are counted.
// TestMetricsEndpoint runs `walcast run` with traces sent to an in-process
// OTLP/HTTP receiver, writes inserts, updates and deletes on two tables,
// and checks /metrics: the totals, the changes decoded, journaled and
// published by entity and op against what was written and what the journal
// holds, target_info, and one span per journal and publish batch.
func TestMetricsEndpoint(t *testing.T) {
	url := pgtest.NewDatabase(t)
	setupSource(t, url)
	execSQL(t, url, `CREATE TABLE things (id int PRIMARY KEY, val text)`, `ALTER PUBLICATION pub ADD TABLE things`)
	otlp := otlptest.NewReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.URL())
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50") // ms: export spans promptly
	p := startWalcast(t, runArgs(url)...)
	waitUntil(t, "active", 30*time.Second, func() bool { return strings.HasPrefix(p.readyz(), "active") })
	execSQL(t, url,
		`INSERT INTO items VALUES (1, 'a'), (2, 'b')`,
		`UPDATE items SET val = 'c' WHERE id = 1`,
		`DELETE FROM items WHERE id = 2`,
		`INSERT INTO things VALUES (1, 'x'), (2, 'y'), (3, 'z')`,
		`UPDATE things SET val = 'w' WHERE id < 3`,
		`DELETE FROM things WHERE id = 3`,
	)
	written := map[string]int{
		"public.items insert": 2, "public.items update": 1, "public.items delete": 1,
		"public.things insert": 3, "public.things update": 2, "public.things delete": 1,
	}
	var body string
	waitUntil(t, "changes counted", 30*time.Second, func() bool {
		p.mu.Lock()
		addr := p.http
		p.mu.Unlock()
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return strings.Contains(body, "walcast_journal_changes_total 10") && strings.Contains(body, "walcast_nats_published_total 10")
	})
	for _, want := range []string{
		`walcast_replication_role{role="active"} 1`,
		`walcast_replication_role{role="standby"} 0`,
		"walcast_replication_lag_bytes ",
		"walcast_replication_generation 1",
		"walcast_replication_reconnects_total 0",
		"walcast_journal_transactions_total ",
		"walcast_journal_batches_total ",
		"walcast_journal_append_duration_seconds_bucket",
		"walcast_journal_batch_size_bucket",
		"walcast_replication_decode_delay_seconds_bucket",
		"walcast_journal_queue_wait_seconds_bucket",
		"walcast_replication_lag_time_seconds ",
		"walcast_nats_published_total ",
		"walcast_nats_oversize_total 0",
		"walcast_nats_publish_lag 0",
		`service_name="walcast"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// What the journal holds, by entity and op, is what was written; and
	// each stage counted exactly that, with no other series.
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	inJournal := map[string]int{}
	rows, err := conn.Query(context.Background(), `SELECT entity, op, count(*) FROM walcast.entries GROUP BY entity, op`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var entity, op string
		var n int
		if err := rows.Scan(&entity, &op, &n); err != nil {
			t.Fatal(err)
		}
		inJournal[entity+" "+op] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(inJournal, written) {
		t.Errorf("journal holds %v, want %v", inJournal, written)
	}
	for _, name := range []string{"walcast_decoded_changes_total", "walcast_journaled_changes_total", "walcast_published_changes_total"} {
		if got := byEntityOp(body, name); !maps.Equal(got, written) {
			t.Errorf("%s: %v, want %v", name, got, written)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}

	// One span per journal batch and per publish batch, never per change:
	// together they carry each change once.
	sum := func(spans []otlptest.Span, name string) (n int64) {
		for _, s := range spans {
			if s.Name == name {
				e, _ := s.Attrs["walcast.entries"].(int64)
				n += e
			}
		}
		return n
	}
	var spans []otlptest.Span
	waitUntil(t, "batch spans exported", 30*time.Second, func() bool {
		spans = otlp.Spans()
		return sum(spans, "walcast.journal.append") >= 10 && sum(spans, "walcast.nats.publish") >= 10
	})
	otlp.Check(t)
	if j, pub := sum(spans, "walcast.journal.append"), sum(spans, "walcast.nats.publish"); j != 10 || pub != 10 {
		t.Errorf("spans carry %d journaled and %d published entries, want 10 and 10", j, pub)
	}
	for _, s := range spans {
		var keys []string
		switch s.Name {
		case "walcast.journal.append":
			keys = []string{"walcast.transactions", "walcast.entries", "walcast.watermark", "walcast.generation"}
		case "walcast.nats.publish":
			keys = []string{"walcast.entries", "walcast.seq.first", "walcast.seq.last"}
			first, _ := s.Attrs["walcast.seq.first"].(int64)
			last, _ := s.Attrs["walcast.seq.last"].(int64)
			if n, _ := s.Attrs["walcast.entries"].(int64); first < 1 || last-first+1 != n {
				t.Errorf("publish span: seqs %d..%d for %d entries", first, last, n)
			}
		default:
			t.Errorf("unexpected span %q", s.Name)
		}
		for _, k := range keys {
			if _, ok := s.Attrs[k]; !ok {
				t.Errorf("span %s lacks %s: %v", s.Name, k, s.Attrs)
			}
		}
		if s.Service != "walcast" {
			t.Errorf("span %s from service %q, want walcast", s.Name, s.Service)
		}
	}
}

// byEntityOp reads the series of a counter by entity and op from a scrape,
// as "entity op" → value.
func byEntityOp(body, name string) map[string]int {
	re := regexp.MustCompile(`(?m)^` + name + `\{entity="([^"]*)",op="([^"]*)"\} (\d+)$`)
	out := map[string]int{}
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		n, _ := strconv.Atoi(m[3])
		out[m[1]+" "+m[2]] = n
	}
	return out
}

func TestRunStartupErrors(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url, `CREATE TABLE items (id int PRIMARY KEY, val text)`)
	// A tenanted table whose tenant column the column list leaves out.
	unscoped := pgtest.NewDatabase(t)
	execSQL(t, unscoped, `CREATE TABLE docs (id int PRIMARY KEY, org text, body text)`, `CREATE PUBLICATION pub FOR TABLE docs (id, body)`)
	c := pgtest.Shared(t)
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"missing publication", runArgs(url), []string{"publication \"pub\" does not exist", "CREATE PUBLICATION"}},
		{"bad password", runArgs(c.UserURL("postgres", "nobody_here", "wrong")), []string{"auth", "password"}},
		{"unreachable", runArgs("postgres://postgres@127.0.0.1:1/postgres?sslmode=disable"), []string{"check that PostgreSQL is running"}},
		{"bad slot name", runArgs(url, "--slot", "Bad-Slot", "--skip-preflight"), []string{"slot name", "lower-case"}},
		{"missing flag", []string{"run", "--publication", "pub"}, []string{"--database-url is required"}},
		{"tenant column not published", runArgs(unscoped, "--tenant-column", "org"),
			[]string{"refusing to start", `leaves out tenant column "org"`, `ALTER PUBLICATION pub DROP TABLE public.docs; ALTER PUBLICATION pub ADD TABLE public.docs (id, body, org);`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := startWalcast(t, tc.args...)
			if code := p.exitCode(t, 30*time.Second); code != exitUsage {
				t.Fatalf("exit %d, want %d\n%s", code, exitUsage, p.log())
			}
			for _, w := range tc.want {
				if !strings.Contains(p.log(), w) {
					t.Fatalf("output lacks %q:\n%s", w, p.log())
				}
			}
			if strings.Contains(p.log(), "wrong") {
				t.Fatalf("a password was printed:\n%s", p.log())
			}
		})
	}
}

// TestLagReturnsToZeroWhenIdle: after a burst of writes, walcast_replication_lag_bytes
// (server WAL end minus the journal watermark) comes back to about zero once the
// source is idle, since idle keepalive positions are journaled and confirmed.
func TestLagReturnsToZeroWhenIdle(t *testing.T) {
	c := pgtest.Start(t, pgtest.Options{Settings: map[string]string{"wal_sender_timeout": "2s"}})
	url := c.NewDatabase(t)
	setupSource(t, url)
	p := startWalcast(t, runArgs(url)...)
	waitUntil(t, "active", 30*time.Second, func() bool { return strings.HasPrefix(p.readyz(), "active") })
	execSQL(t, url, `INSERT INTO items SELECT g, repeat('x', 500) FROM generate_series(1, 5000) g`,
		`CREATE TABLE scratch AS SELECT g, repeat('y', 500) AS pad FROM generate_series(1, 20000) g`) // unpublished WAL too
	lag := func() (int64, bool) {
		p.mu.Lock()
		addr := p.http
		p.mu.Unlock()
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return 0, false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "walcast_replication_lag_bytes "); ok {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n, err == nil
			}
		}
		return 0, false
	}
	var endStr string
	pgtest.MustQueryRow(t, url, `SELECT pg_current_wal_lsn()::text`, nil, &endStr)
	end, err := decoder.ParseLSN(endStr)
	if err != nil {
		t.Fatal(err)
	}
	j, err := journal.Open(context.Background(), journal.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	// The watermark passes the end of the burst, unpublished WAL included,
	// and the metric agrees that nothing is left.
	waitUntil(t, "lag back to about zero", 30*time.Second, func() bool {
		wm, err := j.Watermark(context.Background())
		n, ok := lag()
		return err == nil && wm >= end && ok && n < 64<<10
	})
}
