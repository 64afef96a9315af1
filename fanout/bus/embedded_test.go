package bus

import (
	"net"
	"strings"
	"testing"
)

// TestEmbeddedNATSPortTaken: when another process holds the port, the
// embedded server's start fails with the bind error itself and says what
// to do, instead of waiting for a server that will never listen.
func TestEmbeddedNATSPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	emb, err := StartEmbeddedNATS(ln.Addr().String(), "", EmbeddedCluster{})
	if err == nil {
		emb.Shutdown()
		t.Fatalf("the embedded server started on %s, a port another listener holds", ln.Addr())
	}
	for _, want := range []string{ln.Addr().String(), "address already in use", "--embedded-nats-listen"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}

	// An address that is not this machine's is not a taken port: the
	// error says so (192.0.2.1 is TEST-NET-1, never assigned).
	if emb, err := StartEmbeddedNATS("192.0.2.1:4222", "", EmbeddedCluster{}); err == nil {
		emb.Shutdown()
		t.Fatal("the embedded server started on 192.0.2.1, an address this machine does not have")
	} else if msg := err.Error(); !strings.Contains(msg, "cannot assign requested address") || strings.Contains(msg, "another process") {
		t.Errorf("error %q: want the kernel's answer without blaming another process", msg)
	}

	// Once the port is free the same address works (the check holds
	// nothing), and so does port 0 (a random one).
	_ = ln.Close()
	for _, listen := range []string{ln.Addr().String(), "127.0.0.1:0"} {
		emb, err := StartEmbeddedNATS(listen, "", EmbeddedCluster{})
		if err != nil {
			t.Fatalf("%s: %v", listen, err)
		}
		if !strings.HasPrefix(emb.URL(), "nats://127.0.0.1:") {
			t.Errorf("%s: URL %q", listen, emb.URL())
		}
		emb.Shutdown()
	}
}
