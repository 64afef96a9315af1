// Package sync is the sync node (DESIGN §6), run by `walcast sync`: it
// authenticates WebSocket clients, subscribes to the bus subjects of the
// entities they follow, delivers each change once and in order, and repairs
// gaps from the journal. It reads the journal and never writes it; it never
// imports fanout/publish (the contract between them is fanout/bus).
//
// The package shares its name with the standard library's sync, which its
// files import as usual: inside this package "sync" is always the standard
// library.
package sync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/metric"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/fanout/filter"
	"github.com/walcast/walcast/journal"
)

// Sync node defaults (DESIGN §6).
const (
	DefaultMaxBufferedBytes = 1 << 20
	DefaultMaxDroppedFrames = 1000
	DefaultIdleTimeout      = 120 * time.Second
	DefaultMaxFrameBytes    = 4096
	DefaultMaxFilterRows    = 100_000
	// DefaultMaxFilterMemoryBytes: every filtered subscription's row keys
	// together.
	DefaultMaxFilterMemoryBytes = 256 << 20
	DefaultInboundRate          = 20
	DefaultInboundBurst         = 60
	DefaultWriteTimeout         = 10 * time.Second
	DefaultMaxLag               = 30 * time.Second
	// HTTP server limits (HTTPServer).
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultHTTPWriteTimeout  = 30 * time.Second
	DefaultHTTPIdleTimeout   = 60 * time.Second
	DefaultMaxHeaderBytes    = 16 << 10
)

// Config configures a Node. Zero values take the defaults above.
type Config struct {
	// NATS says how to reach NATS (URL required). The node owns its
	// connection.
	NATS bus.NATSConfig
	// Journal is where replays and repairs read from; the caller owns it. It
	// must have a cursor secret.
	Journal *journal.Journal
	// Auth verifies handshake tokens (required).
	Auth *Authenticator
	// SubjectPrefix of the published subjects; default "walcast".
	SubjectPrefix string

	// MaxBufferedBytes bounds each socket's outbound queue.
	MaxBufferedBytes int
	// MaxDroppedFrames: more drops than this within DropWindowSpan close the
	// socket with 1013. Negative disables the check.
	MaxDroppedFrames int
	// MaxLag closes a socket with 1013 once the oldest thing it owes its
	// client (a queued frame, or a replay-gap waiting for the queue to
	// drain) has waited longer than this: the client cannot keep up.
	// Negative disables the check.
	MaxLag time.Duration
	// IdleTimeout closes a socket that sent no frame for this long (1001).
	IdleTimeout time.Duration
	// MaxConnections refuses upgrades beyond this many open sockets with
	// 503; 0 means unlimited.
	MaxConnections int
	// AcceptRate (per second) and AcceptBurst bound new connections; beyond
	// them the node answers 503 with Retry-After. 0 means unlimited.
	AcceptRate  float64
	AcceptBurst int
	// Limits per client address (ClientKey: an IPv4 address, an IPv6 /64);
	// 0 means unlimited. MaxConnectionsPerIP open sockets; beyond them 503
	// with Retry-After. AcceptRatePerIP (per second) and AcceptBurstPerIP
	// new sockets; beyond them 503 with Retry-After.
	MaxConnectionsPerIP int
	AcceptRatePerIP     float64
	AcceptBurstPerIP    int
	// MaxConnectionsPerSubject bounds the open sockets of one token
	// subject (sub; tokens without one share a budget), from any number of
	// addresses; beyond it 503 with Retry-After. 0 means unlimited.
	MaxConnectionsPerSubject int
	// TrustedProxies are the proxies (load balancers) whose requests carry
	// the client's address in X-Forwarded-For: a request from one of them
	// is charged to the rightmost X-Forwarded-For address that is not
	// itself a trusted proxy. From any other peer the header is ignored
	// (a client could write anything there).
	TrustedProxies []netip.Prefix
	// GET /v1/changes budgets, kept per client address and per token
	// subject alike: ChangesRate (reads per second) and ChangesBurst, and
	// ChangesConcurrency reads in flight. Beyond them 429 with Retry-After.
	// 0 means unlimited.
	ChangesRate        float64
	ChangesBurst       int
	ChangesConcurrency int
	// InboundRate (frames per second) and InboundBurst bound what one client
	// may send; a flood closes the socket with 1008.
	InboundRate  float64
	InboundBurst int
	// MaxFrameBytes caps an inbound frame; a larger one closes with 1008.
	MaxFrameBytes int
	// WriteTimeout bounds one write to a socket.
	WriteTimeout time.Duration
	// ReadHeaderTimeout bounds reading a request's headers (slowloris);
	// HTTPWriteTimeout bounds writing an HTTP response (a /v1/changes read
	// or a refused handshake; an upgraded socket's writes are bounded by
	// WriteTimeout each, its reads by IdleTimeout); HTTPIdleTimeout closes
	// idle keep-alive connections; MaxHeaderBytes caps request headers.
	ReadHeaderTimeout time.Duration
	HTTPWriteTimeout  time.Duration
	HTTPIdleTimeout   time.Duration
	MaxHeaderBytes    int
	// AllowedOrigins are the browser origins, besides the node's own
	// (same host as the request), whose pages may use the node ("*" for
	// any). It applies only to requests that carry an Origin header: a
	// request without one (a service, a CLI) is never refused by it.
	AllowedOrigins []string
	// State configures snapshots (state.go); without a source URL the node
	// serves none.
	State StateConfig
	// MaxMemoryBytes, MaxReplayEntries: node-wide memory bound and the
	// longest socket catch-up (limits.go). 0 means the default, negative
	// no bound.
	MaxMemoryBytes   int64
	MaxReplayEntries int64
	// MaxFilterRows bounds the keys the node keeps per filtered
	// subscription of the rows its client holds (view.go); past it the
	// node sends a removal for every row that may have left the filter.
	// 0 means DefaultMaxFilterRows, negative keeps none.
	MaxFilterRows int
	// MaxFilterMemoryBytes bounds the memory of every filtered
	// subscription's row keys together; a subscription whose keys would
	// pass it keeps none, as past MaxFilterRows. 0 means
	// DefaultMaxFilterMemoryBytes, negative no bound.
	MaxFilterMemoryBytes int64
	// FilterLimits bound the filters clients send; zero fields take
	// filter.DefaultLimits'.
	FilterLimits filter.Limits

	// Clock drives idle eviction, drop windows and token buckets; default
	// the system clock.
	Clock Clock
	// Logger receives the node's logs; default discards.
	Logger *slog.Logger
	// Meter, when set, gets the node's metrics (DESIGN §8).
	Meter metric.Meter

	// sndBuf, when positive, sets each accepted socket's kernel send buffer
	// (tests use it to make a client that stops reading fill the queue soon).
	sndBuf int
}

