package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/metric"

	syncnode "github.com/walcast/walcast/fanout/sync"
	"github.com/walcast/walcast/internal/telemetry"
	"github.com/walcast/walcast/journal"
)

// syncFlags are the flags of walcast sync.
type syncFlags struct {
	nf              natsFlags
	journalURL      string
	journalReadURL  string
	journalReadWait time.Duration
	schema          string
	journalTimeout  time.Duration
	listen          string
	httpListen      string
	jwtSecret       string
	jwtPublicKey    string
	jwksFile        string
	jwksURL         string
	jwksRefresh     time.Duration
	jwtAudience     string
	jwtIssuer       string
	jwtLeeway       time.Duration
	cursorSecret    string
	previousSecrets []string
	prefix          string
	tlsCert         string
	tlsKey          string
	origins         []string
	trustedProxies  []string
	console         bool
	cfg             syncnode.Config
	logs            logFlags
}

func newSyncCmd(env Env) *cobra.Command {
	var sf syncFlags
	cmd := &cobra.Command{
		Use:   "sync",
		Short: "Serve the change stream to WebSocket clients (a sync node)",
		Long: `sync is a sync node: it authenticates clients with a JWT at the WebSocket
handshake (/v1/socket), subscribes to the NATS subjects of the entities its
clients follow, and delivers every change once and in order, replaying from
the journal by cursor and repairing any gap from it. It also serves journal
reads over HTTP (GET /v1/changes). Run as many nodes as you like against one
NATS and one journal.

Exit status: 0 after a clean stop (SIGINT/SIGTERM), 1 when the node fails,
2 for a configuration error or an unreachable journal or NATS at start-up.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := sf.logs.logger(env.Stderr)
			if err != nil {
				return err
			}
			return runSync(cmd.Context(), log, &sf)
		},
	}
	f := cmd.Flags()
	sf.nf.register(cmd, "NATS server(s) the publisher publishes to (required)")
	f.StringVar(&sf.journalURL, "journal-url", "", "journal database, libpq URL or DSN (required)")
	f.StringVar(&sf.journalReadURL, "journal-read-url", "", "a physical (streaming) standby of the journal's server, libpq URL or DSN: catch-up, gap repair and GET /v1/changes reads go there to spare --journal-url; reads it has not replayed far enough for wait for it, then go to --journal-url (empty: every read goes to --journal-url)")
	f.DurationVar(&sf.journalReadWait, "journal-read-max-wait", journal.DefaultReadMaxWait, "how long a read that must see a change the --journal-read-url standby has not replayed yet waits for it before it is made on --journal-url (0: do not wait)")
	f.StringVar(&sf.schema, "journal-schema", journal.DefaultSchema, "schema of the journal")
	f.DurationVar(&sf.journalTimeout, "journal-timeout", journal.DefaultCallTimeout, "limit of each journal read (statement, lock and idle timeouts and TCP keepalives derive from it)")
	f.StringVar(&sf.listen, "listen", "127.0.0.1:8080", "address for /v1/socket and /v1/changes")
	f.StringVar(&sf.httpListen, "http-listen", "127.0.0.1:9188", "address for /metrics, /healthz and /readyz")
	f.StringVar(&sf.jwtSecret, "jwt-secret", "", "HS256 secret client tokens are signed with (prefer the environment variable)")
	f.StringVar(&sf.jwtPublicKey, "jwt-public-key-file", "", "PEM public key (RSA or ECDSA) that verifies RS256/ES256 client tokens")
	f.StringVar(&sf.jwksFile, "jwks-file", "", "JSON Web Key Set of RSA/EC public keys chosen by the token's kid (re-read when the file changes; combines with --jwt-secret or --jwt-public-key-file)")
	f.StringVar(&sf.jwksURL, "jwks-url", "", "URL of the issuer's JSON Web Key Set (https://, or http:// to loopback), fetched at start, every --jwks-refresh and for an unknown kid (at most every 30s); instead of --jwks-file")
	f.DurationVar(&sf.jwksRefresh, "jwks-refresh", syncnode.DefaultJWKSRefresh, "how often --jwks-url is fetched again (at least 30s; Cache-Control is not consulted)")
	f.StringVar(&sf.jwtAudience, "jwt-audience", "", "when set, a client token's aud must include this value")
	f.StringVar(&sf.jwtIssuer, "jwt-issuer", "", "when set, a client token's iss must equal this value")
	f.DurationVar(&sf.jwtLeeway, "jwt-leeway", syncnode.DefaultJWTLeeway, "clock skew allowed on a token's exp, nbf and iat; a socket is closed (4100) this long after exp unless refreshed")
	f.StringVar(&sf.cursorSecret, "cursor-secret", "", "HMAC secret of cursors, the same on every node (required; prefer the environment variable)")
	f.StringSliceVar(&sf.previousSecrets, "previous-cursor-secrets", nil, "rotated-out cursor secrets: their cursors get a resync instead of an error")
	f.StringVar(&sf.prefix, "subject-prefix", "walcast", "NATS subject prefix")
	f.IntVar(&sf.cfg.MaxBufferedBytes, "max-buffered-bytes", syncnode.DefaultMaxBufferedBytes, "bytes queued per socket before frames are dropped")
	f.IntVar(&sf.cfg.MaxDroppedFrames, "max-dropped-frames", syncnode.DefaultMaxDroppedFrames, "drops within 10 s beyond which a socket is closed (1013)")
	f.DurationVar(&sf.cfg.MaxLag, "max-lag", syncnode.DefaultMaxLag, "close a socket whose client has been behind this long (oldest queued frame or owed replay-gap) with 1013 (negative: never)")
	f.DurationVar(&sf.cfg.IdleTimeout, "idle-timeout", syncnode.DefaultIdleTimeout, "close sockets that send nothing for this long (1001)")
	f.IntVar(&sf.cfg.MaxConnections, "max-connections", 10000, "open sockets beyond which upgrades get 503 (0: unlimited)")
	f.Float64Var(&sf.cfg.AcceptRate, "accept-rate", 500, "new connections per second before 503 with Retry-After (0: unlimited)")
	f.IntVar(&sf.cfg.AcceptBurst, "accept-burst", 1000, "burst of new connections above --accept-rate")
	f.IntVar(&sf.cfg.MaxConnectionsPerIP, "max-connections-per-ip", 100, "open sockets per client address (IPv6: per /64) beyond which upgrades get 503 (0: unlimited)")
	f.IntVar(&sf.cfg.MaxConnectionsPerSubject, "max-connections-per-subject", 0, "open sockets per token subject (sub), from any addresses, beyond which upgrades get 503 (0: unlimited)")
	f.StringSliceVar(&sf.trustedProxies, "trusted-proxies", nil, "proxies (addresses or CIDRs) whose X-Forwarded-For gives the client address the per-address limits use")
	f.Float64Var(&sf.cfg.AcceptRatePerIP, "accept-rate-per-ip", 10, "new connections per second per client address before 503 with Retry-After (0: unlimited)")
	f.IntVar(&sf.cfg.AcceptBurstPerIP, "accept-burst-per-ip", 50, "burst of new connections per client address above --accept-rate-per-ip")
	f.Float64Var(&sf.cfg.ChangesRate, "changes-rate", 10, "GET /v1/changes reads per second per client address and per token subject before 429 (0: unlimited)")
	f.IntVar(&sf.cfg.ChangesBurst, "changes-burst", 20, "burst of GET /v1/changes reads above --changes-rate")
	f.IntVar(&sf.cfg.ChangesConcurrency, "changes-concurrency", 4, "GET /v1/changes reads in flight per client address and per token subject before 429 (0: unlimited)")
	f.Float64Var(&sf.cfg.InboundRate, "inbound-rate", syncnode.DefaultInboundRate, "frames per second a client may send (a flood closes with 4429)")
	f.IntVar(&sf.cfg.InboundBurst, "inbound-burst", syncnode.DefaultInboundBurst, "burst of client frames above --inbound-rate")
	f.IntVar(&sf.cfg.MaxFrameBytes, "max-frame-bytes", syncnode.DefaultMaxFrameBytes, "largest frame a client may send (larger closes with 4400)")
	f.StringVar(&sf.tlsCert, "tls-cert-file", "", "serve HTTPS/WSS with this certificate (with --tls-key-file)")
	f.StringVar(&sf.tlsKey, "tls-key-file", "", "key of --tls-cert-file")
	f.StringSliceVar(&sf.origins, "allowed-origins", nil, "browser origins, besides the node's own, whose pages may use the node (\"*\" for any); applies only to requests with an Origin header")
	f.BoolVar(&sf.console, "console", false, "also serve the live console at /console (paste a token, watch topics) and the browser client at /console/walcast.js")
	f.StringVar(&sf.cfg.State.SourceURL, "database-url", "", "source database for snapshots (\"snapshot\":true subscriptions, GET /v1/snapshot), read with a read-only role; a hot standby of the source will do (docs/operating.md); empty: no snapshots")
	f.IntVar(&sf.cfg.State.MaxConcurrent, "max-concurrent-snapshots", syncnode.DefaultMaxConcurrentSnapshots, "reads of the source for snapshots at once on this node (the size of its source connection pool); more wait")
	f.IntVar(&sf.cfg.State.PerClient, "snapshots-per-client", 0, "snapshots in progress per client address and per token subject, sockets and GET /v1/snapshot together; more wait (0: half of --max-concurrent-snapshots, at least 1)")
	f.DurationVar(&sf.cfg.State.Timeout, "snapshot-timeout", syncnode.DefaultSnapshotTimeout, "limit of one snapshot, from its start to its snapshot-end, the client's reading included")
	f.DurationVar(&sf.cfg.State.ReadTimeout, "snapshot-read-timeout", syncnode.DefaultSnapshotReadTimeout, "limit of one read of a table from the source into the spool, BEGIN to COMMIT (its transaction holds back vacuum); a table that cannot be read in it is refused")
	f.Int64Var(&sf.cfg.State.SpoolBytes, "snapshot-spool-bytes", syncnode.DefaultSnapshotSpoolBytes, "bytes of snapshot rows spooled on this node at once (memory and files); a read that would pass it is refused")
	f.StringVar(&sf.cfg.State.SpoolDir, "snapshot-spool-dir", "", "directory of the spool files of large snapshots (default: the system's temporary directory)")
	f.Int64Var(&sf.cfg.MaxMemoryBytes, "max-memory-bytes", syncnode.DefaultMaxMemoryBytes, "bytes queued on sockets plus snapshot rows spooled in memory beyond which new sockets and snapshots get 503 with Retry-After (negative: no bound)")
	f.Int64Var(&sf.cfg.MaxReplayEntries, "max-replay-entries", syncnode.DefaultMaxReplayEntries, "journal entries a socket's catch-up replays at most; further behind it gets resync (or a fresh snapshot) instead (negative: no bound)")
	f.IntVar(&sf.cfg.MaxFilterRows, "max-filter-rows", syncnode.DefaultMaxFilterRows, "keys of rows a filtered subscription's client holds that the node keeps, to send a removal only for rows the client has (about 50 bytes a key of one integer column); past it the node sends one for every row that may have left the filter (negative: keep none)")
	f.Int64Var(&sf.cfg.MaxFilterMemoryBytes, "max-filter-memory-bytes", syncnode.DefaultMaxFilterMemoryBytes, "memory of the row keys the node keeps for every filtered subscription together (see --max-filter-rows); a subscription whose keys would pass it keeps none (negative: no bound)")
	f.Float64Var(&sf.cfg.State.Rate, "snapshot-rate", 2, "snapshots per second a client may ask for, per client address and per token subject, before error rate-limited (0: unlimited)")
	f.IntVar(&sf.cfg.State.Burst, "snapshot-burst", 20, "burst of snapshots above --snapshot-rate")
	sf.logs.register(cmd)
	return cmd
}

// syncAuth builds the authenticator from the JWT flags: at most one of
// --jwt-secret and --jwt-public-key-file, and/or one of --jwks-file and
// --jwks-url. With --jwks-url it fetches the key set within ctx, and its
// refresher runs until ctx ends or the caller closes it.
func syncAuth(ctx context.Context, sf *syncFlags, log *slog.Logger, meter metric.Meter) (*syncnode.Authenticator, error) {
	cfg := syncnode.AuthConfig{JWKSFile: sf.jwksFile, JWKSURL: sf.jwksURL, JWKSRefresh: sf.jwksRefresh,
		Audience: sf.jwtAudience, Issuer: sf.jwtIssuer, Leeway: sf.jwtLeeway, Logger: log, Meter: meter}
	if sf.jwtLeeway == 0 {
		cfg.Leeway = -1 // --jwt-leeway 0: none
	}
	switch {
	case sf.jwtSecret != "" && sf.jwtPublicKey != "":
		return nil, usageErrorf("sync: give --jwt-secret or --jwt-public-key-file, not both")
	case sf.jwtSecret != "":
		cfg.Secret = []byte(sf.jwtSecret)
	case sf.jwtPublicKey != "":
		pem, err := os.ReadFile(sf.jwtPublicKey)
		if err != nil {
			return nil, usageErrorf("sync: --jwt-public-key-file: %v", err)
		}
		cfg.PublicKeyPEM = pem
	case sf.jwksFile == "" && sf.jwksURL == "":
		return nil, usageErrorf("sync: --jwt-secret or --jwt-public-key-file is required, or --jwks-file or --jwks-url (or set WALCAST_JWT_SECRET)")
	}
	switch {
	case sf.jwtLeeway < 0:
		return nil, usageErrorf("sync: --jwt-leeway must not be negative")
	case sf.jwksFile != "" && sf.jwksURL != "":
		return nil, usageErrorf("sync: give --jwks-file or --jwks-url, not both")
	case sf.jwksURL != "" && sf.jwksRefresh < syncnode.JWKSRefetchMinInterval:
		return nil, usageErrorf("sync: --jwks-refresh %v is too short: at least %v, so the node does not hammer the issuer (default %v)",
			sf.jwksRefresh, syncnode.JWKSRefetchMinInterval, syncnode.DefaultJWKSRefresh)
	}
	a, err := syncnode.OpenAuthenticator(ctx, cfg)
	if err != nil {
		return nil, withCode(exitUsage, err)
	}
	return a, nil
}

func runSync(ctx context.Context, log *slog.Logger, sf *syncFlags) error {
	switch {
	case sf.nf.cfg.URL == "":
		return usageErrorf("sync: --nats-url is required (or set WALCAST_NATS_URL)")
	case sf.journalURL == "":
		return usageErrorf("sync: --journal-url is required (or set WALCAST_JOURNAL_URL)")
	case sf.cursorSecret == "":
		return usageErrorf("sync: --cursor-secret is required (or set WALCAST_CURSOR_SECRET); every node and reader must share it")
	case (sf.tlsCert == "") != (sf.tlsKey == ""):
		return usageErrorf("sync: --tls-cert-file and --tls-key-file go together")
	}
	metrics, err := telemetry.NewMetrics(telemetry.WithService(telemetry.ServiceName, version))
	if err != nil {
		return withCode(exitFailed, err)
	}
	defer metrics.Shutdown(context.WithoutCancel(ctx))
	meter := metrics.Meter("walcast/sync")
	auth, err := syncAuth(ctx, sf, log, meter)
	if err != nil {
		return err
	}
	// Deferred before node.Close, so it runs after: the node verifies no
	// token once closed, and the keys stay in force until then anyway.
	defer auth.Close()
	var tlsCfg *tls.Config
	if sf.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(sf.tlsCert, sf.tlsKey)
		if err != nil {
			return usageErrorf("sync: TLS certificate: %v", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	var prev [][]byte
	for _, s := range sf.previousSecrets {
		prev = append(prev, []byte(s))
	}
	if sf.journalReadWait < 0 {
		return usageErrorf("sync: --journal-read-max-wait must not be negative (0: do not wait)")
	}
	readWait := sf.journalReadWait
	if readWait == 0 {
		readWait = -1 // journal.Config: negative is no wait, 0 the default
	}
	j, err := journal.Open(ctx, journal.Config{URL: sf.journalURL, Schema: sf.schema, CallTimeout: sf.journalTimeout,
		ReadURL: sf.journalReadURL, ReadMaxWait: readWait,
		CursorSecret: []byte(sf.cursorSecret), PreviousCursorSecrets: prev})
	if err != nil {
		return startupError(err)
	}
	defer j.Close()

	cfg := sf.cfg
	cfg.NATS = sf.nf.cfg
	cfg.Journal, cfg.Auth, cfg.SubjectPrefix, cfg.Logger = j, auth, sf.prefix, log
	cfg.AllowedOrigins = sf.origins
	for _, p := range sf.trustedProxies {
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			a, aerr := netip.ParseAddr(p)
			if aerr != nil {
				return usageErrorf("sync: --trusted-proxies: %q is neither an address nor a CIDR", p)
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		cfg.TrustedProxies = append(cfg.TrustedProxies, pfx.Masked())
	}
	cfg.Meter = meter
	node, err := syncnode.Open(ctx, cfg)
	if err != nil {
		return withCode(exitUsage, err)
	}
	defer node.Close()
	natsReg, err := node.RegisterNATSMetrics(metrics.Meter("walcast/nats"))
	if err != nil {
		return withCode(exitFailed, err)
	}
	defer natsReg.Unregister()

	ops, err := telemetry.Listen(sf.httpListen, metrics, node.Ready)
	if err != nil {
		return withCode(exitUsage, err)
	}
	ops.SetHealth(node.Healthy)
	ln, err := net.Listen("tcp", sf.listen)
	if err != nil {
		return usageErrorf("sync: listen on %s: %v (choose another --listen)", sf.listen, err)
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	srv := node.HTTPServer()
	scheme := "ws"
	if tlsCfg != nil {
		scheme = "wss"
	}
	if sf.console {
		srv.Handler = node.HandlerWithConsole()
		log.Info("console enabled", "url", strings.Replace(scheme, "ws", "http", 1)+"://"+ln.Addr().String()+"/console/")
	}
	log.Info("walcast sync starting", "version", version, "listen", scheme+"://"+ln.Addr().String()+"/v1/socket",
		"http", ops.Addr(), "journal_schema", j.Schema(), "journal_reads_from_standby", j.HasReplica(), "subject_prefix", sf.prefix,
		"allowed_origins", strings.Join(sf.origins, ","))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := ops.Serve(ctx, log); err != nil {
			log.Error("http endpoints stopped", "err", err)
		}
	}()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		err = nil
	case err = <-serveErr:
	case <-node.Failed():
		// Its NATS connection is closed for good: exit so the supervisor
		// starts a fresh node (clients reconnect to another one meanwhile).
		err = errors.New("the node's NATS connection closed for good (see the log for the cause); restart it")
	}
	// Sockets are hijacked connections: the node closes them (1001) before
	// the server shuts down the rest.
	node.Close()
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_ = srv.Shutdown(sctx)
	scancel()
	if e := <-serveErr; err == nil && !errors.Is(e, http.ErrServerClosed) {
		err = e
	}
	cancel()
	wg.Wait()
	if err != nil {
		return withCode(exitFailed, fmt.Errorf("sync: %w", err))
	}
	log.Info("walcast sync stopped")
	return nil
}
