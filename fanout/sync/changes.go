package sync

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/walcast/walcast/journal"
)

// changesResponse is the JSON of GET /v1/changes: the journal read result
// of DESIGN §5.
type changesResponse struct {
	Changes []json.RawMessage `json:"changes"`
	// Cursor is after the last change, always at a transaction boundary;
	// empty in a partial response.
	Cursor string `json:"cursor"`
	More   bool   `json:"more"`
	// Partial: the changes are the start (or a middle part) of one
	// transaction larger than a page; Continue reads on from after them.
	// Continue is not a cursor: it is refused as one, and a consumer
	// keeps its last cursor until a response that is not partial.
	Partial        bool   `json:"partial,omitempty"`
	Continue       string `json:"continue,omitempty"`
	ResyncRequired bool   `json:"resyncRequired,omitempty"`
	Reason         string `json:"reason,omitempty"`
	ResyncCursor   string `json:"resyncCursor,omitempty"`
	Horizon        int64  `json:"horizon"`
}

// continuePrefix starts the continue value of a partial /v1/changes
// response: a position inside a transaction, which must never be taken for
// a cursor (cursors are base64url, so never hold a '.').
const continuePrefix = "txn."

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
	v, ok := n.httpView(w, r, topic)
	if !ok {
		return
	}
	q := journal.Query{Entities: []string{topic}, Tenant: claims.Tenant, Cursor: qv.Get("cursor")}
	if v != nil {
		q.View = v.text
	}
	if c := qv.Get("continue"); c != "" {
		if q.Cursor != "" || !strings.HasPrefix(c, continuePrefix) {
			writeJSONError(w, http.StatusBadRequest, "bad-continue", "continue takes the continue value of a partial response, and no cursor with it")
			return
		}
		q.Cursor = strings.TrimPrefix(c, continuePrefix)
	} else if strings.HasPrefix(q.Cursor, continuePrefix) {
		writeJSONError(w, http.StatusBadRequest, "bad-cursor", "this is the continue value of a partial response, not a cursor: pass it as continue=, and keep your last cursor")
		return
	}
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
		writeJSONError(w, http.StatusBadRequest, "bad-cursor", "cursor was issued for another topic, tenant, filter or column list")
		return
	case errors.Is(err, journal.ErrForeignJournal):
		writeJSONError(w, http.StatusBadRequest, "bad-cursor", "cursor was issued by another journal")
		return
	case err != nil:
		n.warnEvery("changes", "journal read for /v1/changes failed", "err", err)
		writeJSONError(w, http.StatusServiceUnavailable, "unavailable", "journal unavailable; retry")
		return
	}
	out := changesResponse{Cursor: res.Cursor, More: res.More,
		ResyncRequired: res.ResyncRequired, Reason: string(res.Reason), ResyncCursor: res.ResyncCursor, Horizon: res.Horizon}
	if k := len(res.Changes); k > 0 && !res.Changes[k-1].TxnEnd {
		// The page ends inside a transaction: it ends at the last
		// transaction boundary in it instead, or, when its first
		// transaction does not end within it, is a partial page.
		for k > 0 && !res.Changes[k-1].TxnEnd {
			k--
		}
		if k == 0 {
			out.Partial, out.Continue, out.Cursor = true, continuePrefix+res.Cursor, ""
		} else {
			res.Changes = res.Changes[:k]
			if out.Cursor, err = n.j.CursorAt(q, res.Epoch, res.Changes[k-1].Seq); err != nil {
				writeJSONError(w, http.StatusServiceUnavailable, "unavailable", "cannot issue cursors; retry")
				return
			}
		}
		out.More = true
	}
	if v != nil {
		var resync bool
		if out.Changes, resync = viewChanges(v, res.Changes, &n.stats); resync {
			// A change the filter cannot judge (a value not in its
			// type's form): the reader re-reads the rows, as after any
			// resync, and continues from the horizon.
			out = changesResponse{ResyncRequired: true, Reason: "filter", Horizon: res.Horizon, Changes: []json.RawMessage{}}
			if out.ResyncCursor, err = n.j.CursorAt(q, res.Epoch, res.Horizon); err != nil {
				writeJSONError(w, http.StatusServiceUnavailable, "unavailable", "cannot issue cursors; retry")
				return
			}
		}
	} else {
		out.Changes = make([]json.RawMessage, len(res.Changes))
		for i, e := range res.Changes {
			out.Changes[i] = e.Envelope
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
