package publish

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"

	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/journal"
)

// JetStream mode (walcast run --jetstream-stream). The publisher stores
// every journaled entry in a JetStream stream exactly once and in seq order,
// whatever the dedup window, NATS node failures or walcast restarts:
//
//   - every message carries Nats-Expected-Last-Sequence, the stream
//     sequence its predecessor is stored at (counted on from the stream's
//     last message at the reconcile), so the stream stores a message only
//     right after its predecessor: a lost message makes every later one
//     fail instead of leaving a hole. A clustered stream's leader checks it
//     before it proposes the message, so a message after a hole — a server
//     gone or a leader change with publishes in flight — is refused, never
//     replicated. Because walcast is the stream's only writer, the message
//     at the expected sequence is the predecessor whenever the check
//     passes;
//   - no message carries Nats-Expected-Last-Msg-Id: each replica checks it
//     when it applies the message, against the id of the last message it
//     stored, which a replica that caught up from the leader's snapshot,
//     or whose last message aged out before a restart, does not have
//     (nats-server 2.15: processCatchupMsg and rebuildDedupe leave it
//     stale or empty); the mismatch is a critical write error that takes
//     the replica out of the stream for good;
//   - the published position advances only over acknowledged messages;
//   - at the start of every Run, and after any failure, the publisher
//     reconciles with the stream: it reads the stream's last message and
//     continues after the entry it holds (its Walcast-Seq). What the
//     stream holds is the truth, so an entry acknowledged but not yet
//     recorded in the journal is never stored twice, however long walcast
//     was away. Messages removed from the front of the stream (MaxAge,
//     limits, a purge that keeps some) change nothing: the last one tells;
//   - a stream that holds no message (purged, or every message aged out)
//     still has its last sequence, and the journal saves, with the
//     published position S, the stream's last sequence Q once it held
//     every entry up to S (journal.StreamPosition). Entries are stored in
//     order, each right after its predecessor, by walcast alone, so a
//     stream that ends at L stored L−Q entries after S, acknowledged or
//     not when walcast stopped: the publisher continues after S+(L−Q).
//
// Nats-Msg-Id deduplication still drops a retry of a message whose
// acknowledgement was lost (nats.go retries a publish that found no
// responders), which happens within seconds: the window need only cover
// that (MinDuplicateWindow).
//
// It also acknowledges, as a duplicate, an entry the stream stored before
// and no longer holds while its id is still in the window: after an
// emptied stream with no saved stream position for it is continued from
// the journal's published position. The stream stores nothing for it;
// the publisher counts it as published without moving the expected
// sequence, and probes the entries after it (awaitJS).

// JetStreamConfig configures JetStream mode.
type JetStreamConfig struct {
	Stream string // stream name (required)
	// Replicas of a stream the publisher creates (default 1); an existing
	// stream must have this many.
	Replicas int
	// MaxAge of the stream's messages (0: kept until removed otherwise).
	MaxAge time.Duration
	// DuplicateWindow of a stream the publisher creates (default 2m, at
	// least MinDuplicateWindow); an existing stream's must be at least
	// MinDuplicateWindow.
	DuplicateWindow time.Duration
	// AckTimeout bounds the wait for a batch's acknowledgements (default
	// 10s).
	AckTimeout time.Duration
}

// MinDuplicateWindow is the shortest duplicate window walcast accepts: it
// must outlast nats.go's publish retries and a reconnect.
const MinDuplicateWindow = time.Minute

// streamSubjects are the subjects walcast stores: every entry's, not the
// publisher's position (bus.PositionSubject).
func streamSubjects(prefix string) []string {
	return []string{prefix + ".change.>", prefix + ".message.>", prefix + ".resync"}
}

func (c *JetStreamConfig) setDefaults() {
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.DuplicateWindow <= 0 {
		c.DuplicateWindow = 2 * time.Minute
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = 10 * time.Second
	}
}

// ErrStreamMismatch: an existing stream of the configured name is not fit
// for walcast; nothing was published. The error says what differs and how
// to fix it.
var ErrStreamMismatch = errors.New("the JetStream stream does not match what walcast needs")

