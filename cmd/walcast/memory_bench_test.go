package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

// BenchmarkE2EHugeTransaction measures the peak resident memory (VmHWM) of
// the real `walcast run` process (embedded NATS and the publisher
// included) while it journals and publishes one transaction of
// WALCAST_BENCH_ROWS rows (default 10,000,000) with the default
// --memory-budget (64 MiB; WALCAST_BENCH_BUDGET_MIB overrides). Run alone:
//
//	go test ./cmd/walcast -run '^$' -bench E2EHugeTransaction -benchtime 1x -timeout 30m
func BenchmarkE2EHugeTransaction(b *testing.B) {
	rows := 10_000_000
	if v, err := strconv.Atoi(os.Getenv("WALCAST_BENCH_ROWS")); err == nil && v > 0 {
		rows = v
	}
	budget := 64
	if v, err := strconv.Atoi(os.Getenv("WALCAST_BENCH_BUDGET_MIB")); err == nil && v > 0 {
		budget = v
	}
	for range b.N {
		url := pgtest.NewDatabase(b)
		execSQL(b, url, `CREATE TABLE items (id int PRIMARY KEY, val text)`, `CREATE PUBLICATION pub FOR TABLE items`)
		p := startWalcast(b, runArgs(url, "--skip-preflight", "--log-level", "info", "--memory-budget", strconv.Itoa(budget<<20))...)
		deadline := time.Now().Add(60 * time.Second)
		for !strings.HasPrefix(p.readyz(), "active") {
			if time.Now().After(deadline) {
				b.Fatalf("walcast did not become active:\n%s", p.log())
			}
			time.Sleep(50 * time.Millisecond)
		}
		j, err := journal.Open(context.Background(), journal.Config{URL: url, CursorSecret: cursorSecret})
		if err != nil {
			b.Fatal(err)
		}
		idle := statusKiB(b, p.cmd.Process.Pid, "VmRSS")
		start := time.Now()
		execSQL(b, url, fmt.Sprintf(`INSERT INTO items SELECT g, 'row ' || g FROM generate_series(1, %d) g`, rows))
		committed := time.Since(start)
		var journaled, published time.Duration
		for {
			st, err := j.ReadAfter(context.Background(), 1<<62, 1)
			if err != nil {
				b.Fatal(err)
			}
			pub, err := j.Published(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			if journaled == 0 && st.Horizon >= int64(rows) {
				journaled = time.Since(start)
			}
			if pub >= int64(rows) {
				published = time.Since(start)
				break
			}
			if p.exited() {
				b.Fatalf("walcast exited:\n%s", p.log())
			}
			time.Sleep(200 * time.Millisecond)
		}
		peak := statusKiB(b, p.cmd.Process.Pid, "VmHWM")
		j.Close()
		b.ReportMetric(float64(peak)/1024, "peak-RSS-MiB")
		b.ReportMetric(float64(budget), "budget-MiB")
		b.ReportMetric(float64(rows)/(journaled-committed).Seconds(), "journaled-rows/s-after-commit")
		b.Logf("%d rows in one transaction, --memory-budget %d MiB: RSS %d MiB before, peak %d MiB (budget + %d MiB); committed in %s, journaled after %s, published after %s",
			rows, budget, idle/1024, peak/1024, peak/1024-int64(budget), committed.Round(time.Millisecond), journaled.Round(time.Millisecond), published.Round(time.Millisecond))
	}
}

// statusKiB reads a kB field (VmHWM, VmRSS) of /proc/<pid>/status.
func statusKiB(b testing.TB, pid int, field string) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
