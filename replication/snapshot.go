package replication

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// Snapshots: the DBLog watermark algorithm (as Debezium's incremental
// snapshots). For each chunk of a table, in key order (keyset pagination
// on the primary key, or the replica identity index), the snapshot worker
//
//  1. commits a low watermark, a transactional logical decoding message
//     with prefix snapshotPrefix;
//  2. SELECTs the chunk in a REPEATABLE READ transaction, noting the
//     transactions its snapshot sees in progress (correctness comes from
//     the watermarks, and from reading a chunk again when one of those had
//     committed before the low watermark: see recentXids);
//  3. hands the rows to the stream loop, then commits a high watermark.
//
// The stream loop, meeting the low watermark in commit order, starts
// collecting the keys of the table's changes; at the high watermark it drops
// the chunk's rows whose keys changed in between (their current state is in
// the stream, after the SELECT may or may not have seen it) — all of them
// after a TRUNCATE — and journals the rest as op "read" entries in place of
// the high watermark's transaction, with the chunk's progress in the same
// journal transaction. A row the SELECT saw that was not changed in the
// window is the row's state at the high watermark, so the journal read from
// its first entry rebuilds the table. The live stream never pauses.

// snapshotPrefix is the prefix of the watermark messages. It lies inside the
// default --message-prefix, but the decoder consumes these messages
// (decoder.Config.ControlPrefix): they are never journaled.
const snapshotPrefix = "walcast.snapshot"

// snapshotPoll is how often an idle worker looks for requests.
const snapshotPoll = time.Second

// maxWindows bounds the watermark windows the loop keeps open: a window
// whose high watermark never comes (the worker's connection failed between
// the two) is dropped when it is the oldest past the bound. A worker has
// one window open at a time, so the workers' windows always fit.
const maxWindows = 2 * MaxSnapshotParallel

// MaxSnapshotParallel bounds Config.SnapshotParallel: each worker is a
// connection to the source and a window the stream loop keeps.
const MaxSnapshotParallel = 8

// watermark is the content of a watermark message.
type watermark struct {
	Token  string   `json:"token"` // run:snapshot:chunk
	Mark   string   `json:"mark"`  // "low" or "high"
	Entity string   `json:"entity,omitempty"`
	Key    []string `json:"key,omitempty"` // chunk key column names (low)
}

// chunk is one chunk in flight between the worker and the loop.
type chunk struct {
	token      string
	id         int64
	entity     string
	enc        *decoder.RowEncoder
	rows       [][][]byte // published columns, text forms
	keys       [][]byte   // per row: the chunk key's values as JSON (RowEncoder.Values)
	lastKey    []string   // text forms of the last row's chunk key; nil when no row
	invisible  []uint32   // transactions in progress for the chunk's SELECT (read)
	first      bool       // journal snapshot-begin before the rows
	final      bool       // journal snapshot-end after them
	base       bool       // the first chunk of a run of the pipeline: the loop starts counting here
	cancelled  bool       // final because the snapshot was cancelled
	failed     string     // final because the snapshot failed: the reason (no rows)
	shape      string     // the table's shape (snapTable.shape) when the chunk was read
	rowsBefore int64      // read entries journaled before this chunk (meaningful when base)
	n          int64      // this chunk's number, from 1

	limit    int // rows asked for
	maxBytes int // the chunk stops after a row that takes it to this many bytes of values (not final then)
	bytes    int // bytes of values read
	nrows    int // rows read (rows is dropped by the loop once handled)

	done  chan struct{} // closed by the loop once it handled the high watermark
	ok    bool          // set before done: the chunk was journaled (queued)
	empty bool          // set before done: it had nothing to journal, so its progress is not recorded either
	kept  int           // set before done: rows journaled
}

// snapshotter runs snapshot requests for one session: the worker goroutine
// (run) and the chunks it hands to the session's stream loop.
type snapshotter struct {
	r    *Replicator
	book snapshotBook // the requests and their progress, in the journal
	gen  int64
	run  string // random per session: watermarks of other sessions are ignored

	limit *rowLimiter // --snapshot-max-rows-per-second, over all workers

	claimMu sync.Mutex   // one claim at a time (claim)
	active  atomic.Int32 // snapshots claimed by a worker now (read by the stream loop)

	mu     sync.Mutex        // guards the following fields
	chunks map[string]*chunk // registered, high watermark not yet handled
	busy   map[int64]bool    // snapshots a worker is running
	shrunk map[int64]int     // row limits of snapshots whose SELECT ran out of time (chunkFailed)
}

func newSnapshotter(r *Replicator, gen int64) *snapshotter {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &snapshotter{r: r, book: r.j, gen: gen, run: hex.EncodeToString(b[:]), chunks: map[string]*chunk{}, busy: map[int64]bool{}, shrunk: map[int64]int{},
		limit: &rowLimiter{rate: float64(r.cfg.SnapshotMaxRowsPerSecond)}}
}

func (s *snapshotter) register(c *chunk) {
	s.mu.Lock()
	s.chunks[c.token] = c
	s.mu.Unlock()
}

func (s *snapshotter) take(token string) *chunk {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.chunks[token]
	delete(s.chunks, token)
	return c
}

// refusal is a snapshot the worker cannot run as asked: it is marked failed
// with the message (what happened and the fix) and the worker moves on.
type refusal struct{ msg string }

func (e *refusal) Error() string { return e.msg }

func refusef(format string, args ...any) error { return &refusal{msg: fmt.Sprintf(format, args...)} }

// runWorker runs the session's snapshot workers (Config.SnapshotParallel
// of them, each on a table of its own) and, with --snapshot-new-tables,
// the publication watcher, until ctx ends.
func (s *snapshotter) runWorker(ctx context.Context) {
	var wg sync.WaitGroup
	n := max(1, s.r.cfg.SnapshotParallel)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.worker(ctx)
		}()
	}
	if s.r.cfg.SnapshotNewTables {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.watchPublication(ctx)
		}()
	}
	wg.Wait()
}

// claim returns the next open snapshot no other worker runs, marking it
// busy; release ends the claim.
func (s *snapshotter) claim(ctx context.Context) (journal.Snapshot, bool, error) {
	s.claimMu.Lock()
	defer s.claimMu.Unlock() // held across the read: claims are one at a time
	s.mu.Lock()
	busy := make([]int64, 0, len(s.busy))
	for id := range s.busy {
		busy = append(busy, id)
	}
	s.mu.Unlock()
	snap, ok, err := s.book.NextSnapshot(ctx, busy...)
	if ok {
		s.mu.Lock()
		s.busy[snap.ID] = true
		s.mu.Unlock()
		s.active.Add(1)
	}
	return snap, ok, err
}

