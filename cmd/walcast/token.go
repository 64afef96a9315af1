package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/spf13/cobra"

	"github.com/walcast/walcast/decoder"
	syncnode "github.com/walcast/walcast/fanout/sync"
)

// tokenFlags are the flags of walcast token.
type tokenFlags struct {
	dev        bool
	secret     string
	privateKey string
	kid        string
	topics     []string
	tenant     string
	snapshot   bool
	ttl        time.Duration
	sub        string
	audience   string
	issuer     string
	// onCommandLine holds the flags given on the command line, as opposed
	// to set from the environment.
	onCommandLine map[string]bool
}

func newTokenCmd() *cobra.Command {
	var tf tokenFlags
	cmd := &cobra.Command{
		Use:   "token --dev --topic SCHEMA.TABLE",
		Short: "Mint a development JWT that a sync node accepts",
		Long: `token prints a JWT for a sync node's key on standard output, for trying a
node, its console or a page against it during development.

Production tokens come from your application's auth server, which knows the
user and signs only the topics and tenant that user may read. token knows
nobody: it signs whatever it is told, so it runs only with --dev.

The key is the node's: the same --jwt-secret (HS256; WALCAST_JWT_SECRET, as
walcast sync reads it), or --jwt-private-key-file, the private half of the
node's --jwt-public-key-file or of a key in its JWKS (an RSA key signs RS256,
an ECDSA key ES256, ES384 or ES512 by its curve; with a JWKS give the key's
--kid). --jwt-audience and --jwt-issuer, when the node requires them, are read
from the same flags and variables as the node's.

The token grants each --topic ("*" for every topic), is scoped to --tenant
when given, allows snapshots with --snapshot, names --sub as its subject and
expires after --ttl. The token goes to standard output, a description of it
to standard error.`,
		Example: `  # for a node started with --jwt-secret (or WALCAST_JWT_SECRET)
  export WALCAST_JWT_SECRET=...
  walcast token --dev --topic public.orders --snapshot --ttl 1h

  # for a node started with --jwt-public-key-file pub.pem
  walcast token --dev --jwt-private-key-file key.pem --topic public.orders --tenant acme

  # as a client would use it
  walcast tail --socket ws://127.0.0.1:8080/v1/socket --topic public.orders \
    --token "$(walcast token --dev --topic public.orders)"`,
		Args:              cobra.NoArgs,
		PersistentPreRunE: noteCommandLine(&tf.onCommandLine),
		RunE: func(cmd *cobra.Command, _ []string) error {
			tok, summary, err := mintToken(&tf, time.Now())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "walcast token: %s; for development only: production tokens come from your application's auth server\n", summary)
			_, err = fmt.Fprintln(cmd.OutOrStdout(), tok)
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&tf.dev, "dev", false, "acknowledge that this is a development token (required)")
	_ = f.SetAnnotation("dev", noEnv, []string{"true"})
	f.StringVar(&tf.secret, "jwt-secret", "", "HS256 secret of the sync node (its --jwt-secret; prefer the environment variable)")
	f.StringVar(&tf.privateKey, "jwt-private-key-file", "", "PEM private key (RSA or ECDSA, PKCS #1, SEC 1 or PKCS #8) whose public half the node verifies with")
	f.StringVar(&tf.kid, "kid", "", "key id put in the token's header, for a node that verifies with a JWKS")
	f.StringSliceVar(&tf.topics, "topic", nil, "topic (schema.table) the token grants, repeatable or comma-separated; \"*\" grants every topic (required)")
	f.StringVar(&tf.tenant, "tenant", "", "tenant the token is scoped to (empty: unscoped, it sees only rows with no tenant)")
	f.BoolVar(&tf.snapshot, "snapshot", false, "allow snapshots (the claim \"snapshot\": true)")
	f.DurationVar(&tf.ttl, "ttl", time.Hour, "how long the token is valid")
	f.StringVar(&tf.sub, "sub", "dev", "the token's subject (sub claim), which the node's per-subject limits count by")
	f.StringVar(&tf.audience, "jwt-audience", "", "aud claim, when the node requires one (its --jwt-audience)")
	f.StringVar(&tf.issuer, "jwt-issuer", "", "iss claim, when the node requires one (its --jwt-issuer)")
	return cmd
}

