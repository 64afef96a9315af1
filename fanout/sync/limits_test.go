package sync

import (
	"net/http"
	"net/netip"
	"testing"
	"time"
)

// TestClientKeyForwardedFor: X-Forwarded-For is read only from trusted
// proxies, from the right, stopping at the first hop that is not a trusted
// proxy (or at a malformed entry).
func TestClientKeyForwardedFor(t *testing.T) {
	n := &Node{cfg: Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}}
	cases := []struct {
		peer string
		xff  []string
		want string
	}{
		{"192.0.2.1:5000", nil, "ip:192.0.2.1"},
		{"192.0.2.1:5000", []string{"203.0.113.7"}, "ip:192.0.2.1"}, // untrusted peer: header ignored
		{"10.1.2.3:5000", nil, "ip:10.1.2.3"},
		{"10.1.2.3:5000", []string{"203.0.113.7"}, "ip:203.0.113.7"},
		{"10.1.2.3:5000", []string{"198.51.100.1, 203.0.113.7"}, "ip:203.0.113.7"}, // a client cannot prepend
		{"10.1.2.3:5000", []string{"198.51.100.1", "203.0.113.7, 10.9.9.9"}, "ip:203.0.113.7"},
		{"10.1.2.3:5000", []string{"10.2.2.2, 10.3.3.3"}, "ip:10.2.2.2"},
		{"10.1.2.3:5000", []string{"203.0.113.7, junk"}, "ip:10.1.2.3"},
		{"10.1.2.3:5000", []string{"2001:db8:1:2:3:4:5:6"}, "ip:2001:db8:1:2::/64"},
		{"[2001:db8::1]:5000", nil, "ip:2001:db8::/64"},
		{"[::ffff:192.0.2.9]:5000", nil, "ip:192.0.2.9"},
	}
	for _, tc := range cases {
		r := &http.Request{RemoteAddr: tc.peer, Header: http.Header{}}
		for _, v := range tc.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if got := n.clientKey(r); got != tc.want {
			t.Errorf("%s %q: %s, want %s", tc.peer, tc.xff, got, tc.want)
		}
	}
}

// TestSyncTrustedProxyPerClientLimit: behind a trusted proxy the
// per-address limits apply to the forwarded client address, so clients
// behind one load balancer do not share one budget.
func TestSyncTrustedProxyPerClientLimit(t *testing.T) {
	e := newSyncEnv(t, func(c *Config) {
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		c.MaxConnectionsPerIP = 2
	})
	tok := token(t, []string{orders}, "", time.Hour)
	via := func(xff string) (int, error) {
		_, resp, err := e.dialFromWith("127.0.0.1", tok, 0, http.Header{"X-Forwarded-For": {xff}})
		if resp == nil {
			return 0, err
		}
		return resp.StatusCode, err
	}
	for range 2 {
		if code, err := via("203.0.113.7"); err != nil {
			t.Fatalf("%d %v", code, err)
		}
	}
	if code, _ := via("198.51.100.1, 203.0.113.7"); code != http.StatusServiceUnavailable {
		t.Fatalf("third socket of 203.0.113.7 (a forged hop prepended): %d", code)
	}
	if code, err := via("203.0.113.8"); err != nil {
		t.Fatalf("another client behind the same proxy: %d %v", code, err)
	}
}
