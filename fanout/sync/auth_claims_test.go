package sync

import (
	"strconv"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// TestTokenTimeClaimsMustBeNumbers: exp, nbf and iat are JSON numbers
// (RFC 7519 NumericDate); one written as a string fails the token, as a
// wrong-type claim does. Before, "exp":"99999999999" was read as a time
// (golang-jwt reads dates through json.Number, which takes quoted numbers).
func TestTokenTimeClaimsMustBeNumbers(t *testing.T) {
	auth, err := NewHMACAuth(syncJWTSecret)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Unix()
	good := authSign(t, jwt.SigningMethodHS256, syncJWTSecret, "", authClaims(map[string]any{"nbf": now - 10, "iat": now - 10}))
	if _, err := auth.Verify(good); err != nil {
		t.Fatalf("numeric times: %v", err)
	}
	for _, extra := range []map[string]any{
		{"exp": strconv.FormatInt(now+3600, 10)},
		{"exp": "9999999999"},
		{"nbf": strconv.FormatInt(now-10, 10)},
		{"iat": strconv.FormatInt(now-10, 10)},
		{"exp": true},
		{"exp": []int64{now + 3600}},
	} {
		tok := authSign(t, jwt.SigningMethodHS256, syncJWTSecret, "", authClaims(extra))
		if c, err := auth.Verify(tok); err == nil {
			t.Fatalf("claims %v accepted: %+v", extra, c)
		}
	}
}
