package sync

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// A JSON Web Key Set served over HTTP, as identity providers publish it
// (the jwks_uri of /.well-known/openid-configuration).
//
// The set is fetched once when the Authenticator is built (a failure there
// is the caller's error: the node does not start without keys), then by one
// refresher goroutine the Authenticator owns: every JWKSRefresh, and on
// demand when a token names a kid the set does not hold, at most once per
// JWKSRefetchMinInterval however many such tokens arrive. A fetch that fails
// leaves the keys in force and is logged once per run of failures.
//
// Cache-Control and Expires are ignored on purpose: the operator's refresh
// interval alone bounds how long a key the issuer removed is still
// accepted, and a key the issuer added is fetched on demand anyway, so a
// long max-age would only delay revocation.

const (
	// DefaultJWKSRefresh is how often a JWKS URL is fetched again when
	// AuthConfig.JWKSRefresh is zero.
	DefaultJWKSRefresh = 5 * time.Minute
	// JWKSRefetchMinInterval is the least time between two fetches asked
	// for by tokens with an unknown kid. A flood of tokens with made-up kids
	// costs the issuer at most one request per interval.
	JWKSRefetchMinInterval = 30 * time.Second
	// jwksFetchTimeout bounds one fetch: connecting, TLS, redirects and
	// reading the body.
	jwksFetchTimeout = 10 * time.Second
	// jwksMaxRedirects is how many redirects a fetch follows.
	jwksMaxRedirects = 3
)

// jwksURLFix is the operator's next step when the set cannot be fetched.
const jwksURLFix = "fix: point --jwks-url at the issuer's key set, usually the jwks_uri of https://<issuer>/.well-known/openid-configuration, and check the node can reach it"

// checkJWKSURL accepts https:// URLs, and http:// only to a loopback host
// (local development and tests): a key set fetched in the clear could be
// replaced on the way by anyone on the path, who could then sign tokens.
func checkJWKSURL(u *url.URL) error {
	switch {
	case u.User != nil:
		return errors.New("carries a user name or password (fix: drop the user:password@ part; a key set is public)")
	case u.Host == "" || u.Hostname() == "":
		return errors.New("has no host (fix: give a full URL, https://issuer.example/.well-known/jwks.json)")
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && isLoopbackHost(u.Hostname()):
		return nil
	case u.Scheme == "http":
		return errors.New("is http:// to a host that is not loopback; keys fetched in the clear can be swapped on the way (fix: use the issuer's https:// URL; http:// is accepted only for 127.0.0.1, ::1 and localhost)")
	}
	return fmt.Errorf("has scheme %q (fix: use the issuer's https:// URL)", u.Scheme)
}

func isLoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && a.Unmap().IsLoopback()
}

// jwksRemote fetches a key set from a URL into the Authenticator's jwks.
// It owns the refresher goroutine (run), started by start and stopped by
// close.
type jwksRemote struct {
	url      string // as configured; it carries no credentials (checkJWKSURL)
	client   *http.Client
	interval time.Duration
	log      *slog.Logger
	keys     *atomic.Pointer[jwksState] // the Authenticator's; stored by first, then by run only

	ctx    context.Context // ends with close or the context given at start
	cancel context.CancelFunc
	kick   chan struct{} // capacity 1: an on-demand fetch is wanted
	done   chan struct{} // closed when run has returned
	once   sync.Once     // close
	reg    metric.Registration

	fetchesOK, fetchesFailed atomic.Int64
	lastGood                 atomic.Int64 // UnixNano of the last successful fetch
	failing                  int          // fetches failed in a row; owned by run
	failingSince             time.Time    // owned by run

	mu sync.Mutex // guards the following fields
	// pending is closed when the fetch that serves the tokens waiting for
	// an unknown kid has ended; nil when no token is waiting. Tokens that
	// arrive while it is set wait for the same fetch.
	pending chan struct{}
	// lastAsked is when a token last started an on-demand fetch.
	lastAsked time.Time
}

