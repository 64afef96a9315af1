package publish

import (
	"context"
	"fmt"
	"math"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/internal/telemetry"
	"github.com/walcast/walcast/journal"
)

// BenchmarkE2EPublishCatchUp: catch-up publishing of N journaled entries
// (WALCAST_BENCH_ENTRIES, default 200,000 — 1,000,000 takes about 8 minutes
// on a shared 2-core machine; ~250-byte envelopes in
// 1,000-entry transactions), from the journal's start to the last one
// stored: to core NATS (flushed), to a JetStream R1 stream on one server and
// to an R3 stream on a 3-server cluster (every entry acknowledged), one after
// the other in the same run against the same journal. The servers run in
// this process, beside the publisher and the journal's PostgreSQL, on the
// same cores.
//
//	go test ./fanout/publish -run '^$' -bench E2EPublishCatchUp -benchtime 1x -timeout 30m
func BenchmarkE2EPublishCatchUp(b *testing.B) {
	n := 200_000
	if v := os.Getenv("WALCAST_BENCH_ENTRIES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1000 {
			b.Fatalf("WALCAST_BENCH_ENTRIES=%q: want at least 1000", v)
		}
	}
	ctx := context.Background()
	url := pgtest.NewDatabase(b)
	j, err := journal.Open(ctx, journal.Config{URL: url})
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	gen, err := j.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	lsn := decoder.LSN(0x1000000)
	for added := 0; added < n; {
		var txs []*decoder.Transaction
		for k := 0; k < 10 && added < n; k++ {
			size := min(1000, n-added)
			lsn += 0x10000
			chs := make([]decoder.Change, size)
			for i := range chs {
				chs[i] = change(lsn-1, "public.orders", decoder.OpInsert, added+i, "", `,"status":"paid","customer":"acme","total":"42.00","note":"a benchmark row of some length"`)
			}
			txs = append(txs, decoder.NewTransaction(uint32(added), lsn-0x1000, lsn, time.Now(), chs))
			added += size
		}
		if _, err := j.Append(ctx, gen, txs); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("journaled %d entries in %s", n, time.Since(start).Round(time.Millisecond))

	single := natstest.Start(b)
	cluster := natstest.StartCluster(b, 3)
	var clusterURLs []string
	for _, s := range cluster {
		clusterURLs = append(clusterURLs, s.URL())
	}
	targets := []struct {
		name     string
		url      string
		replicas int // 0: core NATS
	}{
		{"core", single.URL(), 0},
		{"jetstream-R1", single.URL(), 1},
		{"jetstream-R3", strings.Join(clusterURLs, ","), 3},
	}
	b.ResetTimer()
	for range b.N {
		for _, tg := range targets {
			resetPublished(b, url)
			nc, err := bus.ConnectNATS(bus.NATSConfig{URL: tg.url, Name: "bench " + tg.name})
			if err != nil {
				b.Fatal(err)
			}
			cfg := Config{}
			stream := "BENCH_" + strings.ToUpper(strings.ReplaceAll(tg.name, "-", "_"))
			if tg.replicas > 0 {
				cfg.JetStream = &JetStreamConfig{Stream: stream, Replicas: tg.replicas}
				waitJetStream(b, nc)
				// A stream left by an earlier iteration is removed so the
				// run stores all N again.
				if js, err := jetstream.New(nc); err == nil {
					_ = js.DeleteStream(ctx, stream)
				}
			}
			p := New(cfg, j, nc)
			if err := p.CheckJetStream(ctx); err != nil {
				b.Fatal(err)
			}
			pctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			t0 := time.Now()
			go func() { _ = p.Run(pctx); close(done) }()
			for p.Stats().Published < int64(n) {
				time.Sleep(5 * time.Millisecond)
			}
			if tg.replicas == 0 {
				// Core NATS: the server has it all once a flush returns.
				if err := nc.Flush(); err != nil {
					b.Fatal(err)
				}
			}
			took := time.Since(t0)
			cancel()
			<-done
			if tg.replicas > 0 {
				if got := benchStreamMsgs(b, nc, stream); got != uint64(n) {
					b.Fatalf("%s: the stream holds %d messages for %d entries", tg.name, got, n)
				}
			}
			nc.Close()
			rate := float64(n) / took.Seconds()
			b.ReportMetric(rate, tg.name+"-entries/s")
			b.Logf("%s: %d entries in %s: %.0f entries/s", tg.name, n, took.Round(time.Millisecond), rate)
		}
	}
}

