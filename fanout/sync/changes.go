package sync

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/walcast/walcast/journal"
)

// changesResponse is the JSON of GET /v1/changes: the journal read result
// of DESIGN §5.
type changesResponse struct {
	Changes        []json.RawMessage `json:"changes"`
	Cursor         string            `json:"cursor"`
	More           bool              `json:"more"`
	ResyncRequired bool              `json:"resyncRequired,omitempty"`
	Reason         string            `json:"reason,omitempty"`
	ResyncCursor   string            `json:"resyncCursor,omitempty"`
	Horizon        int64             `json:"horizon"`
}

func writeJSONError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "message": msg})
}

// serveChanges answers GET /v1/changes?topic=&cursor=&limit= with the same
// token and scoping as sockets: the token's tenant scopes the read.
func (n *Node) serveChanges(w http.ResponseWriter, r *http.Request) {
	claims, err := n.authenticate(r)
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="walcast"`)
		writeJSONError(w, http.StatusUnauthorized, "unauthorized", err.Error())
		return
	}
	if n.overloaded("memory") {
		w.Header().Set("Retry-After", retryAfter(overloadRetry))
		writeJSONError(w, http.StatusServiceUnavailable, "overloaded", overloadedMessage)
		return
	}
	// Charged to the client's address and to its token's subject alike, so
	// neither many tokens from one address nor one token from many
	// addresses gets more than one client's share of the journal.
	done, wait := n.limits.beginRead(n.clientKey(r), subjectKey(claims))
	if done == nil {
		n.stats.inc(&n.stats.rejected, "changes-limit")
		w.Header().Set("Retry-After", retryAfter(wait))
		writeJSONError(w, http.StatusTooManyRequests, "rate-limited", "too many journal reads; retry after "+retryAfter(wait)+" s")
		return
	}
	defer done()
	qv := r.URL.Query()
	topic := qv.Get("topic")
	if code, msg := n.checkTopic(claims, topic); code != "" {
		writeJSONError(w, topicStatus(code), code, msg)
		return
	}
	q := journal.Query{Entities: []string{topic}, Tenant: claims.Tenant, Cursor: qv.Get("cursor")}
	if l := qv.Get("limit"); l != "" {
		if q.Limit, err = strconv.Atoi(l); err != nil || q.Limit < 0 {
			writeJSONError(w, http.StatusBadRequest, "bad-limit", "limit must be a non-negative integer")
			return
		}
	}
	if h := n.changesHook.Load(); h != nil {
		(*h)(r)
	}
	res, err := n.j.Changes(r.Context(), q)
	n.noteReplica()
	switch {
	case errors.Is(err, journal.ErrCursorTampered):
		writeJSONError(w, http.StatusBadRequest, "bad-cursor", "cursor is malformed or not signed by this deployment; read without one")
		return
	case errors.Is(err, journal.ErrCursorScope):
		writeJSONError(w, http.StatusBadRequest, "bad-cursor", "cursor was issued for another topic or tenant")
		return
	case errors.Is(err, journal.ErrForeignJournal):
		writeJSONError(w, http.StatusBadRequest, "bad-cursor", "cursor was issued by another journal")
		return
	case err != nil:
		n.warnEvery("changes", "journal read for /v1/changes failed", "err", err)
		writeJSONError(w, http.StatusServiceUnavailable, "unavailable", "journal unavailable; retry")
		return
	}
	out := changesResponse{Changes: make([]json.RawMessage, len(res.Changes)), Cursor: res.Cursor, More: res.More,
		ResyncRequired: res.ResyncRequired, Reason: string(res.Reason), ResyncCursor: res.ResyncCursor, Horizon: res.Horizon}
	for i, e := range res.Changes {
		out.Changes[i] = e.Envelope
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
