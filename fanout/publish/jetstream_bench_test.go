package publish

import (
	"context"
	"fmt"
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
