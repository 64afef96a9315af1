package sync

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"io/fs"
	"net/http"
)

// The live console (`walcast sync --console`): a static page built from the
// browser client (fanout/client/js; `make console` rebuilds it, and
// TestConsoleBundleFresh fails when the committed files are stale) and
// embedded here, so `go build` needs no npm. It talks to the node like any
// browser client; the only thing it adds is GET /console/stats, the node's
// counters as JSON, for a request with a token the node accepts.

//go:embed console/index.html console/console.js console/walcast.js
var consoleFiles embed.FS

// ConsoleHandler serves the console at /console/ (the page, console.js,
// and walcast.js — the client package as one ES module a page may import)
// and the counters at /console/stats. Mount it beside Handler.
func (n *Node) ConsoleHandler() http.Handler {
	sub, err := fs.Sub(consoleFiles, "console")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix("/console/", http.FileServerFS(sub))
	mux := http.NewServeMux()
	csp := consoleCSP()
	mux.Handle("GET /console/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		if r.URL.Path == "/console/walcast.js" {
			// The client module, for pages of allowed origins to import
			// (a module script is fetched with CORS).
			n.setCORS(w, r)
		}
		files.ServeHTTP(w, r)
	}))
	mux.Handle("GET /console", http.RedirectHandler("/console/", http.StatusMovedPermanently))
	mux.HandleFunc("GET /console/stats", n.serveConsoleStats)
	return refuseBodies(mux)
}

// consoleCSP is the console's Content-Security-Policy: its own scripts
// only (no inline script, no eval), its one inline style block by hash,
// fetches and sockets to the node itself ('self' covers ws: and wss: of
// the same host), no plugins, forms or base URL, and no framing by any
// page (frame-ancestors, with X-Frame-Options for older browsers): a
// page that framed the console could have a user paste a token into it.
func consoleCSP() string {
	page, err := consoleFiles.ReadFile("console/index.html")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	style := "'none'"
	if _, rest, ok := bytes.Cut(page, []byte("<style>")); ok {
		if css, _, ok := bytes.Cut(rest, []byte("</style>")); ok {
			sum := sha256.Sum256(css)
			style = "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
		}
	}
	return "default-src 'none'; script-src 'self'; style-src " + style +
		"; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}

// serveConsoleStats answers the node's counters (Stats) to a request with a
// valid token: they name no rows, but say how busy the node is.
func (n *Node) serveConsoleStats(w http.ResponseWriter, r *http.Request) {
	if _, err := n.authenticate(r); err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="walcast"`)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	st := n.Stats()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"sockets_open":   st.SocketsOpen,
		"frames_sent":    st.FramesSent,
		"frames_dropped": st.FramesDropped,
		"replay_gaps":    st.ReplayGaps,
		"epoch_changes":  st.EpochChanges,
		"sockets_closed": st.Closed,
		"rejected":       st.Rejected,
		"repairs":        st.Repairs,
	})
}

// HandlerWithConsole is Handler with the console mounted at /console. The
// console is a page of the node's own origin, which the origin rule always
// allows (checkOrigin).
func (n *Node) HandlerWithConsole() http.Handler {
	mux := http.NewServeMux()
	c := n.ConsoleHandler()
	mux.Handle("/console", c)
	mux.Handle("/console/", c)
	mux.Handle("/", n.Handler())
	return refuseBodies(mux)
}
