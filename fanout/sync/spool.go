package sync

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/walcast/walcast/decoder"
)

// A spool holds one read of a table's rows (one source transaction: S, L
// and the rows visible in S), so the transaction can end as soon as the
// rows are read, at the database's pace, and every snapshot that uses the
// read sends them on at its own client's pace. Records are a 4-byte
// big-endian length and a row envelope (decoder.RowEncoder's JSON). The
// first spoolMemBytes stay in memory; the rest goes to an unlinked file
// under StateConfig.SpoolDir. Records are appended by the spool's one
// reader of the source (fill) and read by any number of snapshots at once,
// each with its own spoolCursor, while the fill is still appending.

// spoolMemBytes is what a spool keeps in memory before it moves to a file:
// a small table never touches the disk, a large one costs this much memory
// and a file.
const spoolMemBytes = 256 << 10

// spoolFileChunk is how much a spool writes to, and a cursor reads from,
// its file at once.
const spoolFileChunk = 64 << 10

// spoolShareWindow is how long a complete spool is reused by snapshots of
// the same scope that start after its read ended. Any age is correct (the
// catch-up from its H0 delivers every change the rows lack); the window
// bounds how long those catch-ups get.
const spoolShareWindow = 2 * time.Second

// spoolKey is what makes two snapshots' rows the same: the table, the
// tenant scope, the journal epoch and the table's catalog version. Column
// lists, row filters and the tenant column are per table and versioned in
// the catalog, so a spool filled under one version never serves a
// snapshot asked for under the next (one that may refuse the table).
type spoolKey struct {
	entity  string
	tenant  string
	epoch   int64
	catalog int64
}

// spoolHead is what the fill learned in the source transaction before the
// rows: every snapshot of the spool begins and catches up from it.
type spoolHead struct {
	entity   string
	estimate int64
	h0       int64 // the journal horizon, read before S
	epoch    int64
	snap     pgSnapshot
	walAt    decoder.LSN
}

// spool is one read of a table's rows. Fields set before ready is closed
// (head, and err when the read failed before the rows) are read-only
// after it.
type spool struct {
	st     *stateSource
	key    spoolKey
	cancel context.CancelFunc // ends the fill; called when the last reader leaves
	ready  chan struct{}      // closed once head is set or the read failed
	head   spoolHead

	mu      sync.Mutex // guards the following fields
	mem     []byte     // the first records, at most spoolMemBytes
	file    *os.File   // the records after mem; nil while they fit in memory
	pending []byte     // records not yet written to file
	flushed int64      // bytes of file readers may read
	rows    int64
	done    bool // the fill ended: err, or every row is in the spool
	err     error
	doneAt  time.Time
	readers int
	freed   bool
	bytes   int64         // counted in spoolStats.spooled
	grew    chan struct{} // closed when records are added or the fill ends; nil while nobody waits
}

// errSpoolFull refuses a snapshot that would take the node's spool past
// StateConfig.SpoolBytes.
func errSpoolFull(entity string, limit int64) error {
	return refused("the rows of %s do not fit in the node's snapshot spool (--snapshot-spool-bytes, %d bytes, shared by every snapshot being read); retry later, or the operator can raise --snapshot-spool-bytes", entity, limit)
}

// add appends one row envelope, moving to a file once the memory part is
// full. Called by the fill only.
func (sp *spool) add(body []byte) error {
	st := sp.st
	n := int64(len(body) + 4)
	if used := st.spooled.Add(n); used > st.cfg.SpoolBytes {
		st.spooled.Add(-n)
		return errSpoolFull(sp.key.entity, st.cfg.SpoolBytes)
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(body)))
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.freed {
		st.spooled.Add(-n)
		return context.Canceled // every reader left
	}
	sp.bytes += n
	sp.rows++
	if sp.file == nil && len(sp.mem)+int(n) <= spoolMemBytes {
		sp.mem = append(append(sp.mem, hdr[:]...), body...)
		st.memory.Add(n)
		sp.wakeLocked()
		return nil
	}
	if sp.file == nil {
		f, err := os.CreateTemp(st.cfg.SpoolDir, "walcast-snapshot-*")
		if err != nil {
			return fmt.Errorf("snapshot spool: %w (fix: --snapshot-spool-dir must be a writable directory with room for the snapshots being read)", err)
		}
		// Unlinked at once where the system allows it: nothing is left
		// behind by a crash. Elsewhere it is removed when freed.
		if os.Remove(f.Name()) != nil {
			st.keepNames.Store(true)
		}
		sp.file = f
	}
	sp.pending = append(append(sp.pending, hdr[:]...), body...)
	if len(sp.pending) >= spoolFileChunk {
		return sp.flushLocked()
	}
	return nil
}

