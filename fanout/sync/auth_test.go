package sync

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func pemPublic(t *testing.T, pub any) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func TestAuthenticatorMethods(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	claims := Claims{Topics: []string{"public.orders"}, Tenant: "acme",
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}}
	sign := func(m jwt.SigningMethod, key any) string {
		s, err := jwt.NewWithClaims(m, claims).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	rsaAuth, err := NewPublicKeyAuth(pemPublic(t, &rsaKey.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	ecAuth, err := NewPublicKeyAuth(pemPublic(t, &ecKey.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	hmacAuth, _ := NewHMACAuth(syncJWTSecret)

	rs, es, hs := sign(jwt.SigningMethodRS256, rsaKey), sign(jwt.SigningMethodES256, ecKey), sign(jwt.SigningMethodHS256, syncJWTSecret)
	if c, err := rsaAuth.Verify(rs); err != nil || c.Tenant != "acme" || !c.Allows("public.orders") || c.Allows("public.items") {
		t.Fatalf("RS256: %+v %v", c, err)
	}
	if _, err := ecAuth.Verify(es); err != nil {
		t.Fatalf("ES256: %v", err)
	}
	// Algorithm confusion: an HS256 token never passes a public-key
	// authenticator, nor an RS256 token the HMAC one.
	for _, tc := range []struct {
		a   *Authenticator
		tok string
	}{{rsaAuth, hs}, {ecAuth, rs}, {hmacAuth, rs}, {rsaAuth, es}} {
		if _, err := tc.a.Verify(tc.tok); err == nil {
			t.Fatal("token of another algorithm accepted")
		}
	}
	if _, err := NewPublicKeyAuth([]byte("not a key")); err == nil {
		t.Fatal("garbage key accepted")
	}
	if _, err := NewHMACAuth([]byte("short")); err == nil {
		t.Fatal("short secret accepted")
	}
	// "*" grants every topic.
	c := Claims{Topics: []string{"*"}}
	if !c.Allows("any.thing") {
		t.Fatal("* does not grant")
	}
}