// resetPublished makes the next publisher start from the journal's first
// entry (SetPublished only moves forward).
func resetPublished(b *testing.B, url string) {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE walcast.published SET seq = 0`); err != nil {
		b.Fatal(err)
	}
}

// waitJetStream waits for the servers behind nc to answer JetStream (a
// cluster elects its meta leader first).
func waitJetStream(b *testing.B, nc *nats.Conn) {
	b.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("JetStream not ready: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func benchStreamMsgs(b *testing.B, nc *nats.Conn, name string) uint64 {
	b.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		b.Fatal(fmt.Errorf("stream %s: %w", name, err))
	}
	info, err := s.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return info.State.Msgs
}

// BenchmarkE2EJetStreamCommitToAck: a steady load of single-change
// transactions (WALCAST_BENCH_RATE per second, default 1000, appended in
// 10 ms group commits as the replicator does) for WALCAST_BENCH_SECONDS
// (default 10), published to a JetStream R1 stream on one server and an R3
// stream on a 3-server cluster (in this process): p50 and p99 of
// walcast_jetstream_commit_to_ack_seconds — from the transaction's commit
// time, taken just before its journal append, to the stream's
// acknowledgement — read from the histogram's buckets (each quantile is
// the upper bound of the bucket it falls in). A publish acknowledged only
// through a reconcile after a failure is not counted.
//
//	go test ./fanout/publish -run '^$' -bench E2EJetStreamCommitToAck -benchtime 1x -timeout 30m
func BenchmarkE2EJetStreamCommitToAck(b *testing.B) {
	rate, secs := envInt(b, "WALCAST_BENCH_RATE", 1000), envInt(b, "WALCAST_BENCH_SECONDS", 10)
	ctx := context.Background()
	url := pgtest.NewDatabase(b)
	j, err := journal.Open(ctx, journal.Config{URL: url})
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	gen, err := j.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	single := natstest.Start(b)
	cluster := natstest.StartCluster(b, 3)
	var clusterURLs []string
	for _, s := range cluster {
		clusterURLs = append(clusterURLs, s.URL())
	}
	lsn := decoder.LSN(0x1000000)
	var xid uint32
	b.ResetTimer()
	for range b.N {
		for _, tg := range []struct {
			name     string
			url      string
			replicas int
		}{{"R1", single.URL(), 1}, {"R3", strings.Join(clusterURLs, ","), 3}} {
			nc, err := bus.ConnectNATS(bus.NATSConfig{URL: tg.url, Name: "bench " + tg.name})
			if err != nil {
				b.Fatal(err)
			}
			waitJetStream(b, nc)
			stream := "LATENCY_" + tg.name
			if js, err := jetstream.New(nc); err == nil {
				_ = js.DeleteStream(ctx, stream)
			}
			// Start from the journal's end: only the steady load counts.
			lg, err := j.ReadAfter(ctx, 0, 1)
			if err != nil {
				b.Fatal(err)
			}
			if err := j.SetPublished(ctx, lg.Horizon); err != nil {
				b.Fatal(err)
			}
			m, err := telemetry.NewMetrics()
			if err != nil {
				b.Fatal(err)
			}
			p := New(Config{JetStream: &JetStreamConfig{Stream: stream, Replicas: tg.replicas}}, j, nc)
			if err := p.CheckJetStream(ctx); err != nil {
				b.Fatal(err)
			}
			if err := p.RegisterMetrics(m.Meter("bench")); err != nil {
				b.Fatal(err)
			}
			pctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { _ = p.Run(pctx); close(done) }()
			perTick := max(1, rate/100)
			tick := time.NewTicker(10 * time.Millisecond)
			end := time.Now().Add(time.Duration(secs) * time.Second)
			var first, last int64
			began := time.Now()
			for time.Now().Before(end) {
				<-tick.C
				txs := make([]*decoder.Transaction, perTick)
				now := time.Now()
				for i := range txs {
					lsn += 0x100
					xid++
					txs[i] = decoder.NewTransaction(xid, lsn-0x10, lsn, now,
						[]decoder.Change{change(lsn-1, "public.orders", decoder.OpInsert, int(xid), "", `,"status":"paid"`)})
				}
				res, err := j.Append(ctx, gen, txs)
				if err != nil {
					b.Fatal(err)
				}
				if first == 0 {
					first = res.FirstSeq
				}
				last = res.LastSeq
			}
			tick.Stop()
			// A slow append makes the ticker skip ticks: report the rate
			// achieved.
			achieved := float64(last-first+1) / time.Since(began).Seconds()
			for p.Stats().Published < last {
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
			<-done
			nc.Close()
			rec := httptest.NewRecorder()
			m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			p50, p99, count := histogramQuantiles(b, rec.Body.String(), "walcast_jetstream_commit_to_ack_seconds")
			b.ReportMetric(p50*1000, tg.name+"-p50-ms")
			b.ReportMetric(p99*1000, tg.name+"-p99-ms")
			b.Logf("%s at %d tx/s (%.0f achieved) for %ds: commit→ack p50 ≤ %.1f ms, p99 ≤ %.1f ms (%d acknowledgements)", tg.name, rate, achieved, secs, p50*1000, p99*1000, count)
		}
	}
}

func envInt(b *testing.B, name string, def int) int {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// histogramQuantiles returns the upper bounds of the buckets holding the
// 50th and 99th percentiles of the Prometheus histogram name in body, and
// its count.
func histogramQuantiles(b *testing.B, body, name string) (p50, p99 float64, count int64) {
	b.Helper()
	type bucket struct {
		le float64
		n  int64
	}
	var bs []bucket
	for _, line := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(line, name+`_bucket{le="`)
		if !ok {
			continue
		}
		le, val, _ := strings.Cut(rest, `"} `)
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			b.Fatalf("%s: %v", line, err)
		}
		f := math.Inf(1)
		if le != "+Inf" {
			if f, err = strconv.ParseFloat(le, 64); err != nil {
				b.Fatalf("%s: %v", line, err)
			}
		}
		bs = append(bs, bucket{f, n})
	}
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		b.Fatalf("no %s samples in:\n%s", name, body)
	}
	count = bs[len(bs)-1].n
	q := func(f float64) float64 {
		for _, bk := range bs {
			if float64(bk.n) >= f*float64(count) {
				return bk.le
			}
		}
		return math.Inf(1)
	}
	return q(0.5), q(0.99), count
}
