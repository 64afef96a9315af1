package sync

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxClientKeys bounds the addresses and subjects the node keeps budgets
// for. Budgets at rest (no socket, no read in flight, buckets full) are
// forgotten by the lag sweep; a new client arriving while the table is full
// of active ones is refused like one over its budget.
const maxClientKeys = 1 << 17

// clientKey is the address a request's per-client limits are kept under:
// the IPv4 address, or the /64 of an IPv6 address (one host usually holds a
// whole /64, so per-address limits on IPv6 would limit nothing). The
// address is the peer's, or, when the peer is one of TrustedProxies, the
// rightmost X-Forwarded-For address that is not a trusted proxy (the
// leftmost one when all are). Behind an untrusted proxy every client has
// the proxy's key.
func (n *Node) clientKey(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return "ip:" + host
	}
	a = n.forwardedFor(a.Unmap(), r.Header.Values("X-Forwarded-For"))
	if a.Is6() {
		p, _ := a.Prefix(64)
		return "ip:" + p.String()
	}
	return "ip:" + a.String()
}

// forwardedFor walks X-Forwarded-For from the right while the hop that
// appended each entry is a trusted proxy. A malformed entry stops the walk
// at the last address known good.
func (n *Node) forwardedFor(peer netip.Addr, xff []string) netip.Addr {
	trusted := func(a netip.Addr) bool {
		for _, p := range n.cfg.TrustedProxies {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	if len(xff) == 0 || !trusted(peer) {
		return peer
	}
	var hops []string
	for _, v := range xff {
		hops = append(hops, strings.Split(v, ",")...)
	}
	a := peer
	for i := len(hops) - 1; i >= 0 && trusted(a); i-- {
		h, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break
		}
		a = h.Unmap()
	}
	return a
}

// Node-wide bounds.
const (
	// DefaultMaxMemoryBytes is Config.MaxMemoryBytes' default: bytes queued
	// on sockets plus snapshot rows spooled in memory, past which new
	// sockets and new snapshots are refused (503 with Retry-After, or
	// error overloaded) until some drain.
	DefaultMaxMemoryBytes = 2 << 30
	// DefaultMaxReplayEntries is Config.MaxReplayEntries' default: a socket
	// catch-up that would replay more journal entries than this (counted
	// on the whole journal, every entity) answers resync instead of
	// scanning.
	DefaultMaxReplayEntries = 1_000_000
)

// overloaded reports whether the node's memory (sockets' queues and
// spools in memory) is past MaxMemoryBytes, counting the refusal under
// what when it is.
func (n *Node) overloaded(what string) bool {
	max := n.cfg.MaxMemoryBytes
	if max <= 0 {
		return false
	}
	used := n.stats.queuedBytes.Load()
	if n.state != nil {
		used += n.state.memory.Load()
	}
	if used < max {
		return false
	}
	n.stats.inc(&n.stats.rejected, what)
	return true
}

// overloadedMessage is what a client refused by overloaded is told.
const overloadedMessage = "the node is at its memory bound (--max-memory-bytes): clients are not reading what is queued for them; retry later, or connect to another node"

// overloadRetry is the Retry-After of a refusal for memory.
const overloadRetry = 5 * time.Second

// subjectKey is the budget key of a token's subject.
func subjectKey(c *Claims) string { return "sub:" + c.Subject }

// bucket is token-bucket state kept inside a budget (the budget table's
// lock guards it).
type bucket struct {
	tokens float64
	last   time.Time
	used   bool // tokens and last are set
}

// take takes one token at now from a bucket of rate per second and burst;
// rate <= 0 means unlimited. When none is left it reports false and how
// long until one will be.
func (b *bucket) take(now time.Time, rate float64, burst int) (bool, time.Duration) {
	if rate <= 0 {
		return true, 0
	}
	if !b.used {
		b.tokens, b.last, b.used = float64(burst), now, true
	}
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = min(float64(burst), b.tokens+el*rate)
	}
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / rate * float64(time.Second))
}

// full reports whether the bucket has refilled by now (forgetting it loses
// nothing).
func (b *bucket) full(now time.Time, rate float64, burst int) bool {
	return !b.used || rate <= 0 || b.tokens+now.Sub(b.last).Seconds()*rate >= float64(burst)
}

