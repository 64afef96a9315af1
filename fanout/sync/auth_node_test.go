package sync

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"

	"github.com/walcast/walcast/fanout/client"
)

// authSign signs claims (a map, so tests can write any key) with method
// and key, setting the kid header when given.
func authSign(t testing.TB, m jwt.SigningMethod, key any, kid string, claims map[string]any) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, jwt.MapClaims(claims))
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func authClaims(extra map[string]any) map[string]any {
	c := map[string]any{"sub": "test", "topics": []string{orders}, "exp": time.Now().Add(time.Hour).Unix()}
	for k, v := range extra {
		if v == nil {
			delete(c, k)
			continue
		}
		c[k] = v
	}
	return c
}

func b64u(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// writeJWKS writes a key set of the given public keys by kid.
func writeJWKS(t testing.TB, path string, keys map[string]any) {
	t.Helper()
	var set struct {
		Keys []map[string]string `json:"keys"`
	}
	for kid, k := range keys {
		switch k := k.(type) {
		case *rsa.PublicKey:
			set.Keys = append(set.Keys, map[string]string{"kty": "RSA", "kid": kid, "use": "sig",
				"n": b64u(k.N.Bytes()), "e": b64u(big.NewInt(int64(k.E)).Bytes())})
		case *ecdsa.PublicKey:
			raw, err := k.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			size := (len(raw) - 1) / 2
			set.Keys = append(set.Keys, map[string]string{"kty": "EC", "kid": kid, "crv": k.Curve.Params().Name,
				"x": b64u(raw[1 : 1+size]), "y": b64u(raw[1+size:])})
		}
	}
	b, _ := json.Marshal(set)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// handshakeStatus dials the node's socket with tok in the Authorization
// header and returns the HTTP status (101 for an upgrade).
func (e *syncEnv) handshakeStatus(tok string) int {
	e.t.Helper()
	c, resp, err := websocket.DefaultDialer.Dial(e.wsURL(""), http.Header{"Authorization": {"Bearer " + tok}})
	if err == nil {
		c.Close()
		return http.StatusSwitchingProtocols
	}
	if resp == nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode
}

// Every claim check at the handshake, against the real node: aud, iss, nbf
// and exp with the leeway, keys by kid from a JWKS file beside the static
// secret, the algorithm pinned to the key.
func TestAuthHandshakeChecks(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	writeJWKS(t, jwks, map[string]any{"r1": &rsaKey.PublicKey, "e1": &ecKey.PublicKey})
	auth, err := NewAuthenticator(AuthConfig{Secret: syncJWTSecret, JWKSFile: jwks, Audience: "walcast-sync",
		Issuer: "https://issuer.example", Leeway: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e := newSyncEnv(t, func(c *Config) { c.Auth = auth })
	good := map[string]any{"aud": "walcast-sync", "iss": "https://issuer.example"}
	with := func(kv ...any) map[string]any {
		m := map[string]any{}
		for k, v := range good {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return authClaims(m)
	}
	hs := func(c map[string]any) string { return authSign(t, jwt.SigningMethodHS256, syncJWTSecret, "", c) }
	now := time.Now()
	cases := []struct {
		name string
		tok  string
		want int
	}{
		{"hs256 good", hs(with()), 101},
		{"aud among several", hs(with("aud", []string{"other", "walcast-sync"})), 101},
		{"aud wrong", hs(with("aud", "other")), 401},
		{"aud missing", hs(authClaims(map[string]any{"iss": "https://issuer.example"})), 401},
		{"iss wrong", hs(with("iss", "https://evil.example")), 401},
		{"iss missing", hs(authClaims(map[string]any{"aud": "walcast-sync"})), 401},
		{"nbf in the future", hs(with("nbf", now.Add(5*time.Minute).Unix())), 401},
		{"nbf within the leeway", hs(with("nbf", now.Add(10*time.Second).Unix())), 101},
		{"exp within the leeway", hs(with("exp", now.Add(-10*time.Second).Unix())), 101},
		{"exp beyond the leeway", hs(with("exp", now.Add(-2*time.Minute).Unix())), 401},
		{"iat in the future", hs(with("iat", now.Add(5*time.Minute).Unix())), 401},
		{"rsa by kid", authSign(t, jwt.SigningMethodRS256, rsaKey, "r1", with()), 101},
		{"ec by kid", authSign(t, jwt.SigningMethodES256, ecKey, "e1", with()), 101},
		{"unknown kid", authSign(t, jwt.SigningMethodRS256, rsaKey, "r9", with()), 401},
		{"rsa without kid falls to the secret", authSign(t, jwt.SigningMethodRS256, rsaKey, "", with()), 401},
		{"kid of another key type", authSign(t, jwt.SigningMethodRS256, rsaKey, "e1", with()), 401},
		{"rs512 under an RS256 key", authSign(t, jwt.SigningMethodRS512, rsaKey, "r1", with()), 401},
		// Algorithm confusion: the RSA public key's bytes as an HMAC secret.
		{"hs256 with the public key as secret", authSign(t, jwt.SigningMethodHS256, pemPublic(t, &rsaKey.PublicKey), "r1", with()), 401},
	}
	for _, tc := range cases {
		if got := e.handshakeStatus(tc.tok); got != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, got, tc.want)
		}
	}
}

// Claims are read by their exact names: a token whose grants are spelled
// "Topics" and "TENANT" grants nothing and has no tenant (encoding/json
// alone would read both).
func TestAuthClaimsExactKeys(t *testing.T) {
	e := newSyncEnv(t)
	e.commit(ins(orders, 1))
	tok := authSign(t, jwt.SigningMethodHS256, syncJWTSecret, "", authClaims(map[string]any{
		"topics": nil, "Topics": []string{"*"}, "TENANT": "acme"}))
	c, err := e.node.cfg.Auth.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Topics) != 0 || c.Tenant != "" {
		t.Fatalf("claims read case-insensitively: %+v", c)
	}
	ws := e.mustDial(tok)
	ws.sub(orders, "")
	if f := ws.expect("error"); f.Code != "forbidden" {
		t.Fatalf("got %+v", f)
	}
	// A grant of the wrong JSON type fails the token.
	bad := authSign(t, jwt.SigningMethodHS256, syncJWTSecret, "", authClaims(map[string]any{"tenant": 42}))
	if got := e.handshakeStatus(bad); got != http.StatusUnauthorized {
		t.Fatalf("tenant of type number: status %d", got)
	}
}

// The JWKS file is re-read when it changes: a key added is accepted, a key
// removed is refused, and a broken file keeps the keys read before.
func TestAuthJWKSReload(t *testing.T) {
	k1, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	k2, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	writeJWKS(t, jwks, map[string]any{"k1": &k1.PublicKey})
	auth, err := NewAuthenticator(AuthConfig{JWKSFile: jwks})
	if err != nil {
		t.Fatal(err)
	}
	e := newSyncEnv(t, func(c *Config) { c.Auth = auth })
	t1 := authSign(t, jwt.SigningMethodES256, k1, "k1", authClaims(nil))
	t2 := authSign(t, jwt.SigningMethodES384, k2, "k2", authClaims(nil))
	if e.handshakeStatus(t1) != 101 || e.handshakeStatus(t2) != 401 {
		t.Fatal("initial key set not applied")
	}
	writeJWKS(t, jwks, map[string]any{"k2": &k2.PublicKey})
	// A distinct mtime even on coarse file systems.
	later := time.Now().Add(2 * time.Second)
	_ = os.Chtimes(jwks, later, later)
	waitFor(t, "the new key set", func() bool { return e.handshakeStatus(t2) == 101 })
	if e.handshakeStatus(t1) != 401 {
		t.Fatal("a key removed from the file is still accepted")
	}
	if err := os.WriteFile(jwks, []byte(`{"keys":[{"kty":"oops"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	later = later.Add(2 * time.Second)
	_ = os.Chtimes(jwks, later, later)
	time.Sleep(JWKSPollInterval + 100*time.Millisecond)
	if e.handshakeStatus(t2) != 101 {
		t.Fatal("a broken key set replaced the good one")
	}
	// A key set must hold usable keys: refused at start.
	if _, err := NewAuthenticator(AuthConfig{JWKSFile: jwks}); err == nil {
		t.Fatal("broken JWKS accepted at start")
	}
}

// syncLog is a concurrency-safe log buffer.
type syncLog struct {
	mu gosync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A token in the query string is a credential: the log line of a refused
// handshake (or /v1/changes read) shows the request, never the token.
func TestAuthQueryTokenNotLogged(t *testing.T) {
	var logs syncLog
	e := newSyncEnv(t, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	expired := token(t, []string{orders}, "", -time.Hour)
	forged := authSign(t, jwt.SigningMethodHS256, []byte("another-secret-0123456789abcdef"), "", authClaims(nil))
	for _, tok := range []string{expired, forged} {
		if _, resp, err := e.dial(tok, 0); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("refused handshake: %v %v", resp, err)
		}
		resp, err := http.Get(e.srv.URL + "/v1/changes?topic=" + orders + "&access_token=" + url.QueryEscape(tok))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("/v1/changes: %d", resp.StatusCode)
		}
	}
	out := logs.String()
	if strings.Count(out, "request refused") < 4 || !strings.Contains(out, "access_token=REDACTED") {
		t.Fatalf("refusals not logged:\n%s", out)
	}
	for _, tok := range []string{expired, forged} {
		// The signature alone is the secret part; neither it nor the whole
		// token may appear, in any encoding the logger uses.
		sig := tok[strings.LastIndexByte(tok, '.')+1:]
		if strings.Contains(out, sig) || strings.Contains(out, url.QueryEscape(sig)) {
			t.Fatalf("token logged:\n%s", out)
		}
	}
	if got := redactedURL(&url.URL{Path: "/v1/socket", RawQuery: "ACCESS_TOKEN=x&topic=a&token=y&jwt=z"}); strings.Contains(got, "=x") ||
		strings.Contains(got, "=y") || strings.Contains(got, "=z") || !strings.Contains(got, "topic=a") {
		t.Fatalf("redacted %q", got)
	}
}

// The client's copy of the close-code table agrees with the node's.
func TestCloseCodesAgree(t *testing.T) {
	pairs := [][2]int{
		{CloseIdle, client.CloseIdle}, {CloseBackpressure, client.CloseBackpressure},
		{CloseShutdown, client.CloseShutdown}, {CloseTokenExpired, client.CloseTokenExpired},
		{CloseBadFrame, client.CloseBadFrame}, {CloseFlood, client.CloseFlood},
	}
	for _, p := range pairs {
		if p[0] != p[1] {
			t.Fatalf("node %d, client %d", p[0], p[1])
		}
	}
}

// Shutdown closes sockets with 4000 (reconnect to another node).
func TestCloseOnShutdown(t *testing.T) {
	e := newSyncEnv(t)
	c := e.mustDial(token(t, []string{orders}, "", time.Hour))
	waitFor(t, "socket open", func() bool { return e.node.Stats().SocketsOpen == 1 })
	go e.node.Close()
	if code, reason := c.expectClose(); code != CloseShutdown || reason != "node shutting down" {
		t.Fatalf("closed %d %q", code, reason)
	}
}
