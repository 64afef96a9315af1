package sync

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// testIssuer is an identity provider's key-set endpoint on loopback: it
// serves what the test last set, counts requests and can hold them.
type testIssuer struct {
	t       *testing.T
	srv     *httptest.Server
	fetches atomic.Int64

	mu     gosync.Mutex // guards the following fields
	status int
	body   []byte
	hold   bool // requests wait until the client gives up
	delay  time.Duration
}

func newTestIssuer(t *testing.T, keys map[string]any) *testIssuer {
	is := &testIssuer{t: t, status: http.StatusOK}
	if keys != nil {
		is.body = jwksJSON(t, keys)
	}
	is.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		is.fetches.Add(1)
		is.mu.Lock()
		status, body, hold, delay := is.status, is.body, is.hold, is.delay
		is.mu.Unlock()
		if hold {
			<-r.Context().Done()
			return
		}
		time.Sleep(delay)
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
	}))
	t.Cleanup(is.srv.Close)
	return is
}

func (is *testIssuer) url() string { return is.srv.URL + "/.well-known/jwks.json" }

func (is *testIssuer) set(status int, body []byte) {
	is.mu.Lock()
	is.status, is.body = status, body
	is.mu.Unlock()
}

func (is *testIssuer) setKeys(keys map[string]any) { is.set(http.StatusOK, jwksJSON(is.t, keys)) }

func (is *testIssuer) setHold(hold bool, delay time.Duration) {
	is.mu.Lock()
	is.hold, is.delay = hold, delay
	is.mu.Unlock()
}

// jwksJSON is the key set writeJWKS writes, as bytes.
func jwksJSON(t testing.TB, keys map[string]any) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "jwks.json")
	writeJWKS(t, p, keys)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// openURLAuth builds an Authenticator on the issuer and closes it with
// the test.
func openURLAuth(t *testing.T, cfg AuthConfig) *Authenticator {
	t.Helper()
	a, err := NewAuthenticator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// closedWithin fails the test unless ch is closed within d.
func closedWithin(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not done within %v", what, d)
	}
}

func ecKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Which URLs are accepted before anything is fetched.
func TestJWKSURLCheck(t *testing.T) {
	for raw, ok := range map[string]bool{
		"https://issuer.example/.well-known/jwks.json": true,
		"https://issuer.example:8443/jwks":             true,
		"http://127.0.0.1:8080/jwks":                   true,
		"http://127.9.9.9/jwks":                        true,
		"http://[::1]:9000/jwks":                       true,
		"http://localhost/jwks":                        true,
		"http://LocalHost:1/jwks":                      true,
		"http://issuer.example/jwks":                   false,
		"http://10.0.0.1/jwks":                         false,
		"http://localhost.issuer.example/jwks":         false,
		"http://[::2]/jwks":                            false,
		"ftp://issuer.example/jwks":                    false,
		"file:///etc/jwks.json":                        false,
		"https:///jwks":                                false,
		"https://user:secret@issuer.example/jwks":      false,
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		err = checkJWKSURL(u)
		if (err == nil) != ok {
			t.Errorf("%s: accepted %v, want %v (%v)", raw, err == nil, ok, err)
		}
		if err != nil && !strings.Contains(err.Error(), "fix:") {
			t.Errorf("%s: %q says nothing of a fix", raw, err)
		}
	}
}