// flushLocked writes the pending records to the file. sp.mu is held (a
// write to a local file does not wait for anyone).
func (sp *spool) flushLocked() error {
	if len(sp.pending) == 0 {
		return nil
	}
	if _, err := sp.file.WriteAt(sp.pending, sp.flushed); err != nil {
		return fmt.Errorf("snapshot spool: %w (fix: --snapshot-spool-dir must have room for the snapshots being read)", err)
	}
	sp.flushed += int64(len(sp.pending))
	sp.pending = sp.pending[:0]
	sp.wakeLocked()
	return nil
}

// finish ends the fill with err (nil: every row is in the spool).
func (sp *spool) finish(err error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.freed || sp.done {
		return
	}
	if err == nil && sp.file != nil {
		err = sp.flushLocked()
	}
	sp.pending = nil
	sp.done, sp.err, sp.doneAt = true, err, time.Now()
	sp.wakeLocked()
}

func (sp *spool) wakeLocked() {
	if sp.grew != nil {
		close(sp.grew)
		sp.grew = nil
	}
}

// shareable reports whether a snapshot starting now may use sp.
func (sp *spool) shareable(now time.Time) bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.freed {
		return false
	}
	if !sp.done {
		return true
	}
	return sp.err == nil && now.Sub(sp.doneAt) < spoolShareWindow
}

// free releases what sp holds (memory, file, spool bytes). sp.mu is held;
// no reader is left.
func (sp *spool) freeLocked() {
	if sp.freed {
		return
	}
	sp.freed = true
	st := sp.st
	st.memory.Add(-int64(len(sp.mem)))
	st.spooled.Add(-sp.bytes)
	sp.mem, sp.pending = nil, nil
	if sp.file != nil {
		name := sp.file.Name()
		_ = sp.file.Close()
		if st.keepNames.Load() {
			_ = os.Remove(name)
		}
		sp.file = nil
	}
}

// spoolCursor reads a spool's records in order for one snapshot.
type spoolCursor struct {
	sp     *spool
	off    int64  // next record's offset, across mem and file
	buf    []byte // file bytes read ahead, starting at bufOff
	bufOff int64
}

