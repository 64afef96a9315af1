package journal

import (
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/walcast/walcast/decoder"
)

// recentLog keeps the entries of this process's newest appends in memory,
// so that ReadAfter — the publisher beside the replicator, woken by the
// append's own commit (wakeLocal) — gets what was just committed without a
// journal round trip. Under a steady load that round trip, on a database
// the source's writers keep busy, is most of the time from journal commit
// to NATS, and one more query on the database for every batch.
//
// What it holds is exactly what a read of the journal returns: entries are
// added only after their append committed, built from the same values the
// COPY wrote (envelope bytes, positions, tenant, commit time at the
// journal's microsecond precision), as one contiguous run of seqs that ends
// at the horizon this process's last append left. It forgets everything
// when an append fails (the outcome may be ambiguous), when another
// appender may have written (Acquire, a cache reload), when an append
// starts a new epoch, and when a read of the journal shows the journal
// behind it or in another epoch (a restore under a running process). A
// read whose first entry it does not hold — older entries, or anything past
// this process's own appends — goes to the journal as before.
//
// It is bounded by recentMaxBytes of memory — the envelopes' arenas, the
// entries themselves and their tenants — and recentMaxEntries entries,
// dropping its oldest append first; an append larger than that is not kept
// at all (a catch-up reader far behind reads the journal anyway).
type recentLog struct {
	mu       sync.Mutex // guards the following fields
	version  uint64     // incremented by every change (observe compares it)
	epoch    int64      // the epoch of every kept entry
	epochSeq int64      // the epoch's first seq
	floor    int64      // the retained floor at the last read of the journal; 0: none yet
	next     int64      // the seq after the newest kept entry; 0: nothing kept
	chunks   []recentChunk
	bytes    int // memory the kept chunks hold (recentChunk.bytes)
	entries  int // entries kept

	hits   atomic.Uint64 // reads answered from memory (for tests)
	reader atomic.Int64  // the first seq the newest ReadAfter asked for; 0: none yet
}

// recentChunk is the kept part of one append: consecutive seqs.
type recentChunk struct {
	entries []Entry
	bytes   int // the memory it holds (recentBatch.held)
}

// Bounds of the recent log: about two of a catch-up's journal batches
// (so a publisher a batch behind the writer reads from memory: 0.60-0.62 of
// pg_recvlogical published in BenchmarkE2ECatchUp at 4 MiB, 0.70-0.71 at 8,
// 0.76 at 32), and otherwise a small part of the memory budget.
const (
	recentMaxBytes   = 8 << 20
	recentMaxEntries = 32768
)

// recentBatch gathers the entries of one append while it encodes
// (copySource.row). Envelopes are copied into arenas, each filled and then
// left: an envelope never moves once copied, so nothing grows by copying
// (growing one slice per batch had been 9% of walcast's CPU in a
// catch-up). Arenas double from recentArenaMin to recentArenaBytes (or one
// envelope's size), so a small append holds little more than its
// envelopes and a large one few arenas. held counts everything the batch
// keeps alive — arenas whole, entries at their capacity, tenants — so the
// log's bound is memory, not envelope bytes: many small appends, each
// holding an arena far larger than its envelopes, cannot hold many times
// the bound.
type recentBatch struct {
	entries []Entry
	arena   []byte
	held    int
	over    bool // the append is larger than the log keeps
}

// Arena sizes of a recentBatch: from small against a small append to small
// against the log's bound and large against an envelope.
const (
	recentArenaMin   = 4 << 10
	recentArenaBytes = 256 << 10
)

// recentEntryBytes is the memory of one Entry besides its envelope and tenant.
const recentEntryBytes = int(unsafe.Sizeof(Entry{}))

// newRecentBatch returns a batch for an append of n changes; nil when even
// their entries would exceed the log's bounds.
func newRecentBatch(n int) *recentBatch {
	if n > recentMaxEntries || n*recentEntryBytes > recentMaxBytes {
		return nil
	}
	return &recentBatch{entries: make([]Entry, 0, n), held: n * recentEntryBytes}
}

func (b *recentBatch) add(e Entry, env []byte) {
	if b.over {
		return
	}
	if len(b.entries) >= recentMaxEntries {
		b.drop()
		return
	}
	if cap(b.arena)-len(b.arena) < len(env) {
		size := max(min(2*cap(b.arena), recentArenaBytes), recentArenaMin, len(env))
		if b.held+size > recentMaxBytes {
			b.drop()
			return
		}
		b.arena = make([]byte, 0, size)
		b.held += size
	}
	if b.held+len(e.Tenant) > recentMaxBytes {
		b.drop()
		return
	}
	b.held += len(e.Tenant)
	off := len(b.arena)
	b.arena = append(b.arena, env...)
	e.Envelope = b.arena[off:len(b.arena):len(b.arena)]
	c := cap(b.entries)
	b.entries = append(b.entries, e) // grows only past the changes (a tenant move is two entries)
	b.held += (cap(b.entries) - c) * recentEntryBytes
	if b.held > recentMaxBytes {
		b.drop()
	}
}

