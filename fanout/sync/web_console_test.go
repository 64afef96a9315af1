package sync

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestConsoleHeaders(t *testing.T) {
	e := newSyncEnv(t)
	srv := httptest.NewServer(e.node.HandlerWithConsole())
	defer srv.Close()
	page, err := consoleFiles.ReadFile("console/index.html")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := bytes.Cut(page, []byte("<style>"))
	css, _, _ := bytes.Cut(rest, []byte("</style>"))
	sum := sha256.Sum256(css)
	for _, p := range []string{"/console/", "/console/console.js", "/console/walcast.js"} {
		resp, err := http.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		csp := resp.Header.Get("Content-Security-Policy")
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Frame-Options") != "DENY" ||
			!strings.Contains(csp, "frame-ancestors 'none'") || !strings.Contains(csp, "script-src 'self'") ||
			!strings.Contains(csp, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'") {
			t.Fatalf("%s: %d, X-Frame-Options %q, CSP %q", p, resp.StatusCode, resp.Header.Get("X-Frame-Options"), csp)
		}
	}
}
