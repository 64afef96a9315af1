package sync

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// verifiedClaimsKey is the context key of claims already verified for a
// request: an event stream's handshake (openEventsSocket) carries the
// claims serveEvents verified. Only the node sets it; a client cannot.
type verifiedClaimsKey struct{}

// authenticate verifies a request's token (socket handshake or
// /v1/changes). A refusal is logged at debug level with the URL redacted
// (redactedURL): a token in the query string is a credential and never
// reaches the log. The error is fit for the client.
func (n *Node) authenticate(r *http.Request) (*Claims, error) {
	if c, ok := r.Context().Value(verifiedClaimsKey{}).(*Claims); ok && c != nil {
		return c, nil
	}
	c, err := n.cfg.Auth.Verify(tokenFromRequest(r))
	// The redacted URL is built only for a log that keeps it: a refusal
	// must stay cheap whatever the length of the URL.
	if err != nil && n.log.Enabled(r.Context(), slog.LevelDebug) {
		n.log.Debug("request refused: token not accepted", "path", r.URL.Path, "url", redactedURL(r.URL),
			"remote", r.RemoteAddr, "err", err)
	}
	return c, err
}

// redactedURL is u for a log line: the value of every query parameter that
// may carry a token (access_token, token, jwt, any case) is replaced with
// "REDACTED". Every log line that shows a request URL uses it.
func redactedURL(u *url.URL) string {
	if u.RawQuery == "" {
		return u.String()
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		// Unparseable: keep the path only, never guess at a query.
		c := *u
		c.RawQuery = "REDACTED"
		return c.String()
	}
	for k, vs := range q {
		switch strings.ToLower(k) {
		case "access_token", "token", "jwt":
			for i := range vs {
				vs[i] = "REDACTED"
			}
		}
	}
	c := *u
	c.RawQuery = q.Encode()
	return c.String()
}

// tokenExpired reports whether the socket's token, plus the leeway, has
// expired at now. The sweep calls it holding n.mu; the reading goroutine
// (which alone replaces s.claims, under n.mu) calls it without.
func (s *socket) tokenExpired(now time.Time) bool {
	exp := s.claims.ExpiresAt
	return exp != nil && !now.Before(exp.Add(s.n.cfg.Auth.Leeway()))
}

// closeExpired closes the socket because its token expired unrefreshed.
func (s *socket) closeExpired() {
	s.closeWith(CloseTokenExpired, "token expired", "token-expired")
}

// refresh replaces the socket's token with tok ({"t":"refresh","token":…}).
// The new token must verify, be for the same sub and the same tenant (a
// socket's tenant scopes its cursors and subscriptions; changing it means a
// new socket). Its topics replace the old grant: each subscription the new
// token no longer grants is ended with a forbidden error frame, so a
// refresh never widens, and may narrow, what the socket sees. It is
// answered with {"t":"refreshed","exp":<unix seconds>} or an error frame
// (bad-token, forbidden); a refused refresh leaves the old token in force
// until its exp. A new token without the snapshot claim takes it from the
// existing subscriptions too: a resync the node answers later is a plain
// resync, not a snapshot (a snapshot already running finishes). Runs on
// the reading goroutine, which owns s.claims and s.members.
func (s *socket) refresh(tok string) {
	c, err := s.n.cfg.Auth.Verify(tok)
	if err != nil {
		s.enqueue(errorFrame("bad-token", "refresh refused: "+err.Error(), ""), nil)
		return
	}
	if c.Subject != s.claims.Subject {
		s.enqueue(errorFrame("forbidden", "refresh refused: the token is for another sub", ""), nil)
		return
	}
	if c.Tenant != s.claims.Tenant {
		s.enqueue(errorFrame("forbidden", "refresh refused: the token is for another tenant (open a new socket)", ""), nil)
		return
	}
	s.members = slices.DeleteFunc(s.members, func(m *member) bool {
		if c.Allows(m.topic) {
			return false
		}
		s.n.leave(m)
		s.enqueue(errorFrame("forbidden", "the refreshed token does not grant this topic; unsubscribed", m.topic), nil)
		return true
	})
	if !c.Snapshot {
		// The claim is gone: no subscription may be answered with a
		// snapshot any more (a later resync gets a plain resync).
		for _, m := range s.members {
			m.t.mu.Lock()
			m.snapshot = false
			m.t.mu.Unlock()
		}
	}
	s.n.mu.Lock() // the sweep reads s.claims under n.mu
	s.claims = c
	s.n.mu.Unlock()
	var exp int64
	if c.ExpiresAt != nil {
		exp = c.ExpiresAt.Unix()
	}
	b, _ := json.Marshal(struct {
		T   string `json:"t"`
		Exp int64  `json:"exp"`
	}{"refreshed", exp})
	s.enqueue(newFrame(b), nil)
}