// ensureStream creates the stream, or checks an existing one.
func (p *Publisher) ensureStream(ctx context.Context) (jetstream.Stream, error) {
	c := p.cfg.JetStream
	want := streamSubjects(p.cfg.Prefix)
	s, err := p.js.Stream(ctx, c.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = p.js.CreateStream(ctx, jetstream.StreamConfig{
			Name: c.Stream, Subjects: want, Storage: jetstream.FileStorage, Replicas: c.Replicas,
			MaxAge: c.MaxAge, Duplicates: c.DuplicateWindow, Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld,
			Description: "walcast: every journaled entry once, in seq order (Nats-Msg-Id <journal>:<epoch>:<seq>)",
		})
		if err != nil {
			return nil, fmt.Errorf("create JetStream stream %q: %w (fix: check the account may create streams and the cluster has %d servers for the replicas)", c.Stream, err, c.Replicas)
		}
		p.log.Info("created the JetStream stream", "stream", c.Stream, "subjects", want, "replicas", c.Replicas, "duplicate_window", c.DuplicateWindow)
		p.jsMaxMsg = 0
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up JetStream stream %q: %w (fix: check that the NATS servers run JetStream)", c.Stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read JetStream stream %q: %w", c.Stream, err)
	}
	sc := info.Config
	var bad []string
	for _, w := range want {
		if !slices.Contains(sc.Subjects, w) {
			bad = append(bad, fmt.Sprintf("its subjects %v lack %q", sc.Subjects, w))
		}
	}
	for _, s := range sc.Subjects {
		if !slices.Contains(want, s) {
			bad = append(bad, fmt.Sprintf("it also holds %q (walcast must be its only writer, and %q carries no entries)", s, bus.PositionSubject(p.cfg.Prefix)))
		}
	}
	if sc.Replicas != c.Replicas {
		bad = append(bad, fmt.Sprintf("it has %d replicas, not %d", sc.Replicas, c.Replicas))
	}
	if sc.Duplicates < MinDuplicateWindow {
		bad = append(bad, fmt.Sprintf("its duplicate window is %s, under %s", sc.Duplicates, MinDuplicateWindow))
	}
	if sc.Storage != jetstream.FileStorage {
		bad = append(bad, "it is not on file storage")
	}
	if sc.MaxMsgSize > 0 && sc.MaxMsgSize < minPayload {
		bad = append(bad, fmt.Sprintf("its max message size is %d bytes, under the %d walcast needs for a change too large for it (--max-msg-size -1 lifts it)", sc.MaxMsgSize, minPayload))
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%w: stream %q: %s (fix: nats stream edit %s --subjects %q --replicas %d --dupe-window %s, or name another stream with --jetstream-stream and walcast creates it)",
			ErrStreamMismatch, c.Stream, strings.Join(bad, "; "), c.Stream, strings.Join(want, ","), c.Replicas, c.DuplicateWindow)
	}
	p.jsMaxMsg = int(sc.MaxMsgSize)
	return s, nil
}

// reconcile reads the stream's last message and returns the position to
// continue from (the journal seq it holds, or pos when the stream holds no
// entry of this journal's current history); the next publish expects the
// stream to end at that message's sequence.
func (p *Publisher) reconcile(ctx context.Context, pos int64) (int64, error) {
	info, err := p.stream.Info(ctx)
	if err != nil {
		return pos, fmt.Errorf("read JetStream stream %q: %w", p.cfg.JetStream.Stream, err)
	}
	// The stream refuses a message above its max message size; an
	// operator may have changed it since the last check.
	p.jsMaxMsg = max(int(info.Config.MaxMsgSize), 0)
	p.jsPos.stream = streamIdentity(info)
	p.jsProbe = false
	if info.State.Msgs == 0 {
		// No message to read (a new stream, or every message aged out or
		// purged): the first publish expects the stream's last sequence.
		p.jsLastSeq = info.State.LastSeq
		return p.resumeEmpty(ctx, info.State.LastSeq, pos)
	}
	m, err := p.stream.GetMsg(ctx, info.State.LastSeq)
	if err != nil {
		return pos, fmt.Errorf("read the last message of JetStream stream %q: %w", p.cfg.JetStream.Stream, err)
	}
	id := m.Header.Get(bus.HeaderMsgID)
	jid, epoch, seq, ok := parseMsgID(id)
	if !ok || jid != p.id {
		return pos, fmt.Errorf("%w: the last message of stream %q (sequence %d, subject %s, Nats-Msg-Id %q) was not published by this journal's walcast (fix: give each journal a stream of its own with --jetstream-stream)",
			ErrStreamMismatch, p.cfg.JetStream.Stream, m.Sequence, m.Subject, id)
	}
	p.jsLastSeq = m.Sequence
	lg, err := p.j.ReadAfter(ctx, max(seq-1, 0), 1)
	if err != nil {
		return pos, err
	}
	p.jsPos.epoch = lg.Epoch
	switch {
	case len(lg.Entries) > 0 && lg.Entries[0].Seq == seq && lg.Entries[0].Epoch == epoch:
		// The stream holds the journal's history up to seq.
		if seq != pos {
			p.log.Info("JetStream stream reconciled: continuing after its last entry", "stream", p.cfg.JetStream.Stream, "seq", seq, "journal_published", pos)
		}
		return seq, nil
	case seq >= lg.EpochSeq || (len(lg.Entries) > 0 && lg.Entries[0].Seq == seq):
		// Its last entry is of a history the journal no longer has (a
		// restore, a reset): the journal's current epoch goes after it.
		// Everything before the epoch's first entry is history both share,
		// and the stream holds it (its messages are chained).
		p.log.Warn("the JetStream stream ends with an entry of another journal epoch; publishing the current epoch after it",
			"stream", p.cfg.JetStream.Stream, "stream_last", id, "epoch_first_seq", lg.EpochSeq)
		return lg.EpochSeq - 1, nil
	default:
		// Its last entry was pruned from the journal: the stream is at
		// least as far as the journal's retention.
		return max(pos, seq), nil
	}
}

