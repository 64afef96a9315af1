package journal

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
)

// Snapshots (the snapshots table, migration 3). A request is a row; the
// active replicator takes open ones (pending, then running) in id order,
// journals each table's rows in chunks and records its progress — the last
// chunk's key, rows and chunks journaled — in the same journal transaction
// as the chunk's entries (AppendSnapshot), so a restart resumes from the
// last journaled chunk.

// Snapshot statuses.
const (
	SnapshotPending   = "pending"
	SnapshotRunning   = "running"
	SnapshotDone      = "done"
	SnapshotCancelled = "cancelled"
	SnapshotFailed    = "failed"
)

// Chunk sizes of a snapshot request.
const (
	DefaultSnapshotChunkSize = 4096
	MaxSnapshotChunkSize     = 100000
)

// SnapshotRequest asks for a snapshot of one table.
type SnapshotRequest struct {
	Schema, Table string
	// Where, when not empty, is an SQL condition on the table's columns
	// that restricts the rows read (a trusted operator's SQL, spliced into
	// the snapshot's SELECT).
	Where string
	// ChunkSize is the rows per chunk; 0 means DefaultSnapshotChunkSize.
	ChunkSize int
}

// Snapshot is a snapshot request and its progress.
type Snapshot struct {
	ID              int64      `json:"id"`
	Schema          string     `json:"schema"`
	Table           string     `json:"table"`
	Where           string     `json:"where,omitempty"`
	ChunkSize       int        `json:"chunkSize"`
	Status          string     `json:"status"`
	CancelRequested bool       `json:"cancelRequested,omitempty"`
	LastKey         []string   `json:"lastKey,omitempty"`       // text forms of the last journaled chunk's key columns
	Rows            int64      `json:"rows"`                    // read entries journaled
	Chunks          int64      `json:"chunks"`                  // chunks journaled
	Shape           string     `json:"-"`                       // SnapshotProgress.Shape of the last journaled chunk
	EstimatedRows   *int64     `json:"estimatedRows,omitempty"` // the table's row estimate when it started (before any --where)
	Error           string     `json:"error,omitempty"`
	RequestedAt     time.Time  `json:"requestedAt"`
	StartedAt       *time.Time `json:"startedAt,omitempty"`
	UpdatedAt       *time.Time `json:"updatedAt,omitempty"`
	FinishedAt      *time.Time `json:"finishedAt,omitempty"`
}

// Entity is the snapshot table's entity name.
func (s Snapshot) Entity() string { return decoder.EntityName(s.Schema, s.Table) }

// ErrSnapshotNotFound: no snapshot matched.
var ErrSnapshotNotFound = errors.New("no such snapshot")

// RequestSnapshot records a pending snapshot request and returns its id.
func (j *Journal) RequestSnapshot(ctx context.Context, r SnapshotRequest) (int64, error) {
	const op = "journal.RequestSnapshot"
	if r.ChunkSize == 0 {
		r.ChunkSize = DefaultSnapshotChunkSize
	}
	if r.ChunkSize < 1 || r.ChunkSize > MaxSnapshotChunkSize {
		return 0, opErr(op, fmt.Errorf("chunk size %d is out of range", r.ChunkSize),
			"give a chunk size from 1 to "+strconv.Itoa(MaxSnapshotChunkSize))
	}
	if r.Schema == "" || r.Table == "" {
		return 0, opErr(op, errors.New("no table given"), "name the table as schema.table")
	}
	if err := CheckWhere(r.Where); err != nil {
		return 0, opErr(op, fmt.Errorf("--where: %w", err), "give one boolean expression on the table's columns, such as region = 'eu' AND id > 1000")
	}
	var id int64
	err := j.queryRow(ctx, "INSERT INTO "+j.sql.snapshots+" (table_schema, table_name, where_sql, chunk_size) VALUES ($1, $2, $3, $4) RETURNING id",
		[]any{r.Schema, r.Table, r.Where, r.ChunkSize}, &id)
	if err != nil {
		return 0, opErr(op, err, "check --journal-url and --journal-schema (the journal is created by the first walcast run)")
	}
	return id, nil
}

const snapshotCols = `id, table_schema, table_name, where_sql, chunk_size, status, cancel_requested, last_key, rows, chunks, error,
	requested_at, started_at, updated_at, finished_at, estimated_rows, shape`

func scanSnapshot(r pgx.Row) (Snapshot, error) {
	var s Snapshot
	err := r.Scan(&s.ID, &s.Schema, &s.Table, &s.Where, &s.ChunkSize, &s.Status, &s.CancelRequested, &s.LastKey, &s.Rows, &s.Chunks, &s.Error,
		&s.RequestedAt, &s.StartedAt, &s.UpdatedAt, &s.FinishedAt, &s.EstimatedRows, &s.Shape)
	return s, err
}