// budget is what one client key has in use.
type budget struct {
	conns     int // open sockets (and handshakes holding a slot)
	reads     int // /v1/changes reads and socket catch-up pages in flight
	snaps     int // snapshots in progress (StateConfig.PerClient)
	accept    bucket
	changes   bucket
	snapshots bucket
}

// clientLimits keeps the per-address and per-subject budgets (Config:
// MaxConnectionsPerIP, AcceptRatePerIP, Changes*). Safe for concurrent use;
// its lock is taken after every other lock of the node, never before one.
type clientLimits struct {
	cfg *Config

	mu   sync.Mutex // guards the following fields
	keys map[string]*budget
	// snapFreed is closed when a snapshot slot is given back; nil while
	// nobody waits for one.
	snapFreed chan struct{}
}

func (l *clientLimits) init(cfg *Config) {
	l.cfg = cfg
	l.keys = map[string]*budget{}
	cfg.State.setDefaults()
	if cfg.MaxMemoryBytes == 0 {
		cfg.MaxMemoryBytes = DefaultMaxMemoryBytes
	}
	if cfg.MaxReplayEntries == 0 {
		cfg.MaxReplayEntries = DefaultMaxReplayEntries
	}
	if cfg.AcceptRatePerIP > 0 && cfg.AcceptBurstPerIP <= 0 {
		cfg.AcceptBurstPerIP = max(1, int(cfg.AcceptRatePerIP))
	}
	if cfg.ChangesRate > 0 && cfg.ChangesBurst <= 0 {
		cfg.ChangesBurst = max(1, int(cfg.ChangesRate))
	}
	if cfg.State.Rate > 0 && cfg.State.Burst <= 0 {
		cfg.State.Burst = max(1, int(cfg.State.Rate))
	}
}

// getLocked returns key's budget, creating it; nil when the table is full.
func (l *clientLimits) getLocked(key string) *budget {
	b := l.keys[key]
	if b == nil {
		if len(l.keys) >= maxClientKeys {
			return nil
		}
		b = &budget{}
		l.keys[key] = b
	}
	return b
}

// admitSocket takes a connection slot and an accept token of the address
// key ip and a connection slot of the subject key sub. It returns the
// refusal reason ("max-connections-per-ip", "accept-rate-per-ip",
// "max-connections-per-subject", "client-table-full") and how long to
// wait, or "" when admitted; an admitted socket calls releaseSocket when it
// ends.
func (l *clientLimits) admitSocket(ip, sub string) (string, time.Duration) {
	c := l.cfg
	perIP := c.MaxConnectionsPerIP > 0 || c.AcceptRatePerIP > 0
	perSub := c.MaxConnectionsPerSubject > 0
	if !perIP && !perSub {
		return "", 0
	}
	now := c.Clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var bi, bs *budget
	if perIP {
		if bi = l.getLocked(ip); bi == nil {
			return "client-table-full", 5 * time.Second
		}
		if c.MaxConnectionsPerIP > 0 && bi.conns >= c.MaxConnectionsPerIP {
			return "max-connections-per-ip", 5 * time.Second
		}
	}
	if perSub {
		if bs = l.getLocked(sub); bs == nil {
			return "client-table-full", 5 * time.Second
		}
		if bs.conns >= c.MaxConnectionsPerSubject {
			return "max-connections-per-subject", 5 * time.Second
		}
	}
	if perIP {
		if ok, wait := bi.accept.take(now, c.AcceptRatePerIP, c.AcceptBurstPerIP); !ok {
			return "accept-rate-per-ip", wait
		}
		bi.conns++
	}
	if perSub {
		bs.conns++
	}
	return "", 0
}

// releaseSocket returns the slots an admitted socket of ip and sub held.
func (l *clientLimits) releaseSocket(ip, sub string) {
	c := l.cfg
	perIP := c.MaxConnectionsPerIP > 0 || c.AcceptRatePerIP > 0
	perSub := c.MaxConnectionsPerSubject > 0
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := l.keys[ip]; perIP && b != nil && b.conns > 0 {
		b.conns--
	}
	if b := l.keys[sub]; perSub && b != nil && b.conns > 0 {
		b.conns--
	}
}

