package replication

import (
	"context"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/fanout/publish"
	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

// BenchmarkE2ESnapshot measures a snapshot of a table of rows of about 200
// bytes, journaled and published to an embedded NATS server, next to
// `COPY (SELECT * FROM t) TO STDOUT` of the same table in the same run, on a
// durable server, while a writer commits single-row transactions to another
// published table; it reports the live stream's commit→journal lag (the
// replicator's per-batch lag, sampled every 10 ms) during the snapshot.
// Run it alone:
//
//	go test ./replication -run '^$' -bench E2ESnapshot -benchtime 1x
//
// WALCAST_BENCH_ROWS sets the table's rows (default 1,000,000),
// WALCAST_BENCH_CHUNK the chunk size (default the journal's, 4096), and
// WALCAST_BENCH_LIVE=0 leaves the live writer out.
func BenchmarkE2ESnapshot(b *testing.B) {
	rows := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("WALCAST_BENCH_ROWS")); err == nil && v > 0 {
		rows = v
	}
	c := pgtest.Start(b, pgtest.Options{Settings: map[string]string{
		"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on",
		"shared_buffers": "256MB", "max_wal_size": "4GB", "checkpoint_timeout": "30min",
	}})
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ctx := context.Background()
		url := c.NewDatabase(b)
		execSQL(b, url,
			`CREATE TABLE snapbench (id bigint PRIMARY KEY, account text, amount numeric(12,2), status text, note text, created_at timestamptz)`,
			`INSERT INTO snapbench SELECT g, 'acct-' || (g % 1000), (g % 10000) / 100.0, 'paid', repeat('n', 120), now() FROM generate_series(1, `+strconv.Itoa(rows)+`) g`,
			`CREATE TABLE live (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())`,
			`CREATE PUBLICATION pub FOR TABLE snapbench, live`,
			`VACUUM ANALYZE snapbench`)

		// COPY of the same table, to nowhere.
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if _, err := conn.PgConn().CopyTo(ctx, io.Discard, "COPY (SELECT * FROM snapbench) TO STDOUT"); err != nil {
			b.Fatal(err)
		}
		copyTook := time.Since(start)
		conn.Close(ctx)

		j, err := journal.Open(ctx, journal.Config{URL: url})
		if err != nil {
			b.Fatal(err)
		}
		r, err := New(Config{DatabaseURL: url, Publication: "pub", Standby: true, StatusInterval: time.Second}, j)
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		ns := natstest.Start(b)
		nc, err := bus.ConnectNATS(bus.NATSConfig{URL: ns.URL()})
		if err != nil {
			b.Fatal(err)
		}
		pub := publish.New(publish.Config{}, j, nc)
		pubDone := make(chan struct{})
		go func() { pub.Run(rctx); close(pubDone) }()
		for r.State().Role != RoleActive {
			time.Sleep(10 * time.Millisecond)
		}

		// The live writer: a single-row transaction every 5 ms.
		var wg sync.WaitGroup
		wctx, stopWriter := context.WithCancel(ctx)
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := pgx.Connect(ctx, url)
			if err != nil {
				b.Error(err)
				return
			}
			defer w.Close(ctx)
			for wctx.Err() == nil && os.Getenv("WALCAST_BENCH_LIVE") != "0" {
				if _, err := w.Exec(ctx, "INSERT INTO live DEFAULT VALUES"); err != nil {
					b.Error(err)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		var lags []time.Duration
		wg.Add(1)
		go func() {
			defer wg.Done()
			for wctx.Err() == nil {
				lags = append(lags, time.Duration(r.delay.Load()))
				time.Sleep(10 * time.Millisecond)
			}
		}()

		b.StartTimer()
		start = time.Now()
		chunk, _ := strconv.Atoi(os.Getenv("WALCAST_BENCH_CHUNK"))
		id, err := j.RequestSnapshot(ctx, journal.SnapshotRequest{Schema: "public", Table: "snapbench", ChunkSize: chunk})
		if err != nil {
			b.Fatal(err)
		}
		for {
			s, err := j.SnapshotByID(ctx, id)
			if err != nil {
				b.Fatal(err)
			}
			if s.Status == journal.SnapshotDone {
				break
			}
			if s.Status != journal.SnapshotRunning && s.Status != journal.SnapshotPending {
				b.Fatalf("snapshot %s: %s", s.Status, s.Error)
			}
			time.Sleep(5 * time.Millisecond)
		}
		journaled := time.Since(start)
		st, err := j.State(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for pub.Stats().Published < st.Horizon {
			time.Sleep(5 * time.Millisecond)
		}
		published := time.Since(start)
		b.StopTimer()
		stopWriter()
		wg.Wait()
		cancel()
		<-done
		<-pubDone
		nc.Close()
		j.Close()

		slices.Sort(lags)
		p := func(q float64) time.Duration {
			if len(lags) == 0 {
				return 0
			}
			return lags[min(len(lags)-1, int(q*float64(len(lags))))]
		}
		b.ReportMetric(float64(rows)/published.Seconds(), "snapshot_rows/s")
		b.ReportMetric(copyTook.Seconds()/published.Seconds(), "ratio_to_copy")
		b.ReportMetric(float64(p(0.99).Microseconds())/1000, "live_lag_p99_ms")
		b.Logf("%d rows: COPY %s (%.0f/s); snapshot journaled in %s, published in %s (%.0f/s), ratio to COPY %.2f; live commit→journal lag p50 %s p99 %s max %s (%d samples)",
			rows, copyTook.Round(time.Millisecond), float64(rows)/copyTook.Seconds(), journaled.Round(time.Millisecond),
			published.Round(time.Millisecond), float64(rows)/published.Seconds(), copyTook.Seconds()/published.Seconds(),
			p(0.5).Round(time.Microsecond), p(0.99).Round(time.Microsecond), p(1).Round(time.Microsecond), len(lags))
	}
}
