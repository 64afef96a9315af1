package replication

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/fanout/publish"
	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

// BenchmarkE2ECatchUp measures how fast `walcast run` catches up on WAL
// written while it was away, next to pg_recvlogical draining the same WAL
// (same slot options) to /dev/null in the same run, on a durable server
// (fsync on, synchronous_commit on). Run it alone:
//
//	go test ./replication -run '^$' -bench E2E -benchtime 1x
//
// WALCAST_BENCH_ROWS sets the rows per workload (default 1,000,000 for the
// batched workload; a fifth of it, one row per transaction, for the other).
func BenchmarkE2ECatchUp(b *testing.B) {
	rows := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("WALCAST_BENCH_ROWS")); err == nil && v > 0 {
		rows = v
	}
	c := pgtest.Start(b, pgtest.Options{Settings: map[string]string{
		"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on",
		"shared_buffers": "256MB", "max_wal_size": "4GB", "checkpoint_timeout": "30min",
	}})
	for _, own := range []bool{true, false} {
		// The journal in the source database (the default), or in another
		// database of the same server: the WAL is the same, but logical
		// decoding skips another database's records at once, while the
		// journal's own inserts in the source database are decoded (and
		// only then dropped by pgoutput) — the walsender does about twice
		// the work.
		where := "journal=source"
		if !own {
			where = "journal=otherdb"
		}
		b.Run(where+"/txn=1000rows", func(b *testing.B) { catchUp(b, c, rows, 1000, false, own) })
		b.Run(where+"/txn=1row", func(b *testing.B) { catchUp(b, c, rows/5, 1, false, own) })
		// The same with the NATS publisher running beside the replicator:
		// the time until every change is both journaled and published.
		b.Run(where+"/txn=1000rows/publish", func(b *testing.B) { catchUp(b, c, rows, 1000, true, own) })
		b.Run(where+"/txn=1row/publish", func(b *testing.B) { catchUp(b, c, rows/5, 1, true, own) })
	}
}

func catchUp(b *testing.B, c *pgtest.Cluster, rows, perTxn int, withPublisher, journalInSource bool) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		url := c.NewDatabase(b)
		journalURL := url
		if !journalInSource {
			journalURL = c.NewDatabase(b)
		}
		execSQL(b, url,
			`CREATE TABLE bench (id bigint PRIMARY KEY, account text, amount numeric(12,2), status text, payload jsonb, created_at timestamptz)`,
			`CREATE PUBLICATION pub FOR TABLE bench`,
			`SELECT pg_create_logical_replication_slot('recvlogical', 'pgoutput')`)
		j, err := journal.Open(context.Background(), journal.Config{URL: journalURL})
		if err != nil {
			b.Fatal(err)
		}
		// Create walcast's slot and journal state at the same point, then
		// stop it so the workload accumulates as WAL.
		cfg := Config{DatabaseURL: url, Publication: "pub", Standby: true, StatusInterval: time.Second}
		r, err := New(cfg, j)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		for r.State().Role != RoleActive {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		<-done

		writeWorkload(b, url, rows, perTxn)
		end := currentLSN(b, url)

		// pg_recvlogical drains its own slot up to the same end position.
		start := time.Now()
		cmd := exec.Command(filepath.Join(c.BinDir(), "pg_recvlogical"), "-d", url, "-S", "recvlogical", "--start",
			"-E", end.String(), "-f", "/dev/null", "--no-loop",
			"-o", "proto_version=2", "-o", "publication_names=pub", "-o", "streaming=on", "-o", "messages=true")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("pg_recvlogical: %v\n%s", err, out)
		}
		recv := time.Since(start)

		// walcast catches up until its watermark reaches the end position.
		b.StartTimer()
		start = time.Now()
		r, err = New(cfg, j)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel = context.WithCancel(context.Background())
		go func() { done <- r.Run(ctx) }()
		var pub *publish.Publisher
		pubDone := make(chan struct{})
		if withPublisher {
			ns := natstest.Start(b)
			nc, err := bus.ConnectNATS(bus.NATSConfig{URL: ns.URL()})
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			pub = publish.New(publish.Config{}, j, nc)
			go func() { pub.Run(ctx); close(pubDone) }()
		} else {
			close(pubDone)
		}
		for decoder.LSN(r.watermark.Load()) < end || r.Stats().Changes.Load() < uint64(rows) ||
			(pub != nil && pub.Stats().Published < int64(rows)) {
			time.Sleep(5 * time.Millisecond)
		}
		walcast := time.Since(start)
		b.StopTimer()
		cancel()
		<-done
		<-pubDone
		j.Close()

		b.ReportMetric(float64(rows)/walcast.Seconds(), "walcast_changes/s")
		b.ReportMetric(float64(rows)/recv.Seconds(), "recvlogical_changes/s")
		b.ReportMetric(recv.Seconds()/walcast.Seconds(), "ratio")
		b.Logf("publish=%v: %d rows in %d-row transactions: walcast %s (%.0f/s), pg_recvlogical %s (%.0f/s), ratio %.2f; %d batches",
			withPublisher, rows, perTxn, walcast.Round(time.Millisecond), float64(rows)/walcast.Seconds(),
			recv.Round(time.Millisecond), float64(rows)/recv.Seconds(), recv.Seconds()/walcast.Seconds(), r.Stats().Batches.Load())
	}
}

func writeWorkload(b *testing.B, url string, rows, perTxn int) {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	// Rows of about 300 bytes of JSON once encoded.
	const row = `SELECT g, 'acct-' || (g %% 1000), (g %% 10000) / 100.0, 'paid',
		jsonb_build_object('sku', 'sku-' || g, 'qty', g %% 7, 'note', repeat('n', 60)), now()
		FROM generate_series(%d, %d) g`
	if perTxn > 1 {
		for lo := 0; lo < rows; lo += perTxn {
			if _, err := conn.Exec(ctx, "INSERT INTO bench "+fmt.Sprintf(row, lo, lo+perTxn-1), pgx.QueryExecModeSimpleProtocol); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	// Single-row transactions, many per round trip: an explicit BEGIN and
	// COMMIT around each statement of a multi-statement simple query. The
	// workload session does not wait for its own WAL flushes; walcast's
	// journal commits stay synchronous.
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		b.Fatal(err)
	}
	const per = 1000
	for lo := 0; lo < rows; lo += per {
		var sb strings.Builder
		for g := lo; g < lo+per && g < rows; g++ {
			sb.WriteString("BEGIN; INSERT INTO bench ")
			sb.WriteString(fmt.Sprintf(row, g, g))
			sb.WriteString("; COMMIT;")
		}
		if _, err := conn.PgConn().Exec(ctx, sb.String()).ReadAll(); err != nil {
			b.Fatal(err)
		}
	}
}

func currentLSN(b *testing.B, url string) decoder.LSN {
	b.Helper()
	return queryLSN(b, url, `SELECT pg_current_wal_lsn()::text`)
}
