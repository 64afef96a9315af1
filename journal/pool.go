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
type connPool struct {
	cfg *pgx.ConnConfig
	sem chan struct{} // one token per open-or-opening connection in use

	mu     sync.Mutex // guards the following fields
	idle   []idleConn
	closed bool
}

type idleConn struct {
	c     *pgx.Conn
	since time.Time
}

// pingAfter is how long a connection may sit idle before it is checked on
// reuse, so that a server restart costs a reconnect rather than a failed
// call.
var pingAfter = 10 * time.Second // a variable for tests

func newConnPool(cfg *pgx.ConnConfig, max int) *connPool {
	return &connPool{cfg: cfg, sem: make(chan struct{}, max)}
}

// acquire returns an idle connection or opens one, waiting while max
// connections are in use. The caller must release it.
func (p *connPool) acquire(ctx context.Context) (*pgx.Conn, error) {
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.sem
		return nil, ErrClosed
	}
	for len(p.idle) > 0 {
		ic := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		p.mu.Unlock()
		if time.Since(ic.since) < pingAfter || ic.c.Ping(ctx) == nil {
			return ic.c, nil
		}
		closeConn(ic.c)
		if err := ctx.Err(); err != nil {
			<-p.sem
			return nil, err
		}
		p.mu.Lock()
	}
	p.mu.Unlock()
	c, err := pgx.ConnectConfig(ctx, p.cfg.Copy())
	if err != nil {
		<-p.sem
		return nil, err
	}
	return c, nil
}

// release returns c to the pool, or closes it when it is broken, busy or in a
// transaction (a cancelled query leaves the connection closed by pgx).
func (p *connPool) release(c *pgx.Conn) {
	defer func() { <-p.sem }()
	pc := c.PgConn()
	p.mu.Lock()
	if !p.closed && !c.IsClosed() && !pc.IsBusy() && pc.TxStatus() == 'I' {
		p.idle = append(p.idle, idleConn{c: c, since: time.Now()})
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	closeConn(c)
}

func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// close closes idle connections; connections in use are closed on release.
func (p *connPool) close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, ic := range idle {
		closeConn(ic.c)
	}
}

// Helpers over the pool, with pgx's signatures.

func (j *Journal) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c, err := j.pool.acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer j.pool.release(c)
	return c.Exec(ctx, sql, args...)
}

func (j *Journal) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	c, err := j.pool.acquire(ctx)
	if err != nil {
		return err
	}
	defer j.pool.release(c)
	return c.QueryRow(ctx, sql, args...).Scan(dest...)
}

// inTx runs fn in a transaction on a pooled connection, committing when fn
// returns nil and rolling back otherwise.
func (j *Journal) inTx(ctx context.Context, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	c, err := j.pool.acquire(ctx)
	if err != nil {
		return err
	}
	defer j.pool.release(c)
	return pgx.BeginTxFunc(ctx, c, opts, fn)
}
