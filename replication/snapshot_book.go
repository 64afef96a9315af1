package replication

import (
	"context"

	"github.com/walcast/walcast/journal"
)

// snapshotBook is everything the snapshot worker and the publication
// watcher need of the journal's snapshot bookkeeping: the requests, their
// state and the publication's recorded tables. *journal.Journal implements
// it (journal/snapshot.go, journal/snapshot_tables.go); a change to how that
// bookkeeping is stored touches those files and this list, nothing else of
// the snapshotter.
//
// One piece stays on the append path, outside this interface: a chunk's
// progress is recorded by journal.AppendSnapshot in the transaction that
// journals its rows (stream.go), so rows and progress commit together.
type snapshotBook interface {
	// NextSnapshot claims the oldest runnable request not in busy.
	NextSnapshot(ctx context.Context, busy ...int64) (journal.Snapshot, bool, error)
	// SnapshotByID reads a request's current state (cancelled, rows, chunks).
	SnapshotByID(ctx context.Context, id int64) (journal.Snapshot, error)
	// StartSnapshot marks a request running with its row estimate, fenced by gen.
	StartSnapshot(ctx context.Context, gen, id, estimate int64) error
	// FailSnapshot ends a request with the reason an operator reads, fenced by gen.
	FailSnapshot(ctx context.Context, gen, id int64, reason string) error
	// PublishedTables returns the tables last recorded for the publication,
	// and whether any were ever recorded.
	PublishedTables(ctx context.Context) ([]journal.Table, bool, error)
	// RecordPublishedTables records the publication's tables and, in the
	// same transaction, snapshot requests for the ones that joined it.
	RecordPublishedTables(ctx context.Context, gen int64, tables []journal.Table, reqs []journal.SnapshotRequest) error
}

var _ snapshotBook = (*journal.Journal)(nil)
