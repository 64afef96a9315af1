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

// TestTokensBounded: a name whose escaped form passes MaxTokenBytes becomes
// "~" + hex SHA-256, which no escaped name can equal; every subject stays
// within MaxSubjectBytes.
func TestTokensBounded(t *testing.T) {
	long := strings.Repeat("ü", 5000)
	tok := Token(long)
	if !IsHashedToken(tok) || len(tok) != 65 || strings.ContainsAny(tok, ".*> %") {
		t.Fatalf("Token(long) = %q", tok)
	}
	if Token(long) != tok || Token(long+"x") == tok {
		t.Fatal("hashed tokens are not a function of the name")
	}
	// '~' is escaped, so an escaped name never starts like a hashed token.
	if got := Token(tok); got == tok || IsHashedToken(got) {
		t.Fatalf("Token(%q) = %q collides with a hashed token", tok, got)
	}
	if _, ok := UnescapeToken(tok); ok {
		t.Fatal("UnescapeToken accepted a hashed token")
	}
	// At the boundary: 192 escaped bytes stay escaped, 193 are hashed.
	if got := Token(strings.Repeat("a", MaxTokenBytes)); got != strings.Repeat("a", MaxTokenBytes) {
		t.Fatalf("a token of MaxTokenBytes was hashed: %q", got)
	}
	if got := Token(strings.Repeat(".", MaxTokenBytes/3) + "a"); !IsHashedToken(got) {
		t.Fatalf("a %d-byte escaped token was kept", len(EscapeToken(strings.Repeat(".", MaxTokenBytes/3)+"a")))
	}
	// An identifier of PostgreSQL's maximum length, all multi-byte, is kept.
	if got := Token(strings.Repeat("é", 31) + "x"); IsHashedToken(got) {
		t.Fatal("a 63-byte identifier was hashed")
	}
	prefix := strings.Repeat("p", MaxPrefixBytes)
	if err := CheckPrefix(prefix); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", prefix + "p", "a..b", ".a", "a b", "a.*", "a.>"} {
		if CheckPrefix(bad) == nil {
			t.Errorf("CheckPrefix(%q) accepted", bad)
		}
	}
	huge := strings.Repeat("\x00", 1<<16)
	for _, s := range []string{
		Subject(prefix, decoder.OpInsert, decoder.EntityName(huge, huge), huge, true),
		Subject(prefix, decoder.OpMessage, huge, "", false),
		EntitySubjects(prefix, decoder.EntityName(huge, huge)),
	} {
		if len(s) > MaxSubjectBytes+2 || strings.Count(s, ".") > 4 {
			t.Errorf("subject of %d bytes: %.100q", len(s), s)
		}
	}
	if TenantToken("", false) != NoTenantToken || TenantToken("", true) != "%" || TenantToken("_", true) != "%5F" {
		t.Fatal("no tenant, empty tenant and \"_\" must be three tokens")
	}
	if TenantToken("acme ", true) == TenantToken("acme", true) {
		t.Fatal("a trailing space must change the tenant token")
	}
}