// jsPosition is where the published position stands in the stream; owned
// by Run.
type jsPosition struct {
	stream string // the stream's identity (streamIdentity) as of the last reconcile
	// last is the stream's last sequence with every entry up to the
	// published position stored and none after: the acknowledged
	// sequence of the last entry of the last acknowledged batch, or the
	// stream's last sequence at the reconcile.
	last  uint64
	epoch int64 // the journal's epoch at the reconcile
}

// streamIdentity names the stream a stream position was counted in: its
// name and creation time, so that a stream deleted and created again
// under the same name is another stream, whose sequence counts nothing
// of the old one's.
func streamIdentity(info *jetstream.StreamInfo) string {
	return info.Config.Name + "@" + info.Created.UTC().Format(time.RFC3339Nano)
}

// resumeEmpty is reconcile's part for a stream that holds no message and
// ends at sequence last: it returns the position to continue from.
//
// The journal's saved stream position (S, Q) says the stream held every
// entry up to S, and none after, at sequence Q; entries after S were then
// stored at Q+1, Q+2, … (each right after its predecessor, by walcast
// alone), so the stream stored last−Q of them, whether or not walcast
// recorded their acknowledgements before it stopped. Without a saved
// stream position for this stream (a new stream, a journal of an older
// walcast, one last saved with core NATS) the position is pos, the
// journal's published position.
func (p *Publisher) resumeEmpty(ctx context.Context, last uint64, pos int64) (int64, error) {
	name := p.cfg.JetStream.Stream
	saved, err := p.j.PublishedStream(ctx)
	if err != nil {
		return pos, err
	}
	lg, err := p.j.ReadAfter(ctx, saved.Seq, 1)
	if err != nil {
		return pos, err
	}
	p.jsPos.epoch = lg.Epoch
	if saved.Stream != p.jsPos.stream {
		if last > 0 {
			p.log.Info("the JetStream stream holds no message to reconcile with (purged, or every message aged out) and the journal saved no position in it; continuing after the journal's published position",
				"stream", name, "stream_last_sequence", last, "journal_published", pos)
			// The stream may have stored entries after pos, and still
			// have their ids in its duplicate window.
			p.jsProbe = true
		}
		return pos, nil
	}
	forget := fmt.Sprintf("UPDATE %s.published SET stream = ''", p.j.Schema())
	if last < saved.StreamSeq {
		return pos, fmt.Errorf("%w: stream %q holds no message and ends at sequence %d, before the sequence %d at which it held the journal's entries up to seq %d: it is not the stream walcast stored them in (restored from an older backup, or reset) (fix: to publish this journal after seq %d into it, run %q on the journal database; or name a new stream with --jetstream-stream)",
			ErrStreamMismatch, name, last, saved.StreamSeq, saved.Seq, saved.Seq, forget)
	}
	next := saved.Seq + int64(last-saved.StreamSeq)
	if saved.Epoch != lg.Epoch && next >= lg.EpochSeq {
		// The stream went on with entries of the history the journal had
		// then, and the journal's current epoch starts among them (a
		// restore, a reset): publish the epoch from its first entry.
		p.log.Warn("the JetStream stream holds no message and stored entries of another journal epoch; publishing the current epoch from its first entry",
			"stream", name, "stream_last_sequence", last, "epoch_first_seq", lg.EpochSeq)
		return lg.EpochSeq - 1, nil
	}
	if next > lg.Horizon {
		return pos, fmt.Errorf("%w: stream %q ends at sequence %d, %d messages after the sequence %d at which it held the journal's entries up to seq %d, but the journal ends at seq %d: something besides walcast moved its sequence on (another writer, or a purge to a sequence) (fix: make walcast the stream's only writer; to publish this journal after seq %d into it, run %q on the journal database; or name a new stream with --jetstream-stream)",
			ErrStreamMismatch, name, last, last-saved.StreamSeq, saved.StreamSeq, saved.Seq, lg.Horizon, saved.Seq, forget)
	}
	if last > 0 {
		p.log.Info("the JetStream stream holds no message to reconcile with (purged, or every message aged out); continuing after the entries it stored since the journal's saved stream position",
			"stream", name, "stream_last_sequence", last, "saved_seq", saved.Seq, "saved_stream_sequence", saved.StreamSeq, "seq", next)
	}
	return next, nil
}

