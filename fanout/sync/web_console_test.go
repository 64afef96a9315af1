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

// TestConsoleHeaders: the console's pages may not be framed, run only
// their own scripts, and their one inline style block is allowed by hash.
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

// TestConsoleModuleCORS: a page of an allowed origin may import
// /console/walcast.js (module scripts are fetched with CORS); other
// origins get no Access-Control-Allow-Origin. Before, none did.
func TestConsoleModuleCORS(t *testing.T) {
	const app = "https://app.example.com"
	e := newSyncEnv(t, func(c *Config) { c.AllowedOrigins = []string{app} })
	srv := httptest.NewServer(e.node.HandlerWithConsole())
	defer srv.Close()
	for origin, want := range map[string]string{app: app, "https://evil.example": ""} {
		req, _ := http.NewRequest("GET", srv.URL+"/console/walcast.js", nil)
		req.Header.Set("Origin", origin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Access-Control-Allow-Origin") != want {
			t.Fatalf("walcast.js for %s: %d, Access-Control-Allow-Origin %q, want %q", origin, resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"), want)
		}
	}
}