// mintToken checks the flags, signs the token and verifies it as a sync
// node configured with the same key would. summary describes the token for
// standard error, without the token or any key material.
func mintToken(tf *tokenFlags, now time.Time) (token, summary string, err error) {
	// A key on the command line wins over one from the environment (a
	// shell that exported a node's WALCAST_JWT_SECRET, say).
	if tf.secret != "" && tf.privateKey != "" && tf.onCommandLine["jwt-secret"] != tf.onCommandLine["jwt-private-key-file"] {
		if tf.onCommandLine["jwt-secret"] {
			tf.privateKey = ""
		} else {
			tf.secret = ""
		}
	}
	switch {
	case !tf.dev:
		return "", "", usageErrorf("token: refusing to mint without --dev: production tokens come from your application's auth server, " +
			"which signs only what each user may read; for development, run walcast token --dev --topic SCHEMA.TABLE " +
			"with the node's --jwt-secret (or WALCAST_JWT_SECRET) or --jwt-private-key-file")
	case tf.secret != "" && tf.privateKey != "":
		return "", "", usageErrorf("token: give --jwt-secret or --jwt-private-key-file, not both (on the command line, or both from the environment: WALCAST_JWT_SECRET, WALCAST_JWT_PRIVATE_KEY_FILE)")
	case tf.secret == "" && tf.privateKey == "":
		return "", "", usageErrorf("token: --jwt-secret (or WALCAST_JWT_SECRET) or --jwt-private-key-file is required: the key the sync node verifies tokens with")
	case len(tf.topics) == 0:
		return "", "", usageErrorf("token: --topic is required: the topics (schema.table, or \"*\") the token grants")
	case tf.ttl <= 0:
		return "", "", usageErrorf("token: --ttl must be positive, e.g. 1h")
	case tf.sub == "":
		return "", "", usageErrorf("token: --sub must not be empty: the node counts its per-subject limits by it")
	}
	for _, t := range tf.topics {
		if _, _, ok := decoder.SplitEntity(t); !ok && t != "*" {
			return "", "", usageErrorf("token: --topic %q is not an entity, schema.table (quoted as in the envelope's entity when a name holds a dot), or \"*\"", t)
		}
	}

	var (
		method   jwt.SigningMethod
		signKey  any
		checkCfg *syncnode.AuthConfig // how the node is configured with this key; nil: only through a JWKS
	)
	if tf.secret != "" {
		method, signKey = jwt.SigningMethodHS256, []byte(tf.secret)
		checkCfg = &syncnode.AuthConfig{Secret: []byte(tf.secret)}
	} else {
		var pub crypto.PublicKey
		method, signKey, pub, err = loadPrivateKey(tf.privateKey)
		if err != nil {
			return "", "", usageErrorf("token: --jwt-private-key-file %s: %v", tf.privateKey, err)
		}
		if method == jwt.SigningMethodRS256 || method == jwt.SigningMethodES256 {
			der, err := x509.MarshalPKIXPublicKey(pub)
			if err != nil {
				return "", "", withCode(exitFailed, fmt.Errorf("token: encode the public key: %w", err))
			}
			checkCfg = &syncnode.AuthConfig{PublicKeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})}
		} else if tf.kid == "" {
			// A node's --jwt-public-key-file verifies ECDSA keys as ES256
			// only; other curves verify through a JWKS, by kid.
			return "", "", usageErrorf("token: --jwt-private-key-file %s is a %s key: a sync node verifies it only through a JWKS (--jwks-file or --jwks-url), "+
				"by key id: give the key's --kid (or use a P-256 key, which --jwt-public-key-file verifies as ES256)", tf.privateKey, method.Alg())
		}
	}

	exp := now.Add(tf.ttl).Truncate(time.Second)
	claims := syncnode.Claims{
		Topics:   tf.topics,
		Tenant:   tf.tenant,
		Snapshot: tf.snapshot,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   tf.sub,
			Issuer:    tf.issuer,
			IssuedAt:  jwt.NewNumericDate(now.Truncate(time.Second)),
			ExpiresAt: jwt.NewNumericDate(exp),
		},
	}
	if tf.audience != "" {
		claims.Audience = jwt.ClaimStrings{tf.audience}
	}
	t := jwt.NewWithClaims(method, claims)
	if tf.kid != "" {
		t.Header["kid"] = tf.kid
	}
	token, err = t.SignedString(signKey)
	if err != nil {
		return "", "", withCode(exitFailed, fmt.Errorf("token: sign: %w", err))
	}

	// Verify the token as the node would, so a key the node refuses (a
	// secret too short, say) fails here with the node's own words.
	if checkCfg != nil {
		checkCfg.Audience, checkCfg.Issuer = tf.audience, tf.issuer
		auth, err := syncnode.NewAuthenticator(*checkCfg)
		if err != nil {
			return "", "", usageErrorf("token: a sync node would refuse this key: %v", err)
		}
		if _, err := auth.Verify(token); err != nil {
			return "", "", withCode(exitFailed, fmt.Errorf("token: a sync node with this key would refuse the token: %v", err))
		}
	}

	var desc []string
	desc = append(desc, method.Alg(), "sub "+tf.sub, "topics "+strings.Join(tf.topics, ","))
	if tf.tenant != "" {
		desc = append(desc, "tenant "+tf.tenant)
	}
	if tf.snapshot {
		desc = append(desc, "snapshots allowed")
	}
	desc = append(desc, "expires "+exp.UTC().Format(time.RFC3339))
	return token, strings.Join(desc, ", "), nil
}