// recordJS saves seq as the published position with the stream position
// it stands at (p.jsPos): the stream held every entry up to seq, and none
// after, at sequence p.jsPos.last. Every caller has that true: the stream
// acknowledged up to seq, and anything it stored after is in flight, of
// entries after seq.
func (p *Publisher) recordJS(ctx context.Context, seq int64) error {
	epoch := p.jsPos.epoch
	if p.epochKnown {
		epoch = p.epoch
	}
	return p.saveJS(ctx, seq, epoch)
}

// saveJS is recordJS with the journal epoch of the entries read.
func (p *Publisher) saveJS(ctx context.Context, seq, epoch int64) error {
	if err := p.j.SetPublishedStream(ctx, journal.StreamPosition{Seq: seq, Epoch: epoch, Stream: p.jsPos.stream, StreamSeq: p.jsPos.last}); err != nil {
		return err
	}
	p.recorded, p.savedPos = time.Now(), seq
	return nil
}

// parseMsgID splits <journal id hex>:<epoch hex>:<seq>.
func parseMsgID(id string) (journalID string, epoch, seq int64, ok bool) {
	parts := strings.Split(id, ":")
	if len(parts) != 3 || len(parts[1]) != 16 {
		return "", 0, 0, false
	}
	e, err1 := strconv.ParseUint(parts[1], 16, 63)
	s, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || s <= 0 {
		return "", 0, 0, false
	}
	return parts[0], int64(e), s, true
}

// jsBatch is a batch handed to the stream whose acknowledgements are
// awaited later (Publisher.inflight).
type jsBatch struct {
	futures []jetstream.PubAckFuture // futures[i] is entries[i]'s
	entries []journal.Entry
	start   time.Time // the batch's first publish
	probe   bool      // every message expects the same sequence (Publisher.jsProbe)
}

// errResume: the stream counted a prefix of what was in flight and
// refused the rest (awaitJS); the published position is at the end of
// the prefix, and the next publish expects the sequence the stream ends
// at. Run continues from there, without a reconcile.
var errResume = errors.New("JetStream: continue after the entries the stream counted")

