package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
	"github.com/walcast/walcast/replication"
)

// shippedWalcast builds cmd/walcast as `make build` does — in particular
// without the race detector, whose shadow memory `go test -race` would add
// to what a memory test measures — into a directory of t's, and returns
// its path.
func shippedWalcast(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "walcast")
	cmd := exec.Command(goTool, "build", "-trimpath", "-o", bin, "github.com/walcast/walcast/cmd/walcast")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build walcast to measure it: %v\n%s", err, out)
	}
	return bin
}

// TestSnapshotMemoryBounded runs the real `walcast run`, built as shipped,
// with the default
// --memory-budget while it snapshots three tables of 30,000 rows (two of
// rows of about 200 bytes, one of about 2 KB) in chunks of 100 rows, and
// four writers insert, update and delete rows of the same tables: its peak
// resident memory (VmHWM), embedded NATS server and publisher included, must
// stay under docs/operating.md's bound, the budget plus replication.MemoryOverhead.
func TestSnapshotMemoryBounded(t *testing.T) {
	const (
		rows      = 30_000
		budget    = 64 << 20 // --memory-budget's default
		chunkSize = 100
	)
	url := pgtest.NewDatabase(t)
	execSQL(t, url,
		`CREATE TABLE narrow_a (id int PRIMARY KEY, val text)`,
		`CREATE TABLE narrow_b (id int PRIMARY KEY, val text)`,
		`CREATE TABLE wide (id int PRIMARY KEY, val text)`,
		fmt.Sprintf(`INSERT INTO narrow_a SELECT g, repeat(md5(g::text), 6) FROM generate_series(1, %d) g`, rows),
		fmt.Sprintf(`INSERT INTO narrow_b SELECT g, repeat(md5(g::text), 6) FROM generate_series(1, %d) g`, rows),
		fmt.Sprintf(`INSERT INTO wide SELECT g, repeat(md5(g::text), 64) FROM generate_series(1, %d) g`, rows),
		`CREATE PUBLICATION pub FOR TABLE narrow_a, narrow_b, wide`,
	)
	p := startProcess(t, shippedWalcast(t), runArgs(url, "--skip-preflight", "--log-level", "info")...)
	waitUntil(t, "walcast active", 60*time.Second, func() bool {
		if p.exited() {
			t.Fatalf("walcast exited:\n%s", p.log())
		}
		return strings.HasPrefix(p.readyz(), "active")
	})
	idle := statusKiB(t, p.cmd.Process.Pid, "VmRSS") << 10
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	j, err := journal.Open(ctx, journal.Config{URL: url, CursorSecret: cursorSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()

	// Four writers change the tables while they are read.
	tables := []struct {
		name   string
		repeat int
	}{{"narrow_a", 6}, {"narrow_b", 6}, {"wide", 64}}
	var wg sync.WaitGroup
	var writes atomic.Int64
	werr := make(chan error, 4)
	for w := range 4 {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close(context.Background())
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for ctx.Err() == nil {
				tb := tables[rng.IntN(len(tables))]
				id := 1 + rng.IntN(rows+rows/10)
				var sql string
				switch rng.IntN(3) {
				case 0:
					sql = fmt.Sprintf(`INSERT INTO %s VALUES ($1, repeat(md5(random()::text), %d)) ON CONFLICT (id) DO NOTHING`, tb.name, tb.repeat)
				case 1:
					sql = fmt.Sprintf(`UPDATE %s SET val = repeat(md5(random()::text), %d) WHERE id = $1`, tb.name, tb.repeat)
				default:
					sql = fmt.Sprintf(`DELETE FROM %s WHERE id = $1`, tb.name)
				}
				if _, err := conn.Exec(ctx, sql, id); err != nil {
					if ctx.Err() == nil {
						werr <- err
					}
					return
				}
				writes.Add(1)
				time.Sleep(2 * time.Millisecond) // about 1,000 writes a second in all: the snapshots end within seconds on two cores
			}
		}()
	}
	defer func() {
		cancel()
		wg.Wait()
	}()

	ids := map[int64]string{}
	for _, tb := range tables {
		id, err := j.RequestSnapshot(ctx, journal.SnapshotRequest{Schema: "public", Table: tb.name, ChunkSize: chunkSize})
		if err != nil {
			t.Fatal(err)
		}
		ids[id] = tb.name
	}
	start := time.Now()
	waitUntil(t, "every snapshot done", 5*time.Minute, func() bool {
		if p.exited() {
			t.Fatalf("walcast exited:\n%s", p.log())
		}
		select {
		case err := <-werr:
			t.Fatalf("writer: %v", err)
		default:
		}
		for id, name := range ids {
			s, err := j.SnapshotByID(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			switch s.Status {
			case journal.SnapshotDone:
				if s.Rows < rows/2 {
					t.Fatalf("snapshot of %s done with %d rows journaled", name, s.Rows)
				}
			case journal.SnapshotFailed, journal.SnapshotCancelled:
				t.Fatalf("snapshot of %s: %s %s", name, s.Status, s.Error)
			default:
				return false
			}
		}
		return true
	})
	took := time.Since(start)
	peak := statusKiB(t, p.cmd.Process.Pid, "VmHWM") << 10
	anon, file := statusKiB(t, p.cmd.Process.Pid, "RssAnon")<<10, statusKiB(t, p.cmd.Process.Pid, "RssFile")<<10
	// The embedded NATS server and the publisher run in the same Go
	// runtime, under the soft memory limit walcast run sets to the budget
	// (setGoMemoryLimit): docs/operating.md's bound for the whole process is the
	// budget plus MemoryOverhead, with nothing on top.
	bound := int64(budget + replication.MemoryOverhead)
	t.Logf("3 snapshots of %d rows in chunks of %d under %d writes: %s; VmRSS %d MiB before; VmHWM %d MiB (bound %d MiB); at the end %d MiB anonymous, %d MiB file-backed (the binary)",
		rows, chunkSize, writes.Load(), took.Round(time.Millisecond), idle>>20, peak>>20, bound>>20, anon>>20, file>>20)
	if peak > bound {
		t.Errorf("peak resident memory %d MiB exceeds %d MiB", peak>>20, bound>>20)
	}
}