// drop gives up the append: it is larger than the log keeps.
func (b *recentBatch) drop() {
	b.over, b.entries, b.arena, b.held = true, nil, nil, 0
}

// done returns the entries (nil when over) and the memory they hold.
func (b *recentBatch) done() ([]Entry, int) {
	if b.over {
		return nil, 0
	}
	return b.entries, b.held
}

// rowEntry is the Entry a journal read returns for a row the COPY writes.
func rowEntry(c *decoder.Change, t *decoder.Transaction, seq, entitySeq int64, op decoder.Op, tenant []byte, hasTenant, unknown bool) Entry {
	e := Entry{Seq: seq, Entity: c.Entity, EntitySeq: entitySeq, HasTenant: hasTenant, TenantUnknown: unknown, Op: op,
		LSN: c.LSN, CommitLSN: t.EndLSN, CommitTime: time.UnixMicro(t.CommitTime.UnixMicro())}
	if hasTenant {
		e.Tenant = string(tenant)
	}
	return e
}

// reset forgets every entry.
func (r *recentLog) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resetLocked()
}

func (r *recentLog) resetLocked() {
	r.version++
	r.chunks, r.bytes, r.entries, r.next = nil, 0, 0, 0
}

// add records a committed append of seqs first..next-1 in epoch (which
// starts at epochSeq); entries is what it kept of them, nil when the
// append was too large, and held the memory they hold (recentBatch.done).
func (r *recentLog) add(first, next int64, entries []Entry, held int, epoch, epochSeq int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next != first || r.epoch != epoch || r.epochSeq != epochSeq {
		r.resetLocked()
	}
	r.version++
	r.epoch, r.epochSeq = epoch, epochSeq
	if len(entries) == 0 || entries[0].Seq != first || entries[len(entries)-1].Seq != next-1 {
		// Not kept: what is kept no longer ends at the horizon.
		r.chunks, r.bytes, r.entries, r.next = nil, 0, 0, 0
		return
	}
	for i := range entries {
		entries[i].Epoch = epoch
	}
	c := recentChunk{entries: entries, bytes: held}
	r.chunks = append(r.chunks, c)
	r.bytes += c.bytes
	r.entries += len(entries)
	r.next = next
	for len(r.chunks) > 1 && (r.bytes > recentMaxBytes || r.entries > recentMaxEntries) {
		r.bytes -= r.chunks[0].bytes
		r.entries -= len(r.chunks[0].entries)
		r.chunks[0] = recentChunk{}
		r.chunks = r.chunks[1:]
	}
}

// wanted reports whether an append from seq first on is worth keeping: a
// reader has asked for entries recently enough to be within the log's
// reach of them. A publisher far behind (a catch-up) reads the journal
// anyway, and copying every append for nothing would tax the catch-up; one
// that draws near reads an append or two from the journal, then keeps up
// from memory.
func (r *recentLog) wanted(first int64) bool {
	at := r.reader.Load()
	return at > 0 && first-at <= recentMaxEntries
}

// read answers ReadAfterBytes from memory when it holds the entry after
// after: the entries from there, bounded as the journal's read bounds them
// (limit entries; stop before the entry whose predecessors reach maxBytes,
// the first always included). The entries share their envelopes with other
// readers.
func (r *recentLog) read(after int64, limit, maxBytes int) (Log, bool) {
	r.reader.Store(after + 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.floor == 0 || r.next == 0 || len(r.chunks) == 0 || after+1 < r.chunks[0].entries[0].Seq || after+1 >= r.next {
		return Log{}, false
	}
	out := Log{Floor: r.floor, Horizon: r.next - 1, Epoch: r.epoch, EpochSeq: r.epochSeq}
	bytes := 0
	for _, c := range r.chunks {
		last := c.entries[len(c.entries)-1].Seq
		if last <= after {
			continue
		}
		from := int(after + 1 - c.entries[0].Seq)
		for i := max(from, 0); i < len(c.entries); i++ {
			// bytes is what the entries before this one hold: the first
			// entry always goes (maxBytes is positive).
			if len(out.Entries) == limit || bytes >= maxBytes {
				r.hits.Add(1)
				return out, true
			}
			out.Entries = append(out.Entries, c.entries[i])
			bytes += len(c.entries[i].Envelope)
		}
	}
	r.hits.Add(1)
	return out, true
}

// state returns the version, for observe.
func (r *recentLog) state() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version
}

// observe learns from a read of the journal that started at version: the
// floor, and — when no append changed the log meanwhile, so the read's
// snapshot is not older than what the log holds — whether the journal is
// behind the log or in another epoch (restored under this process), in
// which case the log forgets everything.
func (r *recentLog) observe(version uint64, l Log) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.floor = max(r.floor, l.Floor)
	if r.version == version && r.next != 0 && (l.Epoch != r.epoch || l.Horizon < r.next-1) {
		r.resetLocked()
	}
}