// publishJS hands entries' messages (msgs[i] is entries[i]'s) to the
// stream, chained, then waits for every acknowledgement of the batch handed
// before them, and leaves this one in flight: the stream stores one batch
// while the publisher reads and sends the next, instead of idling for a
// round trip per batch. At most two batches are awaited at once, within
// the async pending bound (initJetStream), so a publish never stalls in
// nats.go.
//
// The published position advances only over acknowledged messages. On
// any failure it returns an error; the caller drops what is in flight
// (abandon) and reconciles with the stream before publishing again. The
// chain keeps that exact: a message of the later batch can be stored only
// right after its predecessor, and one the stream already holds is a
// duplicate of its Nats-Msg-Id.
//
// In probe mode (Publisher.jsProbe) every message of the batch expects
// the stream's last sequence, and the batch is awaited before it returns:
// the stream acknowledges the duplicates it leads with, stores the first
// entry it has not seen, and refuses the rest (awaitJS).
func (p *Publisher) publishJS(ctx context.Context, msgs []*nats.Msg, entries []journal.Entry) error {
	if p.jsProbe {
		// Nothing is in flight in probe mode (awaitJS); should a batch be,
		// its outcome sets the expectation.
		if err := p.settle(ctx); err != nil {
			return err
		}
	}
	b := &jsBatch{futures: make([]jetstream.PubAckFuture, len(msgs)), entries: entries, start: time.Now(), probe: p.jsProbe}
	for i, m := range msgs {
		// The expectation is set as a header here rather than with a
		// publish option, which would cost an option closure and a
		// pubOpts per message.
		m.Header[jetstream.ExpectedLastSeqHeader] = []string{strconv.FormatUint(p.jsLastSeq, 10)}
		f, err := p.js.PublishMsgAsync(m)
		if err != nil {
			return fmt.Errorf("publish seq %d to JetStream: %w", entries[i].Seq, err)
		}
		b.futures[i] = f
		if !b.probe {
			p.jsLastSeq++ // where this message is stored once it is
		}
	}
	prev := p.inflight
	p.inflight = b
	if b.probe {
		return p.settle(ctx)
	}
	if prev != nil {
		return p.awaitJS(ctx, prev)
	}
	return nil
}

// jsExpectRoom is the most bytes the expectation header publishJS adds to
// a message takes in its header block: the stream's last sequence (at most
// 20 digits).
func (p *Publisher) jsExpectRoom() int {
	return len(jetstream.ExpectedLastSeqHeader) + len(": ") + 20 + len("\r\n")
}

// settle waits for the acknowledgements of the batch in flight, if any.
// Whatever does not publish the next batch straight away settles first: a
// catch-up, an epoch change, a skip over pruned entries.
func (p *Publisher) settle(ctx context.Context) error {
	b := p.inflight
	if b == nil {
		return nil
	}
	p.inflight = nil
	return p.awaitJS(ctx, b)
}

