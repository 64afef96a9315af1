package fanout

import (
	"os/exec"
	"strings"
	"testing"
)

// Layers point one way (DESIGN §1): fanout reads the journal and never
// reaches the replication connection or the CLI; the Go client speaks the
// wire protocol only and carries none of the server side.
func TestSyncLayering(t *testing.T) {
	for pkg, forbidden := range map[string][]string{
		"github.com/walcast/walcast/fanout": {
			"github.com/walcast/walcast/replication", "github.com/walcast/walcast/cmd/",
		},
		"github.com/walcast/walcast/fanout/client": {
			"github.com/walcast/walcast/fanout", "github.com/walcast/walcast/journal",
			"github.com/walcast/walcast/replication", "github.com/nats-io/", "github.com/jackc/",
		},
	} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range forbidden {
				if dep == f || strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f) {
					t.Errorf("%s imports %s", pkg, dep)
				}
			}
		}
	}
}