// The node does not start without the key set: every way the first fetch
// can fail is an error that says what happened and what to do, and a URL
// refused by its form is never fetched.
func TestJWKSURLStartRefused(t *testing.T) {
	k := ecKey(t)
	good := jwksJSON(t, map[string]any{"k1": &k.PublicKey})
	is := newTestIssuer(t, nil)
	mux := http.NewServeMux()
	var redirects atomic.Int64
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) {
		redirects.Add(1)
		http.Redirect(w, r, "/loop", http.StatusFound)
	})
	mux.HandleFunc("/away", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://issuer.example/jwks.json", http.StatusFound)
	})
	redir := httptest.NewServer(mux)
	defer redir.Close()
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(good) }))
	defer tlsSrv.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	goneURL := gone.URL + "/jwks.json"
	gone.Close()

	for _, tc := range []struct {
		name   string
		status int
		body   []byte
		url    string // default: the issuer
		cfg    func(*AuthConfig)
		want   string
	}{
		{name: "404", status: 404, body: good, want: "HTTP 404"},
		{name: "500", status: 500, body: good, want: "HTTP 500"},
		{name: "204", status: 204, want: "HTTP 204"},
		{name: "bad JSON", status: 200, body: []byte("<html>login</html>"), want: "not a JSON Web Key Set"},
		{name: "no keys", status: 200, body: []byte(`{"keys":[]}`), want: "no signing keys"},
		{name: "oct key", status: 200, body: []byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`), want: "symmetric"},
		{name: "oversize", status: 200, body: append([]byte(`{"keys":[]}`), strings.Repeat(" ", maxJWKSBytes)...), want: "larger than"},
		{name: "redirect loop", url: redir.URL + "/loop", want: "redirects"},
		{name: "redirect to http", url: redir.URL + "/away", want: "refused"},
		{name: "unreachable", url: goneURL, want: "connect"},
		{name: "untrusted TLS", url: tlsSrv.URL, want: "certificate"},
		{name: "http not loopback", url: "http://issuer.example/jwks.json", want: "not loopback"},
		{name: "credentials", url: "https://user:secret@issuer.example/jwks.json", want: "user name"},
		{name: "scheme", url: "ftp://issuer.example/jwks.json", want: "scheme"},
		{name: "file and URL", cfg: func(c *AuthConfig) { c.JWKSFile = "/nonexistent" }, want: "not both"},
		{name: "negative refresh", cfg: func(c *AuthConfig) { c.JWKSRefresh = -time.Second }, want: "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is.set(tc.status, tc.body)
			before := is.fetches.Load()
			cfg := AuthConfig{JWKSURL: tc.url}
			if cfg.JWKSURL == "" {
				cfg.JWKSURL = is.url()
			}
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			a, err := NewAuthenticator(cfg)
			if err == nil {
				a.Close()
				t.Fatal("started")
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) || !strings.Contains(msg, "fix:") {
				t.Fatalf("error %q: want %q and a fix", msg, tc.want)
			}
			if strings.Contains(msg, "user:secret") {
				t.Fatalf("error %q shows the URL's password", msg)
			}
			if tc.url != "" && is.fetches.Load() != before {
				t.Fatal("the issuer was fetched")
			}
		})
	}
	if n := redirects.Load(); n > jwksMaxRedirects+1 {
		t.Fatalf("%d redirects followed", n)
	}
}

// Tokens signed by a key of the URL's set verify, each key pinned to its
// algorithm; a token whose kid the set lacks, or signed by another key
// under a known kid, does not.
func TestJWKSURLVerify(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ec, other := ecKey(t), ecKey(t)
	is := newTestIssuer(t, map[string]any{"r1": &rsaKey.PublicKey, "e1": &ec.PublicKey})
	a := openURLAuth(t, AuthConfig{JWKSURL: is.url(), Audience: "walcast-sync"})
	claims := authClaims(map[string]any{"aud": "walcast-sync"})
	if c, err := a.Verify(authSign(t, jwt.SigningMethodRS256, rsaKey, "r1", claims)); err != nil || !c.Allows(orders) {
		t.Fatalf("RS256 by r1: %+v %v", c, err)
	}
	if _, err := a.Verify(authSign(t, jwt.SigningMethodES256, ec, "e1", claims)); err != nil {
		t.Fatalf("ES256 by e1: %v", err)
	}
	for name, tok := range map[string]string{
		"foreign key under e1": authSign(t, jwt.SigningMethodES256, other, "e1", claims),
		"unknown kid":          authSign(t, jwt.SigningMethodES256, other, "nope", claims),
		"e1 as RS256":          authSign(t, jwt.SigningMethodRS256, rsaKey, "e1", claims),
		"wrong audience":       authSign(t, jwt.SigningMethodES256, ec, "e1", authClaims(nil)),
	} {
		if _, err := a.Verify(tok); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if got := is.fetches.Load(); got != 2 {
		t.Fatalf("%d fetches, want 2 (start, then one for the unknown kid)", got)
	}
}

// The same through the node's handshake, as a deployment runs it.
func TestJWKSURLHandshake(t *testing.T) {
	k1 := ecKey(t)
	is := newTestIssuer(t, map[string]any{"k1": &k1.PublicKey})
	a := openURLAuth(t, AuthConfig{JWKSURL: is.url()})
	e := newSyncEnv(t, func(c *Config) { c.Auth = a })
	if got := e.handshakeStatus(authSign(t, jwt.SigningMethodES256, k1, "k1", authClaims(nil))); got != http.StatusSwitchingProtocols {
		t.Fatalf("token of k1: %d", got)
	}
	if got := e.handshakeStatus(authSign(t, jwt.SigningMethodES256, ecKey(t), "k1", authClaims(nil))); got != http.StatusUnauthorized {
		t.Fatalf("forged token: %d", got)
	}
}

// A key the issuer adds is fetched when the first token signed by it
// arrives, without waiting for the refresh interval; a second unknown kid
// soon after is not fetched again.
func TestJWKSURLRotationOnDemand(t *testing.T) {
	k1, k2, k3 := ecKey(t), ecKey(t), ecKey(t)
	is := newTestIssuer(t, map[string]any{"k1": &k1.PublicKey})
	a := openURLAuth(t, AuthConfig{JWKSURL: is.url(), JWKSRefresh: time.Hour})
	t1 := authSign(t, jwt.SigningMethodES256, k1, "k1", authClaims(nil))
	t2 := authSign(t, jwt.SigningMethodES256, k2, "k2", authClaims(nil))
	if _, err := a.Verify(t1); err != nil {
		t.Fatal(err)
	}
	is.setKeys(map[string]any{"k1": &k1.PublicKey, "k2": &k2.PublicKey})
	start := time.Now()
	if _, err := a.Verify(t2); err != nil {
		t.Fatalf("token of the rotated-in key: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("on-demand fetch took %v", d)
	}
	if _, err := a.Verify(t1); err != nil {
		t.Fatalf("old key after the rotation: %v", err)
	}
	if got := is.fetches.Load(); got != 2 {
		t.Fatalf("%d fetches, want 2", got)
	}
	// Within JWKSRefetchMinInterval, another new kid is not fetched.
	is.setKeys(map[string]any{"k3": &k3.PublicKey})
	if _, err := a.Verify(authSign(t, jwt.SigningMethodES256, k3, "k3", authClaims(nil))); err == nil {
		t.Fatal("k3 fetched within the minimum interval")
	}
	if got := is.fetches.Load(); got != 2 {
		t.Fatalf("%d fetches, want still 2", got)
	}
}

// A flood of tokens with made-up kids costs the issuer at most one fetch
// beyond the start, and does not hold the tokens up.
func TestJWKSURLUnknownKidFlood(t *testing.T) {
	k1, forger := ecKey(t), ecKey(t)
	is := newTestIssuer(t, map[string]any{"k1": &k1.PublicKey})
	a := openURLAuth(t, AuthConfig{JWKSURL: is.url(), JWKSRefresh: time.Hour})
	// A slow issuer: tokens pile up behind the on-demand fetch.
	is.setHold(false, 100*time.Millisecond)
	toks := make(chan string, 1000)
	for i := range 1000 {
		toks <- authSign(t, jwt.SigningMethodES256, forger, fmt.Sprintf("random-%d-%x", i, i*7919), authClaims(nil))
	}
	close(toks)
	start := time.Now()
	var accepted atomic.Int64
	var wg gosync.WaitGroup
	for range 50 {
		wg.Go(func() {
			for tok := range toks {
				if _, err := a.Verify(tok); err == nil {
					accepted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if accepted.Load() != 0 {
		t.Fatalf("%d forged tokens accepted", accepted.Load())
	}
	if got := is.fetches.Load(); got > 2 {
		t.Fatalf("%d fetches for 1000 unknown kids, want at most 2", got)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the flood took %v", d)
	}
	if _, err := a.Verify(authSign(t, jwt.SigningMethodES256, k1, "k1", authClaims(nil))); err != nil {
		t.Fatalf("good token after the flood: %v", err)
	}
}

// A failing issuer leaves the last good set in force; the failure is
// logged once per run of failures, and a later good fetch recovers.
func TestJWKSURLIssuerFailing(t *testing.T) {
	k1, k2 := ecKey(t), ecKey(t)
	is := newTestIssuer(t, map[string]any{"k1": &k1.PublicKey})
	var logs syncLog
	a := openURLAuth(t, AuthConfig{JWKSURL: is.url(), JWKSRefresh: 10 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	t1 := authSign(t, jwt.SigningMethodES256, k1, "k1", authClaims(nil))
	t2 := authSign(t, jwt.SigningMethodES256, k2, "k2", authClaims(nil))
	failed := func() int { return strings.Count(logs.String(), "JWKS fetch failed") }
	fetchesAfter := func(n int64) {
		t.Helper()
		want := is.fetches.Load() + n
		waitFor(t, fmt.Sprintf("%d more fetches", n), func() bool { return is.fetches.Load() >= want })
	}

	is.set(http.StatusInternalServerError, []byte("down"))
	fetchesAfter(5)
	is.set(http.StatusOK, []byte(`{"keys":[{"kty":"oops"}]}`))
	fetchesAfter(5)
	if _, err := a.Verify(t1); err != nil {
		t.Fatalf("last good key while the issuer fails: %v", err)
	}
	if n := failed(); n != 1 {
		t.Fatalf("failure logged %d times in one run of failures:\n%s", n, logs.String())
	}

	is.setKeys(map[string]any{"k2": &k2.PublicKey})
	waitFor(t, "recovery", func() bool { return strings.Contains(logs.String(), "JWKS changed") })
	if !strings.Contains(logs.String(), "JWKS fetch succeeded again") {
		t.Fatalf("recovery not logged:\n%s", logs.String())
	}
	if _, err := a.Verify(t2); err != nil {
		t.Fatalf("key fetched after recovery: %v", err)
	}
	if !strings.Contains(logs.String(), `"removed":["k1"]`) {
		t.Fatalf("key change not logged:\n%s", logs.String())
	}

	is.set(http.StatusServiceUnavailable, nil)
	waitFor(t, "a new run of failures logged", func() bool { return failed() == 2 })
	fetchesAfter(5)
	if n := failed(); n != 2 {
		t.Fatalf("failure logged %d times over two runs", n)
	}
	if _, err := a.Verify(t2); err != nil {
		t.Fatalf("last good key in the second run of failures: %v", err)
	}
}

// Close ends the refresher, even in the middle of a fetch the issuer never
// answers, and wakes a token waiting for it; the keys stay in force. The
// end of the context given to OpenAuthenticator ends it too.
func TestJWKSURLCloseStopsRefresher(t *testing.T) {
	k1 := ecKey(t)
	is := newTestIssuer(t, map[string]any{"k1": &k1.PublicKey})
	a, err := NewAuthenticator(AuthConfig{JWKSURL: is.url(), JWKSRefresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	is.setHold(true, 0)
	unknown := authSign(t, jwt.SigningMethodES256, ecKey(t), "new", authClaims(nil))
	verified := make(chan struct{})
	go func() {
		defer close(verified)
		_, _ = a.Verify(unknown)
	}()
	waitFor(t, "the on-demand fetch in flight", func() bool { return is.fetches.Load() == 2 })
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	// Well under the 10 s fetch timeout: Close abandons the fetch.
	closedWithin(t, closed, 3*time.Second, "Close")
	select {
	case <-a.remote.done:
	default:
		t.Fatal("Close returned before the refresher")
	}
	closedWithin(t, verified, 3*time.Second, "the waiting Verify")
	a.Close()
	if _, err := a.Verify(authSign(t, jwt.SigningMethodES256, k1, "k1", authClaims(nil))); err != nil {
		t.Fatalf("keys after Close: %v", err)
	}

	is.setHold(false, 0)
	ctx, cancel := context.WithCancel(context.Background())
	b, err := OpenAuthenticator(ctx, AuthConfig{JWKSURL: is.url(), JWKSRefresh: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	closedWithin(t, b.remote.done, 3*time.Second, "the refresher after its context ended")
	b.Close()

	// Without a JWKSURL there is no goroutine, and Close is a no-op.
	h, _ := NewHMACAuth(syncJWTSecret)
	h.Close()
}

// The fetch outcomes and the age of the keys reach the meter, and Close
// unregisters them.
func TestJWKSURLMetrics(t *testing.T) {
	k1 := ecKey(t)
	is := newTestIssuer(t, map[string]any{"k1": &k1.PublicKey})
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	a := openURLAuth(t, AuthConfig{JWKSURL: is.url(), JWKSRefresh: 10 * time.Millisecond, Meter: provider.Meter("test")})
	is.set(http.StatusInternalServerError, nil)
	fetched := func() (ok, failed int64, age bool) {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch d := m.Data.(type) {
				case metricdata.Sum[int64]:
					if m.Name != "walcast.sync.jwks.fetches" {
						continue
					}
					for _, p := range d.DataPoints {
						if v, _ := p.Attributes.Value("outcome"); v.AsString() == "ok" {
							ok = p.Value
						} else {
							failed = p.Value
						}
					}
				case metricdata.Gauge[float64]:
					age = age || m.Name == "walcast.sync.jwks.age" && len(d.DataPoints) == 1
				}
			}
		}
		return ok, failed, age
	}
	waitFor(t, "failed fetches counted", func() bool {
		ok, failed, age := fetched()
		return ok == 1 && failed >= 2 && age
	})
	a.Close()
	if ok, failed, _ := fetched(); ok != 0 || failed != 0 {
		t.Fatalf("metrics still observed after Close: ok %d, failed %d", ok, failed)
	}
}

// The kid is read from the header alone, and anything odd reads as none.
func TestJWKSURLTokenKid(t *testing.T) {
	k := ecKey(t)
	if got := tokenKid(authSign(t, jwt.SigningMethodES256, k, "abc", authClaims(nil))); got != "abc" {
		t.Fatalf("kid %q", got)
	}
	for _, tok := range []string{"", "x", "!!!.a.b", b64u([]byte(`{"kid":7}`)) + ".a.b", b64u([]byte(`[]`)) + ".a.b",
		authSign(t, jwt.SigningMethodES256, k, "", authClaims(nil))} {
		if got := tokenKid(tok); got != "" {
			t.Fatalf("tokenKid(%q) = %q", tok, got)
		}
	}
}
