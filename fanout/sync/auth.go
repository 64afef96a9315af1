package sync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.opentelemetry.io/otel/metric"
)

// Claims are what a socket's token grants (DESIGN §6): the subject, the
// entities it may read (Topics; "*" for all) and, optionally, the one tenant
// it is scoped to. A token without a tenant is unscoped: it sees only rows
// with no tenant.
//
// Claims decode with exact key names (UnmarshalJSON): "Topics" or "TENANT"
// are unknown claims, never topics or a tenant.
type Claims struct {
	Topics []string `json:"topics"`
	Tenant string   `json:"tenant,omitempty"`
	// Snapshot allows "snapshot":true subscriptions and GET /v1/snapshot
	// (the claim "snapshot": true).
	Snapshot bool `json:"snapshot,omitempty"`
	jwt.RegisteredClaims
}

// UnmarshalJSON decodes the claims a token carries by their exact names.
// encoding/json alone matches keys case-insensitively, which would let a
// token's "Topics" or "TENANT" (which an issuer may copy from elsewhere
// without meaning them as grants) be read as the grants. A claim of the
// wrong JSON type fails the token; null is the same as absent.
func (c *Claims) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*c = Claims{}
	field := func(key string, dst any) error {
		raw, ok := m[key]
		if !ok || string(raw) == "null" {
			return nil
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			return fmt.Errorf("claim %q: %w", key, err)
		}
		return nil
	}
	date := func(key string) (*jwt.NumericDate, error) {
		raw, ok := m[key]
		if !ok || string(raw) == "null" {
			return nil, nil
		}
		// jwt.NumericDate reads through json.Number, which takes a
		// string holding a number ("exp":"99999999999") as well: a time
		// claim must be a JSON number (RFC 7519 §2, NumericDate).
		if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
			return nil, fmt.Errorf("claim %q: not a JSON number (seconds since the epoch)", key)
		}
		d := new(jwt.NumericDate)
		return d, field(key, d)
	}
	var err error
	errs := []error{
		field("topics", &c.Topics),
		field("tenant", &c.Tenant),
		field("snapshot", &c.Snapshot),
		field("sub", &c.Subject),
		field("iss", &c.Issuer),
		field("jti", &c.ID),
		field("aud", &c.Audience),
	}
	if c.ExpiresAt, err = date("exp"); err != nil {
		errs = append(errs, err)
	}
	if c.NotBefore, err = date("nbf"); err != nil {
		errs = append(errs, err)
	}
	if c.IssuedAt, err = date("iat"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Allows reports whether the claims grant topic.
func (c *Claims) Allows(topic string) bool {
	return slices.Contains(c.Topics, "*") || slices.Contains(c.Topics, topic)
}

// DefaultJWTLeeway is the clock skew allowed on exp, nbf and iat, and how
// long after exp a socket is closed.
const DefaultJWTLeeway = 30 * time.Second

// AuthConfig configures an Authenticator. At least one key source is
// required; a static key (Secret or PublicKeyPEM, not both) and a JWKS
// (JWKSFile or JWKSURL, not both) may be combined.
type AuthConfig struct {
	// Secret verifies HS256 tokens (at least 16 bytes).
	Secret []byte
	// PublicKeyPEM verifies RS256 (RSA key) or ES256 (P-256 key) tokens.
	PublicKeyPEM []byte
	// JWKSFile holds a JSON Web Key Set ({"keys":[…]}) of RSA and EC public
	// keys selected by the token's kid. The file is re-read when its
	// modification time or size changes (checked at most once per
	// JWKSPollInterval, on the verify path); a file that no longer parses
	// keeps the previous keys and is logged.
	JWKSFile string
	// JWKSURL is where a JSON Web Key Set is fetched from: https://, or
	// http:// to a loopback host (127.0.0.1, ::1, localhost) only. It is
	// fetched when the Authenticator is built (a failure there fails
	// OpenAuthenticator), then again every JWKSRefresh and when a token
	// names a kid the set lacks (at most once per JWKSRefetchMinInterval).
	// A fetch that fails keeps the keys in force and is logged once per
	// run of failures. Each fetch is bounded by 10 s, 3 redirects and
	// maxJWKSBytes, and must answer 200. The Authenticator then owns a
	// goroutine: Close it.
	JWKSURL string
	// JWKSRefresh is how often JWKSURL is fetched again. Zero means
	// DefaultJWKSRefresh; negative is an error. Cache-Control is not
	// consulted (see auth_jwksurl.go).
	JWKSRefresh time.Duration
	// Meter, when set, receives the JWKSURL fetch metrics
	// (walcast.sync.jwks.fetches by outcome, walcast.sync.jwks.age).
	Meter metric.Meter
	// Audience, when set, must be one of the token's aud values.
	Audience string
	// Issuer, when set, must equal the token's iss.
	Issuer string
	// Leeway is the clock skew allowed on exp, nbf and iat, and the grace a
	// socket gets past its token's exp. Zero means DefaultJWTLeeway;
	// negative means none.
	Leeway time.Duration
	// Logger receives JWKS reloads and reload failures; default discards.
	Logger *slog.Logger
}

// JWKSPollInterval is how often the JWKS file's modification time and size
// are checked.
const JWKSPollInterval = time.Second

// Authenticator verifies the JWTs presented at the handshake and in refresh
// frames. Each key has exactly one algorithm, fixed by its type (HS256 for
// the secret, RS256 or ES256/384/512 by curve for public keys, or the JWK's
// own "alg"): a token signed with another algorithm is refused, so no
// public key is ever used as an HMAC secret. exp is required; nbf and iat
// are checked when present, with the leeway. Its methods are safe for
// concurrent use. An Authenticator with a JWKSURL owns a refresher
// goroutine until Close.
type Authenticator struct {
	static   *verifyKey // nil when only a JWKS is configured
	audience string
	issuer   string
	leeway   time.Duration
	log      *slog.Logger

	jwksFile string
	jwks     atomic.Pointer[jwksState]
	checked  atomic.Int64 // time.Now().UnixNano() of the last stat of jwksFile
	reloadMu sync.Mutex   // serializes reloads
	// statFailing is set while jwksFile cannot be stat'ed (logged once).
	statFailing atomic.Bool

	remote *jwksRemote // nil without a JWKSURL
}

// verifyKey is a key and the one algorithm it verifies.
type verifyKey struct {
	alg string
	key any
}

// NewHMACAuth verifies HS256 tokens signed with secret.
func NewHMACAuth(secret []byte) (*Authenticator, error) {
	return NewAuthenticator(AuthConfig{Secret: secret})
}

// NewPublicKeyAuth verifies RS256 or ES256 tokens against a PEM public key
// (an RSA or ECDSA key in PKIX, or a certificate's key).
func NewPublicKeyAuth(pemBytes []byte) (*Authenticator, error) {
	return NewAuthenticator(AuthConfig{PublicKeyPEM: pemBytes})
}

// NewAuthenticator is OpenAuthenticator with a context that never ends:
// with a JWKSURL, only Close stops its refresher.
func NewAuthenticator(cfg AuthConfig) (*Authenticator, error) {
	return OpenAuthenticator(context.Background(), cfg)
}

// OpenAuthenticator builds an Authenticator from cfg. A JWKS file must
// exist and parse now; a JWKS URL must be fetched now, within ctx and the
// fetch timeout, and parse. The refresher of a JWKS URL runs until Close
// is called or ctx ends, whichever is first; the keys fetched last stay in
// force after that.
func OpenAuthenticator(ctx context.Context, cfg AuthConfig) (*Authenticator, error) {
	a := &Authenticator{audience: cfg.Audience, issuer: cfg.Issuer, leeway: cfg.Leeway, log: cfg.Logger, jwksFile: cfg.JWKSFile}
	switch {
	case a.leeway == 0:
		a.leeway = DefaultJWTLeeway
	case a.leeway < 0:
		a.leeway = 0
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.Secret != nil && cfg.PublicKeyPEM != nil:
		return nil, errors.New("jwt: give a secret or a public key, not both (fix: set one of --jwt-secret and --jwt-public-key-file)")
	case cfg.Secret != nil:
		if len(cfg.Secret) < 16 {
			return nil, fmt.Errorf("jwt secret is %d bytes, want at least 16 (fix: set --jwt-secret to a random string of at least 32 characters)", len(cfg.Secret))
		}
		a.static = &verifyKey{alg: "HS256", key: append([]byte(nil), cfg.Secret...)}
	case cfg.PublicKeyPEM != nil:
		if k, err := jwt.ParseRSAPublicKeyFromPEM(cfg.PublicKeyPEM); err == nil {
			a.static = &verifyKey{alg: "RS256", key: k}
		} else if k, err := jwt.ParseECPublicKeyFromPEM(cfg.PublicKeyPEM); err == nil {
			a.static = &verifyKey{alg: "ES256", key: k}
		} else {
			return nil, errors.New("jwt public key: not a PEM RSA or ECDSA public key (fix: point --jwt-public-key-file at a PEM file holding the issuer's public key)")
		}
	}
	if cfg.JWKSFile != "" && cfg.JWKSURL != "" {
		return nil, errors.New("jwks: give a key set file or a URL, not both (fix: set one of --jwks-file and --jwks-url)")
	}
	if a.jwksFile != "" {
		st, err := loadJWKS(a.jwksFile)
		if err != nil {
			return nil, fmt.Errorf("%w (fix: point --jwks-file at the issuer's JSON Web Key Set)", err)
		}
		a.jwks.Store(st)
		a.checked.Store(time.Now().UnixNano())
	}
	if a.static == nil && a.jwksFile == "" && cfg.JWKSURL == "" {
		return nil, errors.New("jwt: no key (fix: set --jwt-secret, --jwt-public-key-file, --jwks-file or --jwks-url)")
	}
	if cfg.JWKSURL != "" {
		r, err := newJWKSRemote(cfg.JWKSURL, cfg.JWKSRefresh, a.log, &a.jwks)
		if err != nil {
			return nil, err
		}
		if err := r.first(ctx); err != nil {
			return nil, err
		}
		if cfg.Meter != nil {
			if err := r.register(cfg.Meter); err != nil {
				r.client.CloseIdleConnections()
				return nil, fmt.Errorf("jwks metrics: %w", err)
			}
		}
		r.start(ctx)
		a.remote = r
	}
	return a, nil
}

// Close stops the JWKS URL refresher and waits for it to return; a fetch
// in flight is abandoned. Verify keeps working with the keys in force.
// Close is safe to call more than once, and is a no-op without a JWKSURL.
func (a *Authenticator) Close() {
	if a.remote != nil {
		a.remote.close()
	}
}

// Leeway is the clock skew allowed on a token's times.
func (a *Authenticator) Leeway() time.Duration { return a.leeway }

// errNoToken: the request carries no token at all.
var errNoToken = errors.New("no token: send Authorization: Bearer <jwt> or the access_token query parameter")

// Verify parses and checks a token. The error is fit for the client: it
// never echoes the token. With a JWKSURL, a token whose kid the set lacks
// may wait for one fetch of the set (at most twice the fetch timeout; see
// jwksRemote.refetch) and is checked again against the keys fetched.
func (a *Authenticator) Verify(token string) (*Claims, error) {
	if token == "" {
		return nil, errNoToken
	}
	a.maybeReloadJWKS()
	c, err := a.parse(token)
	if err != nil && a.remote != nil && keyMiss(err) {
		if kid := tokenKid(token); kid != "" && !a.hasKid(kid) && a.remote.refetch() && a.hasKid(kid) {
			c, err = a.parse(token)
		}
	}
	if err != nil {
		return nil, clientError(err)
	}
	return c, nil
}

// keyMiss reports whether a parse failed for want of the right key (kid
// unknown, algorithm not one of the keys', signature not the key's), as
// opposed to the token's claims.
func keyMiss(err error) bool {
	var ke *keyError
	return errors.As(err, &ke) || errors.Is(err, jwt.ErrTokenSignatureInvalid) || errors.Is(err, jwt.ErrTokenUnverifiable)
}

// hasKid reports whether the JWKS in force holds kid.
func (a *Authenticator) hasKid(kid string) bool {
	st := a.jwks.Load()
	if st == nil {
		return false
	}
	_, ok := st.keys[kid]
	return ok
}

// parse verifies token against the keys in force; its error is jwt's.
func (a *Authenticator) parse(token string) (*Claims, error) {
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(a.methods()), jwt.WithExpirationRequired(), jwt.WithIssuedAt(), jwt.WithLeeway(a.leeway),
	}
	if a.audience != "" {
		opts = append(opts, jwt.WithAudience(a.audience))
	}
	if a.issuer != "" {
		opts = append(opts, jwt.WithIssuer(a.issuer))
	}
	var c Claims
	if _, err := jwt.ParseWithClaims(token, &c, a.key, opts...); err != nil {
		return nil, err
	}
	return &c, nil
}