func newJWKSRemote(raw string, interval time.Duration, log *slog.Logger, keys *atomic.Pointer[jwksState]) (*jwksRemote, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// Not the *url.Error itself: it quotes the URL, password and all.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("--jwks-url: %w (fix: give it as https://issuer.example/.well-known/jwks.json)", err)
	}
	if err := checkJWKSURL(u); err != nil {
		return nil, fmt.Errorf("--jwks-url %s %w", u.Redacted(), err)
	}
	switch {
	case interval == 0:
		interval = DefaultJWKSRefresh
	case interval < 0:
		return nil, fmt.Errorf("jwks refresh interval %v is negative (fix: set --jwks-refresh to a positive duration, default %v)", interval, DefaultJWKSRefresh)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	r := &jwksRemote{url: raw, interval: interval, log: log, keys: keys,
		kick: make(chan struct{}, 1), done: make(chan struct{})}
	r.client = &http.Client{Transport: tr, Timeout: jwksFetchTimeout, CheckRedirect: checkJWKSRedirect}
	return r, nil
}

// checkJWKSRedirect follows at most jwksMaxRedirects redirects, each to a
// URL checkJWKSURL accepts, and never from https:// down to http://.
func checkJWKSRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > jwksMaxRedirects {
		return fmt.Errorf("more than %d redirects", jwksMaxRedirects)
	}
	if err := checkJWKSURL(req.URL); err != nil {
		return fmt.Errorf("redirect to %s refused: it %w", req.URL.Redacted(), err)
	}
	if via[0].URL.Scheme == "https" && req.URL.Scheme != "https" {
		return fmt.Errorf("redirect from https:// to %s refused", req.URL.Redacted())
	}
	return nil
}

// fetch GETs the set: status 200, at most maxJWKSBytes, and a set
// parseJWKS accepts.
func (r *jwksRemote) fetch(ctx context.Context) (*jwksState, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("jwks: %w", err) // *url.Error names the URL
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("jwks %s: HTTP %s, want 200 OK", r.url, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("jwks %s: reading the body: %w", r.url, err)
	}
	if len(b) > maxJWKSBytes {
		return nil, fmt.Errorf("jwks %s: body larger than %d bytes", r.url, maxJWKSBytes)
	}
	keys, err := parseJWKS(b)
	if err != nil {
		return nil, fmt.Errorf("jwks %s: %w", r.url, err)
	}
	return &jwksState{keys: keys}, nil
}

// first fetches the set at start; its error is fit for the operator.
func (r *jwksRemote) first(ctx context.Context) error {
	st, err := r.fetch(ctx)
	if err != nil {
		r.fetchesFailed.Add(1)
		r.client.CloseIdleConnections()
		return fmt.Errorf("%w (%s)", err, jwksURLFix)
	}
	r.fetchesOK.Add(1)
	r.lastGood.Store(time.Now().UnixNano())
	r.keys.Store(st)
	r.log.Info("JWKS fetched", "url", r.url, "keys", len(st.keys), "refresh", r.interval)
	return nil
}

// start runs the refresher until close is called or ctx ends.
func (r *jwksRemote) start(ctx context.Context) {
	r.ctx, r.cancel = context.WithCancel(ctx)
	go r.run()
}

// close stops the refresher and waits for it; a fetch in flight is
// abandoned. The keys in force stay. Safe to call more than once.
func (r *jwksRemote) close() {
	r.once.Do(func() {
		r.cancel()
		<-r.done
		r.client.CloseIdleConnections()
		if r.reg != nil {
			_ = r.reg.Unregister()
		}
	})
}

// run is the refresher: one fetch at a time, on the interval or when a
// token asks (kick); the next interval counts from the last fetch.
func (r *jwksRemote) run() {
	defer close(r.done)
	t := time.NewTimer(r.interval)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		case <-r.kick:
		}
		r.mu.Lock()
		waiting := r.pending
		r.mu.Unlock()
		r.fetchAndStore()
		if waiting != nil {
			r.mu.Lock()
			// This fetch served the waiting tokens, and the kick they
			// sent with it: drop it so it does not cause a second fetch.
			r.pending = nil
			select {
			case <-r.kick:
			default:
			}
			r.mu.Unlock()
			close(waiting)
		}
		if r.ctx.Err() != nil {
			return
		}
		t.Reset(r.interval)
	}
}

