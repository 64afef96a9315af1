package fanout

import (
	"os/exec"
	"strings"
	"testing"
)

// Layers point one way (DESIGN §1): fanout reads the journal and never
// reaches the replication connection or the CLI; the publisher and the sync
// node share only the bus contract and never import each other; the bus
// imports neither nor the journal; the Go client speaks the wire protocol
// only and carries none of the server side; the filter language is pure,
// reading column types from the decoder and nothing with a connection.
func TestLayering(t *testing.T) {
	const (
		mod     = "github.com/walcast/walcast/"
		bus     = mod + "fanout/bus"
		publish = mod + "fanout/publish"
		sync    = mod + "fanout/sync"
		client  = mod + "fanout/client"
		filter  = mod + "fanout/filter"
	)
	for pkg, forbidden := range map[string][]string{
		bus:     {publish, sync, client, mod + "journal", mod + "replication", mod + "cmd/"},
		publish: {sync, client, mod + "replication", mod + "cmd/"},
		sync:    {publish, client, mod + "replication", mod + "cmd/"},
		client: {
			bus, publish, sync, mod + "journal", mod + "replication",
			"github.com/nats-io/", "github.com/jackc/",
		},
		filter: {
			bus, publish, sync, client, mod + "journal", mod + "replication", mod + "cmd/",
			"github.com/nats-io/", "github.com/jackc/", "net",
		},
	} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s listed only %q", pkg, deps)
		}
		for _, dep := range deps {
			for _, f := range forbidden {
				if dep == f || strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f) {
					t.Errorf("%s imports %s", pkg, dep)
				}
			}
		}
	}
}
