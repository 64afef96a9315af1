package replication

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
// start of every session and again whenever it is older than
// xidRefreshEvery. The widened xid is the one of the 2^32 candidates in
// [R - 2^31, R + 2^31).
//
// Why that is the transaction's xid X. Let N be the source's next xid now.
//
//   - X > N - 2^31. The transaction is not yet journaled, so the slot has
//     not confirmed its commit, and the slot's catalog_xmin is at most X
//     (it is the oldest xid still running at a point the slot may restart
//     decoding from, which precedes X's commit; a transaction that started
//     later has a larger xid). catalog_xmin holds back the freezing of the
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
	// xidRefreshEvery is how old R may be before the writer reads it
	// again (one short query on a connection of its own).
	xidRefreshEvery = 2 * time.Second
	// xidMaxAge is how old R may be at all: when it cannot be read again
	// for this long, the session ends (and the next one reads it on its
	// replication connection) rather than widen against a stale value.
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

// xidClock holds R for one session. It is used by the session's journal
// writer only (and by the session before the stream starts).
type xidClock struct {
	r      *Replicator
	ref    uint64    // R
	at     time.Time // when ref was read
	conn   *pgconn.PgConn
	failed bool // a refresh failed since the last one that succeeded (logged once)
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

// anchor reads R on the session's replication connection, before
// START_REPLICATION: it works wherever the stream does.
func (c *xidClock) anchor(ctx context.Context, repl *pgconn.PgConn) error {
	ref, err := readXmax(ctx, repl)
	if err != nil {
		return fmt.Errorf("read the source's transaction id: %w", err)
	}
	c.ref, c.at = ref, time.Now()
	return nil
}

// widen sets the Xid8 of every transaction in txs, reading R again first
// when it is older than xidRefreshEvery. It fails only when R is older than
// xidMaxAge and cannot be read.
func (c *xidClock) widen(ctx context.Context, txs []*decoder.Transaction) error {
	if len(txs) == 0 {
		return nil
	}
	if age := time.Since(c.at); age >= xidRefreshEvery {
		if err := c.refresh(ctx); err != nil {
			if ctx.Err() == nil && age < xidMaxAge {
				if !c.failed {
					c.failed = true
					c.r.log.Warn("cannot read the source's transaction id counter; widening xids against the value read before", "age", age.Round(time.Second), "cause", err,
						"fix", "let walcast's role open connections to the source database (pg_hba.conf)")
				}
			} else {
				return fmt.Errorf("the source's transaction id counter was last read %s ago (at most %s: older, 64-bit xids could be wrong): %w", age.Round(time.Second), xidMaxAge, err)
			}
		}
	}
	for _, tx := range txs {
		tx.Xid8 = widenXid(tx.Xid, c.ref)
	}
	return nil
}

// refresh reads R on the clock's own connection: an ordinary one, or, for
// a source that takes only replication connections, a walsender.
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
	if c.failed {
		c.failed = false
		c.r.log.Info("reading the source's transaction id counter again")
	}
	c.ref, c.at = ref, time.Now()
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

// close closes the clock's connection, if any.
func (c *xidClock) close() {
	if c.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = c.conn.Close(ctx)
	c.conn = nil
}
