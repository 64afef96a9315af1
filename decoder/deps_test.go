package decoder

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPureDependencies keeps the decoder pure (DESIGN §1): no network code,
// no database driver, no other walcast package among its non-test
// dependencies.
func TestPureDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed only %q", deps)
	}
	forbidden := []string{"net", "net/http", "crypto/tls", "os/exec"}
	prefixes := []string{"github.com/jackc/", "github.com/nats-io/", "github.com/walcast/walcast/", "net/"}
	for _, p := range deps {
		if p == "github.com/walcast/walcast/decoder" {
			continue
		}
		for _, f := range forbidden {
			if p == f {
				t.Errorf("decoder depends on %s", p)
			}
		}
		for _, f := range prefixes {
			if strings.HasPrefix(p, f) {
				t.Errorf("decoder depends on %s", p)
			}
		}
	}
}