// Snapshots lists snapshot requests, newest first: all of them, or (open)
// only pending and running ones. limit <= 0 means 100.
func (j *Journal) Snapshots(ctx context.Context, open bool, limit int) ([]Snapshot, error) {
	const op = "journal.Snapshots"
	if limit <= 0 {
		limit = 100
	}
	q := "SELECT " + snapshotCols + " FROM " + j.sql.snapshots
	if open {
		q += " WHERE status IN ('pending', 'running')"
	}
	q += " ORDER BY id DESC LIMIT " + strconv.Itoa(limit)
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	c, err := j.pool.acquire(ctx)
	if err != nil {
		return nil, opErr(op, err, "")
	}
	defer j.pool.release(c)
	rows, err := c.Query(ctx, q)
	if err != nil {
		return nil, opErr(op, err, "check --journal-url and --journal-schema")
	}
	return collectSnapshots(op, rows)
}

// SnapshotByID returns one snapshot request.
func (j *Journal) SnapshotByID(ctx context.Context, id int64) (Snapshot, error) {
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	c, err := j.pool.acquire(ctx)
	if err != nil {
		return Snapshot{}, opErr("journal.SnapshotByID", err, "")
	}
	defer j.pool.release(c)
	s, err := scanSnapshot(c.QueryRow(ctx, "SELECT "+snapshotCols+" FROM "+j.sql.snapshots+" WHERE id = $1", id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Snapshot{}, opErr("journal.SnapshotByID", fmt.Errorf("%w: id %d", ErrSnapshotNotFound, id), "list them with 'walcast snapshot status'")
	}
	if err != nil {
		return Snapshot{}, opErr("journal.SnapshotByID", err, "")
	}
	return s, nil
}

// NextSnapshot returns the open snapshot the replicator should work on: the
// oldest running one, else the oldest pending one, leaving out the
// snapshots busy names (being run by other workers) and any other of their
// tables. ok is false when there is none.
func (j *Journal) NextSnapshot(ctx context.Context, busy ...int64) (s Snapshot, ok bool, err error) {
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	c, err := j.pool.acquire(ctx)
	if err != nil {
		return Snapshot{}, false, opErr("journal.NextSnapshot", err, "")
	}
	defer j.pool.release(c)
	if busy == nil {
		busy = []int64{}
	}
	s, err = scanSnapshot(c.QueryRow(ctx, "SELECT "+snapshotCols+" FROM "+j.sql.snapshots+
		" WHERE status IN ('pending', 'running') AND (table_schema, table_name) NOT IN (SELECT table_schema, table_name FROM "+
		j.sql.snapshots+" WHERE id = ANY($1)) ORDER BY status = 'running' DESC, id LIMIT 1", busy))
	if errors.Is(err, pgx.ErrNoRows) {
		return Snapshot{}, false, nil
	}
	if err != nil {
		return Snapshot{}, false, opErr("journal.NextSnapshot", err, "")
	}
	return s, true, nil
}

// CancelSnapshots asks open snapshots to stop: the one with id, or (id 0)
// every open one of schema.table. A pending one is cancelled at once
// (nothing of it was journaled); a running one is marked cancel_requested,
// and the replicator journals its snapshot-end (cancelled) and sets its
// status. It returns the snapshots it changed.
func (j *Journal) CancelSnapshots(ctx context.Context, id int64, schema, table string) ([]Snapshot, error) {
	const op = "journal.CancelSnapshots"
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	c, err := j.pool.acquire(ctx)
	if err != nil {
		return nil, opErr(op, err, "")
	}
	defer j.pool.release(c)
	rows, err := c.Query(ctx, `UPDATE `+j.sql.snapshots+` SET
		status = CASE WHEN status = 'pending' THEN 'cancelled' ELSE status END,
		finished_at = CASE WHEN status = 'pending' THEN now() ELSE finished_at END,
		cancel_requested = status = 'running', updated_at = now()
		WHERE status IN ('pending', 'running') AND (id = $1 OR ($1 = 0 AND table_schema = $2 AND table_name = $3))
		RETURNING `+snapshotCols, id, schema, table)
	if err != nil {
		return nil, opErr(op, err, "check --journal-url and --journal-schema")
	}
	return collectSnapshots(op, rows)
}

// fencedSnapshotSQL guards a replicator's update of the snapshots table
// with its generation, like appends: a fenced-out replicator changes nothing.
func (j *Journal) fencedUpdate(ctx context.Context, op string, gen int64, set string, args ...any) error {
	args = append([]any{gen}, args...)
	tag, err := j.exec(ctx, "UPDATE "+j.sql.snapshots+" SET "+set+", updated_at = now() WHERE id = $2 AND EXISTS (SELECT 1 FROM "+
		j.sql.meta+" WHERE generation = $1 AND $1 > 0)", args...)
	if err != nil {
		return opErr(op, err, "")
	}
	if tag.RowsAffected() == 0 {
		if g, gerr := j.Generation(ctx); gerr == nil && g != gen {
			return fencedErr(op, gen)
		}
		return opErr(op, fmt.Errorf("%w: id %v", ErrSnapshotNotFound, args[1]), "")
	}
	return nil
}

// StartSnapshot marks a pending snapshot running, with the table's row
// estimate (negative: unknown). Fenced like Append.
func (j *Journal) StartSnapshot(ctx context.Context, gen, id, estimate int64) error {
	var est *int64
	if estimate >= 0 {
		est = &estimate
	}
	return j.fencedUpdate(ctx, "journal.StartSnapshot", gen,
		"status = CASE WHEN status = 'pending' THEN 'running' ELSE status END, started_at = coalesce(started_at, now()), estimated_rows = $3", id, est)
}

// FailSnapshot marks a snapshot failed with an operator-facing reason (what
// happened and how to fix it). Fenced like Append.
func (j *Journal) FailSnapshot(ctx context.Context, gen, id int64, reason string) error {
	return j.fencedUpdate(ctx, "journal.FailSnapshot", gen, "status = 'failed', error = $3, finished_at = now()", id, reason)
}

// SnapshotProgress is a snapshot's progress as of one journaled chunk,
// written by AppendSnapshot in the transaction that journals the chunk.
type SnapshotProgress struct {
	ID int64
	// EndLSN is the commit end LSN of the transaction carrying the chunk's
	// entries: when that transaction is skipped as a replay, so is this.
	EndLSN  decoder.LSN
	LastKey []string // nil: unchanged
	Rows    int64    // read entries journaled in all, after this chunk
	Chunks  int64
	// Status is SnapshotRunning, or SnapshotDone / SnapshotCancelled /
	// SnapshotFailed with the chunk that carries the snapshot-end entry.
	Status string
	Error  string // SnapshotFailed: the reason, with the fix
	// Shape is a digest of what the publication sent of the table's rows
	// when the chunk was read ("": unchanged): a snapshot resumed under
	// another shape reads the table again from its first key.
	Shape string
}

// snapshotProgressSQL is a data-modifying statement for finishSQL's WITH
// list; values are inlined as there (numbers by strconv, text as hex).
func (j *Journal) snapshotProgressSQL(p SnapshotProgress) string {
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	var b strings.Builder
	b.WriteString("UPDATE " + j.sql.snapshots + " SET rows = " + i(p.Rows) + ", chunks = " + i(p.Chunks) + ", updated_at = now()")
	if p.LastKey != nil {
		b.WriteString(", last_key = ARRAY[")
		for n, k := range p.LastKey {
			if n > 0 {
				b.WriteByte(',')
			}
			b.WriteString(textLit(k))
		}
		b.WriteString("]::text[]")
	}
	if p.Shape != "" {
		b.WriteString(", shape = " + textLit(p.Shape))
	}
	switch p.Status {
	case SnapshotDone, SnapshotCancelled:
		b.WriteString(", status = " + textLit(p.Status) + ", finished_at = now()")
	case SnapshotFailed:
		b.WriteString(", status = 'failed', error = " + textLit(p.Error) + ", finished_at = now()")
	default:
		b.WriteString(", status = 'running', started_at = coalesce(started_at, now())")
	}
	// A snapshot failed or cancelled meanwhile (FailSnapshot, or an
	// operator) stays so: a chunk journaled after that does not revive it.
	b.WriteString(" WHERE id = " + i(p.ID) + " AND status IN ('pending', 'running')")
	return b.String()
}

// AppendSnapshot is Append that also records snapshot progress in the same
// journal transaction: each record applies unless its transaction is
// skipped as a replay.
func (j *Journal) AppendSnapshot(ctx context.Context, gen int64, txs []*decoder.Transaction, progress []SnapshotProgress) (AppendResult, error) {
	return j.append(withAppendMode(ctx), "journal.Append", gen, txs, appendOpts{snapshots: progress})
}

// collectSnapshots reads every snapshot row of rows and closes it.
func collectSnapshots(op string, rows pgx.Rows) ([]Snapshot, error) {
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Snapshot, error) { return scanSnapshot(r) })
	if err != nil {
		return nil, opErr(op, err, "")
	}
	return out, nil
}
