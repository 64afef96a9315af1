package sync

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/golang-jwt/jwt/v5"
)

// Claims are what a socket's token grants (DESIGN §6): the subject, the
// entities it may read (Topics; "*" for all) and, optionally, the one tenant
// it is scoped to. A token without a tenant is unscoped: it sees only rows
// with no tenant.
type Claims struct {
	Topics []string `json:"topics"`
	Tenant string   `json:"tenant,omitempty"`
	jwt.RegisteredClaims
}

// Allows reports whether the claims grant topic.
func (c *Claims) Allows(topic string) bool {
	return slices.Contains(c.Topics, "*") || slices.Contains(c.Topics, topic)
}

// Authenticator verifies the JWTs presented at the handshake: HS256 with a
// shared secret, or RS256/ES256 with a public key. exp is required.
type Authenticator struct {
	key     any
	methods []string
}

// NewHMACAuth verifies HS256 tokens signed with secret.
func NewHMACAuth(secret []byte) (*Authenticator, error) {
	if len(secret) < 16 {
		return nil, fmt.Errorf("jwt secret is %d bytes, want at least 16 (fix: set --jwt-secret to a random string of at least 32 characters)", len(secret))
	}
	return &Authenticator{key: append([]byte(nil), secret...), methods: []string{"HS256"}}, nil
}

// NewPublicKeyAuth verifies RS256 or ES256 tokens against a PEM public key
// (an RSA or ECDSA key in PKIX, or a certificate's key).
func NewPublicKeyAuth(pemBytes []byte) (*Authenticator, error) {
	if k, err := jwt.ParseRSAPublicKeyFromPEM(pemBytes); err == nil {
		return &Authenticator{key: k, methods: []string{"RS256"}}, nil
	}
	if k, err := jwt.ParseECPublicKeyFromPEM(pemBytes); err == nil {
		return &Authenticator{key: k, methods: []string{"ES256"}}, nil
	}
	return nil, errors.New("jwt public key: not a PEM RSA or ECDSA public key (fix: point --jwt-public-key-file at a PEM file holding the issuer's public key)")
}

// errNoToken: the request carries no token at all.
var errNoToken = errors.New("no token: send Authorization: Bearer <jwt> or the access_token query parameter")

// Verify parses and checks a token. The error is fit for the client: it
// never echoes the token.
func (a *Authenticator) Verify(token string) (*Claims, error) {
	if token == "" {
		return nil, errNoToken
	}
	var c Claims
	_, err := jwt.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return a.key, nil },
		jwt.WithValidMethods(a.methods), jwt.WithExpirationRequired())
	if err != nil {
		switch {
		case errors.Is(err, jwt.ErrTokenExpired):
			return nil, errors.New("token expired")
		case errors.Is(err, jwt.ErrTokenSignatureInvalid):
			return nil, errors.New("token signature invalid")
		case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
			return nil, errors.New("token lacks exp")
		}
		return nil, errors.New("token invalid")
	}
	return &c, nil
}

// tokenFromRequest takes the token from the Authorization header or the
// access_token query parameter.
func tokenFromRequest(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
			return strings.TrimSpace(h[7:])
		}
		return ""
	}
	return r.URL.Query().Get("access_token")
}
