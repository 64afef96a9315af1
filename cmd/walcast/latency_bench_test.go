package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
)

// BenchmarkE2EPublishLatency measures commit→NATS latency through the real
// `walcast run` process at a steady transaction rate: the time a subscriber
// receives each envelope minus the envelope's commitTime (same machine, same
// clock). Run alone:
//
//	go test ./cmd/walcast -run '^$' -bench E2EPublishLatency -benchtime 1x
func BenchmarkE2EPublishLatency(b *testing.B) {
	for _, rate := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("tx/s=%d", rate), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				publishLatency(b, rate, 5*time.Second)
			}
		})
	}
}

func publishLatency(b *testing.B, rate int, dur time.Duration) {
	url := pgtest.NewDatabase(b)
	execSQL(b, url, `CREATE TABLE items (id int PRIMARY KEY, val text)`, `CREATE PUBLICATION pub FOR TABLE items`)
	ns := natstest.Start(b)
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	var lat []time.Duration
	if _, err := nc.Subscribe("walcast.>", func(m *nats.Msg) {
		now := time.Now()
		var env struct {
			CommitTime time.Time `json:"commitTime"`
		}
		if json.Unmarshal(m.Data, &env) == nil {
			mu.Lock()
			lat = append(lat, now.Sub(env.CommitTime))
			mu.Unlock()
		}
	}); err != nil {
		b.Fatal(err)
	}
	p := startWalcast(b, "run", "--database-url", url, "--publication", "pub", "--http-listen", "127.0.0.1:0",
		"--nats-url", ns.URL(), "--log-format", "json", "--skip-preflight")
	deadline := time.Now().Add(30 * time.Second)
	for !strings.HasPrefix(p.readyz(), "active") {
		if time.Now().After(deadline) {
			b.Fatalf("walcast did not become active:\n%s", p.log())
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Four writers, each committing single-row transactions at rate/4.
	const writers = 4
	ctx := context.Background()
	var wg sync.WaitGroup
	total := 0
	var tmu sync.Mutex
	b.ResetTimer()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				b.Error(err)
				return
			}
			defer conn.Close(ctx)
			interval := time.Second * writers / time.Duration(rate)
			next := time.Now()
			end := next.Add(dur)
			n := 0
			for id := w; time.Now().Before(end); id += writers {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				next = next.Add(interval)
				if _, err := conn.Exec(ctx, "INSERT INTO items VALUES ($1, 'v')", id); err != nil {
					b.Error(err)
					return
				}
				n++
			}
			tmu.Lock()
			total += n
			tmu.Unlock()
		}(w)
	}
	wg.Wait()
	deadline = time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(lat)
		mu.Unlock()
		if n >= total || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	if len(lat) < total {
		b.Fatalf("received %d of %d changes", len(lat), total)
	}
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	achieved := float64(total) / dur.Seconds()
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99_ms")
	b.ReportMetric(achieved, "tx/s")
	b.Logf("%d tx at %.0f tx/s: commit→NATS p50 %s, p99 %s, max %s", total, achieved, p50, p99, lat[len(lat)-1])
}