// clientError turns a parse error into one fit for the client.
func clientError(err error) error {
	var ke *keyError
	switch {
	case errors.As(err, &ke):
		return ke
	case errors.Is(err, jwt.ErrTokenExpired):
		return errors.New("token expired")
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return errors.New("token not valid yet (nbf or iat in the future)")
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return errors.New("token audience not accepted")
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return errors.New("token issuer not accepted")
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return errors.New("token signature invalid")
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return errors.New("token lacks exp")
	}
	return errors.New("token invalid")
}

// keyError is a token whose key cannot be chosen; its text is fit for the
// client.
type keyError struct{ msg string }

func (e *keyError) Error() string { return e.msg }

// methods lists every algorithm some configured key verifies.
func (a *Authenticator) methods() []string {
	var ms []string
	if a.static != nil {
		ms = append(ms, a.static.alg)
	}
	if st := a.jwks.Load(); st != nil {
		for _, k := range st.keys {
			if !slices.Contains(ms, k.alg) {
				ms = append(ms, k.alg)
			}
		}
	}
	return ms
}

// key chooses the token's key: the JWKS key of its kid; else the static
// key; else, without a kid, the JWKS's only key. The token's alg must be
// that key's algorithm.
func (a *Authenticator) key(t *jwt.Token) (any, error) {
	kid, _ := t.Header["kid"].(string)
	var k *verifyKey
	st := a.jwks.Load()
	if st != nil && kid != "" {
		if jk, ok := st.keys[kid]; ok {
			k = &jk
		}
	}
	if k == nil && a.static != nil {
		k = a.static
	}
	if k == nil && st != nil && kid == "" && len(st.keys) == 1 {
		for _, jk := range st.keys {
			k = &jk
		}
	}
	switch {
	case k == nil && kid == "":
		return nil, &keyError{"token has no kid (the node verifies tokens by key id)"}
	case k == nil:
		return nil, &keyError{"token key id unknown"}
	case t.Method.Alg() != k.alg:
		return nil, &keyError{"token algorithm does not match its key"}
	}
	return k.key, nil
}

// tokenFromRequest takes the token from the Authorization header or the
// access_token query parameter. A query-string token is a secret in the
// URL: nothing the node logs carries r.URL unredacted (see redactedURL).
func tokenFromRequest(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
			return strings.TrimSpace(h[7:])
		}
		return ""
	}
	return r.URL.Query().Get("access_token")
}
