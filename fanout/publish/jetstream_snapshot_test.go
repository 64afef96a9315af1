package publish

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/natstest"
)

// localStream is what one server holds of stream name: its own state and
// its raft group ("" when it holds none, or cannot tell now).
func localStream(srv *server.Server, name string) (server.StreamState, string, bool) {
	if srv == nil {
		return server.StreamState{}, "", false
	}
	jsz, err := srv.Jsz(&server.JSzOptions{Accounts: true, Streams: true, RaftGroups: true})
	if err != nil {
		return server.StreamState{}, "", false
	}
	for _, a := range jsz.AccountDetails {
		for _, sd := range a.Streams {
			if sd.Name == name {
				return sd.State, sd.RaftGroup, true
			}
		}
	}
	return server.StreamState{}, "", false
}

// waitReplicas waits until every server holds the stream's n messages, 1
// to n; else it fails with what each holds and the errors they logged.
func waitReplicas(t *testing.T, nodes []*natstest.Server, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var behind []string
		for _, s := range nodes {
			st, _, ok := localStream(s.Server(), "WALCAST")
			if !ok || st.LastSeq != uint64(n) || st.Msgs != uint64(n) {
				behind = append(behind, fmt.Sprintf("%s holds %d messages up to %d", s.Server().Name(), st.Msgs, st.LastSeq))
			}
		}
		if len(behind) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, s := range nodes {
				for _, l := range s.Logged() {
					if strings.HasPrefix(l, "[ERR]") && !strings.Contains(l, "route") {
						t.Logf("%s: %s", s.Server().Name(), l)
					}
				}
			}
			t.Fatalf("replicas not current within 20s (want %d messages each): %s", n, strings.Join(behind, "; "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestJetStreamClusterReplicaCatchesUpFromSnapshot: an R3 stream loses a
// replica while the other two store enough for its leader to snapshot and
// compact its raft log, so the replica, restarted, catches up from the
// snapshot and a stream catch-up rather than from the log. Every replica
// must then hold every later message too, with no write error: a message
// expectation that a replica checks against state a catch-up does not
// restore (the last message id) would take it out of service, silently,
// while the other two kept the stream writable.
func TestJetStreamClusterReplicaCatchesUpFromSnapshot(t *testing.T) {
	f := newPubFixture(t)
	nodes, urls, nc, p := r3Publisher(t, f)
	stop := runFor(t, p)
	t.Cleanup(stop)

	n := 0
	appendN := func(k, pad int) {
		for range k {
			n++
			extra := ""
			if pad > 0 {
				// Random bytes: the raft log holds messages compressed.
				b := make([]byte, pad*3/4)
				_, _ = rand.Read(b)
				extra = `,"blob":"` + base64.StdEncoding.EncodeToString(b) + `"`
			}
			f.appendTx(change(0, "public.orders", decoder.OpInsert, n, "", extra))
		}
	}
	appendN(50, 0)
	waitUntil(t, "the first entries stored", 60*time.Second, func() bool { return p.Stats().Published == int64(n) })

	// A replica that is not the stream's leader goes away.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var leader string
	waitUntil(t, "the stream's leader", 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, "WALCAST")
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		if err != nil || info.Cluster == nil {
			return false
		}
		leader = info.Cluster.Leader
		return leader != ""
	})
	var victim, lead *natstest.Server
	for _, s := range nodes {
		switch {
		case s.Server().Name() == leader:
			lead = s
		case victim == nil:
			victim = s
		}
	}
	if lead == nil || victim == nil {
		t.Fatalf("stream leader %q is not a cluster node", leader)
	}
	victim.Shutdown()

	// Over 8 MB of raft log: the leader snapshots and compacts it.
	appendN(48, 256<<10)
	waitUntil(t, "the large entries stored", 60*time.Second, func() bool { return p.Stats().Published == int64(n) })
	_, group, ok := localStream(lead.Server(), "WALCAST")
	if !ok || group == "" {
		t.Fatal("the leader reports no raft group for the stream")
	}
	// Compacted past what the stopped replica holds (the snapshot taken
	// when the stream was created is snap.1.1).
	snaps := filepath.Join(lead.StoreDir(), "jetstream", "$SYS", "_js_", group, "snapshots", "snap.*")
	waitUntil(t, "the leader's raft snapshot", 30*time.Second, func() bool {
		m, _ := filepath.Glob(snaps)
		return len(m) > 0 && !strings.HasSuffix(m[len(m)-1], "snap.1.1")
	})

	victim.Restart(t)
	waitReplicas(t, nodes, n)
	// Messages after the catch-up reach every replica.
	appendN(20, 0)
	waitUntil(t, "the last entries stored", 60*time.Second, func() bool { return p.Stats().Published == int64(n) })
	waitReplicas(t, nodes, n)
	caughtUp := false
	for _, l := range victim.Logged() {
		caughtUp = caughtUp || strings.Contains(l, "Catchup for stream '$G > WALCAST' complete")
	}
	if !caughtUp {
		t.Errorf("%s did not catch up from the leader's snapshot: the test did not exercise a catch-up", victim.Server().Name())
	}
	for _, s := range nodes {
		for _, l := range s.Logged() {
			if strings.Contains(l, "critical write error") || strings.Contains(l, "mismatch") {
				t.Errorf("%s logged: %s", s.Server().Name(), l)
			}
		}
	}
	checkExactlyOnce(t, streamSeqs(t, strings.Join(urls, ","), "WALCAST"), n)
}
