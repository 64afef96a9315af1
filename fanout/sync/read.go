package sync

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// sharedReads makes concurrent journal reads of the same range share one
// query (DESIGN §6, storms): every member catching up from the same position
// in the same scope waits on one read and gets the same encoded frames.
type sharedReads struct {
	n *Node

	mu       sync.Mutex // guards the following field
	inflight map[readKey]*readCall

	queries  atomic.Int64                          // journal reads made
	canceled atomic.Int64                          // reads canceled because every waiter left
	testHook atomic.Pointer[func(context.Context)] // tests: runs before each journal read, with its context
}

type readKey struct {
	entity, tenant string
	epoch, from    int64
	raw            bool
}

type readCall struct {
	waiters int                // guarded by sharedReads.mu
	cancel  context.CancelFunc // ends the read once no waiter is left
	done    chan struct{}
	page    readPage
	err     error
}

// readPage is one read of the journal, encoded for the scope.
type readPage struct {
	frames []*frame // change frames in seq order
	seqs   []int64
	// ends[i]: frames[i] is the last change of its transaction in the
	// scope (it carries the cursor and "end":true).
	ends []bool
	// truncate[i]: frames[i] is a TRUNCATE, after which the member
	// re-reads the entity as on the live path (resyncLocked); nil when
	// the page has none.
	truncate []bool
	// entries are the page's entries themselves instead of frames, for
	// members of a view (readView), which judge and encode them each.
	entries []journal.Entry
	end     int64 // position the read covered
	more    bool
	// resync is set when the position needs a resync: the frame to send and
	// the position (the horizon) to continue from.
	resync      *frame
	resyncPos   int64
	resyncEpoch int64
}

// read returns the page after from in q's scope, joining a read already in
// flight for the same place (whose q.AtLeast may be lower than this
// caller's: the caller then reads again from where that page ended). The read runs on its own context under the
// node's, so one socket leaving does not fail the others, and it is
// canceled when the last socket waiting for it leaves (a client that
// disconnects costs no further journal time).
func (r *sharedReads) read(ctx context.Context, q journal.Query, epoch, from int64) (readPage, error) {
	return r.readAs(ctx, q, epoch, from, false)
}

// readView is read for members of a view: the page holds the entries, and
// the resync frame's cursor (if any) is for q, the view's scope.
func (r *sharedReads) readView(ctx context.Context, q journal.Query, epoch, from int64) (readPage, error) {
	view := q.View
	q.View = "" // the journal reads the scope; views share the read
	p, err := r.readAs(ctx, q, epoch, from, true)
	if err == nil && p.resync != nil {
		q.View = view
		cur, err := r.n.j.CursorAt(q, p.resyncEpoch, p.resyncPos)
		if err != nil {
			return readPage{}, err
		}
		p.resync = controlFrame("resync", q.Entities[0], cur)
	}
	return p, err
}

func (r *sharedReads) readAs(ctx context.Context, q journal.Query, epoch, from int64, raw bool) (readPage, error) {
	key := readKey{entity: q.Entities[0], tenant: q.Tenant, epoch: epoch, from: from, raw: raw}
	r.mu.Lock()
	if r.inflight == nil {
		r.inflight = map[readKey]*readCall{}
	}
	c := r.inflight[key]
	if c == nil {
		rctx, cancel := context.WithCancel(r.n.ctx)
		c = &readCall{done: make(chan struct{}), cancel: cancel}
		r.inflight[key] = c
		r.n.wg.Add(1)
		go func() {
			defer r.n.wg.Done()
			c.page, c.err = r.do(rctx, q, epoch, from, raw)
			r.mu.Lock()
			if r.inflight[key] == c {
				delete(r.inflight, key)
			}
			r.mu.Unlock()
			cancel()
			close(c.done)
		}()
	}
	c.waiters++
	r.mu.Unlock()
	select {
	case <-c.done:
		return c.page, c.err
	case <-ctx.Done():
		r.mu.Lock()
		c.waiters--
		if c.waiters == 0 {
			// Nobody waits any more: stop the query, and let a later
			// reader of the same place start afresh.
			if r.inflight[key] == c {
				delete(r.inflight, key)
			}
			c.cancel()
			r.canceled.Add(1)
		}
		r.mu.Unlock()
		return readPage{}, ctx.Err()
	}
}

// do reads one page: at most catchUpPageBytes of envelopes (and
// journal.DefaultLimit changes), so a page held outside the socket's queue
// is bounded in bytes.
func (r *sharedReads) do(ctx context.Context, q journal.Query, epoch, from int64, raw bool) (readPage, error) {
	j := r.n.j
	if h := r.testHook.Load(); h != nil {
		(*h)(ctx)
	}
	q.MaxBytes = r.n.catchUpPageBytes()
	r.queries.Add(1)
	var err error
	if q.Cursor, err = j.CursorAt(q, epoch, from); err != nil {
		return readPage{}, err
	}
	res, err := j.Changes(ctx, q)
	r.n.noteReplica()
	if err != nil {
		return readPage{}, err
	}
	if res.ResyncRequired {
		pos, err := j.CursorPosition(res.ResyncCursor)
		if err != nil {
			return readPage{}, err
		}
		return readPage{resync: controlFrame("resync", q.Entities[0], res.ResyncCursor), resyncPos: pos, resyncEpoch: res.Epoch, end: from}, nil
	}
	if raw {
		p := readPage{more: res.More, entries: res.Changes}
		if p.end, err = j.CursorPosition(res.Cursor); err != nil {
			return readPage{}, err
		}
		return p, nil
	}
	p := readPage{more: res.More, frames: make([]*frame, len(res.Changes)), seqs: make([]int64, len(res.Changes)), ends: make([]bool, len(res.Changes))}
	for i, e := range res.Changes {
		cur := ""
		if e.TxnEnd {
			if cur, err = j.CursorAt(q, res.Epoch, e.Seq); err != nil {
				return readPage{}, err
			}
		}
		p.frames[i] = changeFrame(q.Entities[0], cur, e.Envelope, e.TxnEnd)
		p.seqs[i] = e.Seq
		p.ends[i] = e.TxnEnd
		if e.Op == decoder.OpTruncate {
			if p.truncate == nil {
				p.truncate = make([]bool, len(res.Changes))
			}
			p.truncate[i] = true
		}
	}
	if p.end, err = j.CursorPosition(res.Cursor); err != nil {
		return readPage{}, err
	}
	return p, nil
}
