package sync

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/replication"
)

// snapshotBackends are the pids of the node's snapshot sessions on the
// source database.
func snapshotBackends(t *testing.T, env *stateEnv) []uint32 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.src)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()
		AND application_name = 'walcast sync (snapshots)' ORDER BY pid`)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// heapInuse is the process's live Go heap, after a collection.
func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestStateSlowReaderMemory: a client reads a 1M-row snapshot a few pages
// at a time and then not at all. The node sends rows only as fast as the
// socket drains, and the rows it read from the source wait in a spool
// file, so its heap stays within a few MiB of where it was (queueing the
// snapshot would take hundreds of MiB). While it holds its snapshot,
// another client (another tenant: its own read) is served, not queued
// behind it; once it disconnects mid-snapshot its spool is freed.
func TestStateSlowReaderMemory(t *testing.T) {
	const total = spoolTestRows // fewer under -race, where reading 1M rows passes the read timeout
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) { c.State.MaxConcurrent = 1 },
		fmt.Sprintf(`INSERT INTO docs SELECT g, 'a', md5(g::text) FROM generate_series(1, %d) g`, total),
		`ANALYZE docs`)
	base := heapInuse()

	slow := env.mustDial(stateToken(t, "a", true))
	slow.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	read := 0
	for read < 3*DefaultSnapshotPageRows { // a few pages
		f := slow.read()
		if f.T == "row" {
			read++
		} else if f.T != "snapshot-begin" {
			t.Fatalf("frame %+v during the snapshot", f)
		}
	}
	// Wait until the node has stopped reading ahead: the rows it has queued
	// stay the same for a while.
	var sent int64
	deadline := time.Now().Add(30 * time.Second)
	for still := 0; still < 20; {
		time.Sleep(50 * time.Millisecond)
		if now := env.node.Stats().SnapshotRows; now == sent {
			still++
		} else {
			sent, still = now, 0
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node never stopped reading ahead of a client that does not read (%d rows sent)", sent)
		}
	}
	inuse := heapInuse()
	growth := int64(inuse) - int64(base)
	t.Logf("client read %d rows, node sent %d of %d; heap in use %d MiB → %d MiB", read, sent, total, base>>20, inuse>>20)
	const bound = 32 << 20
	if growth > bound {
		t.Errorf("heap grew by %d MiB while a client held a snapshot of %d rows after reading %d; want at most %d MiB (the snapshot must be paced by its reader)",
			growth>>20, total, read, bound>>20)
	}
	if sent > total/2 {
		t.Errorf("the node read %d rows ahead of a client that read %d", sent, read)
	}

	// The read into the spool goes on at the database's pace, bounded by
	// the read timeout (30 s), whatever the client does.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		s := env.node.Stats()
		if s.SnapshotsRunning == 0 && s.SpoolBytes > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rows were not read into the spool within 2 minutes (%+v)", s)
		}
	}
	other := dialState(env, stateToken(t, "b", true))
	other.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	c := newStateClient("b")
	follow(t, env, other, c)
	if len(c.errs) > 0 {
		t.Errorf("the other client: %s", strings.Join(c.errs, "; "))
	}
	slow.c.Close()
	waitFor(t, "the slow client's spool to be freed", func() bool { return env.node.Stats().SpoolBytes == 0 })
	s := env.node.Stats()
	if s.Snapshots["cancelled"] != 1 || s.Snapshots["done"] != 1 || s.SnapshotsQueued != 0 || s.SnapshotReads != 2 {
		t.Errorf("snapshots %v, queued %d, source reads %d; want one cancelled (the client that left), one done, two reads", s.Snapshots, s.SnapshotsQueued, s.SnapshotReads)
	}
}

// TestStateQueuedBeyondMaxConcurrent: more source reads than
// --max-concurrent-snapshots (2) and more than one snapshot per socket (a
// socket subscribing to two topics) wait their turn: while the first two
// reads wait for a lock on the tables (held for less than the reads' lock
// retries last), the rest are queued, never refused, and at most two ever
// read at once; snapshots of the same scope share a read (four scopes,
// four reads); then every one is served and each client's state equals
// the table.
func TestStateQueuedBeyondMaxConcurrent(t *testing.T) {
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) { c.State.MaxConcurrent = 2 })
	pgtest.MustExec(t, env.src, `INSERT INTO docs SELECT g, (ARRAY['a','b',NULL])[g % 3 + 1], 'v' FROM generate_series(1, 2000) g`)
	unlock := lockTables(t, env, "docs, beat")
	var peak atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			if r := env.node.Stats().SnapshotsRunning; r > peak.Load() {
				peak.Store(r)
			}
		}
	}()
	tenants := []string{"a", "b", ""}
	type sub struct {
		sc *stateConn
		c  *stateClient
	}
	var subs []sub
	for i := range 7 {
		sc := dialState(env, stateToken(t, tenants[i%3], true))
		sc.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
		subs = append(subs, sub{sc, newStateClient(tenants[i%3])})
	}
	// One socket, two topics: its second snapshot waits for its first.
	two := dialState(env, stateTokenTopics(t, "a", "public.docs", "public.beat"))
	two.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	two.ws.send(map[string]any{"t": "sub", "topic": "public.beat", "snapshot": true})
	waitFor(t, "two reads running and the rest queued", func() bool {
		s := env.node.Stats()
		return s.SnapshotsRunning == 2 && s.SnapshotsQueued >= 2
	})
	unlock()
	for _, s := range subs {
		follow(t, env, s.sc, s.c)
		if len(s.c.errs) > 0 {
			t.Errorf("client of tenant %q: %s", s.c.tenant, strings.Join(s.c.errs, "; "))
		}
	}
	ends := map[string]bool{}
	for len(ends) < 2 {
		select {
		case b := <-two.frames:
			f, err := newStateClient("a").apply(b)
			if err != nil {
				t.Fatal(err)
			}
			var top struct {
				Topic string `json:"topic"`
			}
			_ = json.Unmarshal(b, &top)
			switch f.T {
			case "snapshot-end":
				ends[top.Topic] = true
			case "error":
				t.Fatalf("the two-topic socket got %s", b)
			}
		case err := <-two.err:
			t.Fatal(err)
		case <-time.After(30 * time.Second):
			t.Fatalf("the two-topic socket: snapshot-ends for %v only", ends)
		}
	}
	close(stop)
	wg.Wait()
	if p := peak.Load(); p > 2 {
		t.Errorf("%d snapshots read at once, --max-concurrent-snapshots is 2", p)
	}
	waitFor(t, "every snapshot done", func() bool {
		s := env.node.Stats()
		return s.Snapshots["done"] == 9 && s.SnapshotsQueued == 0 && s.SnapshotsRunning == 0
	})
	if s := env.node.Stats(); len(s.Snapshots) != 1 || s.SnapshotReads != 4 {
		t.Errorf("snapshots by outcome %v, source reads %d; want 9 done and nothing else, 4 reads (docs for tenants a, b and none, beat for a)", s.Snapshots, s.SnapshotReads)
	}
}
