package sync

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"time"
)

// jwksState is one reading of the JWKS file: its keys by kid and the file
// version they came from.
type jwksState struct {
	keys    map[string]verifyKey
	modTime time.Time
	size    int64
}

// jwk is the part of a JSON Web Key (RFC 7517/7518) the node reads.
type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

// maxJWKSBytes bounds the JWKS file the node reads.
const maxJWKSBytes = 1 << 20

// loadJWKS reads and parses path. Keys whose use is not "sig" are skipped;
// a key the node cannot use (unknown kty, bad encoding, weak RSA) fails the
// whole file, so a typo never silently drops a key. Symmetric ("oct") keys
// are refused: a key set is public, and a secret belongs in --jwt-secret.
func loadJWKS(path string) (*jwksState, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	if fi.Size() > maxJWKSBytes {
		return nil, fmt.Errorf("jwks %s: %d bytes, at most %d", path, fi.Size(), maxJWKSBytes)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	keys, err := parseJWKS(b)
	if err != nil {
		return nil, fmt.Errorf("jwks %s: %w", path, err)
	}
	return &jwksState{keys: keys, modTime: fi.ModTime(), size: fi.Size()}, nil
}

func parseJWKS(b []byte) (map[string]verifyKey, error) {
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("not a JSON Web Key Set: %w", err)
	}
	keys := map[string]verifyKey{}
	for i, k := range set.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		if k.Kid == "" && len(set.Keys) > 1 {
			return nil, fmt.Errorf("key %d has no kid (a set of several keys is chosen from by kid)", i)
		}
		if _, dup := keys[k.Kid]; dup {
			return nil, fmt.Errorf("kid %q appears twice", k.Kid)
		}
		vk, err := k.verifyKey()
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", k.Kid, err)
		}
		keys[k.Kid] = vk
	}
	if len(keys) == 0 {
		return nil, errors.New("no signing keys")
	}
	return keys, nil
}

func b64(field, s string) ([]byte, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) == 0 {
		return nil, fmt.Errorf("%s is not base64url", field)
	}
	return b, nil
}

// verifyKey converts the JWK, pinning its algorithm: the JWK's alg when
// given (it must suit the key), else RS256 for RSA and ES256/384/512 by
// curve.
func (k jwk) verifyKey() (verifyKey, error) {
	switch k.Kty {
	case "RSA":
		n, err := b64("n", k.N)
		if err != nil {
			return verifyKey{}, err
		}
		e, err := b64("e", k.E)
		if err != nil {
			return verifyKey{}, err
		}
		exp := new(big.Int).SetBytes(e)
		if !exp.IsInt64() || exp.Int64() < 3 || exp.Int64() > 1<<31-1 || exp.Int64()%2 == 0 {
			return verifyKey{}, errors.New("bad RSA exponent")
		}
		pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(exp.Int64())}
		if pub.N.BitLen() < 2048 {
			return verifyKey{}, fmt.Errorf("RSA key of %d bits, want at least 2048", pub.N.BitLen())
		}
		alg := k.Alg
		switch alg {
		case "":
			alg = "RS256"
		case "RS256", "RS384", "RS512", "PS256", "PS384", "PS512":
		default:
			return verifyKey{}, fmt.Errorf("alg %q does not suit an RSA key", alg)
		}
		return verifyKey{alg: alg, key: pub}, nil
	case "EC":
		var curve elliptic.Curve
		var alg string
		switch k.Crv {
		case "P-256":
			curve, alg = elliptic.P256(), "ES256"
		case "P-384":
			curve, alg = elliptic.P384(), "ES384"
		case "P-521":
			curve, alg = elliptic.P521(), "ES512"
		default:
			return verifyKey{}, fmt.Errorf("curve %q not supported", k.Crv)
		}
		if k.Alg != "" && k.Alg != alg {
			return verifyKey{}, fmt.Errorf("alg %q does not suit curve %s", k.Alg, k.Crv)
		}
		x, err := b64("x", k.X)
		if err != nil {
			return verifyKey{}, err
		}
		y, err := b64("y", k.Y)
		if err != nil {
			return verifyKey{}, err
		}
		size := (curve.Params().BitSize + 7) / 8
		if len(x) != size || len(y) != size {
			return verifyKey{}, errors.New("x and y have the wrong length for the curve")
		}
		pub, err := ecdsa.ParseUncompressedPublicKey(curve, append(append([]byte{4}, x...), y...))
		if err != nil {
			return verifyKey{}, fmt.Errorf("not a point on %s", k.Crv)
		}
		return verifyKey{alg: alg, key: pub}, nil
	case "oct":
		return verifyKey{}, errors.New("symmetric keys do not belong in a key set (fix: use --jwt-secret)")
	}
	return verifyKey{}, fmt.Errorf("kty %q not supported (RSA or EC)", k.Kty)
}

// maybeReloadJWKS re-reads the JWKS file when it changed, checking at most
// once per JWKSPollInterval. It runs on the verify path and costs one stat
// per interval: no goroutine to own. A file that fails to read or parse
// leaves the previous keys in force (logged once per file version).
func (a *Authenticator) maybeReloadJWKS() {
	if a.jwksFile == "" {
		return
	}
	now := time.Now().UnixNano()
	last := a.checked.Load()
	if now-last < int64(JWKSPollInterval) || !a.checked.CompareAndSwap(last, now) {
		return
	}
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	cur := a.jwks.Load()
	fi, err := os.Stat(a.jwksFile)
	if err != nil {
		if !a.statFailing.Swap(true) {
			a.log.Warn("JWKS file unreadable; keeping the keys read before", "file", a.jwksFile, "err", err)
		}
		return
	}
	a.statFailing.Store(false)
	if cur != nil && fi.ModTime().Equal(cur.modTime) && fi.Size() == cur.size {
		return
	}
	st, err := loadJWKS(a.jwksFile)
	if err != nil {
		a.log.Warn("JWKS file changed but does not parse; keeping the keys read before", "file", a.jwksFile, "err", err)
		// Remember the bad version so it is not re-read (and logged) on
		// every poll; the old keys stay.
		if cur != nil {
			a.jwks.Store(&jwksState{keys: cur.keys, modTime: fi.ModTime(), size: fi.Size()})
		}
		return
	}
	a.jwks.Store(st)
	a.log.Info("JWKS file reloaded", "file", a.jwksFile, "keys", len(st.keys))
}
