package client

import (
	"context"
	"encoding/base64"
	"fmt"
	"testing"
	"time"
)

// The close-code table (docs/sync.md): ranges decide, standard codes keep
// their meaning.
func TestCloseCodeActions(t *testing.T) {
	for code, want := range map[int]closeAction{
		1000: reconnect, 1001: reconnect, 1006: reconnect, 1013: reconnect,
		CloseShutdown: reconnect, 4099: reconnect,
		CloseTokenExpired: renewToken, 4199: renewToken,
		CloseBadFrame: giveUp, CloseFlood: giveUp, 4499: giveUp, 1008: giveUp,
		4500: reconnect,
	} {
		if got := actionOf(code); got != want {
			t.Errorf("code %d: action %d, want %d", code, got, want)
		}
	}
}

func fakeJWT(payload string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"HS256"}`)) + "." + enc([]byte(payload)) + ".sig"
}

// The refresh is scheduled RefreshBefore ahead of exp, never sooner than
// half the remaining life, and not at all without a TokenFunc or an exp.
func TestTokenRefreshSchedule(t *testing.T) {
	sched := func(life time.Duration, withFunc bool) time.Duration {
		c := &Client{opts: Options{RefreshBefore: 30 * time.Second},
			token: fakeJWT(fmt.Sprintf(`{"exp":%d}`, time.Now().Add(life).Unix()))}
		if withFunc {
			c.opts.TokenFunc = func(context.Context) (string, error) { return "", nil }
		}
		return c.refreshIn()
	}
	if d := sched(time.Hour, false); d != never {
		t.Fatalf("without a TokenFunc: %v", d)
	}
	if d := sched(time.Hour, true); d < 59*time.Minute || d > time.Hour-29*time.Second {
		t.Fatalf("hour-long token refreshed after %v, want about 59m30s", d)
	}
	if d := sched(20*time.Second, true); d < 9*time.Second || d > 10*time.Second {
		t.Fatalf("20 s token refreshed after %v, want about half its life", d)
	}
	if d := sched(-time.Minute, true); d != never {
		t.Fatalf("expired token: %v", d)
	}
	exp := time.Now().Add(10 * time.Minute).Unix()
	if got := tokenExpiry(fakeJWT(fmt.Sprintf(`{"exp":%d}`, exp))); got.Unix() != exp {
		t.Fatalf("tokenExpiry %v, want %d", got, exp)
	}
	for _, bad := range []string{"", "a.b", fakeJWT(`{}`), fakeJWT(`{"exp":"soon"}`), "x.!!!.y"} {
		if !tokenExpiry(bad).IsZero() {
			t.Fatalf("tokenExpiry(%q) not zero", bad)
		}
	}
}
