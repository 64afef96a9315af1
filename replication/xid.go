package replication

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcast/walcast/decoder"
)

// pgoutput sends a transaction's xid as 32 bits; the journal also keeps
// its full 64-bit id (xid8, epoch<<32 | xid), which is what a sync node
// compares with the 64-bit snapshots of the source (docs/sync.md, "State,
// then changes"). The writer widens each transaction's xid just before
// journaling it, against a reference R: the xmax of pg_current_snapshot()
// on the source (one past the newest completed transaction), read at the
// start of every session and then every xidRefreshEvery while it streams.
// The widened xid is the one of the 2^32 candidates in
// [R - 2^31, R + 2^31).
//
// Why that is the transaction's xid X. Let N be the source's next xid now.
//
//   - X > N - 2^31. The transaction is not yet journaled, so the slot has
//     not confirmed its commit (status updates carry the journal's
//     watermark), and the slot's catalog_xmin is at most X: it is the
//     oldest xid still running at a point the slot may restart decoding
//     from, which precedes X's commit, so X was either running there or
//     assigned after it. catalog_xmin holds back the freezing of the
//     catalogs, so the database's datfrozenxid is at most X too, and
//     PostgreSQL assigns no xid 2^31 or more past datfrozenxid (the
//     wraparound limit stops it before, at about 2^31 - 3 million).
//     Since R is at most N, X > R - 2^31.
//   - X < R + 2^31. X < N, and N - R counts the xids assigned since R was
//     read plus those assigned but not completed when it was: with R at most
//     xidMaxAge old that is far below 2^31 (PostgreSQL assigns xids at a
//     few million a second at the very most; 2^31 of them take minutes).
//
// An entry of no transaction (xid 0: a non-transactional message) keeps 0.
const (
	// xidRefreshEvery is how often R is read again (one short query on a
	// connection of its own).
	xidRefreshEvery = 2 * time.Second
	// xidMaxAge is how old R may be at all: when it cannot be read again
	// for this long, the next append fails and ends the session (the next
	// one reads R on its replication connection) rather than widen against
	// a stale value.
	xidMaxAge = time.Minute
	// xidQueryTimeout bounds one read of R, the connect included.
	xidQueryTimeout = 5 * time.Second
)

// widenXid returns the 64-bit xid whose low 32 bits are x nearest ref: the
// one in [ref - 2^31, ref + 2^31), or the one at or after ref when that
// range reaches below 0 (the first epoch). It returns 0 for x 0.
func widenXid(x uint32, ref uint64) uint64 {
	if x == 0 {
		return 0
	}
	ahead := x - uint32(ref) // how far x lies after ref, modulo 2^32
	if ahead < 1<<31 {
		return ref + uint64(ahead)
	}
	behind := uint64(uint32(ref) - x) // 1 to 2^31
	if behind > ref {
		return ref + uint64(ahead)
	}
	return ref - behind
}

// xidClock holds R for one session: read on the session's replication
// connection before the stream starts (anchor), then every xidRefreshEvery
// by run, on a connection of its own, while the session streams; the
// session's journal writer reads it (widen) and never waits for the source.
type xidClock struct {
	r *Replicator

	mu  sync.Mutex // guards the following fields
	ref uint64     // R
	at  time.Time  // when ref was read

	conn *pgconn.PgConn // owned by run
}

// readXmax reads pg_current_snapshot()'s xmax on conn with the simple
// protocol, which a walsender (replication=database) runs too.
func readXmax(ctx context.Context, conn *pgconn.PgConn) (uint64, error) {
	res, err := conn.Exec(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())").ReadAll()
	if err != nil {
		return 0, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return 0, errors.New("pg_current_snapshot: unexpected result")
	}
	v, err := strconv.ParseUint(string(res[0].Rows[0][0]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("pg_current_snapshot: xmax %q: %w", res[0].Rows[0][0], err)
	}
	return v, nil
}

// set records a fresh R.
func (c *xidClock) set(ref uint64) {
	c.mu.Lock()
	c.ref, c.at = ref, time.Now()
	c.mu.Unlock()
}

// read returns R and when it was read.
func (c *xidClock) read() (uint64, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ref, c.at
}

// anchor reads R on the session's replication connection, before
// START_REPLICATION: it works wherever the stream does.
func (c *xidClock) anchor(ctx context.Context, repl *pgconn.PgConn) error {
	ref, err := readXmax(ctx, repl)
	if err != nil {
		return fmt.Errorf("read the source's transaction id: %w", err)
	}
	c.set(ref)
	return nil
}

// widen sets the Xid8 of every transaction in txs. It fails when R is
// older than xidMaxAge (run could not read it for that long).
func (c *xidClock) widen(txs []*decoder.Transaction) error {
	if len(txs) == 0 {
		return nil
	}
	ref, at := c.read()
	if age := time.Since(at); age > xidMaxAge {
		return fmt.Errorf("the source's transaction id counter was last read %s ago, more than %s: 64-bit xids widened against it could be wrong (fix: let walcast's role open connections to the source database, see pg_hba.conf)",
			age.Round(time.Second), xidMaxAge)
	}
	for _, tx := range txs {
		tx.Xid8 = widenXid(tx.Xid, ref)
	}
	return nil
}

// run reads R every xidRefreshEvery until ctx ends, on a connection of its
// own: an ordinary one or, for a source that takes only replication
// connections, a walsender. A failure is logged once, with the next success.
func (c *xidClock) run(ctx context.Context) {
	defer c.close()
	t := time.NewTicker(xidRefreshEvery)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := c.refresh(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			failing = true
			_, at := c.read()
			c.r.log.Warn("cannot read the source's transaction id counter; xids are widened against the value read before, for at most "+xidMaxAge.String(),
				"age", time.Since(at).Round(time.Second), "cause", err)
		case err == nil && failing:
			failing = false
			c.r.log.Info("reading the source's transaction id counter again")
		}
	}
}

func (c *xidClock) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, xidQueryTimeout)
	defer cancel()
	if c.conn == nil || c.conn.IsClosed() {
		conn, err := c.open(ctx)
		if err != nil {
			return err
		}
		c.conn = conn
	}
	ref, err := readXmax(ctx, c.conn)
	if err != nil {
		c.close()
		return err
	}
	c.set(ref)
	return nil
}

func (c *xidClock) open(ctx context.Context) (*pgconn.PgConn, error) {
	cfg, err := ParseConnConfig(c.r.cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg.Config.Copy())
	if err == nil {
		return conn, nil
	}
	if conn, rerr := connectReplication(ctx, c.r.cfg.DatabaseURL); rerr == nil {
		return conn, nil
	}
	return nil, ClassifyConnectError("source database (transaction id connection)", err)
}

// close closes run's connection, if any.
func (c *xidClock) close() {
	if c.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = c.conn.Close(ctx)
	c.conn = nil
}