// beginRead admits one /v1/changes read charged to every key (the client's
// address and its token's subject): each must have a read token and room
// for one more read in flight. Admitted, it returns a release func to call
// when the read ends; refused, the wait before retrying.
func (l *clientLimits) beginRead(keys ...string) (func(), time.Duration) {
	c := l.cfg
	if c.ChangesRate <= 0 && c.ChangesConcurrency <= 0 {
		return func() {}, 0
	}
	now := c.Clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	bs := make([]*budget, len(keys))
	for i, k := range keys {
		if bs[i] = l.getLocked(k); bs[i] == nil {
			return nil, 5 * time.Second
		}
		if c.ChangesConcurrency > 0 && bs[i].reads >= c.ChangesConcurrency {
			return nil, time.Second
		}
	}
	// Every key has room in flight; now the rate. A key refused here has
	// spent nothing, the ones before it have spent a token (a refused
	// request still costs its sender).
	for _, b := range bs {
		if ok, wait := b.changes.take(now, c.ChangesRate, c.ChangesBurst); !ok {
			return nil, wait
		}
	}
	for _, b := range bs {
		b.reads++
	}
	return func() {
		l.mu.Lock()
		for _, b := range bs {
			b.reads--
		}
		l.mu.Unlock()
	}, 0
}

// takeSnapshot takes a snapshot token of every key (the client's address
// and its token's subject; State.Rate and State.Burst). Refused, it
// returns the wait before one will be there (a key refused has spent
// nothing; the ones before it have), else 0.
func (l *clientLimits) takeSnapshot(keys ...string) time.Duration {
	c := l.cfg
	if c.State.Rate <= 0 {
		return 0
	}
	now := c.Clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		b := l.getLocked(k)
		if b == nil {
			return 5 * time.Second
		}
		if ok, wait := b.snapshots.take(now, c.State.Rate, c.State.Burst); !ok {
			return max(wait, time.Millisecond)
		}
	}
	return 0
}

// waitSnapshotToken takes a snapshot token of every key as takeSnapshot
// does, waiting for them instead of refusing: a snapshot the node starts
// for a client (a resync) is charged to it and paced by its budget. It
// reports false when ctx ends first.
func (l *clientLimits) waitSnapshotToken(ctx context.Context, keys ...string) bool {
	for {
		wait := l.takeSnapshot(keys...)
		if wait == 0 {
			return true
		}
		select {
		case <-l.cfg.Clock.After(wait):
		case <-ctx.Done():
			return false
		}
	}
}

// acquireSnapshotSlot waits until every key (the client's address and
// its token's subject) has fewer than State.PerClient snapshots in
// progress and takes one of each. It returns the func that gives them
// back, or nil when ctx ends first.
func (l *clientLimits) acquireSnapshotSlot(ctx context.Context, keys ...string) func() {
	perClient := l.cfg.State.PerClient
	for {
		l.mu.Lock()
		bs := make([]*budget, len(keys))
		room := true
		for i, k := range keys {
			if bs[i] = l.getLocked(k); bs[i] == nil || (perClient > 0 && bs[i].snaps >= perClient) {
				room = false
				break
			}
		}
		if room {
			for _, b := range bs {
				b.snaps++
			}
			l.mu.Unlock()
			return func() {
				l.mu.Lock()
				for _, b := range bs {
					b.snaps--
				}
				if l.snapFreed != nil {
					close(l.snapFreed)
					l.snapFreed = nil
				}
				l.mu.Unlock()
			}
		}
		if l.snapFreed == nil {
			l.snapFreed = make(chan struct{})
		}
		freed := l.snapFreed
		l.mu.Unlock()
		select {
		case <-freed:
		case <-time.After(time.Second): // a full client table frees by pruning, not by release
		case <-ctx.Done():
			return nil
		}
	}
}

// prune forgets the budgets at rest at now.
func (l *clientLimits) prune(now time.Time) {
	c := l.cfg
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, b := range l.keys {
		if b.conns == 0 && b.reads == 0 && b.snaps == 0 && b.accept.full(now, c.AcceptRatePerIP, c.AcceptBurstPerIP) &&
			b.changes.full(now, c.ChangesRate, c.ChangesBurst) && b.snapshots.full(now, c.State.Rate, c.State.Burst) {
			delete(l.keys, k)
		}
	}
}

// retryAfter is the Retry-After value (whole seconds, at least 1) for a
// wait.
func retryAfter(wait time.Duration) string {
	return strconv.Itoa(int(max(1, (wait+time.Second-1)/time.Second)))
}
