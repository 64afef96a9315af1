package bus

import (
	"strings"
	"testing"

	"github.com/walcast/walcast/decoder"
)

func TestEscapeTokenRoundTripAndShape(t *testing.T) {
	names := []string{"orders", "Mixed Case", "a.b", "*", ">", "a*b>c", "tab\there", "new\nline", "nul\x00byte",
		"ünïcödé", "%", "%41", "_", "", "-", "日本", "a b.c*d>e%f"}
	seen := map[string]string{}
	for _, n := range names {
		tok := EscapeToken(n)
		if tok == "" || strings.ContainsAny(tok, ".*> \t\r\n\x00") || tok == NoTenantToken {
			t.Errorf("EscapeToken(%q) = %q: not a single safe token", n, tok)
		}
		for i := 0; i < len(tok); i++ {
			if tok[i] >= 0x80 {
				t.Errorf("EscapeToken(%q) = %q keeps non-ASCII bytes", n, tok)
				break
			}
		}
		if prev, ok := seen[tok]; ok {
			t.Errorf("%q and %q both escape to %q", prev, n, tok)
		}
		seen[tok] = n
		back, ok := UnescapeToken(tok)
		if !ok || back != n {
			t.Errorf("UnescapeToken(%q) = %q, %v; want %q", tok, back, ok, n)
		}
	}
	for _, bad := range []string{"", "a.b", "%4", "%zz", "a b", "%4g"} {
		if _, ok := UnescapeToken(bad); ok {
			t.Errorf("UnescapeToken(%q) accepted", bad)
		}
	}
}

func TestSubjects(t *testing.T) {
	cases := []struct {
		op        decoder.Op
		entity    string
		tenant    string
		hasTenant bool
		want      string
	}{
		{decoder.OpInsert, "public.orders", "", false, "walcast.change.public.orders._"},
		{decoder.OpUpdate, "public.orders", "acme", true, "walcast.change.public.orders.acme"},
		{decoder.OpDelete, "public.orders", "_", true, "walcast.change.public.orders.%5F"},
		{decoder.OpInsert, decoder.EntityName("we.ird", "t*>"), "a.b", true, "walcast.change.we%2Eird.t%2A%3E.a%2Eb"},
		{decoder.OpTruncate, decoder.EntityName("s p", "ü"), "", false, "walcast.change.s%20p.%C3%BC._"},
		{decoder.OpMessage, "walcast.audit", "", false, "walcast.message.walcast%2Eaudit"},
		{decoder.OpResync, "", "", false, "walcast.resync"},
	}
	for _, c := range cases {
		got := Subject("walcast", c.op, c.entity, c.tenant, c.hasTenant)
		if got != c.want {
			t.Errorf("Subject(%s, %q, %q) = %q, want %q", c.op, c.entity, c.tenant, got, c.want)
		}
		if n := strings.Count(got, "."); c.op != decoder.OpMessage && c.op != decoder.OpResync && n != 4 {
			t.Errorf("subject %q has %d dots, want 4", got, n)
		}
	}
	if got := EntitySubjects("walcast", "public.orders"); got != "walcast.change.public.orders.*" {
		t.Errorf("EntitySubjects = %q", got)
	}
}
