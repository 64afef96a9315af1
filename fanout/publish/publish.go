// Package publish is the journal → NATS half of fanout, run inside
// `walcast run`: it reads journaled envelopes in seq order and publishes
// each one on its bus subject with the bus headers. It reads the journal and
// records only its published position there; it never serves clients and
// never imports fanout/sync.
package publish

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/internal/backoff"
	"github.com/walcast/walcast/journal"
)

// Config configures a Publisher. Zero fields take the defaults noted.
type Config struct {
	Prefix string // subject prefix; default "walcast"
	// BatchSize is the most entries read and published before one flush and
	// one published-position update; default 1000. In JetStream mode at
	// most two batches (2 × BatchSize messages) await acknowledgements.
	BatchSize int
	// BatchBytes bounds the envelope bytes of one batch read from the
	// journal (the first entry is always read, so a batch holds at most
	// BatchBytes plus one envelope); default 4 MiB. The publisher holds
	// at most two batches: while catching up, the one being published
	// and the next, read ahead (core NATS) or in flight to the stream
	// (JetStream).
	BatchBytes int
	// FlushTimeout bounds waiting for the server to acknowledge a batch
	// (a NATS PING/PONG round trip); default 5s.
	FlushTimeout time.Duration
	// RecordInterval is, with core NATS, the longest the published
	// position goes unsaved while publishing, and how soon it is saved
	// once the publisher has caught up (it is not saved at every catch-up:
	// that would put a journal commit in front of every batch of a steady
	// load); default 250ms. It is saved once more when Run stops. In
	// JetStream mode it is saved at every acknowledged batch (recordDue).
	RecordInterval time.Duration
	// PositionInterval is the most often the publisher's position is
	// published on bus.PositionSubject while it publishes (once more when
	// it has caught up); default 1 s.
	PositionInterval time.Duration
	// JetStream, when set, stores every entry in a JetStream stream,
	// exactly once and in order (jetstream.go); nil publishes to core
	// NATS.
	JetStream *JetStreamConfig
	Logger    *slog.Logger
}

// Publisher publishes journaled envelopes to NATS in seq order. It runs beside
// the replicator and never holds it back: it reads only what is already
// durable, so a NATS outage lets the journal and the slot keep advancing, and
// the publisher catches up when NATS returns.
//
// Delivery is at least once with stable ids: the published position is
// recorded in the journal only after the server has acknowledged a batch
// (flush), so a restart republishes at most the last unacknowledged batch,
// with the same Nats-Msg-Id.
type Publisher struct {
	cfg Config
	j   *journal.Journal
	nc  *nats.Conn
	log *slog.Logger
	id  string // journal id hex

	recorded   time.Time    // when the position was last saved; owned by Run
	savedPos   int64        // the position last saved; owned by Run
	reconnects uint64       // the connection's reconnect count at the last save; owned by Run
	published  atomic.Int64 // last seq handed to NATS
	horizon    atomic.Int64 // journal horizon at the last read
	epoch      int64        // the journal epoch of the last read; owned by Run
	epochKnown bool         // owned by Run
	posSent    int64        // the position last published on bus.PositionSubject; owned by Run

	// ahead is the journal read of the next batch, started while the
	// current one is published (readAhead); nil when none is under way.
	// Owned by Run, which waits for it before returning.
	ahead *readAhead

	// JetStream mode (jetstream.go); owned by Run.
	js          jetstream.JetStream
	inflight    *jsBatch // the batch handed to the stream whose acknowledgements are not yet awaited
	stream      jetstream.Stream
	jsReconcile bool         // reconcile with the stream before publishing
	jsLastSeq   uint64       // the stream sequence the next publish expects the stream to end at
	jsProbe     bool         // probe the next batch (publishJS): the stream may have their ids in its duplicate window, not the messages
	jsMaxMsg    int          // the stream's max message size in bytes (0: none), as of the last check or reconcile
	jsPos       jsPosition   // where the published position stands in the stream
	ackLatency  atomic.Int64 // ns to store the last batch (metrics)
	jsm         jsMetrics    // JetStream measurements (jetstream.go)
	posAt       time.Time    // when; owned by Run
	count       atomic.Uint64
	oversize    atomic.Uint64
	unparsed    atomic.Uint64
	// unparsedLog is when an unparsed envelope was last logged, and
	// unparsedQuiet how many were not logged since; owned by Run.
	unparsedLog   time.Time
	unparsedQuiet uint64

	mc       msgCache                           // strings entries share (message); owned by Run
	rest     *txnRest                           // the transaction the last batch ended inside (txnEnds); owned by Run
	byEntity *decoder.Counters                  // published by entity and op, read by metrics
	counts   map[string]*decoder.EntityCounters // byEntity's entries by entity; owned by Run
	tracer   trace.Tracer
}

