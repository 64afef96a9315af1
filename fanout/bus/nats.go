package bus

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// NATSConfig says how to reach NATS. Credentials are never logged.
type NATSConfig struct {
	URL       string // nats://host:4222[,nats://...]; required
	Name      string // client name shown by the server
	User      string
	Password  string
	Token     string
	CredsFile string // NATS credentials file (JWT + NKey seed)
	NKeyFile  string // NKey seed file
	CAFile    string // CA for the server's TLS certificate
	CertFile  string // client certificate, with KeyFile
	KeyFile   string
}

// How often walcast's NATS connections ping their server, and how many
// pings may go unanswered before the connection is given up for another
// server: a hung server is left within about 30 to 40 s.
const (
	PingInterval        = 10 * time.Second
	MaxPingsOutstanding = 3
)

// ConnectNATS connects with options suited to walcast: reconnect forever,
// and no client-side buffering while disconnected, so a publish during an
// outage fails at once and the publisher retries from the journal instead
// of silently holding messages in memory.
func ConnectNATS(cfg NATSConfig, extra ...nats.Option) (*nats.Conn, error) {
	if cfg.URL == "" {
		return nil, errors.New("no NATS URL given: pass --nats-url nats://host:4222")
	}
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.ReconnectBufSize(-1),
		nats.Timeout(5 * time.Second),
		// A hung or cut-off server keeps the TCP connection open: give it
		// up after 3 unanswered pings 10 s apart (nats.go's default is 2
		// minutes × 2) and fail over to another server of the cluster.
		nats.PingInterval(PingInterval),
		nats.MaxPingsOutstanding(MaxPingsOutstanding),
	}
	if cfg.User != "" || cfg.Password != "" {
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	if cfg.Token != "" {
		opts = append(opts, nats.Token(cfg.Token))
	}
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.NKeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("NATS nkey seed %s: %w", cfg.NKeyFile, err)
		}
		opts = append(opts, o)
	}
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
	}
	if cfg.CertFile != "" || cfg.KeyFile != "" {
		opts = append(opts, nats.ClientCert(cfg.CertFile, cfg.KeyFile))
	}
	opts = append(opts, extra...)
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, classifyNATSError(cfg.URL, err)
	}
	return nc, nil
}

func classifyNATSError(url string, err error) error {
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired):
		return fmt.Errorf("connect to NATS at %s: %w (check --nats-user/--nats-password, --nats-token, --nats-creds or --nats-nkey)", url, err)
	case errors.Is(err, nats.ErrNoServers):
		return fmt.Errorf("connect to NATS at %s: %w (is the server running and the URL right?)", url, err)
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return fmt.Errorf("connect to NATS at %s: %w (is the server running and the URL right?)", url, err)
	}
	return fmt.Errorf("connect to NATS at %s: %w (for TLS check --nats-ca, --nats-cert and --nats-key)", url, err)
}

// EmbeddedNATS is a NATS server inside the walcast process: the
// single-machine default when no --nats-url is given.
type EmbeddedNATS struct {
	srv *server.Server
}

// EmbeddedCluster joins the embedded servers of several walcast run
// instances into one NATS cluster, so that whichever instance is active
// publishes to every sync node connected to any of them.
type EmbeddedCluster struct {
	// Listen is this server's cluster (route) address, host:port; empty:
	// no cluster.
	Listen string
	// Routes are the other instances' cluster addresses, host:port or
	// nats-route://host:port.
	Routes []string
}

// StartEmbeddedNATS starts a NATS server listening on listen (host:port).
// With storeDir set, JetStream is enabled with its store there. With
// cluster.Listen set, the server joins the other instances' embedded
// servers at cluster.Routes (JetStream is then refused: a JetStream
// cluster of walcast's instances would lose its quorum with the instance
// that fails, which is when it is needed).
func StartEmbeddedNATS(listen, storeDir string, cluster EmbeddedCluster) (*EmbeddedNATS, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--embedded-nats-listen %q: want host:port", listen)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("--embedded-nats-listen %q: bad port", listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	} else {
		// The server reports a failed bind only to its logger (off here)
		// and then never becomes ready, so a taken port would cost the
		// whole wait below and end in a guess. Binding it first gives the
		// operator the kernel's answer at once.
		ln, err := net.Listen("tcp", listen)
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("embedded NATS cannot listen on %s: %w (another process holds it, often a NATS server or a second walcast run: stop that process, or choose another --embedded-nats-listen, or point --nats-url at an existing server)", listen, err)
		}
		if err != nil {
			return nil, fmt.Errorf("embedded NATS cannot listen on %s: %w (choose an address of this machine for --embedded-nats-listen, or point --nats-url at an existing server)", listen, err)
		}
		_ = ln.Close()
	}
	opts := &server.Options{Host: host, Port: port, NoSigs: true, NoLog: true, ServerName: "walcast-embedded"}
	if cluster.Listen != "" || len(cluster.Routes) > 0 {
		if err := embeddedClusterOptions(opts, storeDir, cluster); err != nil {
			return nil, err
		}
	}
	if storeDir != "" {
		if err := os.MkdirAll(storeDir, 0o700); err != nil {
			return nil, fmt.Errorf("embedded NATS store %s: %w", storeDir, err)
		}
		opts.JetStream, opts.StoreDir = true, storeDir
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded NATS did not start listening on %s within 10s (is the port taken? choose another --embedded-nats-listen)", listen)
	}
	return &EmbeddedNATS{srv: srv}, nil
}

// URL is the client URL of the embedded server.
func (e *EmbeddedNATS) URL() string { return e.srv.ClientURL() }

// Shutdown stops the server and waits for it.
func (e *EmbeddedNATS) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// embeddedClusterOptions sets opts up to join the other instances'
// embedded servers.
func embeddedClusterOptions(opts *server.Options, storeDir string, c EmbeddedCluster) error {
	if c.Listen == "" {
		return errors.New("--embedded-nats-routes needs --embedded-nats-cluster-listen: the address this instance's embedded server takes routes on")
	}
	if storeDir != "" {
		return errors.New("--embedded-nats-cluster-listen cannot be combined with --embedded-nats-store-dir: JetStream across walcast's instances would lose its quorum with the instance that fails; run a NATS cluster with JetStream and give every instance --nats-url")
	}
	host, portStr, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return fmt.Errorf("--embedded-nats-cluster-listen %q: want host:port", c.Listen)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return fmt.Errorf("--embedded-nats-cluster-listen %q: want a port from 1 to 65535", c.Listen)
	}
	opts.Cluster.Name, opts.Cluster.Host, opts.Cluster.Port = "walcast", host, port
	// Names are unique within a cluster.
	opts.ServerName = "walcast-embedded-" + c.Listen
	for _, r := range c.Routes {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		if !strings.Contains(r, "://") {
			r = "nats-route://" + r
		}
		u, err := url.Parse(r)
		if err != nil || u.Host == "" || u.Port() == "" {
			return fmt.Errorf("--embedded-nats-routes %q: want host:port of another instance's --embedded-nats-cluster-listen", r)
		}
		opts.Routes = append(opts.Routes, u)
	}
	return nil
}
