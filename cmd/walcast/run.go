package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/fanout/publish"
	"github.com/walcast/walcast/internal/telemetry"
	"github.com/walcast/walcast/journal"
	"github.com/walcast/walcast/replication"
)

func newRunCmd(env Env) *cobra.Command {
	var (
		rc            replication.Config
		journalURL    string
		schema        string
		httpListen    string
		retention     journal.Retention
		pruneEvery    time.Duration
		logs          logFlags
		skipPreflight bool
		snapshotMode  string
		jsCfg         publish.JetStreamConfig
		nf            natsFlags
		embeddedNATS  string
		embeddedStore string
		embeddedClu   bus.EmbeddedCluster
		prefix        string
		journalTO     time.Duration
		shutdownTO    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Stream a publication's changes into the journal (the sidecar)",
		Long: `run holds the replication slot of a publication (one active instance per
slot, guarded by an advisory lock; others wait as standbys), decodes every
committed change and writes it to the journal before acknowledging it to
PostgreSQL.

At start it runs the checks of 'walcast verify', logs every warning and failure
with its fix, and refuses to start only when replication is impossible.

On SIGINT/SIGTERM it finishes the journal batch in flight and sends a final
status update; when that takes longer than --shutdown-timeout (a journal
database that stopped answering) it breaks the journal's connections and
exits anyway — nothing unjournaled was acknowledged, so nothing is lost.

Exit status: 0 after a clean stop (SIGINT/SIGTERM; a second signal aborts),
1 when replication fails, 2 for a configuration error or an unreachable
database at start-up, 3 when another instance holds the slot and
--standby=false.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logs.logger(env.Stderr)
			if err != nil {
				return err
			}
			if rc.DatabaseURL == "" {
				return usageErrorf("run: --database-url is required (or set WALCAST_DATABASE_URL)")
			}
			if rc.Publication == "" {
				return usageErrorf("run: --publication is required (or set WALCAST_PUBLICATION)")
			}
			if journalURL == "" {
				journalURL = rc.DatabaseURL
			}
			if err := bus.CheckPrefix(prefix); err != nil {
				return usageErrorf("run: %v", err)
			}
			switch snapshotMode {
			case "":
			case "initial":
				rc.SnapshotInitial = true
			default:
				return usageErrorf("run: --snapshot %q: the only mode is \"initial\" (snapshot every published table when the journal is new); for one table use `walcast snapshot start --table`", snapshotMode)
			}
			if rc.SnapshotParallel < 1 || rc.SnapshotParallel > replication.MaxSnapshotParallel || rc.SnapshotMaxRowsPerSecond < 0 || rc.SnapshotChunkSize < 1 || rc.SnapshotChunkSize > journal.MaxSnapshotChunkSize {
				return usageErrorf("run: --snapshot-parallel must be from 1 to %d (each is a connection to the source), --snapshot-max-rows-per-second at least 0 and --snapshot-chunk-size from 1 to %d", replication.MaxSnapshotParallel, journal.MaxSnapshotChunkSize)
			}
			if rc.MaxTransactionBytes < 1 {
				return usageErrorf("run: --max-transaction-bytes must be at least 1 (default %d, 8 GiB); it bounds what in-progress transactions hold in memory and --spill-dir", int64(decoder.DefaultMaxTransactionBytes))
			}
			// A spill directory that cannot take files is found now, not
			// by the first transaction larger than the memory budget.
			if err := decoder.CheckSpillDir(rc.SpillDir); err != nil {
				return usageErrorf("run: %v\nfix: point --spill-dir (WALCAST_SPILL_DIR) at an existing directory walcast can write, on a volume with room for --max-transaction-bytes", err)
			}
			rc.Logger = log
			setGoMemoryLimit(env, rc.MemoryBudget)
			nf.cfg.Name = "walcast run"
			return runReplicator(cmd.Context(), log, runSetup{tracing: otlpConfigured(env), rc: rc, journalURL: journalURL, schema: schema, httpListen: httpListen,
				retention: retention, pruneEvery: pruneEvery, preflight: !skipPreflight,
				nats: nf.cfg, embeddedNATS: embeddedNATS, embeddedStore: embeddedStore, embeddedCluster: embeddedClu, prefix: prefix,
				journalTimeout: journalTO, shutdownTimeout: shutdownTO, jetstream: jsPtr(jsCfg)})
		},
	}
	f := cmd.Flags()
	f.StringVar(&rc.DatabaseURL, "database-url", "", "source database, libpq URL or DSN (sslmode, sslrootcert, sslcert honoured)")
	f.StringVar(&rc.Publication, "publication", "", "publication to stream (required)")
	f.StringVar(&rc.Slot, "slot", "walcast", "replication slot name")
	f.StringVar(&journalURL, "journal-url", "", "journal database (default: the database URL)")
	f.StringVar(&schema, "journal-schema", journal.DefaultSchema, "schema of the journal")
	f.DurationVar(&journalTO, "journal-timeout", journal.DefaultCallTimeout,
		"limit of each journal call; an append fails when no byte moves for this long (statement, lock and idle timeouts and TCP keepalives derive from it)")
	f.DurationVar(&shutdownTO, "shutdown-timeout", defaultShutdownTimeout,
		"on SIGINT/SIGTERM, how long to wait for the journal batch in flight before breaking the journal's connections and exiting")
	f.StringVar(&rc.TenantColumn, "tenant-column", "", "column hoisted into the envelope's tenant")
	f.StringVar(&rc.MessagePrefix, "message-prefix", "walcast.", "logical decoding message prefix journaled as op \"message\"")
	f.BoolVar(&rc.Standby, "standby", true, "wait as a standby while another instance holds the slot (false: exit 3)")
	f.BoolVar(&rc.RecreateLostSlot, "recreate-lost-slot", false, "recreate a lost or vanished slot and journal a resync entry")
	f.StringVar(&snapshotMode, "snapshot", "", "\"initial\": when the journal is new, snapshot every published table into the stream")
	f.BoolVar(&rc.SnapshotNewTables, "snapshot-new-tables", false, "snapshot a table when it joins the publication while walcast runs (checked every 5s)")
	f.BoolVar(&rc.ResnapshotAfterResync, "resnapshot-after-resync", true, "with the resync entry of --recreate-lost-slot, snapshot every published table again so consumers can rebuild from the stream")
	f.IntVar(&rc.SnapshotParallel, "snapshot-parallel", 2, "tables snapshotted at once (1 to 8)")
	f.IntVar(&rc.SnapshotMaxRowsPerSecond, "snapshot-max-rows-per-second", 0, "cap on the rows all snapshots read per second (0: no cap)")
	f.IntVar(&rc.SnapshotChunkSize, "snapshot-chunk-size", journal.DefaultSnapshotChunkSize, "rows per chunk of the snapshots walcast requests itself (--snapshot initial, new tables, re-snapshots)")
	f.StringVar(&httpListen, "http-listen", "127.0.0.1:9187", "address for /metrics, /healthz and /readyz")
	f.Int64Var(&retention.MaxRows, "retention-max-rows", 0, "keep at most this many journal entries (0: unbounded)")
	f.Int64Var(&retention.MaxBytes, "retention-max-bytes", 0, "keep at most this many bytes of envelopes (0: unbounded)")
	f.DurationVar(&retention.MaxAge, "retention-max-age", 0, "drop entries older than this (0: unbounded)")
	f.DurationVar(&pruneEvery, "retention-interval", time.Minute, "how often retention runs")
	f.IntVar(&rc.BatchMaxTxns, "batch-max-txns", 1000, "close a journal batch at this many source transactions")
	f.IntVar(&rc.BatchMaxChanges, "batch-max-changes", 20000, "close a journal batch at this many changes")
	f.DurationVar(&rc.BatchMaxDelay, "batch-max-delay", 0, "wait up to this long for more transactions before writing a batch (0: write what is queued)")
	f.IntVar(&rc.QueueMaxChanges, "queue-max-changes", 100000, "changes decoded but not yet journaled before reading pauses")
	f.Int64Var(&rc.QueueMaxBytes, "queue-max-bytes", 0, "bytes of decoded, not yet journaled transactions before reading pauses (0: a quarter of --memory-budget)")
	f.IntVar(&rc.MaxEnvelopeBytes, "max-envelope-bytes", decoder.DefaultMaxEnvelopeBytes, "largest envelope journaled as-is; a larger change becomes a quarantine entry (op \"quarantine\")")
	f.Int64Var(&rc.MemoryBudget, "memory-budget", 64<<20, "resident memory of the pipeline's changes: the decoder spills in-progress transactions to --spill-dir past a sixth of it, the queue takes a quarter; RSS stays under it plus 32 MiB")
	f.StringVar(&rc.SpillDir, "spill-dir", "", "directory for spill files (default: the system temp dir)")
	f.Int64Var(&rc.MaxTransactionBytes, "max-transaction-bytes", decoder.DefaultMaxTransactionBytes,
		"bytes in-progress transactions may hold in memory and --spill-dir together; past it the largest becomes one quarantine entry per table it touched (consumers refetch those tables) — keep it below the spill volume's free space")
	f.BoolVar(&skipPreflight, "skip-preflight", false, "do not run the verify checks at start")
	nf.register(cmd, "NATS server(s) to publish to (empty: start an embedded NATS server on --embedded-nats-listen)")
	f.StringVar(&embeddedNATS, "embedded-nats-listen", "127.0.0.1:4222", "address of the embedded NATS server, when --nats-url is empty")
	f.StringVar(&embeddedStore, "embedded-nats-store-dir", "", "enable JetStream on the embedded NATS server with its store here")
	f.StringVar(&embeddedClu.Listen, "embedded-nats-cluster-listen", "",
		"join the embedded NATS servers of several instances into one cluster: this instance's route address, host:port (with --embedded-nats-routes; sync nodes then list every instance's --embedded-nats-listen in --nats-url)")
	f.StringSliceVar(&embeddedClu.Routes, "embedded-nats-routes", nil,
		"the other instances' --embedded-nats-cluster-listen addresses, host:port, repeatable or comma-separated")
	f.StringVar(&prefix, "subject-prefix", "walcast", "first token of every NATS subject")
	f.StringVar(&jsCfg.Stream, "jetstream-stream", "", "store every entry exactly once, in order, in this JetStream stream (created over <prefix>.change.>, <prefix>.message.>, <prefix>.resync if missing; an existing one must match)")
	f.IntVar(&jsCfg.Replicas, "jetstream-replicas", 1, "replicas of the JetStream stream (an existing stream must have as many)")
	f.DurationVar(&jsCfg.MaxAge, "jetstream-max-age", 0, "max age of the JetStream stream's messages when walcast creates it (0: unlimited)")
	f.DurationVar(&jsCfg.DuplicateWindow, "jetstream-duplicate-window", 2*time.Minute, "duplicate window of the JetStream stream when walcast creates it (at least 1m; exactness does not depend on it)")
	logs.register(cmd)
	return cmd
}

// runReplicator wires the journal, the replicator and the HTTP endpoints,
// and runs until ctx ends or replication stops.
// runSetup is everything `walcast run` wires together.
type runSetup struct {
	rc              replication.Config
	journalURL      string
	schema          string
	httpListen      string
	retention       journal.Retention
	pruneEvery      time.Duration
	preflight       bool
	nats            bus.NATSConfig
	embeddedNATS    string
	embeddedStore   string
	embeddedCluster bus.EmbeddedCluster
	jetstream       *publish.JetStreamConfig
	prefix          string
	tracing         bool // an OTLP endpoint is configured: export traces

	journalTimeout  time.Duration // journal.Config.CallTimeout; 0: the default
	shutdownTimeout time.Duration // 0: defaultShutdownTimeout
}

// defaultShutdownTimeout is below Kubernetes' default grace period of 30 s,
// so walcast exits on its own (logging why) before it would be killed.
const defaultShutdownTimeout = 20 * time.Second

// abortGrace is how long the replicator may take to return once the
// journal's connections were broken at the shutdown timeout; past it the
// process exits regardless (exit 1).
const abortGrace = 5 * time.Second

// writerStuckAfter is how long an append may go without moving a byte before
// /readyz reports the journal writer stuck: far above a healthy append's
// silence (milliseconds), and well before the append fails at the call
// timeout and ends the session.
func writerStuckAfter(callTimeout time.Duration) time.Duration {
	return max(callTimeout/5, time.Second)
}

// otlpConfigured reports whether the operator set an OTLP endpoint for
// traces, which turns tracing on (DESIGN §8).
func otlpConfigured(env Env) bool {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		if v, ok := env.LookupEnv(k); ok && v != "" {
			return true
		}
	}
	return false
}

func runReplicator(ctx context.Context, log *slog.Logger, s runSetup) error {
	rc, journalURL, schema, retention, pruneEvery := s.rc, s.journalURL, s.schema, s.retention, s.pruneEvery
	if s.preflight {
		report, err := replication.Verify(ctx, replication.VerifyConfig{DatabaseURL: rc.DatabaseURL, Publication: rc.Publication,
			Slot: rc.Slot, JournalSchema: schema, JournalURL: journalURL, TenantColumn: rc.TenantColumn})
		if err != nil {
			return startupError(err)
		}
		for _, c := range report.Checks {
			switch c.Status {
			case replication.StatusWarn:
				log.Warn("preflight: "+c.Found, "check", c.ID, "fix", c.Fix)
			case replication.StatusFail:
				log.Error("preflight: "+c.Found, "check", c.ID, "fix", c.Fix, "blocking", c.Blocking)
			}
		}
		for _, b := range report.Blocking() {
			// The slot's own state (lost, vanished) is the replicator's to
			// handle: it may recreate it (--recreate-lost-slot) or stop
			// with a precise error.
			if b.ID == "slot" {
				continue
			}
			if b.ID == "tenant_column" {
				return withCode(exitUsage, fmt.Errorf("run: refusing to start: %s; walcast never carries a tenanted table's rows unscoped\nfix: %s", b.Found, b.Fix))
			}
			return withCode(exitUsage, fmt.Errorf("run: replication is impossible until this is fixed: %s\nfix: %s", b.Found, b.Fix))
		}
	}
	j, err := journal.Open(ctx, journal.Config{URL: journalURL, Schema: schema, CallTimeout: s.journalTimeout})
	if err != nil {
		return startupError(err)
	}
	defer j.Close()
	r, err := replication.New(rc, j)
	if err != nil {
		return startupError(err)
	}
	metrics, err := telemetry.NewMetrics(telemetry.WithService(telemetry.ServiceName, version))
	if err != nil {
		return withCode(exitFailed, err)
	}
	defer metrics.Shutdown(context.WithoutCancel(ctx))
	if err := r.RegisterMetrics(metrics.Meter("walcast/replication")); err != nil {
		return withCode(exitFailed, err)
	}
	tracing, err := telemetry.NewTracing(ctx, s.tracing, log, telemetry.WithService(telemetry.ServiceName, version))
	if err != nil {
		return withCode(exitUsage, err)
	}
	defer func() {
		// Export the spans still buffered, but never hang the exit on an
		// unreachable collector.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tracing.Shutdown(sctx); err != nil {
			log.Warn("opentelemetry: final trace export failed", "err", err)
		}
	}()
	r.SetTracerProvider(tracing.TracerProvider())
	if s.nats.URL != "" && (s.embeddedCluster.Listen != "" || len(s.embeddedCluster.Routes) > 0) {
		return withCode(exitUsage, errors.New("--embedded-nats-cluster-listen and --embedded-nats-routes join embedded NATS servers, and --nats-url means there is none: drop one or the other"))
	}
	if s.nats.URL == "" {
		emb, err := bus.StartEmbeddedNATS(s.embeddedNATS, s.embeddedStore, s.embeddedCluster)
		if err != nil {
			return withCode(exitUsage, err)
		}
		defer emb.Shutdown()
		s.nats.URL = emb.URL()
		log.Info("embedded NATS server listening", "url", emb.URL(), "jetstream", s.embeddedStore != "",
			"cluster", s.embeddedCluster.Listen, "routes", s.embeddedCluster.Routes)
	}
	nc, err := bus.ConnectNATS(s.nats)
	if err != nil {
		return withCode(exitUsage, err)
	}
	defer nc.Close()
	pub := publish.New(publish.Config{Prefix: s.prefix, Logger: log, JetStream: s.jetstream}, j, nc)
	if err := pub.CheckJetStream(ctx); err != nil {
		return withCode(exitUsage, err)
	}
	if err := pub.RegisterMetrics(metrics.Meter("walcast/publish")); err != nil {
		return withCode(exitFailed, err)
	}
	natsReg, err := bus.RegisterConnMetrics(metrics.Meter("walcast/nats"), nc)
	if err != nil {
		return withCode(exitFailed, err)
	}
	defer natsReg.Unregister()
	// Sync nodes ask how far the journal covers the source's WAL (to end a
	// snapshot's catch-up on an idle source); this replicator answers while
	// it streams the slot.
	coveredSub, err := publish.ServeCovered(nc, s.prefix, r.Covered)
	if err != nil {
		return withCode(exitFailed, fmt.Errorf("subscribe to %s: %w", bus.CoveredSubject(s.prefix), err))
	}
	defer func() { _ = coveredSub.Unsubscribe() }()
	pub.SetTracerProvider(tracing.TracerProvider())
	stuckAfter := writerStuckAfter(j.CallTimeout())
	srv, err := telemetry.Listen(s.httpListen, metrics, func() (bool, string) {
		// Journaling goes on while NATS is away (the publisher catches up),
		// so the NATS connection is reported, not required.
		ok, detail := runReadiness(r, j, stuckAfter)
		return ok, detail + "; " + bus.ConnStatus(nc)
	})
	if err != nil {
		return withCode(exitUsage, err)
	}
	log.Info("walcast run starting", "version", version, "publication", rc.Publication, "slot", rc.Slot,
		"journal_schema", j.Schema(), "http", srv.Addr(), "tracing", tracing.Enabled())

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ctx, log); err != nil {
			log.Error("http endpoints stopped", "err", err)
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Only the active instance publishes: a standby's journal view is
		// the same, and two publishers would double every message.
		r.WhileActive(ctx, func(actx context.Context) {
			if err := pub.Run(actx); err != nil {
				log.Error("publishing stopped; the journal keeps every entry and a restart publishes them", "err", err)
			}
		})
	}()
	if retention != (journal.Retention{}) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = j.RunRetention(ctx, retention, pruneEvery, func(err error) { log.Warn("journal retention failed; retrying next interval", "err", err) })
		}()
	}
	err = runBounded(ctx, log, r, j, s.shutdownTimeout, cancel, &wg)
	switch {
	case err == nil:
		log.Info("walcast run stopped")
		return nil
	case errors.Is(err, replication.ErrSlotHeld):
		return withCode(exitStandby, err)
	case replication.CodeOf(err) != replication.CodeInternal && replication.CodeOf(err) != replication.CodeSlotLost:
		return withCode(exitUsage, err)
	}
	return withCode(exitFailed, err)
}

// runBounded runs r until it returns, then stops the other goroutines
// (cancel, wg). Once ctx ends (a signal) everything must stop within
// shutdownTimeout: past it the journal's connections are broken (CloseNow),
// which fails an append that hangs on an unresponsive journal database, and
// if even that does not end Run within abortGrace, runBounded returns an
// error and leaves Run behind — the process is about to exit, which closes
// the replication connection and releases the slot's lock. What was not
// journaled was never acknowledged, so Postgres resends it to the next run.
func runBounded(ctx context.Context, log *slog.Logger, r *replication.Replicator, j *journal.Journal,
	shutdownTimeout time.Duration, cancel context.CancelFunc, wg *sync.WaitGroup) error {
	if shutdownTimeout <= 0 {
		shutdownTimeout = defaultShutdownTimeout
	}
	runDone := make(chan error, 1)
	go func() { runDone <- r.Run(ctx) }()
	var runErr error
	returned := false
	select {
	case runErr = <-runDone:
		returned = true
	case <-ctx.Done():
	}
	cancel()
	allDone := make(chan error, 1)
	go func() {
		err := runErr
		if !returned {
			err = <-runDone
		}
		wg.Wait()
		allDone <- err
	}()
	t := time.NewTimer(shutdownTimeout)
	defer t.Stop()
	select {
	case err := <-allDone:
		return err
	case <-t.C:
	}
	log.Warn("shutdown: the journal did not finish in time; breaking its connections", "shutdown_timeout", shutdownTimeout,
		"fix", "check the journal database (locks, a stopped or overloaded server, the network); raise --shutdown-timeout if it is merely slow")
	j.CloseNow()
	select {
	case err := <-allDone:
		return err
	case <-time.After(abortGrace):
		return withCode(exitFailed, fmt.Errorf("run: did not stop within %s of the signal (journal unresponsive); exiting", shutdownTimeout+abortGrace))
	}
}

// runReadiness is the /readyz answer of walcast run's replication.
func runReadiness(r *replication.Replicator, j *journal.Journal, stuckAfter time.Duration) (bool, string) {
	s := r.State()
	switch s.Role {
	case replication.RoleActive:
		if in, stalled := j.AppendStalled(); in && stalled >= stuckAfter {
			return false, fmt.Sprintf("active but the journal writer is stuck: an append has moved no byte for %s (it fails at %s and the session ends)",
				stalled.Round(100*time.Millisecond), j.CallTimeout())
		}
		return true, fmt.Sprintf("active: streaming, generation %d, watermark %s", s.Generation, s.Watermark)
	case replication.RoleStandby:
		return true, "standby: another walcast run holds the slot; ready to take over"
	}
	return false, fmt.Sprintf("%s: %s", s.Role, s.LastError)
}

// startupError maps an error met before streaming to its exit code: a
// classified connection or configuration problem is exit 2.
func startupError(err error) error {
	var re *replication.Error
	if errors.As(err, &re) && re.Code != replication.CodeInternal {
		return withCode(exitUsage, err)
	}
	var je *journal.Error
	if errors.As(err, &je) {
		return withCode(exitUsage, err)
	}
	return withCode(exitFailed, err)
}

// jsPtr is the JetStream configuration, nil when no stream is named.
func jsPtr(c publish.JetStreamConfig) *publish.JetStreamConfig {
	if c.Stream == "" {
		return nil
	}
	return &c
}