// spanPublish names the span of one published batch (DESIGN §8).
const spanPublish = "walcast.nats.publish"

// SetTracerProvider makes the publisher trace every batch it publishes with
// a span from tp (attributes walcast.entries, walcast.seq.first,
// walcast.seq.last). Call it before Run; without it nothing is traced.
func (p *Publisher) SetTracerProvider(tp trace.TracerProvider) {
	p.tracer = tp.Tracer("github.com/walcast/walcast/fanout/publish")
}

// Published returns the envelopes published so far by entity and op
// (republished copies included, like Stats.Messages).
func (p *Publisher) Published() *decoder.Counters { return p.byEntity }

// countPublished counts one published entry by entity and op. Entities are
// bounded by the publication; message prefixes by decoder.MaxMessageEntities.
func (p *Publisher) countPublished(e *journal.Entry) {
	ec := p.counts[e.Entity]
	if ec == nil {
		if e.Op == decoder.OpMessage {
			ec = p.byEntity.Message(e.Entity)
		} else {
			ec = p.byEntity.Entity(e.Entity)
		}
		if len(p.counts) >= 1024 {
			clear(p.counts) // only a cache: keep it small
		}
		p.counts[e.Entity] = ec
	}
	ec.Add(e.Op, 1)
}

// New returns a publisher of j's entries on nc.
func New(cfg Config, j *journal.Journal, nc *nats.Conn) *Publisher {
	if cfg.Prefix == "" {
		cfg.Prefix = "walcast"
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 1000
	}
	if cfg.BatchBytes <= 0 {
		cfg.BatchBytes = 4 << 20
	}
	if cfg.FlushTimeout <= 0 {
		cfg.FlushTimeout = 5 * time.Second
	}
	if cfg.RecordInterval <= 0 {
		cfg.RecordInterval = 250 * time.Millisecond
	}
	if cfg.PositionInterval <= 0 {
		cfg.PositionInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Publisher{cfg: cfg, j: j, nc: nc, log: cfg.Logger, id: j.IDHex(),
		byEntity: decoder.NewCounters(), counts: map[string]*decoder.EntityCounters{}, tracer: noop.Tracer{}}
}

// Stats are the publisher's counters.
type Stats struct {
	Published int64  // last seq handed to NATS
	Horizon   int64  // journal horizon at the last read
	Messages  uint64 // messages published (including republished ones)
	Oversize  uint64 // reference envelopes published for changes too large for NATS
	// Unparsed counts the oversize entries whose envelope could not be
	// parsed (JSON nested deeper than encoding/json's limit, or bytes that
	// are not a JSON object): their reference was built from the journal
	// row's own fields. Each is also counted in Oversize.
	Unparsed uint64
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() Stats {
	return Stats{Published: p.published.Load(), Horizon: p.horizon.Load(),
		Messages: p.count.Load(), Oversize: p.oversize.Load(), Unparsed: p.unparsed.Load()}
}

// Run publishes until ctx ends, then returns nil. Errors (NATS down, journal
// unreachable) are logged once per failure streak and retried with backoff.
//
// It fails at once, before publishing anything, when the subject prefix is
// invalid (bus.CheckPrefix).
func (p *Publisher) Run(ctx context.Context) error {
	if err := bus.CheckPrefix(p.cfg.Prefix); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	if err := p.initJetStream(); err != nil {
		return err
	}
	if p.js != nil {
		// Every run starts from what the stream holds, never from what an
		// earlier run of this publisher remembers: since it ended, the
		// stream may have stored batches it abandoned, another walcast may
		// have published (a takeover and a give-back), or the stream may
		// have been purged.
		p.jsReconcile, p.jsLastSeq, p.inflight = true, 0, nil
	}
	bo := backoff.New(200*time.Millisecond, 10*time.Second)
	var pos int64
	loaded := false
	failing := false
	p.reconnects = p.nc.Stats().Reconnects
	for ctx.Err() == nil {
		var err error
		if !loaded {
			if pos, err = p.j.Published(ctx); err == nil {
				loaded = true
				p.published.Store(pos)
				p.savedPos = pos
			}
		}
		if err == nil && p.js != nil {
			pos, err = p.prepareJS(ctx, pos)
			if errors.Is(err, ErrStreamMismatch) {
				return fmt.Errorf("publish: %w", err)
			}
		}
		if err == nil {
			pos, err = p.step(ctx, pos)
		}
		if errors.Is(err, errResume) {
			// The stream counted fewer of the batches in flight than were
			// sent, and refused the rest (awaitJS): continue after what it
			// counted, from the stream sequence it ends at.
			pos, err = p.published.Load(), nil
		}
		if err == nil {
			if failing {
				p.log.Info("publishing to NATS again", "published", pos)
				failing = false
			}
			bo.Reset()
			continue
		}
		if ctx.Err() != nil {
			break
		}
		// Whatever was handed to NATS after the last flushed position may
		// be lost with the connection: start again from there (copies carry
		// the same Msg-Id).
		p.abandon()
		pos = p.savedPos
		p.published.Store(pos)
		p.jsReconcile = p.js != nil
		if !failing {
			p.log.Warn("publishing paused; the journal keeps advancing and publishing resumes from the last acknowledged entry",
				"err", err, "published", pos)
			failing = true
		}
		if _, werr := bo.Wait(ctx); werr != nil {
			break
		}
	}
	// Stopping: save the position reached (core NATS saves it only every
	// RecordInterval while running), so a restart republishes nothing it
	// need not; a save that fails leaves the older one. In JetStream mode
	// the batch in flight is settled first: the saved position is then
	// what the stream holds, which is where the next run continues even
	// if the stream is emptied meanwhile (reconcile). Its
	// acknowledgements cover the batch before it, whose wait the stop cut
	// short: they are chained. One that does not settle within
	// FlushTimeout does not count: the next run reconciles with the
	// stream.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.FlushTimeout)
	defer cancel()
	if p.js != nil && loaded && !failing {
		_ = p.settle(sctx)
	}
	// The read ahead is waited for (its goroutine is Run's).
	p.abandon()
	if p.js != nil {
		pos = p.published.Load() // acknowledged by the stream
	}
	if loaded && !failing && p.savedPos < pos {
		_ = p.record(sctx, pos)
	}
	return nil
}

// abandon drops what is under way, after a failure or when Run stops: the
// read ahead (waited for), and in JetStream mode the in-flight batch and
// every publish nats.go still awaits an acknowledgement for — one lost in a
// leader change while the connection stayed up would count against the
// pending bound until a reconnect and stall every later publish. The
// reconcile that follows reads what the stream holds, whatever of the
// dropped publishes it stored.
func (p *Publisher) abandon() {
	p.dropAhead()
	if p.js != nil {
		p.inflight = nil
		if p.js.PublishAsyncPending() > 0 {
			p.js.CleanupPublisher()
		}
	}
}

// readAhead is a journal read of the batch after a position, run by its own
// goroutine while the batch before it is published to core NATS, so the
// journal query and the publishing overlap. There is at most one
// (Publisher.ahead): with the batch being published, at most two batches
// (2 × BatchBytes, plus one envelope each) are read and not yet handed to
// NATS.
type readAhead struct {
	after  int64
	cancel context.CancelFunc
	done   chan struct{} // closed when lg and err are set
	lg     journal.Log
	err    error
}

// startReadAhead starts reading the batch after seq.
func (p *Publisher) startReadAhead(ctx context.Context, after int64) {
	actx, cancel := context.WithCancel(ctx)
	a := &readAhead{after: after, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.lg, a.err = p.j.ReadAfterBytes(actx, after, p.cfg.BatchSize, p.cfg.BatchBytes)
	}()
	p.ahead = a
}

// dropAhead cancels the read ahead, if any, and waits for its goroutine.
func (p *Publisher) dropAhead() {
	if a := p.ahead; a != nil {
		p.ahead = nil
		a.cancel()
		<-a.done
	}
}

// read returns the batch after pos: the read ahead when it was of pos (it
// started after every read whose result was used, so reads are used in the
// order they were made and an epoch change is never seen undone), else a
// read now.
func (p *Publisher) read(ctx context.Context, pos int64) (journal.Log, error) {
	if a := p.ahead; a != nil && a.after == pos {
		p.ahead = nil
		defer a.cancel()
		select {
		case <-a.done:
			return a.lg, a.err
		case <-ctx.Done():
			a.cancel()
			<-a.done
			return journal.Log{}, ctx.Err()
		}
	}
	p.dropAhead()
	return p.j.ReadAfterBytes(ctx, pos, p.cfg.BatchSize, p.cfg.BatchBytes)
}

// step publishes one batch after pos, or waits for new entries, and returns
// the new position.
func (p *Publisher) step(ctx context.Context, pos int64) (int64, error) {
	lg, err := p.read(ctx, pos)
	if err != nil {
		return pos, err
	}
	p.horizon.Store(lg.Horizon)
	if p.epochKnown && lg.Epoch != p.epoch && pos >= lg.EpochSeq {
		// The journal's history was reset (a restore, a lost tail, a
		// recreated slot): from the new epoch's first seq on, entries
		// are not the ones this position counted. Publish them, once
		// the stream has acknowledged what is in flight (the saved
		// position moves back below).
		if err := p.settle(ctx); err != nil {
			return pos, err
		}
		p.log.Warn("the journal's epoch changed; publishing the new epoch from its first entry",
			"epoch", journal.EpochHex(lg.Epoch), "first_seq", lg.EpochSeq, "was_at", pos)
		p.epoch = lg.Epoch
		p.savedPos = min(p.savedPos, lg.EpochSeq-1)
		p.posSent = 0
		p.published.Store(lg.EpochSeq - 1)
		if p.js != nil {
			// The stream position saved counts entries of the old epoch
			// after it; count from here.
			return lg.EpochSeq - 1, p.recordJS(ctx, lg.EpochSeq-1)
		}
		return lg.EpochSeq - 1, nil
	}
	p.epoch, p.epochKnown = lg.Epoch, true
	if pos < lg.Floor-1 {
		p.log.Warn("journal entries were pruned before they were published; sync nodes repair from the journal or resync",
			"from", pos+1, "to", lg.Floor-1)
	}
	if len(lg.Entries) == 0 {
		if lg.Horizon > pos && pos < lg.Floor-1 {
			if err := p.settle(ctx); err != nil {
				return pos, err
			}
			if p.js != nil {
				// Nothing was stored for the pruned entries.
				return lg.Floor - 1, p.recordJS(ctx, lg.Floor-1)
			}
			return lg.Floor - 1, p.j.SetPublished(ctx, lg.Floor-1)
		}
		return pos, p.caughtUp(ctx, pos, lg.Horizon)
	}
	last := lg.Entries[len(lg.Entries)-1].Seq
	if last < lg.Horizon && p.js == nil {
		// More is journaled: read it while this batch is published. Not
		// in JetStream mode: there the next read already overlaps the
		// stream storing this batch (publishJS leaves it in flight), a
		// read ahead measured no faster, and memory stays at two
		// batches.
		p.startReadAhead(ctx, last)
	}
	sctx, span := p.tracer.Start(ctx, spanPublish, trace.WithAttributes(
		attribute.Int("walcast.entries", len(lg.Entries)),
		attribute.Int64("walcast.seq.first", lg.Entries[0].Seq),
		attribute.Int64("walcast.seq.last", last)))
	next, err := p.publish(sctx, pos, lg.Entries, lg.Horizon)
	if err != nil && !errors.Is(err, errResume) {
		span.RecordError(err)
		span.SetStatus(codes.Error, "publish failed")
	}
	span.End()
	if err == nil && next == lg.Horizon {
		// The read reached the horizon: caught up as of the read. Wait
		// for the next append straight away instead of reading again to
		// find nothing (a journal round trip per batch under a steady
		// load); Wait returns at once if an append came in meanwhile.
		return next, p.caughtUp(ctx, next, lg.Horizon)
	}
	return next, err
}

// caughtUp is step's part once everything up to horizon is published (pos
// is the position, at or past horizon unless entries were skipped): it
// tells sync nodes where the stream stands (at most every
// PositionInterval; until then the wait is cut short so the last position
// goes out on time), saves the position when RecordInterval has passed
// since the last save (else the wait is cut short for it: a position that
// stopped moving is saved within RecordInterval), and waits for the next
// append.
//
// The save is not made on every catch-up: under a steady load the
// publisher catches up after nearly every batch, and a save is a NATS
// flush and a journal commit — a disk flush — in front of the next batch.
// The saved position is only where a restarted publisher resumes
// (republished copies carry the same Msg-Id), so saving it at most every
// RecordInterval changes nothing a subscriber sees.
func (p *Publisher) caughtUp(ctx context.Context, pos, horizon int64) error {
	if err := p.settle(ctx); err != nil {
		return err
	}
	if err := p.position(pos); err != nil {
		return err
	}
	wait := 30 * time.Second
	if pos > p.posSent {
		wait = max(time.Millisecond, p.cfg.PositionInterval-time.Since(p.posAt))
	}
	if p.savedPos < pos {
		if due := p.recordDue(); due > 0 {
			wait = min(wait, due)
		} else if err := p.record(ctx, pos); err != nil {
			return err
		}
	}
	// Wait for the next append: this process's own appends wake it at
	// their commit (journal.Wait), another process's through NOTIFY.
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if _, err := p.j.Wait(wctx, horizon); err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// publish hands entries to NATS and returns the position to read after
// (the last seq handed); the span of the batch is in ctx. In JetStream mode
// the published position moves only as far as the stream has acknowledged
// (publishJS leaves this batch in flight), so a position message or a
// saved position never counts an entry the stream may not hold.
func (p *Publisher) publish(ctx context.Context, pos int64, entries []journal.Entry, horizon int64) (int64, error) {
	max, err := p.payloadLimit()
	if err != nil {
		return pos, err
	}
	ends, err := p.txnEnds(ctx, entries, horizon)
	if err != nil {
		return pos, err
	}
	var msgs []*nats.Msg
	if p.js != nil {
		msgs = make([]*nats.Msg, 0, len(entries))
	}
	for i := range entries {
		msg, over := p.message(&entries[i], max, ends[i])
		if p.js != nil {
			msgs = append(msgs, msg)
		} else if err := p.nc.PublishMsg(msg); err != nil {
			return pos, fmt.Errorf("publish seq %d to %s: %w", entries[i].Seq, msg.Subject, err)
		}
		p.count.Add(1)
		p.countPublished(&entries[i])
		if over {
			p.oversize.Add(1)
		}
	}
	last := entries[len(entries)-1].Seq
	done := last // the position the server has (core NATS: once flushed)
	if p.js != nil {
		if err := p.publishJS(ctx, msgs, entries); err != nil {
			return pos, err
		}
		done = p.published.Load()
	} else {
		p.published.Store(last)
	}
	if err := p.position(done); err != nil {
		return pos, err
	}
	// The position is saved (recordDue) after a flush or the stream's
	// acknowledgements prove the server has everything up to it.
	if done > p.savedPos && p.recordDue() <= 0 {
		if err := p.record(ctx, done); err != nil {
			return pos, err
		}
	}
	return last, nil
}

// txnClass is the class of entries one subject carries, for
// bus.HeaderTxnEnd: an entity and a tenant token, tenant-unknown entries
// apart.
type txnClass struct {
	entity, tenant   string
	hasTenant, unkno bool
}

// txnRest caches the end of the transaction a batch ended inside: the last
// seq of each class among its entries after the batch, read once per
// transaction however many batches it spans.
type txnRest struct {
	commit decoder.LSN
	epoch  int64
	last   map[txnClass]int64 // class → last seq of the transaction
	entity map[string]int64   // entity → last seq of the transaction
}

// txnEnds returns, per entry, the bus.HeaderTxnEnd value it carries ("" for
// none). Entries of a transaction are contiguous and share commit_lsn;
// when the batch ends below the horizon inside a transaction, the rest of
// that transaction is looked up in the journal (journal.TxnRest, only the
// classes of its entries) before anything is decided, so a mark never
// depends on where a batch happened to end.
func (p *Publisher) txnEnds(ctx context.Context, entries []journal.Entry, horizon int64) ([]string, error) {
	ends := make([]string, len(entries))
	if len(entries) == 0 {
		return ends, nil
	}
	last := &entries[len(entries)-1]
	var rest *txnRest
	if last.Seq < horizon {
		r := p.rest
		if r == nil || r.commit != last.CommitLSN || r.epoch != last.Epoch {
			m, err := p.j.TxnRest(ctx, last.Seq, last.CommitLSN)
			if err != nil {
				return nil, err
			}
			r = &txnRest{commit: last.CommitLSN, epoch: last.Epoch, last: map[txnClass]int64{}, entity: map[string]int64{}}
			for k, seq := range m {
				c := txnClass{entity: k.Entity, tenant: k.Tenant, hasTenant: k.HasTenant, unkno: k.TenantUnknown}
				r.last[c] = max(r.last[c], seq)
				r.entity[k.Entity] = max(r.entity[k.Entity], seq)
			}
			p.rest = r
		}
		rest = r
	}
	var seenClass map[txnClass]bool
	var seenEntity map[string]bool
	commit := decoder.LSN(0)
	for i := len(entries) - 1; i >= 0; i-- {
		e := &entries[i]
		if i == len(entries)-1 || e.CommitLSN != commit {
			commit = e.CommitLSN
			seenClass, seenEntity = map[txnClass]bool{}, map[string]bool{}
			if rest != nil && commit == rest.commit {
				for c, seq := range rest.last {
					if seq > e.Seq {
						seenClass[c] = true
					}
				}
				for en, seq := range rest.entity {
					if seq > e.Seq {
						seenEntity[en] = true
					}
				}
			}
		}
		c := txnClass{entity: e.Entity, tenant: e.Tenant, hasTenant: e.HasTenant, unkno: e.TenantUnknown}
		switch {
		case !seenEntity[e.Entity]:
			ends[i] = bus.TxnEndEntity
		case !seenClass[c]:
			ends[i] = bus.TxnEndTenant
		}
		seenClass[c], seenEntity[e.Entity] = true, true
	}
	return ends, nil
}

// recordDue is how long until the published position is to be saved
// again (≤ 0: now).
//
// With core NATS the saved position is only where a restarted publisher
// resumes (republished copies carry the same Msg-Id), so it is saved at
// most every RecordInterval: a save is a NATS flush and a journal commit
// in front of the next batch. In JetStream mode it is saved at every
// acknowledged batch, for a stream that holds no message to reconcile
// with (purged, or every message aged out) resumes from it: entries the
// stream acknowledged but the journal does not count would be stored
// again. The save is then one journal round trip per batch, made while
// the next batch is in flight, without a disk flush (SetPublished).
func (p *Publisher) recordDue() time.Duration {
	if p.js != nil {
		return 0
	}
	return p.cfg.RecordInterval - time.Since(p.recorded)
}

// position publishes seq as the publisher's position on bus.PositionSubject
// when it moved since the last one, at most every PositionInterval. It
// follows every entry up to seq on the same connection, so a node that has
// handled it has handled them (nats.go's Barrier; fanout/sync).
func (p *Publisher) position(seq int64) error {
	if seq <= p.posSent || !p.epochKnown || time.Since(p.posAt) < p.cfg.PositionInterval {
		return nil
	}
	m := nats.NewMsg(bus.PositionSubject(p.cfg.Prefix))
	m.Header.Set(bus.HeaderSeq, strconv.FormatInt(seq, 10))
	m.Header.Set(bus.HeaderEpoch, journal.EpochHex(p.epoch))
	if err := p.nc.PublishMsg(m); err != nil {
		return fmt.Errorf("publish the position %d: %w", seq, err)
	}
	p.posSent, p.posAt = seq, time.Now()
	return nil
}

// errReconnected reports a reconnect since the last saved position.
var errReconnected = errors.New("the NATS connection was re-established; messages sent to the old connection may be lost")

// record flushes to the server and saves seq as the published position.
//
// A flush only proves the current connection delivered what it carried: if
// the connection was re-established since the last save, messages written
// to the old one may never have reached a server, so the publisher rewinds
// (Run) and republishes from the saved position instead.
func (p *Publisher) record(ctx context.Context, seq int64) error {
	if p.js != nil {
		// Every entry up to seq was acknowledged by the stream.
		return p.recordJS(ctx, seq)
	}
	fctx, cancel := context.WithTimeout(ctx, p.cfg.FlushTimeout)
	defer cancel()
	if err := p.nc.FlushWithContext(fctx); err != nil {
		return fmt.Errorf("NATS did not acknowledge the published changes: %w", err)
	}
	if r := p.nc.Stats().Reconnects; r != p.reconnects {
		p.reconnects = r
		return errReconnected
	}
	if err := p.j.SetPublished(ctx, seq); err != nil {
		return err
	}
	p.recorded, p.savedPos = time.Now(), seq
	return nil
}

// message builds the NATS message of an entry; over reports a reference
// envelope in place of the entry's own. An envelope larger than max goes
// out as a reference envelope without row data; one whose reference is
// still too large (huge names) as a minimal reference; one that cannot be
// parsed (rowReference) as a reference built from the journal row's fields
// alone. Subject and headers are bounded (fanout/bus), and with max at
// least minPayload (payloadLimit) every entry yields a message the server
// takes, so no entry can stall the publisher. In JetStream mode the room
// left counts the expectation header publishJS adds.
//
// It runs once per entry, so it allocates little: the strings entries share
// (subject, epoch, commit LSN) come from p.mc, the header values share one
// array, and Walcast-Seq is the end of the Nats-Msg-Id string.
func (p *Publisher) message(e *journal.Entry, max int, txnEnd string) (m *nats.Msg, over bool) {
	subject := p.mc.subject(p.cfg.Prefix, e)
	epoch := p.mc.epochHex(e.Epoch)
	var buf [96]byte
	b := append(buf[:0], p.id...)
	b = append(b, ':')
	b = append(b, epoch...)
	b = append(b, ':')
	n := len(b)
	b = strconv.AppendInt(b, e.Seq, 10)
	id := string(b)
	h := newHeaders()
	h.set(bus.HeaderMsgID, id)
	h.set(bus.HeaderEpoch, epoch)
	h.set(bus.HeaderSeq, id[n:])
	h.set(bus.HeaderEntitySeq, strconv.FormatInt(e.EntitySeq, 10))
	h.set(bus.HeaderCommitLSN, p.mc.lsnText(e.CommitLSN))
	if e.TenantUnknown {
		h.set(bus.HeaderTenantUnknown, "true")
	}
	if txnEnd != "" {
		h.set(bus.HeaderTxnEnd, txnEnd)
	}
	if len(e.Entity) <= bus.MaxHeaderValueBytes {
		h.set(bus.HeaderEntity, e.Entity)
	}
	if e.HasTenant && len(e.Tenant) <= bus.MaxHeaderValueBytes {
		h.set(bus.HeaderTenant, e.Tenant)
	}
	// Headers and subject count against the payload limit too; leave them
	// room.
	room := max - len(subject) - h.size
	if p.js != nil {
		room -= p.jsExpectRoom()
	}
	m = &nats.Msg{Subject: subject, Header: h.h, Data: e.Envelope}
	if len(m.Data) <= room {
		return m, false
	}
	ref, err := referenceEnvelope(e.Envelope, false)
	if err == nil && len(ref) > room {
		ref, err = referenceEnvelope(e.Envelope, true)
	}
	if err != nil {
		p.noteUnparsed(e, err)
		ref = rowReference(e, true)
	}
	if len(ref) > room {
		// Names too large for the room (a server with a small max
		// payload): the minimal row reference, without the name headers
		// (the subject still routes it; the journal has the rest).
		ref = rowReference(e, false)
		delete(m.Header, bus.HeaderEntity)
		delete(m.Header, bus.HeaderTenant)
	}
	m.Data = ref
	return m, true
}

// minPayload is the least max payload (or JetStream max message size)
// walcast publishes with: room for the longest subject, the headers
// without the entity and tenant values, the expectation header and a
// minimal row reference, with a wide margin.
const minPayload = 4096

// payloadLimit is the most bytes one message may take: the server's max
// payload and, in JetStream mode, the stream's max message size. Below
// minPayload even a minimal reference may not fit; that is the servers'
// configuration, not an entry, and stops publishing with the fix.
func (p *Publisher) payloadLimit() (int, error) {
	max := int(p.nc.MaxPayload())
	if max < minPayload {
		return 0, fmt.Errorf("the NATS server's max_payload is %d bytes, under the %d walcast needs for a change too large for it (fix: raise max_payload in the NATS server configuration)", max, minPayload)
	}
	if p.js != nil && p.jsMaxMsg > 0 {
		max = min(max, p.jsMaxMsg)
	}
	return max, nil
}

// noteUnparsed counts an oversize entry whose envelope could not be parsed
// and logs it, once a minute at most with the number not logged since:
// every such entry is published as its row reference, so it repeats only
// if more such entries are journaled.
func (p *Publisher) noteUnparsed(e *journal.Entry, err error) {
	p.unparsed.Add(1)
	if !p.unparsedLog.IsZero() && time.Since(p.unparsedLog) < time.Minute {
		p.unparsedQuiet++
		return
	}
	p.log.Warn("a journaled change too large for NATS has an envelope that cannot be parsed; published a reference built from its journal row, and readers fetch the change from the journal (nothing to fix in walcast; JSON values nested deeper than 10,000 levels cause this)",
		"seq", e.Seq, "entity", e.Entity, "err", err, "not_logged_since_last", p.unparsedQuiet)
	p.unparsedLog, p.unparsedQuiet = time.Now(), 0
}

// rowReference is the reference envelope of an entry built from its journal
// row's fields alone, never from its envelope: seq, entitySeq, lsn,
// commitLsn, commitTime, op, tenantUnknown and "oversize":true, and with
// names the entity and tenant when at most bus.MaxHeaderValueBytes each.
// It is valid JSON whatever the row holds (strings are escaped, invalid
// UTF-8 replaced); without names it is at most a few hundred bytes.
func rowReference(e *journal.Entry, names bool) []byte {
	b := make([]byte, 0, 256)
	b = append(b, `{"seq":`...)
	b = strconv.AppendInt(b, e.Seq, 10)
	b = append(b, `,"entitySeq":`...)
	b = strconv.AppendInt(b, e.EntitySeq, 10)
	b = append(b, `,"lsn":"`...)
	b = append(b, e.LSN.String()...)
	b = append(b, `","commitLsn":"`...)
	b = append(b, e.CommitLSN.String()...)
	b = append(b, '"')
	if !e.CommitTime.IsZero() {
		b = append(b, `,"commitTime":"`...)
		b = e.CommitTime.UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z")
		b = append(b, '"')
	}
	if names && len(e.Entity) <= bus.MaxHeaderValueBytes {
		b = append(b, `,"entity":`...)
		b = appendJSONString(b, e.Entity)
	}
	b = append(b, `,"op":`...)
	b = appendJSONString(b, string(e.Op))
	if names && e.HasTenant && len(e.Tenant) <= bus.MaxHeaderValueBytes {
		b = append(b, `,"tenant":`...)
		b = appendJSONString(b, e.Tenant)
	}
	if e.TenantUnknown {
		b = append(b, `,"tenantUnknown":true`...)
	}
	return append(b, `,"oversize":true}`...)
}

// appendJSONString appends s as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

// headers builds a message's header map with one array for its values;
// size is the encoded header block's length in bytes (as nats.go encodes
// it, before it trims values, so never less).
type headers struct {
	h    nats.Header
	vals []string
	size int
}

// newHeaders has room for the headers of most entries (message sets six to
// eight; the map then needs no growing).
func newHeaders() headers {
	return headers{h: make(nats.Header, 9), vals: make([]string, 0, 9),
		size: len("NATS/1.0\r\n") + len("\r\n")}
}

func (h *headers) set(k, v string) {
	h.vals = append(h.vals, v)
	n := len(h.vals)
	h.h[k] = h.vals[n-1 : n : n] // capacity 1: appending to one value never overwrites the next
	h.size += len(k) + len(": ") + len(v) + len("\r\n")
}

// msgCache keeps the strings consecutive entries share, so that message
// builds them once per run of entries rather than once per entry: the
// subject (by op, entity and tenant; at most maxSubjects kept), the epoch's
// hex and the commit LSN's text (a transaction's entries share it). Owned by
// Run.
type msgCache struct {
	subjects map[subjectKey]string
	epoch    int64
	epochStr string
	lsn      decoder.LSN
	lsnStr   string
}

type subjectKey struct {
	op             decoder.Op
	entity, tenant string
	hasTenant      bool
}

// maxSubjects bounds msgCache's subjects: entities are bounded by the
// publication, tenants are not.
const maxSubjects = 4096

func (c *msgCache) subject(prefix string, e *journal.Entry) string {
	k := subjectKey{e.Op, e.Entity, e.Tenant, e.HasTenant}
	if s, ok := c.subjects[k]; ok {
		return s
	}
	s := bus.Subject(prefix, e.Op, e.Entity, e.Tenant, e.HasTenant)
	if c.subjects == nil || len(c.subjects) >= maxSubjects {
		c.subjects = make(map[subjectKey]string) // only a cache: start again
	}
	c.subjects[k] = s
	return s
}

func (c *msgCache) epochHex(e int64) string {
	if c.epochStr == "" || c.epoch != e {
		c.epoch, c.epochStr = e, journal.EpochHex(e)
	}
	return c.epochStr
}

func (c *msgCache) lsnText(l decoder.LSN) string {
	if c.lsnStr == "" || c.lsn != l {
		c.lsn, c.lsnStr = l, l.String()
	}
	return c.lsnStr
}

// referenceEnvelope drops the row data of an envelope and marks it oversize;
// readers fetch the full entry from the journal by seq. minimal keeps only
// the envelope's positions and op (no names, which can be as large as the
// data), for an envelope whose reference would still not fit.
func referenceEnvelope(env []byte, minimal bool) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(env, &fields); err != nil {
		return nil, fmt.Errorf("journaled envelope is not a JSON object: %w", err)
	}
	if minimal {
		for k := range fields {
			switch k {
			case "seq", "entitySeq", "lsn", "commitLsn", "xid", "commitTime", "op":
			default:
				delete(fields, k)
			}
		}
	}
	for _, k := range []string{"before", "after", "key", "unchanged", "content", "beforeJsonNull", "afterJsonNull"} {
		delete(fields, k)
	}
	if q, ok := fields["quarantine"]; ok {
		// A quarantine entry keeps its reason; its raw bytes stay in the journal.
		var qf map[string]json.RawMessage
		if json.Unmarshal(q, &qf) == nil {
			delete(qf, "raw")
			if b, err := json.Marshal(qf); err == nil {
				fields["quarantine"] = b
			}
		}
	}
	fields["oversize"] = json.RawMessage("true")
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(fields); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// RegisterMetrics exports the publisher's counters through meter (DESIGN §8).
func (p *Publisher) RegisterMetrics(meter metric.Meter) error {
	published, err := meter.Int64ObservableCounter("walcast.nats.published",
		metric.WithDescription("envelopes published to NATS (republished copies included)"))
	if err != nil {
		return err
	}
	oversize, err := meter.Int64ObservableCounter("walcast.nats.oversize",
		metric.WithDescription("reference envelopes published for changes larger than the NATS max payload"))
	if err != nil {
		return err
	}
	unparsed, err := meter.Int64ObservableCounter("walcast.nats.unparsed",
		metric.WithDescription("oversize envelopes that could not be parsed, published as a reference built from the journal row (also counted in walcast.nats.oversize)"))
	if err != nil {
		return err
	}
	behind, err := meter.Int64ObservableGauge("walcast.nats.publish.lag", metric.WithUnit("{entry}"),
		metric.WithDescription("journal entries not yet published (journal horizon minus published seq)"))
	if err != nil {
		return err
	}
	byEntity, err := meter.Int64ObservableCounter("walcast.published.changes",
		metric.WithDescription("envelopes published to NATS by entity and op (republished copies included)"))
	if err != nil {
		return err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		p.byEntity.Each(func(entity string, op decoder.Op, n uint64) {
			o.ObserveInt64(byEntity, int64(n), metric.WithAttributes(attribute.String("entity", entity), attribute.String("op", string(op))))
		})
		s := p.Stats()
		o.ObserveInt64(published, int64(s.Messages))
		o.ObserveInt64(oversize, int64(s.Oversize))
		o.ObserveInt64(unparsed, int64(s.Unparsed))
		lag := s.Horizon - s.Published
		if lag < 0 {
			lag = 0
		}
		o.ObserveInt64(behind, lag)
		return nil
	}, published, oversize, unparsed, behind, byEntity)
	if err != nil {
		return err
	}
	return p.registerJetStreamMetrics(meter)
}