// fetchAndStore fetches the set and, if it is good, puts it in force. A
// failure keeps the keys in force; the first failure of a run is logged,
// and so is the success that ends it.
func (r *jwksRemote) fetchAndStore() {
	st, err := r.fetch(r.ctx)
	if err != nil {
		if r.ctx.Err() != nil {
			return // closing: not the issuer's failure
		}
		r.fetchesFailed.Add(1)
		if r.failing == 0 {
			r.failingSince = time.Now()
			r.log.Warn("JWKS fetch failed; keeping the keys fetched before (logged once until a fetch succeeds)",
				"url", r.url, "err", err, "next_try", r.interval)
		}
		r.failing++
		return
	}
	old := r.keys.Load()
	r.keys.Store(st)
	r.fetchesOK.Add(1)
	r.lastGood.Store(time.Now().UnixNano())
	if r.failing > 0 {
		r.log.Info("JWKS fetch succeeded again", "url", r.url, "failed_fetches", r.failing,
			"failing_for", time.Since(r.failingSince).Round(time.Second))
		r.failing = 0
	}
	if added, removed := kidDiff(old, st); len(added)+len(removed) > 0 {
		r.log.Info("JWKS changed", "url", r.url, "keys", len(st.keys), "added", added, "removed", removed)
	} else {
		r.log.Debug("JWKS unchanged", "url", r.url, "keys", len(st.keys))
	}
}

// kidDiff lists the kids of cur missing from old, and those of old missing
// from cur, sorted. A key whose kid stayed but whose material changed is
// neither (issuers rotate by kid).
func kidDiff(old, cur *jwksState) (added, removed []string) {
	var was map[string]verifyKey
	if old != nil {
		was = old.keys
	}
	for kid := range cur.keys {
		if _, ok := was[kid]; !ok {
			added = append(added, kid)
		}
	}
	for kid := range was {
		if _, ok := cur.keys[kid]; !ok {
			removed = append(removed, kid)
		}
	}
	slices.Sort(added)
	slices.Sort(removed)
	return added, removed
}

// refetch asks the refresher for a fetch because a token named a kid the
// set lacks, and waits for it. Tokens arriving while such a fetch is asked
// for or in flight wait for the same one; beyond that, at most one fetch
// per JWKSRefetchMinInterval is asked for, and other callers return false at once.
// The wait is bounded by the fetch timeout (twice: an interval fetch may be
// in flight first) and by close. It reports whether a fetch ended, so the
// caller should look at the keys again.
func (r *jwksRemote) refetch() bool {
	if r.ctx.Err() != nil {
		return false
	}
	r.mu.Lock()
	ch := r.pending
	if ch == nil {
		now := time.Now()
		if !r.lastAsked.IsZero() && now.Sub(r.lastAsked) < JWKSRefetchMinInterval {
			r.mu.Unlock()
			return false
		}
		r.lastAsked = now
		ch = make(chan struct{})
		r.pending = ch
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
	r.mu.Unlock()
	t := time.NewTimer(2 * jwksFetchTimeout)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-r.ctx.Done():
		return false
	case <-t.C:
		return false
	}
}

// register exposes the fetch outcomes and the age of the keys in force.
func (r *jwksRemote) register(meter metric.Meter) error {
	fetches, err := meter.Int64ObservableCounter("walcast.sync.jwks.fetches",
		metric.WithDescription("fetches of the --jwks-url key set, by outcome (ok, error)"))
	if err != nil {
		return err
	}
	age, err := meter.Float64ObservableGauge("walcast.sync.jwks.age", metric.WithUnit("s"),
		metric.WithDescription("seconds since the --jwks-url key set in force was fetched"))
	if err != nil {
		return err
	}
	ok := metric.WithAttributes(attribute.String("outcome", "ok"))
	failed := metric.WithAttributes(attribute.String("outcome", "error"))
	r.reg, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(fetches, r.fetchesOK.Load(), ok)
		o.ObserveInt64(fetches, r.fetchesFailed.Load(), failed)
		if last := r.lastGood.Load(); last != 0 {
			o.ObserveFloat64(age, time.Since(time.Unix(0, last)).Seconds())
		}
		return nil
	}, fetches, age)
	return err
}

// tokenKid is the kid in a compact JWT's header, or "" when it has none
// or the header does not decode. It is read before verification only to
// decide whether the key set is worth fetching again.
func tokenKid(token string) string {
	h, _, ok := strings.Cut(token, ".")
	if !ok || len(h) > 8<<10 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(h)
	if err != nil {
		return ""
	}
	var hdr struct {
		Kid string `json:"kid"`
	}
	if json.Unmarshal(b, &hdr) != nil {
		return ""
	}
	return hdr.Kid
}