func (c *Config) setDefaults() error {
	if c.NATS.URL == "" {
		return errors.New("sync: --nats-url is required")
	}
	if c.Journal == nil {
		return errors.New("sync: a journal is required")
	}
	if c.Auth == nil {
		return errors.New("sync: an authenticator is required (fix: set --jwt-secret or --jwt-public-key-file)")
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = "walcast"
	}
	if err := bus.CheckPrefix(c.SubjectPrefix); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	if c.MaxBufferedBytes <= 0 {
		c.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if c.MaxDroppedFrames == 0 {
		c.MaxDroppedFrames = DefaultMaxDroppedFrames
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxLag == 0 {
		c.MaxLag = DefaultMaxLag
	}
	if c.InboundRate <= 0 {
		c.InboundRate = DefaultInboundRate
	}
	if c.InboundBurst <= 0 {
		c.InboundBurst = DefaultInboundBurst
	}
	if c.MaxFilterRows == 0 {
		c.MaxFilterRows = DefaultMaxFilterRows
	}
	if c.MaxFilterMemoryBytes == 0 {
		c.MaxFilterMemoryBytes = DefaultMaxFilterMemoryBytes
	}
	if c.MaxFrameBytes <= 0 {
		c.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.HTTPWriteTimeout <= 0 {
		c.HTTPWriteTimeout = DefaultHTTPWriteTimeout
	}
	if c.HTTPIdleTimeout <= 0 {
		c.HTTPIdleTimeout = DefaultHTTPIdleTimeout
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.Clock == nil {
		c.Clock = realSyncClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Node is a sync node (DESIGN §6): it serves WebSockets at /v1/socket
// and journal reads at /v1/changes, subscribes to an entity's NATS subjects
// while a socket is a member of it, and repairs every gap from the journal.
//
// Lock order: Node.mu, then syncTopic.mu, then socket.mu.
type Node struct {
	cfg      Config
	j        *journal.Journal
	nc       *nats.Conn
	log      *slog.Logger
	upgrader websocket.Upgrader
	// poller holds idle sockets without a goroutine; nil where it cannot
	// run (not Linux, or epoll failed at Open).
	poller *idlePoller
	accept *tokenBucket
	limits clientLimits // per-address and per-subject budgets
	// rowBudget bounds the row keys of every filtered subscription
	// together (view.go); viewCatalog keeps the catalog entries their
	// filters are checked against.
	rowBudget   rowBudget
	viewCatalog catalogCache

	changesHook atomic.Pointer[func(*http.Request)] // tests: runs before each /v1/changes journal read
	state       *stateSource                        // snapshots; nil without a source (state.go)
	reads       sharedReads
	stats       syncStats
	reg         metric.Registration

	ctx    context.Context // ends with Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the node's own goroutines (sweeper, horizon)
	conns  sync.WaitGroup // open sockets

	horizon      atomic.Int64 // newest journal seq known
	horizonKnown atomic.Bool
	epoch        atomic.Int64  // the journal epoch every position the node holds is in (epoch.go)
	epochPoke    chan struct{} // asks watchEpoch for a check
	positions    chan [2]int64 // publisher positions (epoch, seq) to apply, the newest (position.go)

	natsUp     atomic.Bool
	natsClosed atomic.Bool   // the connection is closed for good (nats.go gave up)
	failed     chan struct{} // closed once the node cannot serve any more (Failed)
	failOnce   sync.Once

	// entities are the entities with a journaled change (topics a "*" grant
	// may follow), refreshed by followEntities.
	entities atomic.Pointer[map[string]struct{}]

	refusedOrigins originLog // refused origins already logged (web.go)

	warnMu   sync.Mutex           // guards warnedAt
	warnedAt map[string]time.Time // when each repeating warning was last logged

	mu      sync.Mutex // guards the following fields
	topics  map[string]*syncTopic
	sockets map[*socket]struct{}
	closed  bool
}

// Open connects to NATS and starts the node's background work. The
// node serves nothing until its Handler is mounted; Close stops it.
func Open(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, j: cfg.Journal, log: cfg.Logger, topics: map[string]*syncTopic{}, sockets: map[*socket]struct{}{},
		failed: make(chan struct{}), epochPoke: make(chan struct{}, 1), positions: make(chan [2]int64, 1)}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.reads.n = n
	n.limits.init(&n.cfg)
	n.rowBudget.limit = max(cfg.MaxFilterMemoryBytes, 0)
	if cfg.AcceptRate > 0 {
		burst := cfg.AcceptBurst
		if burst <= 0 {
			burst = max(1, int(cfg.AcceptRate))
		}
		n.accept = newTokenBucket(cfg.AcceptRate, burst, cfg.Clock)
	}
	n.upgrader = websocket.Upgrader{
		// Every open socket keeps its read buffer. gorilla needs it to
		// hold a frame header and a control frame's payload (at most 125
		// bytes); a larger message is read past it straight into the
		// caller's buffer, so 128 bytes costs no extra reads.
		ReadBufferSize:   128,
		WriteBufferSize:  4096,
		WriteBufferPool:  &sync.Pool{},
		HandshakeTimeout: 10 * time.Second,
		CheckOrigin:      n.checkOrigin,
		Error: func(w http.ResponseWriter, _ *http.Request, status int, reason error) {
			http.Error(w, reason.Error(), status)
		},
	}
	if cfg.NATS.Name == "" {
		cfg.NATS.Name = "walcast sync"
	}
	nc, err := bus.ConnectNATS(cfg.NATS,
		nats.DisconnectErrHandler(func(*nats.Conn, error) {
			n.natsUp.Store(false)
			n.log.Warn("NATS disconnected; sockets will be repaired from the journal on reconnect")
		}),
		nats.ReconnectHandler(func(*nats.Conn) {
			n.natsUp.Store(true)
			n.repairAll("reconnect")
		}),
		// nats.go closes a connection for good after a protocol error
		// (e.g. the server's "maximum control line exceeded") or when it
		// stops reconnecting: nothing will be delivered any more, so the
		// node reports itself failed (Healthy, Ready, Failed) and `walcast
		// sync` exits for its supervisor to restart it.
		nats.ClosedHandler(func(c *nats.Conn) {
			n.natsUp.Store(false)
			if n.ctx.Err() != nil {
				return // Close
			}
			n.natsClosed.Store(true)
			n.log.Error("NATS connection closed for good; the node can deliver nothing and must be restarted", "err", c.LastError())
			n.fail()
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) && sub != nil {
				n.repairSubject(sub.Subject, "slow-consumer")
				return
			}
			n.warnEvery("nats-error", "NATS error", "err", err)
		}))
	if err != nil {
		n.cancel()
		return nil, fmt.Errorf("sync: %w", err)
	}
	n.nc = nc
	n.natsUp.Store(true)
	if err := n.loadEntities(ctx); err != nil {
		nc.Close()
		n.cancel()
		return nil, fmt.Errorf("sync: read the journal's entities: %w", err)
	}
	epoch, _, err := n.j.Epoch(ctx)
	if err != nil {
		nc.Close()
		n.cancel()
		return nil, fmt.Errorf("sync: read the journal's epoch: %w", err)
	}
	n.epoch.Store(epoch)
	if n.state, err = openState(ctx, cfg.State); err != nil {
		nc.Close()
		n.cancel()
		return nil, err
	}
	if n.state != nil {
		n.state.useCatalog(n.j, n.warnEvery)
	}
	if _, err := nc.Subscribe(cfg.SubjectPrefix+".resync", n.onResync); err != nil {
		nc.Close()
		n.cancel()
		return nil, fmt.Errorf("sync: subscribe to resync entries: %w", err)
	}
	if _, err := nc.Subscribe(bus.PositionSubject(cfg.SubjectPrefix), n.onPosition); err != nil {
		nc.Close()
		n.cancel()
		return nil, fmt.Errorf("sync: subscribe to the publisher's position: %w", err)
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		nc.Close()
		n.cancel()
		return nil, fmt.Errorf("sync: NATS flush: %w", err)
	}
	if cfg.Meter != nil {
		if n.reg, err = registerSyncMetrics(cfg.Meter, n); err != nil {
			nc.Close()
			n.cancel()
			return nil, fmt.Errorf("sync: metrics: %w", err)
		}
	}
	if n.poller, err = newIdlePoller(); err != nil {
		n.log.Debug("idle sockets keep a reading goroutine", "reason", err)
		n.poller = nil
	}
	n.wg.Add(6)
	go n.followPositions()
	go n.watchEpoch()
	go n.sweepIdle()
	go n.sweepLag()
	go n.followHorizon()
	go n.followEntities()
	return n, nil
}

// fail marks the node failed (Failed is closed).
func (n *Node) fail() { n.failOnce.Do(func() { close(n.failed) }) }

// Failed is closed when the node can no longer serve (its NATS connection
// closed for good): the process should exit so it is replaced.
func (n *Node) Failed() <-chan struct{} { return n.failed }

// Healthy reports whether the node is alive: false once its NATS
// connection is closed for good (a disconnect being retried is not
// unhealthy, only unready).
func (n *Node) Healthy() (bool, string) {
	if n.natsClosed.Load() {
		return false, "NATS connection closed for good"
	}
	return true, "ok"
}

// entityRefresh is how often the known-entity list is re-read while the
// journal advances.
const entityRefresh = 2 * time.Second

// loadEntities reads the entities a "*" grant may follow.
func (n *Node) loadEntities(ctx context.Context) error {
	list, err := n.j.Entities(ctx, MaxTopicBytes, maxKnownEntities)
	if err != nil {
		return err
	}
	m := make(map[string]struct{}, len(list))
	for _, e := range list {
		if _, _, ok := decoder.SplitEntity(e); ok {
			m[e] = struct{}{}
		}
	}
	n.entities.Store(&m)
	return nil
}

// maxKnownEntities bounds the entity list a node keeps.
const maxKnownEntities = 100000

// known reports whether entity has a journaled change.
func (n *Node) known(entity string) bool {
	_, ok := (*n.entities.Load())[entity]
	return ok
}

// checkTopic is the one check of a topic a client names, on the socket,
// the event stream, GET /v1/changes and GET /v1/snapshot, made before
// anything is spent on it (no NATS subscription, no goroutine, no query):
// at most MaxTopicBytes, an entity name (decoder.SplitEntity), granted by
// the claims, and — when granted only by "*" — an entity the journal has
// changes of (known). A topic the token names explicitly is accepted: its
// issuer vouches for it. It returns "" or the refusal's code (bad-topic,
// forbidden, unknown-topic) and a message for the client.
//
// An unknown topic gets the same answer whatever the reason (no such
// table, one the node's role may not read, one that is not published, a
// system catalog): it comes from the journal's entity list alone, so it
// says nothing about the source database.
func (n *Node) checkTopic(c *Claims, topic string) (code, msg string) {
	switch {
	case len(topic) > MaxTopicBytes:
		return "bad-topic", fmt.Sprintf("a topic is at most %d bytes", MaxTopicBytes)
	case !isEntity(topic):
		return "bad-topic", "a topic is an entity, schema.table"
	case slices.Contains(c.Topics, topic):
		return "", ""
	case !c.Allows(topic):
		return "forbidden", "the token does not grant this topic"
	case !n.known(topic):
		return "unknown-topic", "no change of this entity has been journaled; name an existing entity (a new table is known within seconds of its first change)"
	}
	return "", ""
}

func isEntity(topic string) bool {
	_, _, ok := decoder.SplitEntity(topic)
	return ok
}

// topicStatus is the HTTP status of a checkTopic refusal.
func topicStatus(code string) int {
	switch code {
	case "forbidden":
		return http.StatusForbidden
	case "unknown-topic":
		return http.StatusNotFound
	}
	return http.StatusBadRequest
}

// followEntities re-reads the entity list every entityRefresh while the
// journal horizon moves, so a table's first change makes it a topic within
// seconds without any client frame causing a journal query.
func (n *Node) followEntities() {
	defer n.wg.Done()
	var seen int64 = -1
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.cfg.Clock.After(entityRefresh):
		}
		h := n.horizon.Load()
		if h == seen {
			continue
		}
		ctx, cancel := context.WithTimeout(n.ctx, 10*time.Second)
		if err := n.loadEntities(ctx); err != nil {
			n.warnEvery("entities", "reading the journal's entities failed; retrying", "err", err)
		} else {
			seen = h
		}
		cancel()
	}
}

// Ready reports whether the node can serve: NATS connected and the journal
// horizon known.
func (n *Node) Ready() (bool, string) {
	switch {
	case n.natsClosed.Load():
		return false, "NATS connection closed for good; " + bus.ConnStatus(n.nc)
	case !n.natsUp.Load():
		return false, "NATS disconnected; " + bus.ConnStatus(n.nc)
	case n.horizon.Load() == 0 && !n.horizonKnown.Load():
		return false, "journal horizon not read yet"
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return true, fmt.Sprintf("ready: %d sockets, %d topics; %s", len(n.sockets), len(n.topics), bus.ConnStatus(n.nc))
}

// Handler serves /v1/socket, /v1/changes, /v1/snapshot and /v1/events
// (events.go), refusing any request with a body and any Origin that is not
// allowed (web.go).
func (n *Node) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/socket", n.originGuard(n.serveSocket))
	mux.HandleFunc("GET /v1/changes", n.api(n.serveChanges))
	mux.HandleFunc("GET /v1/snapshot", n.api(n.serveSnapshot))
	mux.HandleFunc("GET /v1/events", n.api(n.serveEvents))
	for _, p := range []string{"/v1/changes", "/v1/snapshot", "/v1/events"} {
		mux.HandleFunc("OPTIONS "+p, n.servePreflight)
	}
	return refuseBodies(mux)
}

// HTTPServer returns a server for Handler with the node's HTTP limits:
// header read, response write and keep-alive idle timeouts and a header size
// cap. No request body is read (Handler refuses them unread), so nothing
// is read without a deadline: headers within ReadHeaderTimeout, the next
// request within IdleTimeout. An upgraded socket leaves the server's
// deadlines behind: its writer sets a deadline per write and idle eviction
// bounds its reads.
func (n *Node) HTTPServer() *http.Server {
	return &http.Server{
		Handler:           n.Handler(),
		ReadHeaderTimeout: n.cfg.ReadHeaderTimeout,
		WriteTimeout:      n.cfg.HTTPWriteTimeout,
		IdleTimeout:       n.cfg.HTTPIdleTimeout,
		MaxHeaderBytes:    n.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(n.log.Handler(), slog.LevelDebug),
	}
}

// Close closes every socket with 1001, stops the node's goroutines and
// closes its NATS connection. It waits for all of them.
func (n *Node) Close() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	socks := make([]*socket, 0, len(n.sockets))
	for s := range n.sockets {
		socks = append(socks, s)
	}
	n.mu.Unlock()
	for _, s := range socks {
		s.closeWith(CloseShutdown, "node shutting down", "shutdown")
	}
	n.conns.Wait()
	if n.poller != nil {
		n.poller.close()
	}
	n.cancel()
	n.wg.Wait()
	n.state.close()
	if n.reg != nil {
		_ = n.reg.Unregister()
	}
	n.nc.Close()
}

// followHorizon keeps n.horizon at the journal's newest seq: sockets that
// subscribe without a cursor start there.
func (n *Node) followHorizon() {
	defer n.wg.Done()
	var after int64 = -1
	for {
		h, err := n.j.Wait(n.ctx, after)
		if err != nil {
			return // closed or ctx ended; Wait itself rides out outages
		}
		n.horizon.Store(h)
		n.horizonKnown.Store(true)
		if h <= after {
			n.pokeEpoch() // the horizon went back: the journal's epoch changed
		}
		after = h
	}
}

// sweepIdle closes sockets that have sent nothing for IdleTimeout, and
// those whose token has expired, checking every max(1 s, IdleTimeout/4).
func (n *Node) sweepIdle() {
	defer n.wg.Done()
	every := max(time.Second, n.cfg.IdleTimeout/4)
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.cfg.Clock.After(every):
		}
		now := n.cfg.Clock.Now()
		cutoff := now.Add(-n.cfg.IdleTimeout).UnixNano()
		n.mu.Lock()
		var idle, expired []*socket
		for s := range n.sockets {
			switch {
			case s.lastRecv.Load() < cutoff:
				idle = append(idle, s)
			case s.tokenExpired(now):
				expired = append(expired, s)
			}
		}
		n.mu.Unlock()
		for _, s := range idle {
			s.closeWith(websocket.CloseGoingAway, "idle timeout", "idle")
		}
		// A token is checked at the handshake; a socket does not outlive it.
		for _, s := range expired {
			s.closeExpired()
		}
	}
}

