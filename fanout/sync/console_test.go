package sync

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestConsoleBundleFresh rebuilds the console from fanout/client/js into a
// temporary directory and fails when the committed files in console/ differ:
// they are what `go build` embeds, so a change to the client or the console
// must be followed by `make console` and committed with it.
func TestConsoleBundleFresh(t *testing.T) {
	needJS(t, false)
	out := t.TempDir()
	cmd := exec.Command("node", "scripts/bundle.mjs", "--out", out)
	cmd.Dir = jsDir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bundle: %v\n%s", err, b)
	}
	for _, name := range []string{"index.html", "console.js", "walcast.js"} {
		want, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := consoleFiles.ReadFile("console/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("fanout/sync/console/%s is stale: run `make console` and commit the result", name)
		}
	}
}

// TestConsoleServed: the page, its script and the client module are served
// at /console/; the counters need a token.
func TestConsoleServed(t *testing.T) {
	e := newSyncEnv(t)
	srv := httptest.NewServer(e.node.HandlerWithConsole())
	t.Cleanup(srv.Close)
	for path, want := range map[string]string{"/console/": "text/html", "/console/console.js": "javascript", "/console/walcast.js": "javascript"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), want) {
			t.Fatalf("%s: %d %q", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	resp, err := http.Get(srv.URL + "/console/stats")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("stats without a token: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/console/stats", nil)
	req.Header.Set("Authorization", "Bearer "+token(t, []string{"public.orders"}, "", time.Hour))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var st map[string]any
	if resp.StatusCode != 200 || json.Unmarshal(b, &st) != nil || st["sockets_open"] == nil {
		t.Fatalf("stats: %d %s", resp.StatusCode, b)
	}
	// The socket and the changes endpoint are still served beside it.
	resp, err = http.Get(srv.URL + "/v1/changes?topic=public.orders")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/v1/changes through HandlerWithConsole: %d", resp.StatusCode)
	}
}
