package natstest

import (
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestPublishSurvivesRestart(t *testing.T) {
	s := Start(t)
	reconnected := make(chan struct{}, 1)
	nc, err := nats.Connect(s.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatalf("JetStream unavailable: %v", err)
	}
	if _, err := js.Publish("t.a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	url := s.URL()
	s.Restart(t)
	if s.URL() != url {
		t.Fatalf("URL changed across restart: %s -> %s", url, s.URL())
	}
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("client did not reconnect after restart")
	}
	info, err := js.StreamInfo("T")
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("stream lost its message across restart: %d msgs", info.State.Msgs)
	}
}

func TestMain(m *testing.M) {
	ServeIfChild()
	os.Exit(m.Run())
}

// TestProcessCluster: three child-process servers form a JetStream cluster
// (an R3 stream takes messages); a paused server is cut off from its routes
// and a client connected to it gets nothing until it resumes; a killed server
// restarts with its store.
func TestProcessCluster(t *testing.T) {
	nodes := StartProcessCluster(t, 3)
	nc, err := nats.Connect(nodes[0].URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err = js.AddStream(&nats.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no R3 stream on the cluster: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	paused, err := nats.Connect(nodes[1].URL())
	if err != nil {
		t.Fatal(err)
	}
	defer paused.Close()
	got := make(chan *nats.Msg, 10)
	if _, err := paused.ChanSubscribe("t.>", got); err != nil {
		t.Fatal(err)
	}
	if err := paused.Flush(); err != nil {
		t.Fatal(err)
	}
	nodes[1].Pause(t)
	// The two others go on (after electing a new stream leader, if it was
	// the paused one); a retry carries the same message id.
	if err := publishRetry(js, "1"); err != nil {
		t.Fatalf("an R3 stream with one of three servers paused: %v", err)
	}
	select {
	case m := <-got:
		t.Fatalf("a paused server delivered %q", m.Data)
	case <-time.After(500 * time.Millisecond):
	}
	nodes[1].Resume(t)
	nodes[0].Kill(t)
	nodes[0].Start(t)
	// The client was on the killed server: it reconnects to another.
	if err := publishRetry(js, "2"); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	info, err := js.StreamInfo("T")
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("the stream holds %d messages, want 2", info.State.Msgs)
	}
}

// publishRetry publishes data until the stream acknowledges it, for up to
// 45 s; a retry carries the same message id.
func publishRetry(js nats.JetStreamContext, data string) error {
	deadline := time.Now().Add(45 * time.Second)
	for {
		_, err := js.Publish("t.a", []byte(data), nats.AckWait(2*time.Second), nats.MsgId(data))
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