// next returns the next row envelope, waiting while the fill is behind;
// io.EOF after the last. The slice is valid until the next call.
func (c *spoolCursor) next(ctx context.Context) ([]byte, error) {
	sp := c.sp
	for {
		sp.mu.Lock()
		if sp.freed {
			sp.mu.Unlock()
			return nil, errors.New("snapshot spool freed while being read")
		}
		mem, file, flushed, done, err := sp.mem, sp.file, sp.flushed, sp.done, sp.err
		memLen := int64(len(mem))
		var wait chan struct{}
		if c.off >= memLen+flushed && !done {
			if sp.grew == nil {
				sp.grew = make(chan struct{})
			}
			wait = sp.grew
		}
		sp.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if wait != nil {
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if c.off < memLen {
			// Records never straddle mem and file.
			n := int64(binary.BigEndian.Uint32(mem[c.off:]))
			b := mem[c.off+4 : c.off+4+n]
			c.off += 4 + n
			return b, nil
		}
		if c.off >= memLen+flushed {
			return nil, io.EOF // done, and every record read
		}
		// The file holds whole records up to flushed.
		fo := c.off - memLen
		hdr, err := c.readFile(file, fo, 4, flushed)
		if err != nil {
			return nil, err
		}
		n := int64(binary.BigEndian.Uint32(hdr))
		b, err := c.readFile(file, fo+4, n, flushed)
		if err != nil {
			return nil, err
		}
		c.off += 4 + n
		return b, nil
	}
}

// readFile returns n bytes of file at off, reading ahead in chunks up to
// limit.
func (c *spoolCursor) readFile(file *os.File, off, n, limit int64) ([]byte, error) {
	if off >= c.bufOff && off+n <= c.bufOff+int64(len(c.buf)) {
		return c.buf[off-c.bufOff : off-c.bufOff+n], nil
	}
	size := min(max(n, spoolFileChunk), limit-off)
	if int64(cap(c.buf)) < size {
		c.buf = make([]byte, size)
	}
	c.buf = c.buf[:size]
	if _, err := file.ReadAt(c.buf, off); err != nil {
		return nil, fmt.Errorf("snapshot spool: %w", err)
	}
	c.bufOff = off
	return c.buf[:n], nil
}

// spools is the node's registry of spools that new snapshots may share.
type spools struct {
	mu sync.Mutex // guards the following field
	by map[spoolKey]*spool
}

// attach returns a spool of key for a new snapshot, joining one being
// read or read moments ago, else starting a read with start (called with
// no lock held). The caller must detach it.
func (st *stateSource) attach(key spoolKey, start func(context.Context, *spool)) *spool {
	now := time.Now()
	st.spools.mu.Lock()
	if st.spools.by == nil {
		st.spools.by = map[spoolKey]*spool{}
	}
	if sp := st.spools.by[key]; sp != nil && sp.shareable(now) {
		sp.mu.Lock()
		sp.readers++
		sp.mu.Unlock()
		st.spools.mu.Unlock()
		st.shared.Add(1)
		return sp
	}
	ctx, cancel := context.WithCancel(st.ctx)
	sp := &spool{st: st, key: key, ready: make(chan struct{}), readers: 1, cancel: cancel}
	st.spools.by[key] = sp
	st.spools.mu.Unlock()
	st.reads.Add(1)
	start(ctx, sp)
	return sp
}

// detach is a snapshot done with sp: the last reader frees it (and ends
// its fill), unless it is complete and still shareable, when the registry
// frees it once the share window has passed.
func (st *stateSource) detach(sp *spool) {
	st.spools.mu.Lock()
	defer st.spools.mu.Unlock()
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.readers--
	if sp.readers > 0 {
		return
	}
	if sp.done && sp.err == nil && time.Since(sp.doneAt) < spoolShareWindow && st.spools.by[sp.key] == sp {
		return // kept for a moment; sweepSpools frees it
	}
	if st.spools.by[sp.key] == sp {
		delete(st.spools.by, sp.key)
	}
	sp.cancel()
	sp.freeLocked()
}

// sweepSpools frees the complete spools nobody reads whose share window
// has passed.
func (st *stateSource) sweepSpools(now time.Time) {
	st.spools.mu.Lock()
	defer st.spools.mu.Unlock()
	for k, sp := range st.spools.by {
		sp.mu.Lock()
		if sp.done && (sp.err != nil || now.Sub(sp.doneAt) >= spoolShareWindow) {
			delete(st.spools.by, k)
			if sp.readers == 0 {
				sp.cancel()
				sp.freeLocked()
			}
		}
		sp.mu.Unlock()
	}
}

// spoolStats are the spool counters exposed in Stats.
type spoolStats struct {
	reads   atomic.Int64 // source reads (spools filled)
	shared  atomic.Int64 // snapshots that used a spool another one started
	spooled atomic.Int64 // bytes in spools, memory and files
	memory  atomic.Int64 // bytes of spools in memory
	// keepNames: spool files could not be unlinked while open (not a
	// Unix system), so each is removed by name when freed.
	keepNames atomic.Bool
}