// awaitJS waits for the acknowledgements of b, in order, and then moves
// the published position to its last seq.
//
// An acknowledgement flagged Duplicate at a sequence at or before the one
// the stream ended at (p.jsPos.last, moved on by each acknowledgement) is
// of an entry the stream stored before and no longer holds (purged, or
// aged out) while its id is still in the duplicate window: it counts as
// published, as the stream saw it, but the stream did not move. Every
// message sent after it expected the stream to have moved, so the stream
// refuses them (it stores a message only at its expectation): awaitJS
// records the position up to the duplicate at the sequence the stream
// ends at, waits for the refusals of the rest, and returns errResume; the
// next entries are probed (Publisher.jsProbe), as they are likely
// duplicates too. A probe batch (b.probe) ends the same way after the
// first entry the stream stores, and leaves probe mode.
func (p *Publisher) awaitJS(ctx context.Context, b *jsBatch) error {
	timer := time.NewTimer(p.cfg.JetStream.AckTimeout)
	defer timer.Stop()
	last := p.jsPos.last // the stream sequence the stream ends at with every message acknowledged so far
	for i, f := range b.futures {
		var ack *jetstream.PubAck
		select {
		case ack = <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("JetStream did not store seq %d: %w", b.entries[i].Seq, err)
		case <-timer.C:
			return fmt.Errorf("JetStream acknowledged none of seq %d and later within %s", b.entries[i].Seq, p.cfg.JetStream.AckTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
		// Acknowledgements come in order: each one covers its
		// predecessors (they are chained), so the stream holds, or held,
		// every entry up to this one.
		seen := ack.Duplicate && ack.Sequence <= last
		if !seen {
			last = ack.Sequence
		}
		p.jsm.acked.Store(b.entries[i].Seq)
		p.jsm.acknowledged(ctx, b.entries[i].CommitTime)
		if seen == b.probe {
			continue
		}
		// The chain after this entry expected another sequence.
		p.finishJS(ctx, b, i, last)
		p.jsLastSeq, p.jsProbe = last, !b.probe
		if p.jsProbe {
			p.log.Info("the JetStream stream had stored an entry it no longer holds (purged, or aged out) and still has its id in its duplicate window; counting it as published, and probing the next entries for more",
				"stream", p.cfg.JetStream.Stream, "seq", b.entries[i].Seq, "stream_last_sequence", last)
		}
		var rest []jetstream.PubAckFuture
		var seqs []int64
		for j := i + 1; j < len(b.futures); j++ {
			rest, seqs = append(rest, b.futures[j]), append(seqs, b.entries[j].Seq)
		}
		if n := p.inflight; n != nil && n != b {
			for j, f := range n.futures {
				rest, seqs = append(rest, f), append(seqs, n.entries[j].Seq)
			}
		}
		p.inflight = nil
		if len(rest) == 0 {
			return nil
		}
		if err := p.recordJS(ctx, b.entries[i].Seq); err != nil {
			return err
		}
		if err := p.drainJS(ctx, timer, rest, seqs, last); err != nil {
			return err
		}
		return errResume
	}
	p.finishJS(ctx, b, len(b.futures)-1, last)
	return nil
}

// finishJS moves the published position to b's entry i, acknowledged
// with the stream ending at sequence last.
func (p *Publisher) finishJS(ctx context.Context, b *jsBatch, i int, last uint64) {
	took := time.Since(b.start)
	p.ackLatency.Store(int64(took))
	if h := p.jsm.ackLatency; h != nil {
		h.Record(ctx, took.Seconds())
	}
	p.published.Store(b.entries[i].Seq)
	p.jsPos.last = last
}

// drainJS waits for the outcome of futures (of the entries seqs), sent
// expecting the stream to end past last, where it ends: each must be
// refused, or be a duplicate of a message stored before. Anything else
// (one stored, or no answer) is an error, after which the caller
// reconciles.
func (p *Publisher) drainJS(ctx context.Context, timer *time.Timer, futures []jetstream.PubAckFuture, seqs []int64, last uint64) error {
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			if !ack.Duplicate || ack.Sequence > last {
				return fmt.Errorf("JetStream stored seq %d at sequence %d, after its predecessor was not stored at %d", seqs[i], ack.Sequence, last)
			}
		case err := <-f.Err():
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) || (apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence && apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
				return fmt.Errorf("JetStream did not store seq %d: %w", seqs[i], err)
			}
		case <-timer.C:
			return fmt.Errorf("JetStream answered none of seq %d and later within %s", seqs[i], p.cfg.JetStream.AckTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// prepareJS finds or creates the stream and, after a start or a failure,
// reconciles with it; it returns the position to publish after.
func (p *Publisher) prepareJS(ctx context.Context, pos int64) (int64, error) {
	if p.stream == nil {
		s, err := p.ensureStream(ctx)
		if err != nil {
			return pos, err
		}
		p.stream = s
	}
	if !p.jsReconcile {
		return pos, nil
	}
	p.jsm.reconciles.Add(1)
	next, err := p.reconcile(ctx, pos)
	if err != nil {
		// The stream is out of reach: keep the horizon current so the lag
		// metric grows through the outage instead of freezing.
		if lg, rerr := p.j.ReadAfter(ctx, pos, 1); rerr == nil {
			p.horizon.Store(lg.Horizon)
		}
		return pos, err
	}
	p.jsPos.last = p.jsLastSeq
	p.jsm.acked.Store(next)
	p.published.Store(next)
	// Save where the stream stands now, so that a stream emptied later
	// counts from here (resumeEmpty), whatever was saved before: a journal
	// of an older walcast, another stream, core NATS. The position is of
	// the journal's epoch as the reconcile read it.
	if err := p.saveJS(ctx, next, p.jsPos.epoch); err != nil {
		return pos, err
	}
	p.jsReconcile = false
	return next, nil
}

// initJetStream sets up JetStream mode once, when configured.
func (p *Publisher) initJetStream() error {
	if p.cfg.JetStream == nil || p.js != nil {
		return nil
	}
	if p.cfg.JetStream.Stream == "" {
		return errors.New("publish: JetStream mode needs a stream name (--jetstream-stream)")
	}
	p.cfg.JetStream.setDefaults()
	if p.cfg.JetStream.DuplicateWindow < MinDuplicateWindow {
		return fmt.Errorf("publish: a JetStream duplicate window of %s is under %s (fix: --jetstream-duplicate-window 2m)", p.cfg.JetStream.DuplicateWindow, MinDuplicateWindow)
	}
	// Two batches are in flight at most (publishJS), so no publish waits
	// for room. Publishes whose acknowledgement is lost while the
	// connection stays up would stay pending in nats.go until a
	// reconnect; Run drops them after any failure (abandon), before
	// reconciling.
	js, err := jetstream.New(p.nc, jetstream.WithPublishAsyncMaxPending(2*p.cfg.BatchSize))
	if err != nil {
		return fmt.Errorf("publish: JetStream: %w", err)
	}
	p.js, p.jsReconcile = js, true
	return nil
}

// CheckJetStream creates or checks the configured stream now, so that
// `walcast run` refuses to start on a stream it cannot use (ErrStreamMismatch,
// with the fix) instead of failing once it becomes active. Without
// JetStream mode it does nothing.
func (p *Publisher) CheckJetStream(ctx context.Context) error {
	if err := p.initJetStream(); err != nil || p.js == nil {
		return err
	}
	s, err := p.ensureStream(ctx)
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	p.stream = s
	return nil
}

// AckLatency is how long the stream took to acknowledge the last batch
// (JetStream mode; 0 before the first).
func (p *Publisher) AckLatency() time.Duration { return time.Duration(p.ackLatency.Load()) }

// jsMetrics are JetStream mode's measurements (registerJetStreamMetrics).
type jsMetrics struct {
	acked      atomic.Int64  // the last journal seq the stream acknowledged (or holds, after a reconcile)
	reconciles atomic.Uint64 // reconciliations with the stream's last message (at start and after each failure)
	// Histograms, nil until registered.
	ackLatency  metric.Float64Histogram
	commitToAck metric.Float64Histogram
}

// acknowledged records an entry's source commit age at its acknowledgement.
func (m *jsMetrics) acknowledged(ctx context.Context, commit time.Time) {
	if m.commitToAck != nil && !commit.IsZero() {
		m.commitToAck.Record(ctx, max(time.Since(commit), 0).Seconds())
	}
}

// latencyBuckets span a loopback acknowledgement (sub-millisecond) to a
// failover (seconds), in seconds.
var latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// registerJetStreamMetrics exports JetStream mode's measurements; without
// JetStream mode it registers nothing:
//
//   - walcast.jetstream.acked: the last journal seq the stream acknowledged;
//   - walcast.jetstream.lag: journal horizon minus that seq (entries the
//     stream does not hold yet; it grows through a NATS outage);
//   - walcast.jetstream.ack.latency: seconds from a batch's first publish
//     to its last acknowledgement;
//   - walcast.jetstream.commit_to_ack: seconds from each entry's source
//     commit to its acknowledgement by the stream (replication, journal and
//     publishing together; large while catching up a backlog);
//   - walcast.jetstream.reconciles: reconciliations with the stream (one at
//     start, one after each failed batch or lost connection).
func (p *Publisher) registerJetStreamMetrics(meter metric.Meter) error {
	if p.cfg.JetStream == nil {
		return nil
	}
	var err error
	if p.jsm.ackLatency, err = meter.Float64Histogram("walcast.jetstream.ack.latency", metric.WithUnit("s"),
		metric.WithDescription("seconds from a batch's first JetStream publish to its last acknowledgement"),
		metric.WithExplicitBucketBoundaries(latencyBuckets...)); err != nil {
		return err
	}
	if p.jsm.commitToAck, err = meter.Float64Histogram("walcast.jetstream.commit_to_ack", metric.WithUnit("s"),
		metric.WithDescription("seconds from an entry's source commit to its acknowledgement by the JetStream stream"),
		metric.WithExplicitBucketBoundaries(latencyBuckets...)); err != nil {
		return err
	}
	acked, err := meter.Int64ObservableGauge("walcast.jetstream.acked",
		metric.WithDescription("the last journal seq the JetStream stream acknowledged"))
	if err != nil {
		return err
	}
	lag, err := meter.Int64ObservableGauge("walcast.jetstream.lag", metric.WithUnit("{entry}"),
		metric.WithDescription("journal entries the JetStream stream has not acknowledged (journal horizon minus the last acknowledged seq)"))
	if err != nil {
		return err
	}
	reconciles, err := meter.Int64ObservableCounter("walcast.jetstream.reconciles",
		metric.WithDescription("reconciliations with the JetStream stream's last message (at start and after each failure)"))
	if err != nil {
		return err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		a := p.jsm.acked.Load()
		o.ObserveInt64(acked, a)
		o.ObserveInt64(lag, max(p.horizon.Load()-a, 0))
		o.ObserveInt64(reconciles, int64(p.jsm.reconciles.Load()))
		return nil
	}, acked, lag, reconciles)
	return err
}