// syncTopic is the node's state for one entity while it has members: its
// NATS subscription and the entitySeq it last saw.
type syncTopic struct {
	n      *Node
	entity string
	sub    *nats.Subscription
	ready  chan struct{} // closed once the subscription is active on the server and baselined
	err    error         // set before ready is closed when that failed

	mu            sync.Mutex // guards the following fields
	members       map[*member]struct{}
	baselined     bool      // lastEntitySeq is known
	lastEntitySeq int64     // newest entitySeq received (or journaled at creation)
	lastSeen      int64     // newest seq received for the entity, or the journal horizon at the baseline if newer
	lost          lostCheck // entries the journal holds and the topic never received (position.go)
	gone          bool      // unsubscribed; a joiner must create a new topic
	burst         liveBurst // sockets whose writers wait for the end of a burst (socket.go)
}

// memberState is where a member stands.
type memberState uint8

const (
	memberCatchingUp   memberState = iota // reading the journal; live messages skip it
	memberLive                            // receiving live messages
	memberDesynced                        // a frame was dropped; waiting for the client to resubscribe
	memberGone                            // unsubscribed or socket closed
	memberSnapshotting                    // reading a snapshot (state.go); live messages skip it
)

// member is one socket's subscription to one topic.
type member struct {
	s     *socket
	t     *syncTopic
	topic string
	q     journal.Query // the scope: the entity and the socket's tenant
	// tenantTok is the subject tenant token of the scope: bus.NoTenantToken
	// for an unscoped socket.
	tenantTok string

	// Guarded by t.mu.
	state  memberState
	pos    int64 // the seq of the last entry delivered (or scanned) for this scope
	epoch  int64 // the journal epoch pos is in (epoch.go)
	repair bool  // catching up must read once more before going live
	quiet  bool  // pos was moved by a publisher position the client has not been told of (position.go)
	// Transactions (docs/sync.md "Transactions"). mid: the client was
	// given changes of a transaction but not its end, so pos is inside a
	// transaction of the scope; bound is then the newest position at a
	// transaction boundary the client was given (equal to pos otherwise),
	// the only position a cursor is issued for. held (live only): the
	// newest live change of the scope, not yet sent, until the next
	// message of the entity shows whether it ends its transaction.
	// owesResync: a TRUNCATE was sent; the resync it calls for follows
	// the end of its transaction.
	mid        bool
	bound      int64
	held       *liveChange
	owesResync bool
	// unjudged: a change of the transaction in progress could not be
	// judged under the member's view (view.go), so the member owes a
	// resync at its end and is sent nothing more of it: a cursor after a
	// transaction the client holds only part of would not be a boundary
	// of its rows.
	unjudged bool
	// snapshot: the client subscribed with "snapshot":true, so a resync is
	// answered with a fresh snapshot; job is the snapshot running (state.go).
	snapshot bool
	job      *snapJob
	// view: the subscription's filter and column list (view.go), nil for
	// the whole topic; rows: what the node knows of the rows the client
	// holds under it (never nil with a view).
	view *view
	rows *rowSet
}

