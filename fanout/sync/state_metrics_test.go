package sync

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/internal/telemetry"
	"github.com/walcast/walcast/replication"
)

// TestStateMetrics: /metrics counts snapshots by outcome (refused: no
// claim; failed: the source session killed; cancelled: the client left;
// done), the rows sent, the snapshots running and queued
// (--max-concurrent-snapshots 1), and their durations.
func TestStateMetrics(t *testing.T) {
	m, err := telemetry.NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) {
		c.State.MaxConcurrent = 1
		c.Meter = m.Meter("walcast/sync")
	})
	pgtest.MustExec(t, env.src, `INSERT INTO docs SELECT g, 'a', 'v' FROM generate_series(1, 700) g`)
	scrape := func() string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		b, _ := io.ReadAll(rec.Body)
		return string(b)
	}
	want := func(body string, lines ...string) {
		t.Helper()
		for _, l := range lines {
			if !strings.Contains(body, l+"\n") {
				t.Errorf("metrics lack %q", l)
			}
		}
		if t.Failed() {
			var ours []string
			for _, l := range strings.Split(body, "\n") {
				if strings.Contains(l, "snapshot") {
					ours = append(ours, l)
				}
			}
			t.Fatalf("snapshot metrics:\n%s", strings.Join(ours, "\n"))
		}
	}
	want(scrape(), `walcast_sync_snapshots_total{outcome="done"} 0`, `walcast_sync_snapshots_total{outcome="failed"} 0`,
		"walcast_sync_snapshots_running 0", "walcast_sync_snapshots_queued 0", "walcast_sync_snapshot_rows_total 0")

	// Refused: a token without the snapshot claim.
	a := env.mustDial(stateToken(t, "a", false))
	a.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	a.expect("error")

	// A lock on the table holds snapshots at their first read.
	unlock := lockTables(t, env, "docs")
	b := env.mustDial(stateToken(t, "a", true))
	b.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	waitFor(t, "one snapshot reading", func() bool { return len(snapshotBackends(t, env)) == 1 })
	bPID := snapshotBackends(t, env)[0]
	// Another tenant's snapshot needs a read of its own: it waits for
	// the node's only read slot.
	c := dialState(env, stateToken(t, "b", true))
	c.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	waitFor(t, "one snapshot queued", func() bool { return env.node.Stats().SnapshotsQueued == 1 })
	want(scrape(), "walcast_sync_snapshots_running 1", "walcast_sync_snapshots_queued 1", `walcast_sync_snapshots_total{outcome="refused"} 1`)

	// Failed: B's source session is killed.
	pgtest.MustExec(t, env.src, fmt.Sprintf(`SELECT pg_terminate_backend(%d)`, bPID))
	for {
		f := b.read()
		if f.T == "error" {
			if f.Code != "snapshot-failed" {
				t.Fatalf("error frame %+v, want snapshot-failed", f)
			}
			break
		}
	}
	// Cancelled: C, now reading (held by the lock), leaves.
	waitFor(t, "the queued snapshot reading", func() bool {
		s := env.node.Stats()
		return s.SnapshotsQueued == 0 && s.SnapshotsRunning == 1 && len(snapshotBackends(t, env)) == 1
	})
	c.ws.c.Close()
	waitFor(t, "no snapshot running", func() bool {
		return env.node.Stats().SnapshotsRunning == 0 && len(snapshotBackends(t, env)) == 0
	})
	unlock()
	// Done.
	d := dialState(env, stateToken(t, "a", true))
	d.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	dc := newStateClient("a")
	follow(t, env, d, dc)
	waitFor(t, "the snapshot counted", func() bool { return env.node.Stats().Snapshots["done"] == 1 })
	want(scrape(), `walcast_sync_snapshots_total{outcome="done"} 1`, `walcast_sync_snapshots_total{outcome="failed"} 1`,
		`walcast_sync_snapshots_total{outcome="cancelled"} 1`, `walcast_sync_snapshots_total{outcome="refused"} 1`,
		"walcast_sync_snapshots_running 0", "walcast_sync_snapshots_queued 0",
		fmt.Sprintf("walcast_sync_snapshot_rows_total %d", len(dc.rows)),
		"walcast_sync_snapshot_duration_seconds_count 3")
}
