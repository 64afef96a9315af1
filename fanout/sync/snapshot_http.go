package sync

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/walcast/walcast/journal"
)

// serveSnapshot answers GET /v1/snapshot?topic= for services: the frames a
// socket's "snapshot":true subscription gets up to its snapshot-end
// (snapshot-begin, row, change), one JSON object per line
// (application/x-ndjson), the last line the snapshot-end with the cursor to
// read on from (GET /v1/changes, or a socket's sub). Same token, scoping
// and snapshot claim as sockets; charged to the client's read budgets
// (--changes-rate, --changes-concurrency) for its whole length.
func (n *Node) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	claims, err := n.authenticate(r)
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="walcast"`)
		writeJSONError(w, http.StatusUnauthorized, "unauthorized", err.Error())
		return
	}
	// Checked before any database work (no lock, no query): a topic
	// outside the journal's entities gets the answer a missing table gets.
	topic := r.URL.Query().Get("topic")
	if code, msg := n.checkTopic(claims, topic); code != "" {
		writeJSONError(w, topicStatus(code), code, msg)
		return
	}
	if code, msg := n.checkSnapshot(claims); code != "" {
		status := http.StatusForbidden
		if code == "snapshot-unavailable" {
			status = http.StatusNotImplemented
		}
		writeJSONError(w, status, code, msg)
		return
	}
	v, ok := n.httpView(w, r, topic)
	if !ok {
		return
	}
	if n.overloaded("memory") {
		w.Header().Set("Retry-After", retryAfter(overloadRetry))
		writeJSONError(w, http.StatusServiceUnavailable, "overloaded", overloadedMessage)
		return
	}
	done, wait := n.limits.beginRead(n.clientKey(r), subjectKey(claims))
	if done == nil {
		n.stats.inc(&n.stats.rejected, "changes-limit")
		w.Header().Set("Retry-After", retryAfter(wait))
		writeJSONError(w, http.StatusTooManyRequests, "rate-limited", "too many journal reads; retry after "+retryAfter(wait)+" s")
		return
	}
	defer done()
	if wait := n.limits.takeSnapshot(n.clientKey(r), subjectKey(claims)); wait > 0 {
		n.stats.inc(&n.stats.rejected, "snapshot-rate")
		n.snapshotEnded("refused", time.Time{})
		w.Header().Set("Retry-After", retryAfter(wait))
		writeJSONError(w, http.StatusTooManyRequests, "rate-limited", "too many snapshots from this client; retry after "+retryAfter(wait)+" s")
		return
	}
	ctx := r.Context()
	release := n.acquireSnapshot(ctx, nil, n.clientKey(r), subjectKey(claims))
	if release == nil {
		return
	}
	defer release()
	started := time.Now()
	sink := &httpSink{w: w, rc: http.NewResponseController(w), timeout: n.cfg.WriteTimeout}
	q := journal.Query{Entities: []string{topic}, Tenant: claims.Tenant}
	if v != nil {
		q.View = v.text
	}
	res, err := n.readStateAgain(ctx, q, v, "", sink)
	if res.held != nil {
		res.held.forget() // a reader over HTTP is not followed
	}
	if err == nil {
		var cur string
		if cur, err = n.j.CursorAt(q, res.epoch, res.pos); err == nil {
			err = sink.send(ctx, snapshotEndPayload(topic, cur, res))
			if err == nil {
				err = sink.rc.Flush()
			}
			if err == nil {
				n.snapshotEnded("done", started)
			} else {
				n.snapshotEnded("cancelled", started) // the client left before the end
			}
			return
		}
	}
	if ctx.Err() != nil {
		n.snapshotEnded("cancelled", started)
		return // the client left
	}
	n.snapshotEnded(snapshotOutcome(err), started)
	var ref *errSnapshotRefused
	msg := "the snapshot failed; retry"
	if errors.As(err, &ref) {
		msg = ref.msg
	} else {
		n.warnEvery("snapshot", "snapshot failed", "topic", topic, "err", err)
	}
	if !sink.started {
		status := http.StatusServiceUnavailable
		if ref != nil {
			status = http.StatusUnprocessableEntity
		}
		writeJSONError(w, status, "snapshot-failed", msg)
		return
	}
	b, _ := json.Marshal(struct {
		T       string `json:"t"`
		Code    string `json:"code"`
		Message string `json:"message"`
	}{"error", "snapshot-failed", msg + "; what was read is incomplete, read the snapshot again"})
	_ = sink.send(context.WithoutCancel(ctx), b)
	_ = sink.rc.Flush()
}

// httpSink writes a snapshot as NDJSON, each write bounded by the node's
// write timeout (the server's own response deadline is lifted: a snapshot
// lasts as long as it takes the client to read it).
type httpSink struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	started bool
	unflush int
}

func (k *httpSink) send(ctx context.Context, payload []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !k.started {
		k.started = true
		k.w.Header().Set("Content-Type", "application/x-ndjson")
		k.w.WriteHeader(http.StatusOK)
	}
	_ = k.rc.SetWriteDeadline(time.Now().Add(k.timeout))
	if _, err := k.w.Write(append(payload, '\n')); err != nil {
		return err
	}
	if k.unflush++; k.unflush >= 256 {
		k.unflush = 0
		return k.rc.Flush()
	}
	return nil
}