func (s *snapshotter) release(id int64) {
	s.mu.Lock()
	delete(s.busy, id)
	s.mu.Unlock()
	s.active.Add(-1)
}

// worker works through open snapshot requests until ctx ends.
func (s *snapshotter) worker(ctx context.Context) {
	log := s.r.log
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			closeSourceConn(ctx, conn)
		}
	}()
	wait := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	failures := 0
	for ctx.Err() == nil {
		snap, ok, err := s.claim(ctx)
		if err != nil || !ok {
			if err != nil && ctx.Err() == nil {
				log.Warn("cannot read snapshot requests; retrying", "cause", err)
			}
			if !wait(snapshotPoll) {
				return
			}
			continue
		}
		if conn == nil || conn.IsClosed() {
			conn, err = s.connect(ctx)
			if err != nil {
				s.release(snap.ID)
				log.Warn("snapshot: cannot connect to the source database; retrying", "cause", err)
				if !wait(snapshotPoll) {
					return
				}
				continue
			}
		}
		s.r.snapRunning.Add(1)
		err = s.snapshot(ctx, conn, snap)
		s.r.snapRunning.Add(-1)
		if ctx.Err() != nil {
			s.release(snap.ID)
			return
		}
		var ref *refusal
		var changed *tableChanged
		switch {
		case err == nil:
			failures = 0
		case errors.As(err, &ref), errors.As(err, &changed):
			reason := err.Error()
			if ref != nil {
				reason = ref.msg
			}
			log.Error("snapshot failed", "id", snap.ID, "table", snap.Entity(), "reason", reason)
			// Still claimed: no other worker takes the snapshot up while its
			// end is journaled.
			if ferr := s.fail(ctx, conn, snap, reason); ferr != nil {
				log.Warn("cannot mark the snapshot failed", "id", snap.ID, "cause", ferr)
			}
		default:
			failures++
			log.Warn("snapshot interrupted; resuming from its last journaled chunk", "id", snap.ID, "table", snap.Entity(), "cause", err)
			if conn != nil && !conn.IsClosed() {
				closeSourceConn(ctx, conn)
			}
			conn = nil
			s.release(snap.ID)
			if !wait(min(time.Duration(failures)*snapshotPoll, 30*time.Second)) {
				return
			}
			continue
		}
		s.release(snap.ID)
	}
}

// fail ends snap as failed with reason (what happened, and the fix). A
// snapshot whose snapshot-begin is journaled also gets its snapshot-end,
// saying it failed and why, so every begin in the stream has an end: it
// goes through the stream loop as a chunk of no rows in a window of its
// own, and the journal records the status in the same transaction. Where
// that cannot be done (no connection), only the status is recorded.
func (s *snapshotter) fail(ctx context.Context, conn *pgx.Conn, snap journal.Snapshot, reason string) error {
	cur, err := s.book.SnapshotByID(ctx, snap.ID)
	if err != nil {
		return err
	}
	if cur.Status != journal.SnapshotRunning || cur.Chunks == 0 || conn == nil || conn.IsClosed() {
		return s.book.FailSnapshot(ctx, s.gen, snap.ID, reason)
	}
	c := &chunk{id: snap.ID, entity: snap.Entity(), final: true, failed: reason, base: true, rowsBefore: cur.Rows, n: cur.Chunks + 1,
		done: make(chan struct{})}
	c.token = s.run + ":" + strconv.FormatInt(snap.ID, 10) + ":" + strconv.FormatInt(c.n, 10)
	if err := s.emit(ctx, conn, watermark{Token: c.token, Mark: "low", Entity: c.entity}); err != nil {
		return s.book.FailSnapshot(ctx, s.gen, snap.ID, reason)
	}
	s.register(c)
	if err := s.emit(ctx, conn, watermark{Token: c.token, Mark: "high"}); err != nil {
		s.take(c.token)
		return s.book.FailSnapshot(ctx, s.gen, snap.ID, reason)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
	}
	if !c.ok {
		return s.book.FailSnapshot(ctx, s.gen, snap.ID, reason)
	}
	return s.journaled(ctx, snap.ID, 0)
}

func (s *snapshotter) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := ParseConnConfig(s.r.cfg.DatabaseURL)
	if err != nil {
		return nil, ClassifyConnectError("source database (snapshot connection)", err)
	}
	for k, v := range sessionSettings {
		cfg.RuntimeParams[k] = v
	}
	// A chunk holds its table's lock for one statement at most, and a
	// session that stops answering (walcast gone, the network cut) is ended
	// by the server, which releases the lock.
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	cfg.RuntimeParams["lock_timeout"] = ms(snapshotLockTimeout)
	cfg.RuntimeParams["statement_timeout"] = ms(snapshotStatementTimeout)
	cfg.RuntimeParams["idle_in_transaction_session_timeout"] = ms(snapshotIdleTimeout)
	cfg.RuntimeParams["tcp_keepalives_idle"] = "15"
	cfg.RuntimeParams["tcp_keepalives_interval"] = "15"
	cfg.RuntimeParams["tcp_keepalives_count"] = "4"
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, ClassifyConnectError("source database (snapshot connection)", err)
	}
	return conn, nil
}

// snapTable is what a snapshot needs to know of its table.
type snapTable struct {
	entity  string
	relid   uint32   // the relation's oid: a table dropped and created again is another table
	lock    string   // the LOCK TABLE target: the relation, quoted (a partitioned table locks its partitions too)
	parts   []uint32 // a partitioned table's leaf partitions, by oid
	shape   string   // what the publication sends of a row: the published columns, their types, the row filter
	from    string   // quoted relation, with ONLY for a plain table
	cols    []string // published columns, quoted, in attribute order
	keyCols []string // chunk key columns, quoted
	keyName []string // chunk key column names
	keyType []string // their types (format_type)
	keyColl []string // their collations ("" for the type's default), so a change of ordering is noticed
	keyIdx  []int    // their indexes in cols
	filter  string   // the publication's row filter, if any
	enc     *decoder.RowEncoder
}

