package replication

import (
	"context"
	"encoding/hex"
	"fmt"

	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcast/walcast/journal"
)

// publicationPoll is how often --snapshot-new-tables compares the
// publication's tables with the journal's record of them.
const publicationPoll = 5 * time.Second

// publishedTables lists the publication's tables (as pgoutput publishes
// them: partition roots under publish_via_partition_root) over conn, in
// name order.
func publishedTables(ctx context.Context, conn *pgconn.PgConn, pub string) ([]journal.Table, error) {
	q := "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = convert_from(decode('" +
		hex.EncodeToString([]byte(pub)) + "', 'hex'), 'UTF8') ORDER BY 1, 2"
	res, err := conn.Exec(ctx, q).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("list the tables of publication %q: %w", pub, err)
	}
	tables := []journal.Table{}
	if len(res) == 1 {
		for _, row := range res[0].Rows {
			tables = append(tables, journal.Table{Schema: string(row[0]), Name: string(row[1])})
		}
	}
	return tables, nil
}

// snapshotRequests asks for a snapshot of each table, with the configured
// chunk size.
func (r *Replicator) snapshotRequests(tables []journal.Table) []journal.SnapshotRequest {
	reqs := make([]journal.SnapshotRequest, len(tables))
	for i, t := range tables {
		reqs[i] = journal.SnapshotRequest{Schema: t.Schema, Table: t.Name, ChunkSize: r.cfg.SnapshotChunkSize}
	}
	return reqs
}

// watchPublication (--snapshot-new-tables) compares the publication's tables
// with the journal's record every publicationPoll and, for tables that
// joined it, records the new set and a snapshot request of each in one
// journal transaction. A journal that never recorded a set (one created by
// an older walcast) records the current set without snapshots: only tables
// that join later are new.
func (s *snapshotter) watchPublication(ctx context.Context) {
	log := s.r.log
	failing := false
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			closeSourceConn(ctx, conn)
		}
	}()
	for {
		var err error
		if conn == nil || conn.IsClosed() {
			conn, err = s.connect(ctx)
		}
		if err == nil {
			err = s.checkPublication(ctx, conn)
		}
		if err != nil && conn != nil {
			closeSourceConn(ctx, conn) // a failed check starts again on a new connection
			conn = nil
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			log.Warn("cannot compare the publication's tables with the journal's; retrying", "cause", err)
			failing = true
		case err == nil && failing:
			log.Info("comparing the publication's tables with the journal's again")
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(publicationPoll):
		}
	}
}

func (s *snapshotter) checkPublication(ctx context.Context, conn *pgx.Conn) error {
	cur, err := publishedTables(ctx, conn.PgConn(), s.r.cfg.Publication)
	if err != nil {
		return err
	}
	if len(cur) == 0 {
		// An empty list is also what a dropped publication gives: recorded,
		// it would make every table of a publication created again "new".
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", s.r.cfg.Publication).Scan(&exists); err != nil {
			return fmt.Errorf("look up publication %q: %w", s.r.cfg.Publication, err)
		}
		if !exists {
			return fmt.Errorf("publication %q does not exist; fix: CREATE PUBLICATION %s FOR TABLE …, or run with the --publication that exists", s.r.cfg.Publication, pgx.Identifier{s.r.cfg.Publication}.Sanitize())
		}
	}
	known, recorded, err := s.book.PublishedTables(ctx)
	if err != nil {
		return err
	}
	had := make(map[journal.Table]bool, len(known))
	for _, t := range known {
		had[t] = true
	}
	var added []journal.Table
	for _, t := range cur {
		if !had[t] {
			added = append(added, t)
		}
	}
	if recorded && len(added) == 0 && len(known) == len(cur) {
		return nil
	}
	var reqs []journal.SnapshotRequest
	if recorded {
		reqs = s.r.snapshotRequests(added)
	}
	if err := s.book.RecordPublishedTables(ctx, s.gen, cur, reqs); err != nil {
		return err
	}
	for _, r := range reqs {
		s.r.log.Info("a table joined the publication; snapshotting it", "table", journal.Table{Schema: r.Schema, Name: r.Table}.Entity())
	}
	return nil
}

// rowLimiter spaces the chunks of all snapshot workers so that at most
// rate rows are read per second (rate 0: no limit).
type rowLimiter struct {
	rate float64

	mu   sync.Mutex // guards next
	next time.Time  // when the rows reserved so far have been paid for
}

// wait blocks until n more rows may be read, or ctx ends.
func (l *rowLimiter) wait(ctx context.Context, n int) error {
	if l == nil || l.rate <= 0 || n <= 0 {
		return nil
	}
	l.mu.Lock()
	now := time.Now()
	start := l.next
	if start.Before(now) {
		start = now
	}
	l.next = start.Add(time.Duration(float64(n) / l.rate * float64(time.Second)))
	l.mu.Unlock()
	d := time.Until(start)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// closeSourceConn closes a snapshot connection to the source, within
// closeTimeout even when ctx has ended.
func closeSourceConn(ctx context.Context, conn *pgx.Conn) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	conn.Close(cctx)
}
