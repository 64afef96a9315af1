package sync

import (
	"context"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/walcast/walcast/journal"
)

// syncStats are the sync node's counters. The hot path only adds to atomics;
// the metrics are observed from them when /metrics is scraped.
type syncStats struct {
	socketsOpen   atomic.Int64
	framesSent    atomic.Int64
	framesDropped atomic.Int64
	replayGaps    atomic.Int64
	liveReceived  atomic.Int64
	liveHandled   atomic.Int64 // messages whose delivery finished (tests)
	framesEncoded atomic.Int64 // live change frames encoded (benchmarks)
	// controlOverflows counts sockets closed because even the control
	// reserve was full (tests).
	controlOverflows atomic.Int64
	lagCloses        atomic.Int64 // sockets closed for MaxLag (tests)
	epochChanges     atomic.Int64 // journal epoch changes the node followed
	epochIgnored     atomic.Int64 // messages of another epoch ignored
	positionsMoved   atomic.Int64 // member positions moved by publisher positions (tests)
	// Filtered subscriptions (view.go): changes of a member's scope not
	// sent because its view excludes them, removals sent for rows that
	// left a view, changes a view could not judge (answered with a
	// resync), and members whose row set passed MaxFilterRows.
	filterSkipped, filterRemovals, filterResyncs atomic.Int64
	// snapshotsQueued counts snapshots asked for and waiting for a slot
	// (the socket's or the client's); reads waiting for one of the node's
	// --max-concurrent-snapshots, the running ones and the rows sent are
	// stateSource.queued, .active and .rows.
	snapshotsQueued atomic.Int64
	// queuedBytes is the bytes queued on every socket (the sum of their
	// queued), for the node's memory bound.
	queuedBytes atomic.Int64
	// replicaFallbacks is the journal's standby fallbacks last logged
	// (noteReplica).
	replicaFallbacks atomic.Int64
	// snapshotDuration records, per snapshot that read, from its start
	// (slot taken) to its end; nil without a Meter. Set once in Open.
	snapshotDuration metric.Float64Histogram

	mu       sync.Mutex       // guards the following fields
	closed   map[string]int64 // close reason → sockets
	rejected map[string]int64 // refusal reason → requests
	repairs  map[string]int64 // cause → entity repairs
	// snapshots counts snapshots by outcome: done, cancelled (the client
	// unsubscribed or left, or a resync superseded it, also while queued),
	// failed, refused (no snapshot claim, no source, or a table the node
	// cannot read).
	snapshots map[string]int64
}

func (st *syncStats) inc(m *map[string]int64, key string) {
	st.mu.Lock()
	if *m == nil {
		*m = map[string]int64{}
	}
	(*m)[key]++
	st.mu.Unlock()
}

// Stats is a snapshot of a sync node's counters, for tests and logs.
type Stats struct {
	SocketsOpen, FramesSent, FramesDropped, ReplayGaps int64
	EpochChanges, EpochIgnored                         int64
	Closed, Rejected, Repairs                          map[string]int64
	// Snapshots are by outcome (done, cancelled, failed, refused);
	// SnapshotsRunning are source reads in progress, SnapshotsQueued
	// snapshots waiting for the socket's or the client's slot and reads
	// waiting for a node read slot, SnapshotRows is every row frame sent.
	// SnapshotTenantUnknown counts, fail closed (scope.go), snapshots
	// refused because their table's rows cannot be scoped ("table") and
	// rows dropped because their tenant could not be known ("row").
	Snapshots                                       map[string]int64
	SnapshotsRunning, SnapshotsQueued, SnapshotRows int64
	SnapshotTenantUnknown                           map[string]int64
	// SnapshotReads counts reads of a table from the source (each fills
	// a spool); SnapshotsShared the snapshots served from a spool another
	// snapshot's read filled. SpoolBytes are spooled now (memory and
	// files); MemoryBytes is what the node's memory bound counts: bytes
	// queued on sockets and spooled in memory.
	SnapshotReads, SnapshotsShared int64
	SpoolBytes, MemoryBytes        int64
	// JournalStandby counts the journal reads meant for the standby of
	// --journal-read-url: made there, waited for, made on the journal's
	// server instead (journal.ReplicaStats); zero without one.
	JournalStandby journal.ReplicaStats
	// Filter counts what filtered subscriptions did (docs/sync.md
	// "Filtered subscriptions").
	Filter FilterStats
}