// loadTable reads the table's published columns, replica identity and chunk
// key from the source's catalogs (loadSourceTable).
func (s *snapshotter) loadTable(ctx context.Context, conn *pgx.Conn, snap journal.Snapshot) (*snapTable, error) {
	ent := snap.Entity()
	pub := s.r.cfg.Publication
	src, err := loadSourceTable(ctx, conn, pub, snap.Schema, snap.Table, s.r.cfg.TenantColumn)
	switch {
	case errors.Is(err, errNoSourceTable):
		return nil, refusef("table %s does not exist in the source database; fix: check the name (schema.table) and start a new snapshot", ent)
	case errors.Is(err, errNotPublished):
		return nil, refusef("table %s is not in publication %q, so its changes are not streamed and a snapshot could not be kept current; fix: ALTER PUBLICATION %s ADD TABLE %s; then start a new snapshot",
			ent, pub, pgx.Identifier{pub}.Sanitize(), pgx.Identifier{snap.Schema, snap.Table}.Sanitize())
	case err != nil:
		return nil, err
	}
	if s.r.cfg.TenantColumn != "" && src.unscoped(s.r.cfg.TenantColumn) {
		return nil, refusef("table %s has tenant column %q but publication %q leaves it out of its column list, so no row's tenant can be known and its rows would reach every tenant; fix: %s then start a new snapshot",
			ent, s.r.cfg.TenantColumn, pub, unscopedFix(pub, src, s.r.cfg.TenantColumn))
	}
	relid, ident, kind, atts, pk, ri := src.relid, string(src.ident), string(src.kind), src.cols, src.pk, src.ri
	// Chunk key: columns every change of a row carries, so a change inside
	// a chunk's window can be matched with the row read. A delete carries
	// only the replica identity's columns (an update that moves a row, its
	// old values of them), so the key is the replica identity: the primary
	// key under DEFAULT, the identity index under USING INDEX; under FULL
	// every column is carried and the primary key, else the identity index,
	// orders the chunks.
	qname := pgx.Identifier{snap.Schema, snap.Table}.Sanitize()
	var chunkKey []int16
	switch ident {
	case "d":
		chunkKey = pk
	case "i":
		chunkKey = ri
	case "f":
		chunkKey = pk
		if len(chunkKey) == 0 {
			chunkKey = ri
		}
	case "n":
		return nil, refusef("table %s has REPLICA IDENTITY NOTHING, so its updates and deletes carry no key and a row read could never be matched with its changes; fix: ALTER TABLE %s REPLICA IDENTITY DEFAULT; (with a primary key) or REPLICA IDENTITY FULL; then start a new snapshot",
			ent, qname)
	}
	if len(chunkKey) == 0 {
		return nil, refusef("table %s has neither a primary key nor a replica identity index, so it cannot be read in key order; fix: add a primary key, or ALTER TABLE %s REPLICA IDENTITY USING INDEX <a unique index on NOT NULL columns>; then start a new snapshot",
			ent, qname)
	}
	t := &snapTable{entity: ent, relid: relid, lock: qname, from: qname}
	if kind != "p" {
		t.from = "ONLY " + t.from
	} else if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(relid::oid ORDER BY relid::oid), '{}') FROM pg_partition_tree($1::oid) WHERE isleaf`,
		relid).Scan(&t.parts); err != nil {
		return nil, err
	}
	infos := src.columnInfos()
	pos := map[int16]int{}
	for i, a := range atts {
		t.cols = append(t.cols, pgx.Identifier{a.name}.Sanitize())
		pos[a.num] = i
	}
	for _, n := range chunkKey {
		i, ok := pos[n]
		if !ok {
			return nil, refusef("a key column of table %s is not published (the publication's column list leaves it out), so changes to a row cannot be matched with the row read; fix: publish the key columns, then start a new snapshot", ent)
		}
		// The parameter's cast carries no collation: the column's own wins
		// over the parameter's default, in the comparison and in ORDER BY.
		a := atts[i]
		t.keyCols = append(t.keyCols, pgx.Identifier{a.name}.Sanitize())
		t.keyName = append(t.keyName, a.name)
		t.keyType = append(t.keyType, a.typ)
		t.keyColl = append(t.keyColl, a.collate)
		t.keyIdx = append(t.keyIdx, i)
	}
	t.filter = src.filter
	var shape strings.Builder
	for _, a := range atts {
		shape.WriteString(a.name + " " + a.typ + a.collate + "\x00")
	}
	sum := sha256.Sum256([]byte(shape.String() + "where " + t.filter))
	t.shape = hex.EncodeToString(sum[:16])
	t.enc = decoder.NewRowEncoder(snap.Schema, snap.Table, infos, s.r.cfg.TenantColumn)
	// Reads pass the guard the stream's changes pass (DESIGN §5 Limits).
	t.enc.Guard(s.r.cfg.MaxEnvelopeBytes, func(reason string) { s.r.quarantined.add(reason, 1) })
	return t, nil
}

// chunkSQL is the keyset query of one chunk: rows after the last key (none
// for the first chunk), in key order. Text values come back in text format
// (the output functions' forms, as pgoutput sends them).
func (t *snapTable) chunkSQL(first bool, where string, limit int) string {
	var b strings.Builder
	b.WriteString("SELECT " + strings.Join(t.cols, ", ") + ", " + strings.Join(t.keyCols, ", ") + " FROM " + t.from)
	var conds []string
	if !first {
		params := make([]string, len(t.keyCols))
		for i := range t.keyCols {
			params[i] = "CAST($" + strconv.Itoa(i+1) + "::text AS " + t.keyType[i] + ")"
		}
		conds = append(conds, "("+strings.Join(t.keyCols, ", ")+") > ("+strings.Join(params, ", ")+")")
	}
	if where != "" {
		conds = append(conds, "("+where+")")
	}
	if t.filter != "" {
		conds = append(conds, "("+t.filter+")")
	}
	if len(conds) > 0 {
		b.WriteString(" WHERE " + strings.Join(conds, " AND "))
	}
	b.WriteString(" ORDER BY " + strings.Join(t.keyCols, ", ") + " LIMIT " + strconv.Itoa(limit))
	return b.String()
}

// snapshot runs one snapshot from its persisted progress to its end.
func (s *snapshotter) snapshot(ctx context.Context, conn *pgx.Conn, snap journal.Snapshot) (err error) {
	// A request's condition may come from any role that can write the
	// snapshots table, not only from walcast snapshot start.
	if err := journal.CheckWhere(snap.Where); err != nil {
		return refusef("the snapshot's --where condition of %s is refused: %v; fix: start a new snapshot with one boolean expression on the table's columns (such as region = 'eu')", snap.Entity(), err)
	}
	t, err := s.loadTable(ctx, conn, snap)
	if err != nil {
		return err
	}
	if snap.Status == journal.SnapshotPending {
		var est int64 = -1
		// The estimate is only for status's ETA: a failure to read it is
		// no reason to stop.
		_ = conn.QueryRow(ctx, `SELECT coalesce(sum(greatest(c.reltuples, 0)), -1)::bigint FROM pg_partition_tree($1::regclass) p
			JOIN pg_class c ON c.oid = p.relid WHERE p.isleaf`, pgx.Identifier{snap.Schema, snap.Table}.Sanitize()).Scan(&est)
		if err := s.book.StartSnapshot(ctx, s.gen, snap.ID, est); err != nil {
			return err
		}
		s.r.log.Info("snapshot started", "id", snap.ID, "table", t.entity, "chunk_size", snap.ChunkSize, "where", snap.Where)
	} else {
		s.r.log.Info("snapshot resumed", "id", snap.ID, "table", t.entity, "rows", snap.Rows, "chunks", snap.Chunks)
	}
	// Chunks are pipelined: up to snapshotInFlight are read and handed to
	// the stream loop before the oldest is handled, so the reads overlap
	// the loop's and the journal's work. The loop takes them in order and
	// rejects every chunk after one it could not journal (snapWindows.high:
	// expect), so when the oldest failed the worker waits out the rest and
	// starts again after the last journaled chunk.
	lastKey, rowsDone, chunks := snap.LastKey, snap.Rows, snap.Chunks // as journaled
	began := time.Now()
	var inflight []*chunk
	shape := snap.Shape                                              // the shape lastKey was read in ("": not known)
	readKey, readShape, next, base := lastKey, shape, chunks+1, true // where the next chunk starts
	rowCap := snap.ChunkSize                                         // rows the next chunk asks for, at most
	var queued int64                                                 // the last chunk number the loop queued for the journal (one with entries)
	drain := func() error {                                          // wait for every chunk in flight (after a failure)
		for _, c := range inflight {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-c.done:
			}
			if c.ok && !c.empty {
				queued = max(queued, c.n)
			}
		}
		inflight = inflight[:0]
		return nil
	}
	// Whatever ends the snapshot here, chunks the loop queued reach the
	// journal before the worker lets the snapshot go: another worker (or
	// the next attempt) resumes from the journaled progress, and would
	// otherwise read again, and journal twice, what is still queued.
	defer func() {
		if err == nil || ctx.Err() != nil {
			return
		}
		if derr := drain(); derr != nil {
			return
		}
		if queued > 0 {
			if werr := s.journaled(ctx, snap.ID, queued); werr != nil {
				err = errors.Join(err, werr)
			}
		}
	}()
	for {
		// Hand chunks to the loop until the pipeline is full or the last
		// chunk (fewer rows than asked, or a cancel) is in it.
		for len(inflight) < snapshotInFlight && (len(inflight) == 0 || !inflight[len(inflight)-1].final) {
			cur, err := s.book.SnapshotByID(ctx, snap.ID)
			if err != nil {
				return err
			}
			if cur.Status != journal.SnapshotRunning {
				return drain() // finished or failed elsewhere
			}
			c := &chunk{id: snap.ID, entity: t.entity, enc: t.enc, first: next == 1, base: base, rowsBefore: rowsDone, n: next,
				cancelled: cur.CancelRequested, done: make(chan struct{}), limit: min(s.chunkLimit(snap), rowCap), maxBytes: s.chunkMaxBytes()}
			c.token = s.run + ":" + strconv.FormatInt(snap.ID, 10) + ":" + strconv.FormatInt(c.n, 10)
			if !c.cancelled {
				// --snapshot-max-rows-per-second: wait before the window
				// opens, so it stays as short as the read.
				if err := s.limit.wait(ctx, c.limit); err != nil {
					return err
				}
			}
			if err := s.emit(ctx, conn, watermark{Token: c.token, Mark: "low", Entity: t.entity, Key: t.keyName}); err != nil {
				return err
			}
			if c.cancelled {
				c.final = true
				s.register(c)
				if err := s.emit(ctx, conn, watermark{Token: c.token, Mark: "high"}); err != nil {
					s.take(c.token)
					return err
				}
			} else if err := s.read(ctx, conn, t, snap, readKey, readShape, c); err != nil {
				// Close the window before giving up on the chunk.
				s.register(&chunk{token: c.token, done: make(chan struct{}), id: -1})
				_ = s.emit(ctx, conn, watermark{Token: c.token, Mark: "high"})
				if derr := drain(); derr != nil {
					return derr
				}
				return s.chunkFailed(snap, c, err)
			}
			inflight = append(inflight, c)
			if c.bytes > 0 {
				// Ask the next chunk for about the rows that fit its byte
				// bound, so wide rows are not read only to be dropped.
				rowCap = max(1, min(snap.ChunkSize, int(int64(c.maxBytes)*int64(c.nrows)/int64(c.bytes))+1))
			}
			base = false
			next++
			if c.lastKey != nil {
				readKey = c.lastKey
			}
			if c.shape != "" {
				readShape = c.shape
			}
		}
		c := inflight[0]
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.done:
		}
		inflight = inflight[1:]
		if c.ok && !c.empty {
			queued = max(queued, c.n)
		}
		if !c.ok {
			// The window was lost or the chunk may lack a change: read it
			// again, after what the journal holds; the chunks after it are
			// rejected by the loop.
			if err := drain(); err != nil {
				return err
			}
			readKey, readShape, next, base = lastKey, shape, chunks+1, true
			continue
		}
		rowsDone += int64(c.kept)
		chunks = c.n
		s.r.snapChunks.Add(1)
		if c.lastKey != nil {
			lastKey = c.lastKey
		}
		if c.shape != "" {
			shape = c.shape
		}
		if c.final {
			if err := s.journaled(ctx, snap.ID, 0); err != nil {
				return err
			}
			el := time.Since(began)
			s.r.log.Info("snapshot finished", "id", snap.ID, "table", t.entity, "rows", rowsDone, "chunks", chunks, "cancelled", c.cancelled,
				"took", el.Round(time.Millisecond))
			return nil
		}
	}
}

// journaled waits until the journal holds the chunks of snapshot id up to
// chunk n, which the loop has queued (n 0: its last chunk, the one that
// ends it), or the snapshot is no longer running. So the snapshot is not
// taken up again from progress the journal does not have yet (which would
// read and journal those chunks twice). The queue is journaled in order or
// the session ends (and ctx with it), so the wait has no deadline of its
// own; a queue slow behind a huge transaction is logged now and then.
func (s *snapshotter) journaled(ctx context.Context, id, n int64) error {
	for waited := 1; ; waited++ {
		cur, err := s.book.SnapshotByID(ctx, id)
		if err != nil {
			return err
		}
		if cur.Status != journal.SnapshotRunning || n > 0 && cur.Chunks >= n {
			return nil
		}
		if waited%3000 == 0 {
			s.r.log.Warn("snapshot: chunks are queued but not journaled yet; waiting (the journal is behind the stream)",
				"id", id, "chunk", n, "journaled", cur.Chunks, "waited", (time.Duration(waited) * 20 * time.Millisecond).String())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// snapshotInFlight is how many chunks a worker has handed to the stream
// loop and not yet seen handled.
const snapshotInFlight = 3

// Limits of the snapshot connections (connect): a chunk's lock wait, and its
// SELECT (and COMMIT). While a chunk holds its table's ACCESS SHARE lock, a
// customer's DDL on the table waits, and every query behind that DDL with
// it: the lock is held for one chunk's SELECT at most
// snapshotStatementTimeout. A session that stops answering inside a
// transaction is ended by the server after snapshotIdleTimeout, so its lock
// is released.
const (
	snapshotLockTimeout      = 2 * time.Second
	snapshotStatementTimeout = 30 * time.Second
	snapshotIdleTimeout      = 60 * time.Second
)

// minChunkBytes is the least a chunk's byte bound goes down to.
const minChunkBytes = 256 << 10

// chunkMaxBytes is the bytes of values a chunk may hold: the chunks all
// workers have in flight take at most half of the journal queue's bound,
// so wide rows shorten the chunks instead of growing the process.
func (s *snapshotter) chunkMaxBytes() int {
	q := s.r.cfg.QueueMaxBytes
	if q <= 0 {
		q = 16 << 20
	}
	return max(minChunkBytes, int(q/int64(2*snapshotInFlight*max(1, s.r.cfg.SnapshotParallel))))
}

// chunkLimit is the row limit of the next chunk of snap: its chunk size,
// unless one of its SELECTs ran out of time and shrank it (chunkFailed).
func (s *snapshotter) chunkLimit(snap journal.Snapshot) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, ok := s.shrunk[snap.ID]; ok {
		return n
	}
	return snap.ChunkSize
}

// chunkFailed turns a failed chunk read into what the worker does next. A
// SELECT that ran out of time is read again at a quarter of the rows, down
// to one; a single row that cannot be read in time is refused with the fix.
func (s *snapshotter) chunkFailed(snap journal.Snapshot, c *chunk, err error) error {
	var to *chunkTimeout
	if !errors.As(err, &to) || to.lock {
		return err
	}
	if c.limit <= 1 {
		return refusef("the snapshot's SELECT of a single row of %s ran longer than %s; fix: make the --where condition or the publication's row filter cheap to evaluate (an index on its columns), then start a new snapshot",
			c.entity, snapshotStatementTimeout)
	}
	s.mu.Lock()
	s.shrunk[snap.ID] = max(1, c.limit/4)
	s.mu.Unlock()
	return err
}

// emit commits a watermark message in its own transaction.
func (s *snapshotter) emit(ctx context.Context, conn *pgx.Conn, w watermark) error {
	b, err := json.Marshal(w)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2::text)", snapshotPrefix, string(b)); err != nil {
		return fmt.Errorf("emit snapshot watermark: %w", err)
	}
	return nil
}

// recentXids is how many of the newest committed transactions the stream
// loop remembers (snapWindows.recent), with the tables they changed: far
// more than can be committing at once, so an in-progress transaction of a
// chunk's SELECT whose commit came before the low watermark is always among
// them.
const recentXids = 1 << 16

// The SELECT's snapshot and the stream. A transaction writes its commit
// record before it becomes visible to other sessions' snapshots, so one
// whose commit record precedes the low watermark in the WAL — and so
// precedes the window in the stream — can still be in progress for the
// SELECT that follows the watermark: its change would be missed by both the
// SELECT and the window. read records the SELECT's in-progress transactions
// (the xip of the snapshot it ran in); at the high watermark, one of them
// that the stream committed before the low watermark means the chunk may
// lack a change, and it is read again (high). Exact, and it never waits:
// an in-progress transaction that commits after the low watermark is seen
// by the window or comes after the reads.

// read SELECTs one chunk into c and commits its high watermark, in one
// REPEATABLE READ transaction that locks the table before it takes its
// snapshot and holds the lock until the high watermark is committed:
//
//   - A table-rewriting ALTER TABLE or a TRUNCATE is not MVCC-safe: one
//     that commits after a snapshot was taken leaves that snapshot reading
//     an empty table. With the lock taken first, such a statement either
//     committed before the snapshot (its rows are visible) or waits until
//     the chunk's high watermark is in the WAL, after the reads' position.
//   - No DDL can come between the SELECT and the high watermark, so the
//     reads, journaled at the high watermark, are in the table's shape at
//     that point of the stream.
//   - The table's catalog entries are read again in the same snapshot: a
//     column added, dropped, renamed or retyped since the last chunk is
//     read as the table now is; a table dropped and created again, or
//     whose chunk key changed, cannot be continued (tableChanged).
//
// The transactions the snapshot saw in progress go to c.invisible. The lock
// waits at most snapshotLockTimeout and the SELECT runs at most
// snapshotStatementTimeout (session settings, see connect): a customer's
// DDL queues behind a chunk for no longer than that.
func (s *snapshotter) read(ctx context.Context, conn *pgx.Conn, t *snapTable, snap journal.Snapshot, lastKey []string, shape string, c *chunk) (err error) {
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
		return fmt.Errorf("read snapshot chunk of %s: %w", t.entity, err)
	}
	registered := false
	defer func() {
		end := "COMMIT"
		if err != nil {
			end = "ROLLBACK"
		}
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snapshotStatementTimeout)
		defer cancel()
		if _, cerr := conn.Exec(ectx, end); cerr != nil && err == nil {
			err = fmt.Errorf("commit the high watermark of a snapshot chunk of %s: %w", t.entity, cerr)
		}
		if err != nil && registered {
			s.take(c.token)
		}
	}()
	// LOCK is a utility statement: it does not take the transaction's
	// snapshot, the next statement does.
	if _, err := conn.Exec(ctx, "LOCK TABLE "+t.lock+" IN ACCESS SHARE MODE"); err != nil {
		return classifyChunkErr(t, snap, err)
	}
	nt, err := s.loadTable(ctx, conn, snap)
	if err != nil {
		return err
	}
	if err := t.continues(nt); err != nil {
		return err
	}
	if lastKey != nil && shape != "" && nt.shape != shape {
		// A column added, dropped, renamed or retyped, or the
		// publication's column list or row filter changed: the rows read
		// so far are in the old shape. Start over from the first key, in
		// this chunk, so that at the snapshot's end every row has been
		// read as the table now is (the chunk's progress and reads are one
		// journal transaction: a crash resumes from this chunk).
		lastKey = nil
		s.r.log.Info("snapshot starts over: the table's published columns or row filter changed", "id", snap.ID, "table", t.entity)
	}
	*t = *nt
	c.enc, c.shape = t.enc, t.shape
	var xip []int64
	if err := conn.QueryRow(ctx, "SELECT coalesce(array_agg(x::text::bigint), '{}') FROM pg_snapshot_xip(pg_current_snapshot()) x").Scan(&xip); err != nil {
		return fmt.Errorf("read the source's snapshot: %w", err)
	}
	c.invisible = make([]uint32, len(xip))
	for i, x := range xip {
		c.invisible[i] = uint32(x) // pgoutput's xids are the low 32 bits of xid8
	}
	limit := c.limit
	sql := t.chunkSQL(lastKey == nil, snap.Where, limit)
	params := make([][]byte, len(lastKey))
	for i, k := range lastKey {
		params[i] = []byte(k)
	}
	rr := conn.PgConn().ExecParams(ctx, sql, params, nil, nil, nil)
	ncols := len(t.cols)
	full := false // the chunk reached its byte bound before its row limit
	for rr.NextRow() {
		if full {
			continue // the rest of the result is read and dropped
		}
		vals := rr.Values()
		row := make([][]byte, ncols)
		for i := 0; i < ncols; i++ {
			if vals[i] != nil {
				row[i] = bytes.Clone(vals[i])
				c.bytes += len(vals[i])
			}
		}
		c.rows = append(c.rows, row)
		key := make([]string, len(t.keyCols))
		for i := range key {
			key[i] = string(vals[ncols+i])
		}
		c.lastKey = key
		full = c.bytes >= c.maxBytes
	}
	if _, err := rr.Close(); err != nil {
		return classifyChunkErr(t, snap, err)
	}
	c.final = !full && len(c.rows) < limit
	c.keys = make([][]byte, len(c.rows))
	for i, row := range c.rows {
		c.keys[i] = t.enc.Values(nil, row, t.keyIdx)
	}
	// The high watermark commits with the read, while the lock is held.
	// From the registration on, the stream loop may handle the chunk (and
	// drop its rows) before this returns: the worker reads only fields
	// the loop never writes.
	c.nrows = len(c.rows)
	s.register(c)
	registered = true
	return s.emit(ctx, conn, watermark{Token: c.token, Mark: "high"})
}

// continues says whether a snapshot read as t can go on as nt, the same
// table read again: the same relation, ordered by the same key.
func (t *snapTable) continues(nt *snapTable) error {
	if nt.relid != t.relid {
		return &tableChanged{entity: t.entity, what: "was dropped and created again"}
	}
	if !slices.Equal(nt.parts, t.parts) {
		// Rows of a partition attached now may lie before the snapshot's
		// position, and the stream carries nothing for them (nor for the
		// rows of one detached).
		return &tableChanged{entity: t.entity, what: "had partitions attached or detached"}
	}
	if !slices.Equal(nt.keyName, t.keyName) || !slices.Equal(nt.keyType, t.keyType) || !slices.Equal(nt.keyColl, t.keyColl) {
		return &tableChanged{entity: t.entity, what: fmt.Sprintf("changed its chunk key from (%s) to (%s) (its replica identity, or a key column's name, type or collation)",
			strings.Join(t.keyName, ", "), strings.Join(nt.keyName, ", "))}
	}
	return nil
}

// tableChanged is a table that changed under a running snapshot so that its
// key order cannot be continued: the snapshot fails, saying so, and a new
// one reads the table as it is now.
type tableChanged struct{ entity, what string }

func (e *tableChanged) Error() string {
	return fmt.Sprintf("table %s %s while it was snapshotted, so the rest of it cannot be read in the order the snapshot began; fix: start a new snapshot of the table (walcast snapshot start --table %s)", e.entity, e.what, e.entity)
}

// classifyChunkErr says what a failed LOCK or chunk SELECT means: a table
// gone is a refusal; a lock wait or statement that ran out of time is
// retried; an error in the SQL is the --where condition's when one was
// given (the rest of the statement is built from the catalog).
func classifyChunkErr(t *snapTable, snap journal.Snapshot, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("read snapshot chunk of %s: %w", t.entity, err)
	}
	switch {
	case pgErr.Code == "42P01": // undefined_table: dropped while snapshotted
		return &tableChanged{entity: t.entity, what: "was dropped"}
	case pgErr.Code == "55P03" || pgErr.Code == "57014": // lock_not_available, query_canceled (statement_timeout)
		return &chunkTimeout{entity: t.entity, lock: pgErr.Code == "55P03", cause: err}
	case snap.Where != "" && (pgErr.Code[:2] == "42" || pgErr.Code[:2] == "22"):
		return refusef("the snapshot's SELECT of %s failed: %s (SQLSTATE %s); fix: correct the --where condition (a boolean expression on the table's columns) and start a new snapshot",
			t.entity, pgErr.Message, pgErr.Code)
	}
	return fmt.Errorf("read snapshot chunk of %s: %w", t.entity, err)
}

// chunkTimeout is a chunk whose lock wait or SELECT ran out of time: the
// chunk is read again later (a lock wait: behind a customer's DDL), or
// smaller (a SELECT: a selective --where or row filter walks far).
type chunkTimeout struct {
	entity string
	lock   bool
	cause  error
}

func (e *chunkTimeout) Error() string {
	if e.lock {
		return fmt.Sprintf("snapshot chunk of %s waited %s for its lock (the table is locked, usually by DDL); it is read again shortly: %v", e.entity, snapshotLockTimeout, e.cause)
	}
	return fmt.Sprintf("snapshot chunk of %s ran longer than %s; it is read again in smaller chunks: %v", e.entity, snapshotStatementTimeout, e.cause)
}

func (e *chunkTimeout) Unwrap() error { return e.cause }

// window collects the keys of a table's changes between a chunk's low and
// high watermarks. Owned by the stream loop.
type window struct {
	token     string
	entity    string
	key       []string
	changed   map[string]struct{}
	truncated bool // a TRUNCATE of the table: none of the chunk's rows is kept
	unknown   bool // a change whose key is not known: the chunk is read again
	// since is snapWindows.seq when the low watermark was met: the
	// transactions committed in the window are those remembered after it.
	since  uint64
	opened time.Time
	// evicted holds the transactions that committed before the low
	// watermark, changed the window's table and left the ring of recent
	// transactions while the window was open: high needs them as much as
	// those still in the ring.
	evicted map[uint32]struct{}
}

// maxWindowAge bounds how long a window stays open: a chunk's high
// watermark follows its low one within a lock wait, a SELECT and a commit
// (snapshotLockTimeout + snapshotStatementTimeout, and the round trips), so
// an older window belongs to a worker that gave up; its chunk, if its high
// watermark still comes, is read again.
const maxWindowAge = 5 * time.Minute

// snapWindows is the stream loop's side of the algorithm.
type snapWindows struct {
	s        *snapshotter
	open     []*window // in low watermark order
	progress map[*decoder.Transaction]*journal.SnapshotProgress

	// expect and rows are per snapshot: the chunk number the loop takes
	// next, and the read entries journaled so far (from a base chunk on).
	expect map[int64]int64
	rows   map[int64]int64

	// recent holds the newest recentXids committed transactions (ring, in
	// commit order) with the tables they changed and their seq, so high
	// can tell whether a transaction the chunk's SELECT saw in progress
	// committed in the window, or before it having changed the chunk's
	// table. seq counts the transactions remembered.
	recent  map[uint32]touched // xid → the newest of its ring entries
	ring    []uint32
	ringPos int
	seq     uint64
}

// touched is what a remembered transaction changed: up to two entities,
// or many (more, or not known).
type touched struct {
	n    int    // ring entries with this xid (2 only after xid wraparound)
	seq  uint64 // the newest entry's
	ents [2]string
	k    int
	many bool
}

func (t touched) has(entity string) bool {
	return t.many || t.ents[0] == entity && t.k > 0 || t.ents[1] == entity && t.k > 1
}

// touchedBy lists the entities tx changed (cheaply: decoder counts, never
// a re-read of a spilled transaction).
func touchedBy(tx *decoder.Transaction) touched {
	var t touched
	if !tx.CountChanges(func(entity string, _ decoder.Op, _ int) {
		switch {
		case t.many:
		case t.k > 0 && t.ents[0] == entity, t.k > 1 && t.ents[1] == entity:
		case t.k < len(t.ents):
			t.ents[t.k] = entity
			t.k++
		default:
			t.many = true
		}
	}) {
		t.many = true
	}
	return t
}

// remember records a committed transaction's xid and what it changed.
func (w *snapWindows) remember(xid uint32, t touched) {
	if w.recent == nil {
		// No size hint: a map sized for recentXids would be cleared in
		// full (megabytes) by every session, however few it remembers.
		w.recent = make(map[uint32]touched)
		w.ring = make([]uint32, 0, 1024)
	}
	w.seq++
	if len(w.ring) < recentXids {
		w.ring = append(w.ring, xid)
	} else {
		old := w.ring[w.ringPos]
		o := w.recent[old]
		oseq := w.seq - recentXids // the evicted entry's seq
		for _, win := range w.open {
			if oseq <= win.since && o.has(win.entity) {
				if win.evicted == nil {
					win.evicted = map[uint32]struct{}{}
				}
				win.evicted[old] = struct{}{}
			}
		}
		if o.n <= 1 {
			delete(w.recent, old)
		} else {
			o.n--
			w.recent[old] = o
		}
		w.ring[w.ringPos] = xid
		w.ringPos = (w.ringPos + 1) % recentXids
	}
	t.n = w.recent[xid].n + 1
	t.seq = w.seq
	w.recent[xid] = t
}

// process handles the committed transactions txs, in commit order: it
// records the keys changed in open windows and replaces each high
// watermark's transaction with the chunk's entries. It returns the
// transactions to journal and the progress records of those carrying
// chunks (nil when none).
func (w *snapWindows) process(txs []*decoder.Transaction) ([]*decoder.Transaction, map[*decoder.Transaction]*journal.SnapshotProgress) {
	w.progress = nil
	now := time.Now()
	for len(w.open) > 0 && now.Sub(w.open[0].opened) > maxWindowAge {
		w.open = w.open[1:]
	}
	for i, tx := range txs {
		// Which tables it changed matters only while a snapshot runs;
		// otherwise it counts as touching every table (a chunk that
		// follows may read again, never miss a change), and the hot path
		// does not pay for the counting.
		t := touched{many: true}
		if w.s.active.Load() > 0 || len(w.open) > 0 {
			t = touchedBy(tx)
		}
		if tx.Len() > 0 {
			for _, win := range w.open {
				if t.has(win.entity) {
					w.observe(tx)
					break
				}
			}
		}
		for _, ctl := range tx.Controls() {
			var m watermark
			if json.Unmarshal(ctl, &m) != nil || !strings.HasPrefix(m.Token, w.s.run+":") {
				continue // another session's, or not ours at all
			}
			switch m.Mark {
			case "low":
				w.open = append(w.open, &window{token: m.Token, entity: m.Entity, key: m.Key, changed: map[string]struct{}{},
					since: w.seq, opened: now})
				if len(w.open) > maxWindows {
					w.open = w.open[1:]
				}
			case "high":
				if out := w.high(tx, m.Token); out != nil {
					txs[i] = out
				}
			}
		}
		w.remember(tx.Xid, t)
	}
	return txs, w.progress
}

// observe adds the keys tx changes to the windows of their tables.
func (w *snapWindows) observe(tx *decoder.Transaction) {
	it := tx.Changes()
	for it.Next() {
		c := it.Change()
		for _, win := range w.open {
			if win.entity != c.Entity {
				continue
			}
			if c.Op == decoder.OpTruncate {
				win.truncated = true
				continue
			}
			keys, ok := changeKeys(c.Body, win.key)
			if !ok {
				// A change whose key cannot be told: the chunk may hold
				// its row, so it is read again.
				win.unknown = true
				continue
			}
			for _, k := range keys {
				win.changed[k] = struct{}{}
			}
		}
	}
	if err := it.Err(); err != nil {
		// A spilled transaction that cannot be read again: its keys are
		// not known, so every open window's chunk is read again.
		for _, win := range w.open {
			win.unknown = true
		}
	}
}

// changeKeys returns the chunk key values (as RowEncoder.Values encodes
// them) of a change envelope's key, before and after rows: an update that
// moves a row to another key changes both. ok is false when the envelope
// does not parse or carries none of them (a quarantined change without its
// key): then its row cannot be told.
func changeKeys(body []byte, cols []string) (keys []string, ok bool) {
	var env struct {
		Op                 decoder.Op
		Key, Before, After map[string]json.RawMessage
	}
	if json.Unmarshal(body, &env) != nil {
		return nil, false
	}
	for _, row := range []map[string]json.RawMessage{env.Key, env.Before, env.After} {
		if row == nil {
			continue
		}
		b := []byte{'['}
		all := true
		for i, c := range cols {
			v, has := row[c]
			if !has {
				all = false
				break
			}
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, v...)
		}
		if all {
			keys = append(keys, string(append(b, ']')))
		}
	}
	if len(keys) == 0 && env.Op != decoder.OpMessage {
		return nil, false
	}
	return keys, true
}

// high closes the window of token and builds the transaction that journals
// the chunk in place of tx; nil when tx stays as it is.
func (w *snapWindows) high(tx *decoder.Transaction, token string) *decoder.Transaction {
	var win *window
	for i, o := range w.open {
		if o.token == token {
			win = o
			w.open = append(w.open[:i:i], w.open[i+1:]...)
			break
		}
	}
	c := w.s.take(token)
	if c == nil {
		return nil // not registered: a chunk of an earlier attempt
	}
	defer close(c.done)
	if c.base && c.id >= 0 {
		if w.expect == nil {
			w.expect, w.rows = map[int64]int64{}, map[int64]int64{}
		}
		w.expect[c.id], w.rows[c.id] = c.n, c.rowsBefore
	}
	if c.id >= 0 && w.expect[c.id] != c.n {
		return nil // a chunk after one the loop could not journal: c.ok stays false
	}
	if c.id < 0 || win == nil || win.unknown {
		return nil // abandoned chunk, its low watermark never seen, or a change it cannot match: c.ok stays false
	}
	for _, x := range c.invisible {
		t, known := w.recent[x]
		if known && t.seq > win.since {
			continue // committed in the window: its keys are in changed
		}
		_, evicted := win.evicted[x]
		if evicted || known && t.has(c.entity) {
			// Changed the chunk's table, committed before the low
			// watermark, yet invisible to the SELECT: the chunk may lack
			// its change. Read it again.
			w.s.r.snapRereads.Add(1)
			w.s.r.log.Debug("snapshot chunk read again: a transaction committed before its low watermark was not visible to its SELECT",
				"snapshot", c.id, "chunk", c.n, "xid", x)
			return nil
		}
	}
	b := decoder.NewTxBuilder(tx.Xid, tx.CommitLSN, tx.EndLSN, tx.CommitTime)
	if tx.Len() > 0 {
		it := tx.Changes()
		for it.Next() {
			b.Copy(it.Change())
		}
		if it.Err() != nil {
			return nil
		}
	}
	lsn := tx.CommitLSN
	if c.first {
		b.Marker(lsn, true, decoder.SnapshotMarker{ID: c.id, Entity: c.entity})
	}
	kept := 0
	if !win.truncated {
		for i, row := range c.rows {
			if _, changed := win.changed[string(c.keys[i])]; changed {
				continue
			}
			b.Read(c.enc, lsn, row)
			kept++
		}
	}
	total := w.rows[c.id] + int64(kept)
	status := journal.SnapshotRunning
	if c.final {
		b.Marker(lsn, false, decoder.SnapshotMarker{ID: c.id, Entity: c.entity, Rows: total, Cancelled: c.cancelled, Failed: c.failed})
		switch {
		case c.failed != "":
			status = journal.SnapshotFailed
		case c.cancelled:
			status = journal.SnapshotCancelled
		default:
			status = journal.SnapshotDone
		}
	}
	out := b.Transaction()
	if w.progress == nil {
		w.progress = map[*decoder.Transaction]*journal.SnapshotProgress{}
	}
	w.progress[out] = &journal.SnapshotProgress{ID: c.id, EndLSN: out.EndLSN, LastKey: c.lastKey, Rows: total, Chunks: c.n, Status: status, Error: c.failed,
		Shape: c.shape}
	// A chunk that journals nothing (every row changed in its window, and
	// no marker) is an empty transaction the loop leaves out, progress and
	// all: the next chunk's progress supersedes it.
	c.ok, c.kept, c.empty = true, kept, out.Len() == 0
	w.rows[c.id], w.expect[c.id] = total, c.n+1
	c.rows, c.keys = nil, nil
	_ = tx.Close()
	return out
}

// lookupArrayElement describes the element of the array type oid (or of the
// array at the end of oid's chain of domains): its base type and delimiter,
// for decoder.Config.ArrayElement and decoder.ColumnInfo.Element. It
// reports false when oid is not an array or no longer exists.
func lookupArrayElement(ctx context.Context, conn *pgx.Conn, oid uint32) (decoder.ArrayElement, bool, error) {
	var e decoder.ArrayElement
	inElem := false
	for depth := 0; depth < 64; depth++ {
		var typtype, ns, name, delim string
		var base, elem uint32
		var typlen int16
		err := conn.QueryRow(ctx, `SELECT t.typtype::text, t.typbasetype, t.typelem, t.typlen, n.nspname, t.typname, t.typdelim::text
			FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = $1`, oid).Scan(&typtype, &base, &elem, &typlen, &ns, &name, &delim)
		if errors.Is(err, pgx.ErrNoRows) {
			return e, false, nil
		}
		if err != nil {
			return e, false, fmt.Errorf("look up array type %d in the source's catalog: %w", oid, err)
		}
		if inElem && e.Delim == 0 && len(delim) == 1 {
			e.Delim = delim[0] // the element type's own (a domain copies its base type's)
		}
		switch {
		case typtype == "d":
			oid = base
		case !inElem:
			if elem == 0 || typlen != -1 {
				return e, false, nil
			}
			inElem, oid = true, elem
			continue
		default:
			e.Schema, e.Name = ns, name
			return e, true, nil
		}
	}
	return e, false, nil
}
