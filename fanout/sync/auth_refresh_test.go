package sync

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/walcast/walcast/decoder"
)

const authItems = "public.items"

// authFrame is a node → client frame with the fields refresh answers carry.
type authFrame struct {
	T       string `json:"t"`
	Topic   string `json:"topic"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Exp     int64  `json:"exp"`
	Change  struct {
		Entity string `json:"entity"`
	} `json:"change"`
}

func (c *wsConn) readAuth() authFrame {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, b, err := c.c.ReadMessage()
	if err != nil {
		c.t.Fatal(err)
	}
	var f authFrame
	if err := json.Unmarshal(b, &f); err != nil {
		c.t.Fatalf("frame %s: %v", b, err)
	}
	return f
}

// A socket lives until its token's exp plus the leeway, and not a moment
// longer: a frame sent after it closes the socket with 4100 at once (the
// sweep would only notice within a quarter of the idle timeout).
func TestTokenExpiryLeewayAndCode(t *testing.T) {
	clock := newFakeClock()
	e := newSyncEnv(t, func(c *Config) {
		c.Clock = clock
		c.IdleTimeout = 24 * time.Hour
	})
	exp := time.Now().Add(time.Hour).Truncate(time.Second)
	tok := authSign(t, jwt.SigningMethodHS256, syncJWTSecret, "", authClaims(map[string]any{"exp": exp.Unix()}))
	ws := e.mustDial(tok)
	clock.Advance(exp.Sub(clock.Now()) + 10*time.Second) // past exp, within the 30 s leeway
	ws.send(map[string]string{"t": "ping"})
	ws.expect("pong")
	clock.Advance(30 * time.Second)
	ws.send(map[string]string{"t": "ping"})
	if code, reason := ws.expectClose(); code != CloseTokenExpired || reason != "token expired" {
		t.Fatalf("closed %d %q", code, reason)
	}
	if e.node.Stats().Closed["token-expired"] != 1 {
		t.Fatalf("stats %+v", e.node.Stats())
	}
}

// {"t":"refresh"} replaces the token on a live socket: the socket then
// lives to the new exp; subscriptions the new token does not grant end with
// a forbidden error; a token for another sub or tenant, or one that does
// not verify, is refused and the old token stays in force. Real time, no
// leeway: tokens of a few seconds.
func TestRefreshToken(t *testing.T) {
	auth, err := NewAuthenticator(AuthConfig{Secret: syncJWTSecret, Leeway: -1})
	if err != nil {
		t.Fatal(err)
	}
	e := newSyncEnv(t, func(c *Config) { c.Auth = auth })
	start := time.Now()
	expA := start.Add(3 * time.Second).Unix()
	sign := func(extra map[string]any) string {
		return authSign(t, jwt.SigningMethodHS256, syncJWTSecret, "", authClaims(extra))
	}
	ws := e.mustDial(sign(map[string]any{"topics": []string{orders, authItems}, "tenant": "acme", "exp": expA}))
	for _, topic := range []string{orders, authItems} {
		ws.sub(topic, "")
		if f := ws.readAuth(); f.T != "subscribed" {
			t.Fatalf("got %+v", f)
		}
	}

	refuse := func(tok, code string) {
		t.Helper()
		ws.send(map[string]string{"t": "refresh", "token": tok})
		if f := ws.readAuth(); f.T != "error" || f.Code != code {
			t.Fatalf("refresh: got %+v, want error %s", f, code)
		}
	}
	refuse(sign(map[string]any{"sub": "someone-else", "tenant": "acme"}), "forbidden")
	refuse(sign(map[string]any{"tenant": "other"}), "forbidden")
	refuse(sign(map[string]any{}), "forbidden") // no tenant is another tenant
	refuse(sign(map[string]any{"tenant": "acme", "exp": start.Add(-time.Hour).Unix()}), "bad-token")
	refuse(authSign(t, jwt.SigningMethodHS256, []byte("another-secret-0123456789abcdef"), "", authClaims(map[string]any{"tenant": "acme"})), "bad-token")
	refuse("", "bad-token")

	newExp := expA + 3
	ws.send(map[string]string{"t": "refresh", "token": sign(map[string]any{"tenant": "acme", "exp": newExp})}) // orders only
	if f := ws.readAuth(); f.T != "error" || f.Code != "forbidden" || f.Topic != authItems {
		t.Fatalf("narrowed refresh: got %+v", f)
	}
	if f := ws.readAuth(); f.T != "refreshed" || f.Exp != newExp {
		t.Fatalf("got %+v, want refreshed exp %d", f, newExp)
	}
	// Past the first token's exp, within the new one's.
	waitFor(t, "the first token's exp", func() bool { return time.Now().Unix() > expA })
	ws.send(map[string]string{"t": "ping"})
	if f := ws.readAuth(); f.T != "pong" {
		t.Fatalf("got %+v", f)
	}
	// The dropped topic is no longer delivered, nor may it be resubscribed.
	e.commit(row{entity: authItems, op: decoder.OpInsert, id: 2, tenant: "acme", state: decoder.TenantKnown})
	e.commit(row{entity: orders, op: decoder.OpInsert, id: 2, tenant: "acme", state: decoder.TenantKnown})
	if f := ws.readAuth(); f.T != "change" || f.Change.Entity != orders {
		t.Fatalf("got %+v, want the orders change only", f)
	}
	ws.sub(authItems, "")
	if f := ws.readAuth(); f.T != "error" || f.Code != "forbidden" {
		t.Fatalf("got %+v", f)
	}
	// The new exp is enforced.
	waitFor(t, "the new token's exp", func() bool { return time.Now().Unix() > newExp })
	ws.send(map[string]string{"t": "ping"})
	if code, _ := ws.expectClose(); code != CloseTokenExpired {
		t.Fatalf("closed %d, want %d", code, CloseTokenExpired)
	}
}