// loadPrivateKey reads a PEM private key and returns the algorithm a sync
// node verifies its public half with (RS256 for RSA; ES256, ES384 or ES512
// by the ECDSA curve), the key to sign with, and its public half.
func loadPrivateKey(path string) (jwt.SigningMethod, any, crypto.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cannot read it (%w); give the path of a PEM private key file", errors.Unwrap(err))
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, nil, nil, errors.New("no PEM block in it; give a PEM private key (-----BEGIN PRIVATE KEY-----), e.g. from openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256")
	}
	if strings.Contains(block.Type, "PUBLIC KEY") || block.Type == "CERTIFICATE" {
		return nil, nil, nil, fmt.Errorf("it holds a %s, not a private key: tokens are signed with the private key whose public half the node verifies with", strings.ToLower(block.Type))
	}
	if strings.Contains(block.Type, "ENCRYPTED") {
		return nil, nil, nil, errors.New("the key is encrypted; decrypt it first (openssl pkey -in KEY -out PLAIN)")
	}
	var key any
	if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		key = k
	} else if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		key = k
	} else if k, err := x509.ParseECPrivateKey(block.Bytes); err == nil {
		key = k
	} else {
		return nil, nil, nil, fmt.Errorf("the %s block is not a PKCS #8, PKCS #1 or SEC 1 private key", block.Type)
	}
	switch k := key.(type) {
	case *rsa.PrivateKey:
		return jwt.SigningMethodRS256, k, &k.PublicKey, nil
	case *ecdsa.PrivateKey:
		switch k.Curve {
		case elliptic.P256():
			return jwt.SigningMethodES256, k, &k.PublicKey, nil
		case elliptic.P384():
			return jwt.SigningMethodES384, k, &k.PublicKey, nil
		case elliptic.P521():
			return jwt.SigningMethodES512, k, &k.PublicKey, nil
		}
		return nil, nil, nil, fmt.Errorf("ECDSA curve %s is not one a sync node verifies (P-256, P-384 or P-521)", k.Curve.Params().Name)
	case ed25519.PrivateKey:
		return nil, nil, nil, errors.New("it is an Ed25519 key, and a sync node verifies RS256 (RSA) and ES256/ES384/ES512 (ECDSA) tokens only; use an RSA or ECDSA key")
	}
	return nil, nil, nil, fmt.Errorf("a %T key is not one a sync node verifies; use an RSA or ECDSA key", key)
}
