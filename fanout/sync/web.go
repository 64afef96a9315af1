package sync

import (
	"net/http"
	"time"
)

// What every HTTP path of the node shares (docs/sync.md "HTTP limits"): no
// request bodies.

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
