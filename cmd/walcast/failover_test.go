package main

import (
	"context"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/internal/pgtest"
)

// freeAddrs returns n loopback addresses nothing listens on (just now).
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	for _, ln := range lns {
		_ = ln.Close()
	}
	return out
}

// TestEmbeddedNATSFailover runs the default deployment without a NATS of
// its own: two `walcast run` on one slot, each with its embedded NATS
// server, the two servers joined into one cluster
// (--embedded-nats-cluster-listen, --embedded-nats-routes), and a sync
// node given both client addresses. A subscriber on the standby's server
// receives what the active one publishes. The active instance is killed with
// SIGKILL under write load; the standby takes the slot and publishes to its
// own server; the sync node's client receives every committed change
// exactly once, in order, whichever server the node was connected to.
func TestEmbeddedNATSFailover(t *testing.T) {
	url := pgtest.NewDatabase(t)
	setupSource(t, url)
	addrs := freeAddrs(t, 4)
	client1, route1, client2, route2 := addrs[0], addrs[1], addrs[2], addrs[3]
	instance := func(listen, route, peer string) *proc {
		return startWalcast(t, "run", "--database-url", url, "--publication", "pub", "--http-listen", "127.0.0.1:0",
			"--embedded-nats-listen", listen, "--embedded-nats-cluster-listen", route, "--embedded-nats-routes", peer,
			"--log-format", "json")
	}
	a := instance(client1, route1, route2)
	waitUntil(t, "the first instance active", 30*time.Second, func() bool { return strings.HasPrefix(a.readyz(), "active") })
	b := instance(client2, route2, route1)
	waitUntil(t, "the second instance standby", 30*time.Second, func() bool { return strings.HasPrefix(b.readyz(), "standby") })

	natsURLs := "nats://" + client1 + ",nats://" + client2
	_, wsURL := startSync(t, "--nats-url", natsURLs, "--journal-url", url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, c := subscribeItems(t, ctx, wsURL, "failover")

	// A subscriber on the standby's server gets what the active instance
	// publishes to its own: the servers are one cluster.
	nc, err := nats.Connect("nats://" + client2)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	routed, err := nc.SubscribeSync("walcast.change.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	w := startWriter(t, url)
	if _, err := routed.NextMsg(30 * time.Second); err != nil {
		t.Fatalf("a subscriber on the standby's embedded server got nothing the active instance published: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.done
	took := time.Now()
	waitUntil(t, "the standby to take the slot over", 30*time.Second, func() bool { return strings.HasPrefix(b.readyz(), "active") })
	t.Logf("the standby took over %s after the kill", time.Since(took).Round(time.Millisecond))
	time.Sleep(700 * time.Millisecond)
	committed := w.finish()
	if len(committed) == 0 {
		t.Fatal("the writer committed nothing")
	}

	expectCommitted(t, ctx, c, committed)
	t.Logf("%d changes reached the client exactly once across the failover", len(committed))
}

// TestEmbeddedNATSClusterFlags: the cluster flags are refused where they
// cannot work, saying what to do instead.
func TestEmbeddedNATSClusterFlags(t *testing.T) {
	url := pgtest.NewDatabase(t)
	setupSource(t, url)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--embedded-nats-routes", "127.0.0.1:1"}, "needs --embedded-nats-cluster-listen"},
		{[]string{"--embedded-nats-cluster-listen", "127.0.0.1:0", "--embedded-nats-store-dir", t.TempDir()}, "run a NATS cluster with JetStream"},
		{[]string{"--embedded-nats-cluster-listen", "127.0.0.1:x"}, "want a port"},
		{[]string{"--embedded-nats-cluster-listen", "127.0.0.1:7", "--nats-url", "nats://127.0.0.1:1"}, "drop one or the other"},
	} {
		p := startWalcast(t, runArgs(url, tc.args...)...)
		if code := p.exitCode(t, 30*time.Second); code != exitUsage || !strings.Contains(p.log(), tc.want) {
			t.Errorf("%v: exit %d, want %d saying %q\n%s", tc.args, code, exitUsage, tc.want, p.log())
		}
	}
}