// join adds m to its entity's topic, subscribing to NATS first if the
// topic is new, and returns the topic. The subscription is active on the
// server when join returns.
func (n *Node) join(ctx context.Context, m *member) (*syncTopic, error) {
	for {
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return nil, errors.New("node shutting down")
		}
		t := n.topics[m.topic]
		if t == nil {
			t = &syncTopic{n: n, entity: m.topic, members: map[*member]struct{}{}, ready: make(chan struct{})}
			sub, err := n.nc.Subscribe(bus.EntitySubjects(n.cfg.SubjectPrefix, m.topic), t.onMsg)
			if err != nil {
				n.mu.Unlock()
				return nil, err
			}
			sub.SetPendingLimits(1<<16, 256<<20)
			t.sub = sub
			n.topics[m.topic] = t
			m.t = t
			t.members[m] = struct{}{}
			n.mu.Unlock()
			// Live first: the server has the subscription before any read.
			var last, horizon int64
			err = n.nc.FlushTimeout(5 * time.Second)
			if err == nil {
				last, horizon, err = n.j.EntityBaseline(ctx, m.topic)
			}
			t.mu.Lock()
			if err == nil && !t.baselined {
				t.baselined, t.lastEntitySeq = true, last
				// Changes journaled up to horizon may have been
				// published before the subscription: the catch-ups
				// read at least that far (a standby journal may not
				// have replayed them yet).
				t.lastSeen = max(t.lastSeen, horizon)
			}
			t.err = err
			t.mu.Unlock()
			close(t.ready)
			if err != nil {
				n.leave(m)
				return nil, err
			}
			return t, nil
		}
		n.mu.Unlock()
		t.mu.Lock()
		if t.gone {
			t.mu.Unlock()
			continue
		}
		m.t = t
		t.members[m] = struct{}{}
		t.mu.Unlock()
		// Joining a topic another socket is creating: wait until its
		// subscription is live too.
		select {
		case <-t.ready:
		case <-ctx.Done():
			n.leave(m)
			return nil, ctx.Err()
		}
		if t.err != nil {
			n.leave(m)
			return nil, t.err
		}
		return t, nil
	}
}

