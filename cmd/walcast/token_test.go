package main

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	syncnode "github.com/walcast/walcast/fanout/sync"
	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
)

const tokenTestSecret = "token-test-secret-0123456789abcdef"

// writePEM writes a PEM block to a file in dir and returns its path.
func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func pkcs8(t *testing.T, key any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func pkix(t *testing.T, pub any) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// mint runs walcast token and returns the token it printed.
func mint(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	code, stdout, stderr := walcast(t, env, append([]string{"token"}, args...)...)
	if code != exitOK {
		t.Fatalf("walcast token %v: exit %d\n%s", args, code, stderr)
	}
	tok := strings.TrimSpace(stdout)
	if strings.Count(tok, ".") != 2 || strings.ContainsAny(tok, " \n") {
		t.Fatalf("walcast token printed %q, want one JWT", stdout)
	}
	if !strings.Contains(stderr, "for development only") {
		t.Fatalf("walcast token did not warn on standard error: %q", stderr)
	}
	return tok
}

// TestTokenRequiresDev: without --dev the command refuses, says where
// production tokens come from and what to pass; the acknowledgement cannot
// come from the environment.
func TestTokenRequiresDev(t *testing.T) {
	env := map[string]string{"WALCAST_JWT_SECRET": tokenTestSecret, "WALCAST_DEV": "true"}
	code, stdout, stderr := walcast(t, env, "token", "--topic", "public.orders")
	if code != exitUsage || stdout != "" {
		t.Fatalf("exit %d, stdout %q; want 2 and no token", code, stdout)
	}
	for _, want := range []string{"refusing to mint without --dev", "application's auth server", "walcast token --dev --topic"} {
		if !strings.Contains(stderr, want) {
			t.Fatalf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}

// TestTokenHS256Claims: a token minted with the node's secret (read from
// WALCAST_JWT_SECRET, as walcast sync reads it) passes the node's own
// verification with the claims given, and only for the node's audience and
// issuer when it requires them.
func TestTokenHS256Claims(t *testing.T) {
	before := time.Now()
	env := map[string]string{"WALCAST_JWT_SECRET": tokenTestSecret, "WALCAST_JWT_AUDIENCE": "app", "WALCAST_JWT_ISSUER": "dev-issuer"}
	tok := mint(t, env, "--dev", "--topic", "public.orders,public.customers", "--topic", "public.items",
		"--tenant", "acme", "--snapshot", "--ttl", "10m", "--sub", "alice")
	auth, err := syncnode.NewAuthenticator(syncnode.AuthConfig{Secret: []byte(tokenTestSecret), Audience: "app", Issuer: "dev-issuer"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := auth.Verify(tok)
	if err != nil {
		t.Fatalf("the node's verification refused the token: %v", err)
	}
	if !slices.Equal(c.Topics, []string{"public.orders", "public.customers", "public.items"}) || c.Tenant != "acme" || !c.Snapshot || c.Subject != "alice" {
		t.Fatalf("claims %+v", c)
	}
	if exp := c.ExpiresAt.Time; exp.Before(before.Add(10*time.Minute-time.Second)) || exp.After(time.Now().Add(10*time.Minute)) {
		t.Fatalf("exp %v, want 10m after %v", exp, before)
	}
	// Another secret, or a node that requires another audience, refuses it.
	other, err := syncnode.NewHMACAuth([]byte("another-secret-0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Verify(tok); err == nil {
		t.Fatal("a node with another secret accepted the token")
	}
	strict, err := syncnode.NewAuthenticator(syncnode.AuthConfig{Secret: []byte(tokenTestSecret), Audience: "other-app"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strict.Verify(tok); err == nil {
		t.Fatal("a node requiring another audience accepted the token")
	}

	// Defaults: an hour, subject "dev", unscoped, no snapshots.
	tok = mint(t, map[string]string{"WALCAST_JWT_SECRET": tokenTestSecret}, "--dev", "--topic", "*")
	plain, err := syncnode.NewHMACAuth([]byte(tokenTestSecret))
	if err != nil {
		t.Fatal(err)
	}
	c, err = plain.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Allows("public.anything") || c.Tenant != "" || c.Snapshot || c.Subject != "dev" ||
		c.ExpiresAt.Time.Sub(c.IssuedAt.Time) != time.Hour {
		t.Fatalf("default claims %+v", c)
	}
}

// TestTokenPrivateKeys: a token signed with a private key file passes the
// node's verification with the public half (--jwt-public-key-file) for RSA
// and P-256 keys; other keys get a clear refusal.
func TestTokenPrivateKeys(t *testing.T) {
	dir := t.TempDir()
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecDER, err := x509.MarshalECPrivateKey(ecKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, file string
		pub        any
		alg        string
	}{
		{"RSA PKCS #8", writePEM(t, dir, "rsa8.pem", "PRIVATE KEY", pkcs8(t, rsaKey)), &rsaKey.PublicKey, "RS256"},
		{"RSA PKCS #1", writePEM(t, dir, "rsa1.pem", "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaKey)), &rsaKey.PublicKey, "RS256"},
		{"P-256 SEC 1", writePEM(t, dir, "ec.pem", "EC PRIVATE KEY", ecDER), &ecKey.PublicKey, "ES256"},
		{"P-256 PKCS #8", writePEM(t, dir, "ec8.pem", "PRIVATE KEY", pkcs8(t, ecKey)), &ecKey.PublicKey, "ES256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := walcast(t, nil, "token", "--dev", "--jwt-private-key-file", tc.file, "--topic", "public.orders", "--tenant", "t1")
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if !strings.Contains(stderr, tc.alg) {
				t.Fatalf("stderr does not name %s: %s", tc.alg, stderr)
			}
			auth, err := syncnode.NewPublicKeyAuth(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pkix(t, tc.pub)}))
			if err != nil {
				t.Fatal(err)
			}
			c, err := auth.Verify(strings.TrimSpace(stdout))
			if err != nil {
				t.Fatalf("the node's verification refused the token: %v", err)
			}
			if !c.Allows("public.orders") || c.Allows("public.other") || c.Tenant != "t1" {
				t.Fatalf("claims %+v", c)
			}
		})
	}

	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"missing file", []string{"--jwt-private-key-file", filepath.Join(dir, "nope.pem")}, []string{"nope.pem", "cannot read it", "no such file"}},
		{"not PEM", []string{"--jwt-private-key-file", garbage}, []string{"no PEM block", "PEM private key"}},
		{"public key", []string{"--jwt-private-key-file", writePEM(t, dir, "pub.pem", "PUBLIC KEY", pkix(t, &ecKey.PublicKey))}, []string{"not a private key"}},
		{"Ed25519", []string{"--jwt-private-key-file", writePEM(t, dir, "ed.pem", "PRIVATE KEY", pkcs8(t, edKey))}, []string{"Ed25519", "RSA or ECDSA"}},
		{"P-384 without kid", []string{"--jwt-private-key-file", writePEM(t, dir, "p384.pem", "PRIVATE KEY", pkcs8(t, p384))}, []string{"ES384", "JWKS", "--kid"}},
		{"short secret", []string{"--jwt-secret", "short"}, []string{"would refuse this key", "at least 16"}},
		{"both keys", []string{"--jwt-secret", tokenTestSecret, "--jwt-private-key-file", garbage}, []string{"not both"}},
		{"no key", nil, []string{"--jwt-secret (or WALCAST_JWT_SECRET) or --jwt-private-key-file is required"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := walcast(t, nil, append([]string{"token", "--dev", "--topic", "public.orders"}, tc.args...)...)
			if code != exitUsage || stdout != "" {
				t.Fatalf("exit %d, stdout %q; want 2 and no token\n%s", code, stdout, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Fatalf("stderr lacks %q:\n%s", w, stderr)
				}
			}
		})
	}

	// A key file on the command line wins over the secret of a node's
	// exported environment, and the other way round.
	code, _, stderr := walcast(t, map[string]string{"WALCAST_JWT_SECRET": tokenTestSecret}, "token", "--dev", "--topic", "public.orders",
		"--jwt-private-key-file", filepath.Join(dir, "ec.pem"))
	if code != exitOK || !strings.Contains(stderr, "ES256") {
		t.Fatalf("key file on the command line, secret in the environment: exit %d\n%s", code, stderr)
	}
	code, _, stderr = walcast(t, map[string]string{"WALCAST_JWT_PRIVATE_KEY_FILE": filepath.Join(dir, "ec.pem")}, "token", "--dev", "--topic", "public.orders",
		"--jwt-secret", tokenTestSecret)
	if code != exitOK || !strings.Contains(stderr, "HS256") {
		t.Fatalf("secret on the command line, key file in the environment: exit %d\n%s", code, stderr)
	}

	// A P-384 key with a kid signs ES384, for a node with a JWKS.
	code, stdout, stderr := walcast(t, nil, "token", "--dev", "--topic", "public.orders", "--kid", "k1",
		"--jwt-private-key-file", filepath.Join(dir, "p384.pem"))
	if code != exitOK || !strings.Contains(stderr, "ES384") || stdout == "" {
		t.Fatalf("P-384 with --kid: exit %d\n%s", code, stderr)
	}
}

// TestTokenUsageErrors: flags that make no usable token are refused.
func TestTokenUsageErrors(t *testing.T) {
	env := map[string]string{"WALCAST_JWT_SECRET": tokenTestSecret}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--dev"}, "--topic is required"},
		{[]string{"--dev", "--topic", "orders"}, `--topic "orders" is not an entity`},
		{[]string{"--dev", "--topic", "public.orders", "--ttl", "0s"}, "--ttl must be positive"},
		{[]string{"--dev", "--topic", "public.orders", "--sub", ""}, "--sub must not be empty"},
	} {
		code, _, stderr := walcast(t, env, append([]string{"token"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Fatalf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

// TestTokenAcceptedBySyncNode: real sync nodes, one with --jwt-secret and
// one with --jwt-public-key-file, accept the tokens walcast token mints for
// their keys, for the topics granted and no others.
func TestTokenAcceptedBySyncNode(t *testing.T) {
	url := pgtest.NewDatabase(t)
	ns := natstest.Start(t)
	dir := t.TempDir()
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := writePEM(t, dir, "key.pem", "PRIVATE KEY", pkcs8(t, ecKey))
	pubFile := writePEM(t, dir, "pub.pem", "PUBLIC KEY", pkix(t, &ecKey.PublicKey))

	startNode := func(keyArgs ...string) string {
		args := append([]string{"sync", "--nats-url", ns.URL(), "--journal-url", url, "--listen", "127.0.0.1:0",
			"--http-listen", "127.0.0.1:0", "--cursor-secret", string(cursorSecret), "--log-format", "json"}, keyArgs...)
		node := startWalcast(t, args...)
		listenRe := regexp.MustCompile(`"listen":"ws://([^"]+)/v1/socket"`)
		var addr string
		waitUntil(t, "sync listening", 30*time.Second, func() bool {
			if m := listenRe.FindStringSubmatch(node.log()); m != nil {
				addr = m[1]
			}
			return addr != "" && strings.HasPrefix(node.readyz(), "ready")
		})
		return "http://" + addr
	}
	status := func(base, tok, topic string) int {
		t.Helper()
		req, err := http.NewRequest("GET", base+"/v1/changes?topic="+topic, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	hsNode := startNode("--jwt-secret", syncJWTSecret)
	esNode := startNode("--jwt-public-key-file", pubFile)
	hsTok := mint(t, map[string]string{"WALCAST_JWT_SECRET": syncJWTSecret}, "--dev", "--topic", "public.items")
	esTok := mint(t, nil, "--dev", "--topic", "public.items", "--jwt-private-key-file", keyFile)
	for _, tc := range []struct {
		name, node, tok, topic string
		want                   int
	}{
		{"HS256 granted topic", hsNode, hsTok, "public.items", http.StatusOK},
		{"HS256 other topic", hsNode, hsTok, "public.other", http.StatusForbidden},
		{"ES256 granted topic", esNode, esTok, "public.items", http.StatusOK},
		{"ES256 other topic", esNode, esTok, "public.other", http.StatusForbidden},
		{"ES256 token at the HS256 node", hsNode, esTok, "public.items", http.StatusUnauthorized},
		{"HS256 token at the ES256 node", esNode, hsTok, "public.items", http.StatusUnauthorized},
	} {
		if got := status(tc.node, tc.tok, tc.topic); got != tc.want {
			t.Fatalf("%s: GET /v1/changes answered %d, want %d", tc.name, got, tc.want)
		}
	}
}
