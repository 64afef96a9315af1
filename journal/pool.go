package journal

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// connPool is a small bounded pool of connections.
//
// pgxpool would do, but it needs github.com/jackc/puddle/v2 listed in go.mod,
// which this package may not change; the journal's needs (a handful of
// short transactions and reads) are met by this.
//
// Connections come in two modes that differ only in session settings (see
// appendParams): append mode for appends, normal for everything else. An
// idle connection is reused only for its own mode, so the steady state never
// pays a SET. Every connection checked out has its progress watchdog armed
// (watchConn) with the call timeout: whatever the caller's context says, a
// call on which no byte moves for that long fails.
type connPool struct {
	cfg, appendCfg *pgx.ConnConfig
	lim            limits
	sem            chan struct{} // one token per open-or-opening connection in use

	mu        sync.Mutex // guards the following fields
	idle      []idleConn
	busy      map[*pgx.Conn]busyConn
	appending *pgx.Conn // the append-mode connection checked out, if any
	closed    bool
}

type idleConn struct {
	c      *pgx.Conn
	since  time.Time
	append bool
}

type busyConn struct {
	w      *watchConn // nil if the dialer was not ours (cannot happen via Open)
	append bool
}

// pingAfter is how long a connection may sit idle before it is checked on
// reuse, so that a server restart costs a reconnect rather than a failed
// call.
var pingAfter = 10 * time.Second // a variable for tests

func newConnPool(cfg *pgx.ConnConfig, lim limits, max int) *connPool {
	ac := cfg.Copy()
	for k, v := range appendParams {
		ac.RuntimeParams[k] = v
	}
	return &connPool{cfg: cfg, appendCfg: ac, lim: lim, sem: make(chan struct{}, max), busy: map[*pgx.Conn]busyConn{}}
}

// appendKey marks a context whose calls are appends (append-mode
// connections).
type appendKey struct{}

func withAppendMode(ctx context.Context) context.Context {
	return context.WithValue(ctx, appendKey{}, true)
}

func isAppendMode(ctx context.Context) bool {
	v, _ := ctx.Value(appendKey{}).(bool)
	return v
}

// acquire returns an idle connection of ctx's mode or opens one, waiting
// while max connections are in use. Waiting, checking and connecting are
// bounded by the call timeout. The caller must release it.
func (p *connPool) acquire(ctx context.Context) (*pgx.Conn, error) {
	mode := isAppendMode(ctx)
	wctx, cancel := context.WithTimeout(ctx, p.lim.call)
	defer cancel()
	select {
	case p.sem <- struct{}{}:
	case <-wctx.Done():
		return nil, wctx.Err()
	}
	c, err := p.get(wctx, mode)
	if err != nil {
		<-p.sem
		return nil, err
	}
	w := watched(c)
	if w != nil {
		w.arm(p.lim.call)
	}
	p.mu.Lock()
	if p.closed { // closed while connecting
		p.mu.Unlock()
		closeConn(c)
		<-p.sem
		return nil, ErrClosed
	}
	p.busy[c] = busyConn{w: w, append: mode}
	if mode {
		p.appending = c
	}
	p.mu.Unlock()
	return c, nil
}

func (p *connPool) get(ctx context.Context, mode bool) (*pgx.Conn, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	for {
		i := len(p.idle) - 1
		for ; i >= 0 && p.idle[i].append != mode; i-- {
		}
		if i < 0 {
			break
		}
		ic := p.idle[i]
		p.idle = append(p.idle[:i], p.idle[i+1:]...)
		p.mu.Unlock()
		if time.Since(ic.since) < pingAfter || ic.c.Ping(ctx) == nil {
			return ic.c, nil
		}
		closeConn(ic.c)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p.mu.Lock()
	}
	// Keep the pool's total within its bound: make room by closing the
	// longest-idle connection of the other mode.
	var evict *pgx.Conn
	if len(p.idle) > 0 && len(p.idle)+len(p.busy) >= cap(p.sem) {
		evict = p.idle[0].c
		p.idle = p.idle[1:]
	}
	p.mu.Unlock()
	if evict != nil {
		closeConn(evict)
	}
	cfg := p.cfg
	if mode {
		cfg = p.appendCfg
	}
	return pgx.ConnectConfig(ctx, cfg.Copy())
}

// release returns c to the pool, or closes it when it is broken, busy or in a
// transaction (a cancelled query leaves the connection closed by pgx).
func (p *connPool) release(c *pgx.Conn) {
	defer func() { <-p.sem }()
	pc := c.PgConn()
	p.mu.Lock()
	b := p.busy[c]
	delete(p.busy, c)
	if p.appending == c {
		p.appending = nil
	}
	if b.w != nil {
		b.w.disarm()
	}
	if !p.closed && !c.IsClosed() && !pc.IsBusy() && pc.TxStatus() == 'I' {
		p.idle = append(p.idle, idleConn{c: c, since: time.Now(), append: b.append})
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	closeConn(c)
}

// appendProgress reports whether an append holds a connection and when a
// byte last moved on it.
func (p *connPool) appendProgress() (bool, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.appending == nil {
		return false, time.Time{}
	}
	if w := p.busy[p.appending].w; w != nil {
		return true, w.lastProgress()
	}
	return true, time.Time{}
}

func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// close closes idle connections; connections in use are closed on release.
// With abort it also breaks the sockets of connections in use, so the calls
// on them fail at once.
func (p *connPool) close(abort bool) {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	var socks []*watchConn
	if abort {
		for _, b := range p.busy {
			if b.w != nil {
				socks = append(socks, b.w)
			}
		}
	}
	p.mu.Unlock()
	for _, w := range socks {
		_ = w.Conn.Close()
	}
	for _, ic := range idle {
		closeConn(ic.c)
	}
}

// Helpers over the pool, with pgx's signatures. Each is one journal call,
// bounded by the call timeout.

func (j *Journal) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	c, err := j.pool.acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer j.pool.release(c)
	return c.Exec(ctx, sql, args...)
}

func (j *Journal) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	c, err := j.pool.acquire(ctx)
	if err != nil {
		return err
	}
	defer j.pool.release(c)
	return c.QueryRow(ctx, sql, args...).Scan(dest...)
}

// inTx runs fn in a transaction on a pooled connection, committing when fn
// returns nil and rolling back otherwise. The whole transaction is one call.
func (j *Journal) inTx(ctx context.Context, opts pgx.TxOptions, fn func(context.Context, pgx.Tx) error) error {
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	c, err := j.pool.acquire(ctx)
	if err != nil {
		return err
	}
	defer j.pool.release(c)
	return pgx.BeginTxFunc(ctx, c, opts, func(tx pgx.Tx) error { return fn(ctx, tx) })
}