// leave removes m from its topic and unsubscribes the topic when m was its
// last member.
func (n *Node) leave(m *member) {
	t := m.t
	if t == nil {
		return
	}
	n.mu.Lock()
	t.mu.Lock()
	m.state = memberGone
	if m.rows != nil {
		m.rows.forget() // gives its keys' memory back
	}
	if m.job != nil {
		m.job.cancel() // a snapshot stops reading at once
		m.job = nil
	}
	delete(t.members, m)
	empty := len(t.members) == 0 && !t.gone
	if empty {
		t.gone = true
		delete(n.topics, t.entity)
	}
	t.mu.Unlock()
	n.mu.Unlock()
	if empty {
		_ = t.sub.Unsubscribe()
		t.endBurst(nil) // its pending messages will not be handled
	}
}

// onMsg delivers one published change to the topic's live members. NATS
// calls it sequentially per subscription, in publish (seq) order.
func (t *syncTopic) onMsg(msg *nats.Msg) {
	n := t.n
	defer t.endBurst(msg.Sub)
	n.stats.liveReceived.Add(1)
	defer n.stats.liveHandled.Add(1)
	seq, err1 := strconv.ParseInt(msg.Header.Get(bus.HeaderSeq), 10, 64)
	eseq, err2 := strconv.ParseInt(msg.Header.Get(bus.HeaderEntitySeq), 10, 64)
	if err1 != nil || err2 != nil {
		n.warnEvery("headers", "NATS message without walcast headers ignored", "subject", msg.Subject)
		return
	}
	// The tenant is the subject's tenant token, exact for every value
	// (header values are trimmed by nats.go and never routed on).
	tenantTok, ok := bus.TenantOf(msg.Subject)
	if !ok {
		n.warnEvery("subject", "NATS message on a subject without a tenant token ignored", "subject", msg.Subject)
		return
	}
	unknown := msg.Header.Get(bus.HeaderTenantUnknown) == "true"
	payload := msg.Data
	epoch, ok := msgEpoch(msg)
	if !ok {
		n.warnEvery("headers", "NATS message with an invalid Walcast-Epoch header ignored", "subject", msg.Subject)
		return
	}
	if !n.inEpoch(epoch) {
		// Of another epoch: a straggler of the old history, or the first
		// of a new one, which the epoch check turns into a resync of
		// every member at a horizon that covers this message.
		n.stats.epochIgnored.Add(1)
		return
	}

	t.mu.Lock()
	t.lastSeen = max(t.lastSeen, seq)
	if t.baselined && eseq <= t.lastEntitySeq {
		t.mu.Unlock() // a republished message
		return
	}
	gap := t.baselined && eseq != t.lastEntitySeq+1
	t.lastEntitySeq, t.baselined = eseq, true
	if gap {
		t.repairLocked("gap")
		t.mu.Unlock()
		n.stats.inc(&n.stats.repairs, "gap")
		return
	}
	t.mu.Unlock()
	// The envelope's own op and oversize flag (a row value may hold the same
	// words in embedded JSON, so no substring test). Once per message, not
	// per socket.
	var head struct {
		Op       decoder.Op `json:"op"`
		Oversize bool       `json:"oversize"`
	}
	if err := json.Unmarshal(payload, &head); err != nil {
		n.warnEvery("invalid-message", "NATS message with an invalid envelope; repairing the entity from the journal", "subject", msg.Subject, "seq", seq)
		t.mu.Lock()
		t.repairLocked("invalid-message")
		t.mu.Unlock()
		return
	}
	end := msg.Header.Get(bus.HeaderTxnEnd) == bus.TxnEndEntity
	c := &liveChange{seq: seq, epoch: epoch, op: head.Op, commit: msg.Header.Get(bus.HeaderCommitLSN), payload: payload}
	if head.Oversize {
		// The row is read from the journal, never on this callback (a slow
		// journal would stall the entity's delivery to every member): the
		// members that see it catch up from their positions, on their own
		// goroutines, and the journal read brings the full envelope (and
		// what they held, again, with its end mark).
		t.mu.Lock()
		enc := liveFrames{n: n, topic: t.entity}
		k := 0
		for m := range t.members {
			if m.state != memberLive || m.epoch != epoch {
				continue
			}
			if h := m.held; h != nil && h.commit != c.commit {
				m.releaseLocked(&enc, true)
			}
			if m.state != memberLive {
				continue
			}
			if seq > m.pos && visible(m.tenantTok, tenantTok, unknown) {
				m.held = nil // read again from m.pos
				m.state = memberCatchingUp
				m.s.startCatchUp(m)
				k++
			} else if end && m.held != nil {
				m.releaseLocked(&enc, true)
			}
		}
		t.mu.Unlock()
		if k > 0 {
			n.stats.inc(&n.stats.repairs, "oversize")
		}
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	enc := liveFrames{n: n, topic: t.entity}
	for m := range t.members {
		if m.state != memberLive || m.epoch != epoch {
			continue
		}
		if h := m.held; h != nil && h.commit != c.commit {
			// Another transaction began without the end mark of the
			// held one reaching this node (a publisher that does not
			// mark ends): the held change was its last.
			m.releaseLocked(&enc, true)
		}
		mc, in := c, seq > m.pos && visible(m.tenantTok, tenantTok, unknown)
		if in && m.view != nil && m.state == memberLive {
			mc, in = m.viewLocked(&enc, c) // the view's form of c, if any
		}
		if !in {
			if end && m.held != nil && m.state == memberLive {
				m.releaseLocked(&enc, true)
			}
			continue
		}
		if m.held != nil {
			m.releaseLocked(&enc, false) // c follows it in its transaction
			if m.state != memberLive {
				continue
			}
		}
		m.held = mc
		if end {
			m.releaseLocked(&enc, true)
		}
	}
}

// liveChange is one live message of a topic, as a member holds it until
// it knows whether the change ends its transaction in the member's scope.
type liveChange struct {
	seq, epoch int64
	op         decoder.Op
	commit     string // the Walcast-Commit-Lsn header: the transaction
	payload    []byte
}

// liveFrames encodes the frames of one NATS callback once per change,
// scope and end mark, so every member of a scope shares the bytes; and
// judges the change once per view (views, vm), so every member of a view
// shares its form of it.
type liveFrames struct {
	n     *Node
	topic string
	m     map[liveFrameKey]*frame
	views viewCache
	vm    map[viewFormKey]*liveChange
}

type viewFormKey struct {
	view   string
	action viewAction
}

// viewChange is c as members of v get it for action: c itself when the
// view leaves its envelope as it is.
func (e *liveFrames) viewChange(v *view, action viewAction, c *liveChange, payload []byte) *liveChange {
	if action == viewSend && len(payload) == len(c.payload) && (len(payload) == 0 || &payload[0] == &c.payload[0]) {
		return c
	}
	k := viewFormKey{view: v.text, action: action}
	if vc := e.vm[k]; vc != nil {
		return vc
	}
	vc := &liveChange{seq: c.seq, epoch: c.epoch, op: c.op, commit: c.commit, payload: payload}
	if e.vm == nil {
		e.vm = map[viewFormKey]*liveChange{}
	}
	e.vm[k] = vc
	return vc
}

type liveFrameKey struct {
	c      *liveChange
	tenant string // "" for a frame inside a transaction: it carries no cursor, so no scope
	end    bool
}

func (e *liveFrames) frame(m *member, c *liveChange, end bool) *frame {
	k := liveFrameKey{c: c, end: end}
	if end {
		k.tenant = m.q.Tenant
	}
	if f := e.m[k]; f != nil {
		return f
	}
	cur := ""
	if end {
		var err error
		if cur, err = e.n.j.CursorAt(m.q, c.epoch, c.seq); err != nil {
			return nil
		}
	}
	f := changeFrame(e.topic, cur, c.payload, end)
	e.n.stats.framesEncoded.Add(1)
	if e.m == nil {
		e.m = map[liveFrameKey]*frame{}
	}
	e.m[k] = f
	return f
}

// releaseLocked sends m's held change, as the end of its transaction in
// m's scope or not. A TRUNCATE also means: re-read the entity (DESIGN §6);
// that resync follows the end of the truncate's transaction, so the
// cursor it carries is at a boundary. t.mu is held.
func (m *member) releaseLocked(enc *liveFrames, end bool) {
	c := m.held
	m.held = nil
	if c.payload == nil {
		// A change the member's view could not judge: nothing to send,
		// and the resync it owes goes out if its transaction ends here.
		if end {
			m.pos = c.seq
			m.endedLocked(c.seq, true)
		}
		return
	}
	f := enc.frame(m, c, end)
	if f == nil {
		return
	}
	m.deliverLocked(f, c.seq, end)
	if m.state == memberLive && c.op == decoder.OpTruncate {
		m.owesResync = true
	}
	m.endedLocked(c.seq, end)
}

// endedLocked follows a change frame sent for seq: at the end of a
// transaction a resync owed since a TRUNCATE in it goes out. t.mu is held.
func (m *member) endedLocked(seq int64, end bool) {
	if end && m.owesResync && (m.state == memberLive || m.state == memberCatchingUp) {
		m.owesResync, m.unjudged = false, false
		m.resyncLocked(m.s.n.resyncFrame(m, seq), seq)
	}
}

// visible applies DESIGN §5 to one live change by its subject's tenant
// token: a tenant-scoped socket (scope = bus.TenantToken(tenant, true)) sees
// its tenant's rows and rows with no tenant; an unscoped socket (scope =
// bus.NoTenantToken) only rows with no tenant; a tenant-unknown change
// reaches neither. Tokens are exact ("acme " is not "acme", "" is not no
// tenant), as the journal's filter is.
func visible(scope, tenant string, unknown bool) bool {
	switch {
	case unknown:
		return false
	case tenant == bus.NoTenantToken:
		return true
	}
	return scope != bus.NoTenantToken && scope == tenant
}

// deliverLocked queues f (for seq; end: f ends its transaction in m's
// scope) on m's socket. A frame that does not fit
// desyncs the member: it receives nothing more until the client resubscribes
// after the replay-gap its socket sends once drained. t.mu is held.
func (m *member) deliverLocked(f *frame, seq int64, end bool) {
	if m.s.enqueueIn(f, m, &m.t.burst) {
		m.pos, m.quiet = seq, false
		m.setMidLocked(!end)
		return
	}
	if m.state != memberGone {
		m.state = memberDesynced
		m.held, m.owesResync, m.unjudged = nil, false, false
	}
}

// setMidLocked records whether the client now holds part of a
// transaction (mid) after m.pos moved; at a boundary, pos is the client's
// newest boundary. t.mu is held.
func (m *member) setMidLocked(mid bool) {
	m.mid = mid
	if !mid {
		m.bound = m.pos
	}
}

// boundaryLocked is the position a cursor for m may be issued at: its
// newest transaction boundary. t.mu is held.
func (m *member) boundaryLocked() int64 {
	if m.mid {
		return m.bound
	}
	return m.pos
}

// resyncLocked queues a resync frame f (at seq) on m's socket as a control
// frame: it is never dropped (a socket that cannot take it is closed with
// 1013). A member subscribed with "snapshot":true gets a fresh snapshot
// instead. t.mu is held.
func (m *member) resyncLocked(f *frame, seq int64) {
	if m.rows != nil {
		m.rows.forget() // the client re-reads: the node cannot know what it will hold
	}
	if m.snapshot && m.state != memberGone && m.s.startSnapshotLocked(m, "resync") {
		return // answered with a fresh snapshot (state.go)
	}
	if m.s.enqueue(f, nil) {
		m.pos = seq
		m.held, m.owesResync, m.unjudged = nil, false, false
		m.setMidLocked(false)
	}
}

// repairLocked marks every member of the topic as owing a read of the
// journal from its position. t.mu is held.
func (t *syncTopic) repairLocked(cause string) {
	for m := range t.members {
		switch m.state {
		case memberLive:
			m.held = nil // read again from m.pos
			m.state = memberCatchingUp
			m.s.startCatchUp(m)
		case memberCatchingUp:
			m.repair = true
		}
	}
	t.n.log.Debug("repairing entity from the journal", "entity", t.entity, "cause", cause, "members", len(t.members))
}

// topicList returns the node's topics at this moment, so they can be
// walked without holding n.mu.
func (n *Node) topicList() []*syncTopic {
	n.mu.Lock()
	defer n.mu.Unlock()
	topics := make([]*syncTopic, 0, len(n.topics))
	for _, t := range n.topics {
		topics = append(topics, t)
	}
	return topics
}

// repairAll repairs every topic (after a NATS reconnect: anything published
// while disconnected was lost to this node).
func (n *Node) repairAll(cause string) {
	topics := n.topicList()
	for _, t := range topics {
		t.mu.Lock()
		t.baselined = false // the next message sets the baseline; the repair covers the rest
		t.repairLocked(cause)
		t.mu.Unlock()
		n.stats.inc(&n.stats.repairs, cause)
	}
	n.log.Info("repairing all topics from the journal", "cause", cause, "topics", len(topics))
}

func (n *Node) repairSubject(subject, cause string) {
	n.mu.Lock()
	var found *syncTopic
	for _, t := range n.topics {
		if t.sub.Subject == subject {
			found = t
			break
		}
	}
	n.mu.Unlock()
	if found != nil {
		found.mu.Lock()
		found.repairLocked(cause)
		found.mu.Unlock()
		n.stats.inc(&n.stats.repairs, cause)
	}
}

// onResync sends a resync frame to every member of every topic whose
// position is below the resync entry, and moves it there.
func (n *Node) onResync(msg *nats.Msg) {
	seq, err := strconv.ParseInt(msg.Header.Get(bus.HeaderSeq), 10, 64)
	if err != nil {
		return
	}
	if epoch, ok := msgEpoch(msg); !ok || !n.inEpoch(epoch) {
		// A resync entry that starts a new epoch: the epoch check
		// resyncs every member (positions of the old epoch say nothing
		// about the new one, so m.pos >= seq below would skip some).
		return
	}
	topics := n.topicList()
	for _, t := range topics {
		t.mu.Lock()
		enc := map[string]*frame{}
		for m := range t.members {
			if (m.state != memberLive && m.state != memberCatchingUp) || (m.pos >= seq && m.epoch == n.epoch.Load()) {
				continue
			}
			f := enc[m.q.Tenant]
			if f == nil {
				f = n.resyncFrame(m, seq)
				enc[m.q.Tenant] = f
			}
			m.resyncLocked(f, seq)
		}
		t.mu.Unlock()
	}
}

// resyncFrame is a resync for m at pos in m's epoch.
func (n *Node) resyncFrame(m *member, pos int64) *frame {
	cur, _ := n.j.CursorAt(m.q, m.epoch, pos)
	return controlFrame("resync", m.topic, cur)
}

// warnEvery logs a warning that can repeat (per message, per socket) at most
// once a minute per key, so a failing journal or a bad publisher cannot
// flood the log.
func (n *Node) warnEvery(key, msg string, args ...any) {
	now := time.Now()
	n.warnMu.Lock()
	if n.warnedAt == nil {
		n.warnedAt = map[string]time.Time{}
	}
	last, seen := n.warnedAt[key]
	if seen && now.Sub(last) < time.Minute {
		n.warnMu.Unlock()
		return
	}
	n.warnedAt[key] = now
	n.warnMu.Unlock()
	n.log.Warn(msg, args...)
}
