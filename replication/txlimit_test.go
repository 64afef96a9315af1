package replication

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
)

// lockedBuffer collects log output written from the replicator's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// openFilesIn counts this process's open files in dir: spill files are
// unlinked at creation, so only a descriptor shows one still holds space.
func openFilesIn(t *testing.T, dir string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(target, dir+string(filepath.Separator)) {
			n++
		}
	}
	return n
}

// TestTransactionBoundQuarantines: a transaction past MaxTransactionBytes
// (1 MiB here, under a memory budget small enough to spill it first) is
// journaled as one quarantine entry per table it touched — its xid, LSNs,
// size, change count and tables, and that they must be refetched — the
// changes after it arrive, its spill file is gone, the slot confirms its
// commit, and a restart does not journal it again. Arriving whole and
// streamed by Postgres (logical_decoding_work_mem 64kB) alike; a streamed
// one rolled back after passing the bound leaves nothing.
func TestTransactionBoundQuarantines(t *testing.T) {
	for _, streamed := range []bool{false, true} {
		name := "whole"
		if streamed {
			name = "streamed"
		}
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			if streamed {
				execSQL(t, f.url, `ALTER SYSTEM SET logical_decoding_work_mem = '64kB'`, `SELECT pg_reload_conf()`)
				t.Cleanup(func() { execSQL(t, f.url, `ALTER SYSTEM RESET logical_decoding_work_mem`, `SELECT pg_reload_conf()`) })
			}
			var logs lockedBuffer
			cfg := f.config()
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			cfg.MemoryBudget = 256 << 10 // the decoder spills past about 43 KB
			cfg.MaxTransactionBytes = 1 << 20
			cfg.SpillDir = t.TempDir()
			run := f.start(cfg)
			waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })

			w := newWorkload(t, f.url)
			w.exec(t, nil, "INSERT INTO items VALUES (1, 'before', 1)")
			if streamed {
				// Rolled back after passing the bound: nothing of it may
				// appear, and its spill file must be gone.
				w.rollback(t, "INSERT INTO items SELECT g, repeat('r', 500), g FROM generate_series(100000, 103999) g")
			}
			ctx := context.Background()
			tx, err := w.conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var xid int64
			if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint % 4294967296`).Scan(&xid); err != nil {
				t.Fatal(err)
			}
			for _, s := range []string{
				"INSERT INTO items SELECT g, repeat('x', 500), g FROM generate_series(10, 4009) g", // about 2.3 MB of envelopes
				"INSERT INTO other VALUES (1, 'o')",
			} {
				if _, err := tx.Exec(ctx, s); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			commitEnd := queryLSN(t, f.url, `SELECT pg_current_wal_lsn()::text`)
			w.exec(t, nil, "INSERT INTO items VALUES (2, 'after', 2)")
			waitFor(t, "the change after the big transaction", 60*time.Second, func() bool { return len(f.entries()) >= 4 })

			es := f.entries()
			if len(es) != 4 || es[0].Op != decoder.OpInsert || es[3].Op != decoder.OpInsert || changeID(es[3]) != `insert:public.items:2:"after"` {
				for _, e := range es {
					t.Logf("%.300s", e.Envelope)
				}
				t.Fatalf("%d entries, want: insert, quarantine of items, quarantine of other, insert", len(es))
			}
			for i, entity := range []string{"public.items", "public.other"} {
				e := es[1+i]
				env := envelopeOf(t, e)
				q := env.Quarantine
				if e.Op != decoder.OpQuarantine || e.Entity != entity || q == nil {
					t.Fatalf("entry %d: %s", e.Seq, e.Envelope)
				}
				if env.Xid != uint32(xid) || e.CommitLSN > commitEnd || e.CommitLSN != es[1].CommitLSN || q.FirstLSN != es[1].LSN ||
					q.Op != decoder.QuarantinedTransaction || q.Reason != decoder.ReasonTransactionTooLarge || q.Changes != 4001 ||
					q.Size < 2<<20 || !reflect.DeepEqual(q.Tables, []string{"public.items", "public.other"}) || !strings.Contains(q.Detail, "refetch") {
					t.Fatalf("entry %d (xid %d): %s", e.Seq, xid, e.Envelope)
				}
			}
			if es[1].LSN >= es[2].LSN {
				t.Fatalf("entries at %s and %s: each stands at its table's first change", es[1].LSN, es[2].LSN)
			}
			if n := run.r.Quarantined(decoder.ReasonTransactionTooLarge); n != 2 {
				t.Fatalf("walcast.quarantined{reason=transaction-too-large} = %d, want 2", n)
			}
			if l := logs.String(); !strings.Contains(l, "--max-transaction-bytes") || !strings.Contains(l, "xid="+strconv.FormatInt(xid, 10)) {
				t.Fatalf("no log line with the xid and the fix:\n%s", l)
			}
			if ents, _ := os.ReadDir(cfg.SpillDir); len(ents) != 0 || openFilesIn(t, cfg.SpillDir) != 0 {
				t.Fatalf("spill directory holds %v, %d open files", ents, openFilesIn(t, cfg.SpillDir))
			}
			waitFor(t, "slot confirmation past the big transaction", 10*time.Second, func() bool {
				wm, _ := f.j.Watermark(context.Background())
				return wm >= es[3].CommitLSN && slotConfirmed(t, f.url) == wm
			})
			if streamed {
				var n int64
				pgtest.MustQueryRow(t, f.url, `SELECT coalesce(sum(stream_txns), 0) FROM pg_stat_replication_slots WHERE slot_name = 'walcast'`, nil, &n)
				if n == 0 {
					t.Fatal("no transaction was streamed")
				}
			}

			// A restart: Postgres may send the big transaction again; it is
			// not journaled twice.
			if err := run.stop(t); err != nil {
				t.Fatal(err)
			}
			run = f.start(cfg)
			waitFor(t, "active role after the restart", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
			w.exec(t, nil, "INSERT INTO items VALUES (3, 'restarted', 3)")
			waitFor(t, "the change after the restart", 30*time.Second, func() bool { return len(f.entries()) >= 5 })
			if es := f.entries(); len(es) != 5 || changeID(es[4]) != `insert:public.items:3:"restarted"` {
				t.Fatalf("%d entries after the restart, want 5; last %.200s", len(es), es[len(es)-1].Envelope)
			}
		})
	}
}
