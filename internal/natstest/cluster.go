package natstest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// StartCluster runs n NATS servers in the test process, routed to each
// other as one cluster with JetStream (each its own store), on loopback
// ports kept across restarts. They are shut down when the test ends.
// JetStream needs a moment after start to elect its meta leader: callers
// retry their first JetStream call.
func StartCluster(t testing.TB, n int) []*Server {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	servers := make([]*Server, n)
	for i := range servers {
		dir, err := os.MkdirTemp("", "walcast-natstest-cluster-")
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{opts: server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			NoLog:      true,
			NoSigs:     true,
			JetStream:  true,
			StoreDir:   dir,
			Cluster:    server.ClusterOpts{Name: "walcast-test", Host: "127.0.0.1", Port: ports[i]},
			Routes:     routes,
		}}
		if err := s.start(); err != nil {
			os.RemoveAll(dir)
			t.Fatal(err)
		}
		servers[i] = s
		t.Cleanup(func() {
			s.Shutdown()
			os.RemoveAll(dir)
		})
	}
	return servers
}
