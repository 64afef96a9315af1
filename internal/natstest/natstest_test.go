package natstest

import (
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
