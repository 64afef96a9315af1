package sync

import (
	"net/http"
	"strconv"
	"sync"
	"time"
)

// What every HTTP path of the node shares (docs/sync.md "HTTP limits" and
// "Origins"): no request bodies, the origin rule, CORS for allowed origins
// and Cache-Control on responses that carry rows or tokens.

// refuseBodies answers a request that carries a body (a declared
// Content-Length or any Transfer-Encoding) with 413 and closes its
// connection, without reading the body. No endpoint of the node takes one,
// and net/http would otherwise read what is left of it after the handler,
// with no deadline: a client that declares 100 KB and sends two bytes
// would hold its connection and goroutine for good, before any token is
// checked. The read deadline set in the past makes that read fail at once.
func refuseBodies(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength == 0 && len(r.TransferEncoding) == 0 {
			h.ServeHTTP(w, r)
			return
		}
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		w.Header().Set("Connection", "close")
		w.Header().Set("Cache-Control", "no-store")
		writeJSONError(w, http.StatusRequestEntityTooLarge, "body-not-accepted",
			"the node's endpoints take no request body; send the request without one (no Content-Length, no Transfer-Encoding)")
	})
}

// checkOrigin reports whether a request's Origin may use the node. The
// rule applies to browsers only: a request without an Origin header (a
// service, `walcast tail`, curl) is never refused by it. A page of the
// node's own origin (the request's Host: the console) is always allowed;
// any other origin must be listed in AllowedOrigins ("*" for any). Tokens
// are read only from the Authorization header or the URL, never from a
// cookie, so a page cannot borrow a user's credentials by sending a
// request: the rule keeps unlisted pages from using a token they hold, not
// a forgery defence.
func (n *Node) checkOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" || sameHost(origin, r.Host) {
		return true
	}
	for _, o := range n.cfg.AllowedOrigins {
		if o == "*" || o == origin {
			return true
		}
	}
	return false
}

func sameHost(origin, host string) bool {
	for _, p := range []string{"http://", "https://"} {
		if len(origin) > len(p) && origin[:len(p)] == p {
			return origin[len(p):] == host
		}
	}
	return false
}

// refuseOrigin answers a request whose Origin is not allowed: 403 with
// what to do, counted (connections_rejected{reason="origin"}) and logged
// once per origin.
func (n *Node) refuseOrigin(w http.ResponseWriter, r *http.Request) {
	origin := r.Header.Get("Origin")
	n.stats.inc(&n.stats.rejected, "origin")
	n.refusedOrigins.note(n, origin)
	w.Header().Set("Cache-Control", "no-store")
	if len(origin) > maxOriginBytes {
		origin = origin[:maxOriginBytes] + "…"
	}
	http.Error(w, "origin "+strconv.Quote(origin)+" is not allowed: add it to the node's --allowed-origins", http.StatusForbidden)
}

// maxLoggedOrigins bounds the refused origins remembered so that each is
// logged once.
const maxLoggedOrigins = 1024

// maxOriginBytes is how much of an origin is logged and remembered.
const maxOriginBytes = 256

// originLog remembers the refused origins already logged. Once it holds
// maxLoggedOrigins, further new origins are logged together at most once a
// minute (warnEvery) and not remembered: memory stays bounded, and so does
// the log, whatever origins clients send.
type originLog struct {
	mu   sync.Mutex // guards seen
	seen map[string]struct{}
}

func (l *originLog) note(n *Node, origin string) {
	if len(origin) > maxOriginBytes {
		origin = origin[:maxOriginBytes]
	}
	l.mu.Lock()
	if _, ok := l.seen[origin]; ok {
		l.mu.Unlock()
		return
	}
	full := len(l.seen) >= maxLoggedOrigins
	if !full {
		if l.seen == nil {
			l.seen = map[string]struct{}{}
		}
		l.seen[origin] = struct{}{}
	}
	l.mu.Unlock()
	if full {
		n.warnEvery("origins", "requests from more origins refused; not logged one by one (walcast_sync_connections_rejected_total{reason=\"origin\"} counts them)",
			"origin", origin, "fix", "add the origins of your pages to --allowed-origins")
		return
	}
	n.log.Warn("request refused: its Origin is not allowed (logged once per origin)", "origin", origin,
		"fix", "add it to --allowed-origins if pages of that origin should use this node")
}

// originGuard refuses a request whose Origin is not allowed before h runs.
func (n *Node) originGuard(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !n.checkOrigin(r) {
			n.refuseOrigin(w, r)
			return
		}
		h(w, r)
	}
}

// api wraps the HTTP reads (/v1/changes, /v1/snapshot, /v1/events): their
// responses, errors included, carry rows, cursors or a token in the URL,
// so no cache may keep them (Cache-Control: no-store); a request from an
// origin that is not allowed is refused; an allowed cross-origin page may
// read the answer (Access-Control-Allow-Origin, never with credentials).
func (n *Node) api(h http.HandlerFunc) http.HandlerFunc {
	return n.originGuard(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		n.setCORS(w, r)
		h(w, r)
	})
}

// setCORS lets an allowed cross-origin page read the response.
func (n *Node) setCORS(w http.ResponseWriter, r *http.Request) {
	o := r.Header.Get("Origin")
	if o == "" || !n.checkOrigin(r) {
		return
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", o)
	h.Set("Access-Control-Expose-Headers", "Retry-After, WWW-Authenticate")
	h.Add("Vary", "Origin")
}

// servePreflight answers a CORS preflight of /v1/events, /v1/changes or
// /v1/snapshot: a fetch from another origin that sends the token in
// Authorization (or Last-Event-ID) asks first. Only allowed origins are
// answered; no credentials are allowed (tokens never ride on cookies).
func (n *Node) servePreflight(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Header.Get("Origin") == "":
		http.Error(w, "not a CORS preflight (no Origin header); send GET", http.StatusBadRequest)
		return
	case !n.checkOrigin(r):
		n.refuseOrigin(w, r)
		return
	}
	n.setCORS(w, r)
	h := w.Header()
	h.Set("Access-Control-Allow-Methods", "GET")
	h.Set("Access-Control-Allow-Headers", "Authorization, Last-Event-ID, Accept, Cache-Control")
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
}