// FilterStats: Skipped changes of members' scopes their views exclude
// (frames not sent), Removals of rows that left a view, Resyncs for
// changes a view could not judge, RowSetsOverflowed members whose rows
// passed MaxFilterRows or the node's MaxFilterMemoryBytes (the node no
// longer knows which rows they hold).
type FilterStats struct {
	Skipped, Removals, Resyncs, RowSetsOverflowed int64
	// RowSetBytes is what the row sets hold now, against
	// MaxFilterMemoryBytes.
	RowSetBytes int64
}

// Stats returns a snapshot of the node's counters.
func (n *Node) Stats() Stats {
	st := &n.stats
	out := Stats{SocketsOpen: st.socketsOpen.Load(), FramesSent: st.framesSent.Load(),
		FramesDropped: st.framesDropped.Load(), ReplayGaps: st.replayGaps.Load(),
		EpochChanges: st.epochChanges.Load(), EpochIgnored: st.epochIgnored.Load(),
		Closed: map[string]int64{}, Rejected: map[string]int64{}, Repairs: map[string]int64{},
		Snapshots: map[string]int64{}, SnapshotsQueued: st.snapshotsQueued.Load()}
	out.MemoryBytes = st.queuedBytes.Load()
	out.Filter = FilterStats{Skipped: st.filterSkipped.Load(), Removals: st.filterRemovals.Load(),
		Resyncs: st.filterResyncs.Load(), RowSetsOverflowed: n.rowBudget.overflowed.Load(), RowSetBytes: n.rowBudget.used.Load()}
	if n.state != nil {
		out.SnapshotsRunning, out.SnapshotRows = n.state.active.Load(), n.state.rows.Load()
		out.SnapshotTenantUnknown = map[string]int64{"table": n.state.unknownTables.Load(), "row": n.state.unknownRows.Load()}
		out.SnapshotsQueued += n.state.queued.Load()
		out.SnapshotReads, out.SnapshotsShared = n.state.reads.Load(), n.state.shared.Load()
		out.SpoolBytes = n.state.spooled.Load()
		out.MemoryBytes += n.state.memory.Load()
	}
	if rs, ok := n.j.ReplicaStats(); ok {
		out.JournalStandby = rs
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	for k, v := range st.closed {
		out.Closed[k] = v
	}
	for k, v := range st.rejected {
		out.Rejected[k] = v
	}
	for k, v := range st.repairs {
		out.Repairs[k] = v
	}
	for k, v := range st.snapshots {
		out.Snapshots[k] = v
	}
	return out
}

// snapshotOutcomes are the outcome label's values, each exported from the
// start (0 until it happens) so a rate over them needs no first event.
var snapshotOutcomes = []string{"done", "cancelled", "failed", "refused"}

// registerSyncMetrics exposes the counters (DESIGN §8).
func registerSyncMetrics(meter metric.Meter, n *Node) (metric.Registration, error) {
	open, err := meter.Int64ObservableUpDownCounter("walcast.sync.sockets.open",
		metric.WithDescription("WebSocket connections currently open"))
	if err != nil {
		return nil, err
	}
	sent, err := meter.Int64ObservableCounter("walcast.sync.frames.sent",
		metric.WithDescription("frames written to sockets"))
	if err != nil {
		return nil, err
	}
	dropped, err := meter.Int64ObservableCounter("walcast.sync.frames.dropped",
		metric.WithDescription("frames dropped because a socket's outbound queue was full"))
	if err != nil {
		return nil, err
	}
	gaps, err := meter.Int64ObservableCounter("walcast.sync.replay_gaps",
		metric.WithDescription("replay-gap frames sent"))
	if err != nil {
		return nil, err
	}
	received, err := meter.Int64ObservableCounter("walcast.sync.nats.received",
		metric.WithDescription("change messages received from NATS"))
	if err != nil {
		return nil, err
	}
	closed, err := meter.Int64ObservableCounter("walcast.sync.sockets.closed",
		metric.WithDescription("sockets closed, by reason"))
	if err != nil {
		return nil, err
	}
	rejected, err := meter.Int64ObservableCounter("walcast.sync.connections.rejected",
		metric.WithDescription("connection attempts refused before the upgrade, by reason"))
	if err != nil {
		return nil, err
	}
	repairs, err := meter.Int64ObservableCounter("walcast.sync.repairs",
		metric.WithDescription("entity repairs from the journal, by cause (gap, reconnect, slow-consumer)"))
	if err != nil {
		return nil, err
	}
	epochs, err := meter.Int64ObservableCounter("walcast.sync.epoch_changes",
		metric.WithDescription("journal epoch changes (restores, resets) the node followed by resyncing every client"))
	if err != nil {
		return nil, err
	}
	snapshots, err := meter.Int64ObservableCounter("walcast.sync.snapshots",
		metric.WithDescription("snapshots (\"snapshot\":true subscriptions, GET /v1/snapshot) by outcome: done, cancelled, failed, refused"))
	if err != nil {
		return nil, err
	}
	snapRows, err := meter.Int64ObservableCounter("walcast.sync.snapshot.rows",
		metric.WithDescription("row frames sent by snapshots"))
	if err != nil {
		return nil, err
	}
	snapUnknown, err := meter.Int64ObservableCounter("walcast.sync.snapshot.tenant_unknown",
		metric.WithDescription("fail closed: snapshots refused because their table's rows cannot be scoped to a tenant (what=table), rows dropped because their tenant could not be known (what=row)"))
	if err != nil {
		return nil, err
	}
	snapRunning, err := meter.Int64ObservableUpDownCounter("walcast.sync.snapshots.running",
		metric.WithDescription("reads of the source database for snapshots in progress (at most --max-concurrent-snapshots)"))
	if err != nil {
		return nil, err
	}
	snapQueued, err := meter.Int64ObservableUpDownCounter("walcast.sync.snapshots.queued",
		metric.WithDescription("snapshots waiting for a slot (the socket's, the client's --snapshots-per-client, or a read slot of --max-concurrent-snapshots)"))
	if err != nil {
		return nil, err
	}
	snapReads, err := meter.Int64ObservableCounter("walcast.sync.snapshot.source_reads",
		metric.WithDescription("reads of a table from the source database for snapshots; snapshots of the same table and scope that overlap share one"))
	if err != nil {
		return nil, err
	}
	snapShared, err := meter.Int64ObservableCounter("walcast.sync.snapshot.shared",
		metric.WithDescription("snapshots served from rows another snapshot read from the source"))
	if err != nil {
		return nil, err
	}
	spoolBytes, err := meter.Int64ObservableUpDownCounter("walcast.sync.snapshot.spool", metric.WithUnit("By"),
		metric.WithDescription("snapshot rows spooled now, in memory and files (at most --snapshot-spool-bytes)"))
	if err != nil {
		return nil, err
	}
	memBytes, err := meter.Int64ObservableUpDownCounter("walcast.sync.memory", metric.WithUnit("By"),
		metric.WithDescription("bytes queued on sockets plus snapshot rows spooled in memory; past --max-memory-bytes new sockets and snapshots are refused (connections.rejected reason memory)"))
	if err != nil {
		return nil, err
	}
	standbyReads, err := meter.Int64ObservableCounter("walcast.sync.journal.standby_reads",
		metric.WithDescription("journal reads made on the standby of --journal-read-url"))
	if err != nil {
		return nil, err
	}
	standbyWaits, err := meter.Int64ObservableCounter("walcast.sync.journal.standby_waits",
		metric.WithDescription("journal reads that found the standby of --journal-read-url behind a seq they must see and waited for it (up to --journal-read-max-wait)"))
	if err != nil {
		return nil, err
	}
	standbyFallbacks, err := meter.Int64ObservableCounter("walcast.sync.journal.standby_fallbacks",
		metric.WithDescription("journal reads meant for the standby of --journal-read-url made on --journal-url instead, by reason: behind (not replayed within --journal-read-max-wait), epoch (a cursor of another epoch), error (the standby failed the read)"))
	if err != nil {
		return nil, err
	}
	filterCounts, err := meter.Int64ObservableCounter("walcast.sync.filter.changes",
		metric.WithDescription("changes of filtered subscriptions' scopes, by what the filter made of them: skipped (not sent), removal (a row that left the filter, sent as its key's delete), resync (could not be judged from the change: the client re-reads)"))
	if err != nil {
		return nil, err
	}
	rowSetsOver, err := meter.Int64ObservableCounter("walcast.sync.filter.rowsets_overflowed",
		metric.WithDescription("filtered subscriptions whose rows passed --max-filter-rows, or the node's --max-filter-memory-bytes: the node no longer knows which rows they hold and sends a removal for every row that may have left (raise the flags to save those frames)"))
	if err != nil {
		return nil, err
	}
	rowSetBytes, err := meter.Int64ObservableUpDownCounter("walcast.sync.filter.rowset", metric.WithUnit("By"),
		metric.WithDescription("memory of the keys the node keeps of the rows filtered subscriptions hold (at most --max-filter-memory-bytes)"))
	if err != nil {
		return nil, err
	}
	if n.stats.snapshotDuration, err = meter.Float64Histogram("walcast.sync.snapshot.duration", metric.WithUnit("s"),
		metric.WithDescription("snapshot length, from taking its slot to its end, whatever the outcome"),
		metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600)); err != nil {
		return nil, err
	}
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := n.Stats()
		o.ObserveInt64(open, s.SocketsOpen)
		o.ObserveInt64(sent, s.FramesSent)
		o.ObserveInt64(dropped, s.FramesDropped)
		o.ObserveInt64(gaps, s.ReplayGaps)
		o.ObserveInt64(received, n.stats.liveReceived.Load())
		o.ObserveInt64(epochs, s.EpochChanges)
		for k, v := range s.Closed {
			o.ObserveInt64(closed, v, metric.WithAttributes(attribute.String("reason", k)))
		}
		for k, v := range s.Rejected {
			o.ObserveInt64(rejected, v, metric.WithAttributes(attribute.String("reason", k)))
		}
		for k, v := range s.Repairs {
			o.ObserveInt64(repairs, v, metric.WithAttributes(attribute.String("cause", k)))
		}
		for _, k := range snapshotOutcomes {
			o.ObserveInt64(snapshots, s.Snapshots[k], metric.WithAttributes(attribute.String("outcome", k)))
		}
		o.ObserveInt64(snapRows, s.SnapshotRows)
		for _, k := range []string{"table", "row"} {
			o.ObserveInt64(snapUnknown, s.SnapshotTenantUnknown[k], metric.WithAttributes(attribute.String("what", k)))
		}
		o.ObserveInt64(snapRunning, s.SnapshotsRunning)
		o.ObserveInt64(snapQueued, s.SnapshotsQueued)
		o.ObserveInt64(snapReads, s.SnapshotReads)
		o.ObserveInt64(snapShared, s.SnapshotsShared)
		o.ObserveInt64(spoolBytes, s.SpoolBytes)
		o.ObserveInt64(memBytes, s.MemoryBytes)
		o.ObserveInt64(filterCounts, s.Filter.Skipped, metric.WithAttributes(attribute.String("outcome", "skipped")))
		o.ObserveInt64(filterCounts, s.Filter.Removals, metric.WithAttributes(attribute.String("outcome", "removal")))
		o.ObserveInt64(filterCounts, s.Filter.Resyncs, metric.WithAttributes(attribute.String("outcome", "resync")))
		o.ObserveInt64(rowSetsOver, s.Filter.RowSetsOverflowed)
		o.ObserveInt64(rowSetBytes, s.Filter.RowSetBytes)
		if n.j.HasReplica() {
			o.ObserveInt64(standbyReads, s.JournalStandby.Reads)
			o.ObserveInt64(standbyWaits, s.JournalStandby.Waits)
			for _, k := range journal.FallbackReasons {
				o.ObserveInt64(standbyFallbacks, s.JournalStandby.Fallbacks[k], metric.WithAttributes(attribute.String("reason", k)))
			}
		}
		return nil
	}, standbyReads, standbyWaits, standbyFallbacks, open, sent, dropped, gaps, received, closed, rejected, repairs, epochs, snapshots, snapRows, snapUnknown, snapRunning, snapQueued,
		snapReads, snapShared, spoolBytes, memBytes, filterCounts, rowSetsOver, rowSetBytes)
}

// noteReplica logs, once per minute at most, that journal reads meant for
// the standby of --journal-read-url were made on the journal's server,
// with why and what to do. Called after the reads that serve clients.
func (n *Node) noteReplica() {
	rs, ok := n.j.ReplicaStats()
	if !ok {
		return
	}
	var total int64
	for _, v := range rs.Fallbacks {
		total += v
	}
	if prev := n.stats.replicaFallbacks.Swap(total); total <= prev {
		return
	}
	args := []any{"behind", rs.Fallbacks[journal.FallbackBehind], "epoch", rs.Fallbacks[journal.FallbackEpoch], "error", rs.Fallbacks[journal.FallbackError]}
	if rs.LastError != nil {
		args = append(args, "last_error", rs.LastError)
	}
	n.warnEvery("journal-standby", "journal reads meant for the standby (--journal-read-url) were made on the journal's server (--journal-url) instead: "+
		"the standby had not replayed entries clients were owed within --journal-read-max-wait (behind), or failed the read (error); "+
		"check the standby's replay lag (pg_stat_replication.replay_lag on the journal's server) and its log, or raise --journal-read-max-wait; "+
		"metric walcast.sync.journal.standby_fallbacks counts them", args...)
}
