package sync

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/filter"
	"github.com/walcast/walcast/journal"
)

// A view is a filtered subscription's part of its topic: a row filter and a
// column list (fanout/filter), checked against the table's catalog entry
// when the client subscribes (docs/sync.md "Filtered subscriptions"). It is
// immutable and shared by every change it judges; what the node knows of
// the rows one client holds under it is that member's rowSet.
type view struct {
	filter  *filter.Filter     // nil: every row
	proj    *filter.Projection // nil: every column
	keyCols []string           // the table's key columns (replica identity)
	// oldRows: the table's replica identity is FULL, so every update and
	// delete carries the whole old row and the filter decides from it
	// whether the client held the row; no row set is kept.
	oldRows bool
	// text is the request's canonical form (viewRequest.text). It binds
	// cursors (journal.Query.View), so a cursor is never resumed under
	// another filter or column list, and names the view in a callback's
	// cache.
	text string
}

// viewRequest is what a sub frame or an HTTP query asks: the filter's JSON
// (nil for none) and the column list (nil for every column; an empty list
// keeps the key columns only).
type viewRequest struct {
	filter  json.RawMessage
	columns []string
	hasCols bool
}

func (r viewRequest) empty() bool { return len(r.filter) == 0 && !r.hasCols }

// withFilter sets r's filter; JSON null is no filter.
func (r viewRequest) withFilter(raw json.RawMessage) viewRequest {
	if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" {
		raw = nil
	}
	r.filter = raw
	return r
}

// text is the request in one canonical form, the view's text: the filter
// decoded and encoded again (objects' keys sorted, strings' escapes and
// numbers' spelling as json.Marshal writes them, no HTML escaping), and
// the column list sorted. It binds cursors (journal.Query.View), so it is
// computed from the request alone: an event stream matches its cursors to
// its topics before any view is compiled. Callers bound the filter's size
// first.
func (r viewRequest) text() string {
	if r.empty() {
		return ""
	}
	var b strings.Builder
	if len(r.filter) > 0 {
		b.WriteString("f")
		d := json.NewDecoder(bytes.NewReader(r.filter))
		d.UseNumber()
		var v any
		var c bytes.Buffer
		enc := json.NewEncoder(&c)
		enc.SetEscapeHTML(false)
		if d.Decode(&v) == nil && enc.Encode(v) == nil {
			b.Write(bytes.TrimSpace(c.Bytes()))
		} else {
			b.Write(r.filter) // refused by Compile anyway
		}
	}
	if r.hasCols {
		cols := slices.Clone(r.columns)
		slices.Sort(cols)
		j, _ := json.Marshal(cols)
		b.WriteString("\x00c")
		b.Write(j)
	}
	return b.String()
}

// errViewRefused is a filter or column list the node refuses; its message
// names the problem (a *filter.Error's path and message).
type errViewRefused struct{ msg string }

func (e *errViewRefused) Error() string { return e.msg }

// compileView checks req against the table's newest catalog entry. A table
// the catalog does not publish is refused as a missing one. Errors other
// than *errViewRefused are the journal's.
func compileView(e journal.CatalogEntry, ok bool, req viewRequest, lim filter.Limits) (*view, error) {
	entity := decoder.EntityName(e.Schema, e.Name)
	if !ok || !e.Published {
		return nil, &errViewRefused{msg: refusedMissing(entity).Error()}
	}
	cols := e.ColumnInfos()
	v := &view{keyCols: e.KeyColumns(), oldRows: e.ReplicaIdentity == journal.IdentityFull}
	if len(req.filter) > 0 {
		f, err := filter.Compile(req.filter, cols, lim)
		if err != nil {
			return nil, viewRefusal(err)
		}
		v.filter = f
	}
	if req.hasCols {
		p, err := filter.NewProjection(req.columns, cols)
		if err != nil {
			return nil, viewRefusal(err)
		}
		v.proj = p
	}
	v.text = req.text() // after Compile has bounded the filter
	return v, nil
}

func viewRefusal(err error) error {
	var fe *filter.Error
	if errors.As(err, &fe) {
		return &errViewRefused{msg: fe.Error()}
	}
	return &errViewRefused{msg: err.Error()}
}

// viewChange is one change judged under a view: what the node may send a
// member of the view, before it knows what that member holds.
type viewChange struct {
	op decoder.Op
	// now: whether the new row (an insert's, an update's or a snapshot
	// row's) is in the view; old: whether the row before the change was,
	// judged on the image the change carries of it (an update's before or
	// key, a delete's before or key), so Undecided unless the filter reads
	// only columns of that image.
	now, old       filter.Result
	oldKey, newKey string
	// holes: the new image lacks the value of a column the view keeps
	// (listed in unchanged: a TOASTed value PostgreSQL did not resend).
	holes bool
	// missing names a column the filter reads that the new image does not
	// have at all: the table changed since the filter was checked.
	missing string

	v *view
	p *parsedChange
	// send is the change as the view shows it (its images cut to the kept
	// columns); remove is an update's removal of its old key from the view
	// (a delete of that key, marked "left":"filter"). Each is encoded
	// when first asked for (payload), as most changes need neither.
	send, remove []byte
}

// payload is what a member gets for action: the change as the view shows
// it, or its removal; nil when it cannot be encoded.
func (c *viewChange) payload(a viewAction) []byte {
	var err error
	switch a {
	case viewSend:
		if c.send == nil {
			if c.v.proj == nil || !c.p.rowOp() {
				c.send = c.p.raw
			} else if c.send, err = c.v.project(c.p); err != nil {
				c.send = nil
			}
		}
		return c.send
	case viewRemove:
		if c.remove == nil {
			if c.remove, err = removal(c.p, c.oldKey); err != nil {
				c.remove = nil
			}
		}
		return c.remove
	}
	return nil
}

// decide is r.apply (r may be nil: nothing known) with the payload of its
// action; an action whose payload cannot be encoded is a resync.
func (c *viewChange) decide(r *rowSet, state bool) (viewAction, []byte) {
	a := r.apply(c, state)
	p := c.payload(a)
	if p == nil && (a == viewSend || a == viewRemove) {
		return viewResync, nil
	}
	return a, p
}

// envelopeImages are the parts of an envelope a view reads.
type envelopeImages struct {
	Op             decoder.Op                 `json:"op"`
	Key            map[string]json.RawMessage `json:"key"`
	Before         map[string]json.RawMessage `json:"before"`
	After          map[string]json.RawMessage `json:"after"`
	Unchanged      []string                   `json:"unchanged"`
	BeforeJSONNull []string                   `json:"beforeJsonNull"`
	AfterJSONNull  []string                   `json:"afterJsonNull"`
}

// parsedChange is one envelope decoded once for every view that judges it.
type parsedChange struct {
	raw    []byte
	im     envelopeImages
	newKey string
	top    map[string]json.RawMessage // the whole envelope, decoded when a view rewrites it
}

func parseChange(env []byte) (*parsedChange, error) {
	p := &parsedChange{raw: env}
	if err := json.Unmarshal(env, &p.im); err != nil {
		return nil, err
	}
	if p.rowOp() {
		var err error
		if p.newKey, err = canonicalKey(p.im.Key); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// oldKey is the key the row had before the change: an update's before cut
// to keyCols when it carries them all (a key change, or REPLICA IDENTITY
// FULL), else the change's key.
func (p *parsedChange) oldKey(keyCols []string) string {
	if p.im.Op != decoder.OpUpdate || p.im.Before == nil {
		return p.newKey
	}
	k := make(map[string]json.RawMessage, len(keyCols))
	for _, name := range keyCols {
		if val, ok := p.im.Before[name]; ok {
			k[name] = val
		}
	}
	if len(k) != len(keyCols) {
		return p.newKey
	}
	if old, err := canonicalKey(k); err == nil {
		return old
	}
	return p.newKey
}

// rowOp: the change is about one row (not a truncate or the rest).
func (p *parsedChange) rowOp() bool {
	switch p.im.Op {
	case decoder.OpInsert, decoder.OpRead, decoder.OpUpdate, decoder.OpDelete:
		return true
	}
	return false
}

// fields is a fresh copy of the envelope's top-level fields, to rewrite.
func (p *parsedChange) fields() (map[string]json.RawMessage, error) {
	if p.top == nil {
		if err := json.Unmarshal(p.raw, &p.top); err != nil {
			return nil, err
		}
	}
	return maps.Clone(p.top), nil
}

// judge reads one envelope under v.
func (v *view) judge(env []byte) (*viewChange, error) {
	p, err := parseChange(env)
	if err != nil {
		return nil, err
	}
	return v.judgeParsed(p)
}

// judgeParsed judges p under v: filters and keys only, nothing encoded.
func (v *view) judgeParsed(p *parsedChange) (*viewChange, error) {
	im := &p.im
	c := &viewChange{op: im.Op, now: filter.Matches, old: filter.Undecided, v: v, p: p}
	if !p.rowOp() {
		return c, nil // truncate and the rest: not about one row
	}
	c.newKey, c.oldKey = p.newKey, p.oldKey(v.keyCols)
	oldImage, oldNull := im.Key, []string(nil)
	if im.Before != nil {
		oldImage, oldNull = im.Before, im.BeforeJSONNull
	}
	if im.Op == decoder.OpUpdate || im.Op == decoder.OpDelete {
		c.old = filter.Matches // every row is in a view without a filter
		if v.filter != nil {
			c.old = v.filter.Match(filter.Row{Values: oldImage, JSONNull: oldNull})
		}
	}
	if im.Op != decoder.OpDelete && v.filter != nil {
		c.now = v.filter.Match(filter.Row{Values: im.After, Unchanged: im.Unchanged, JSONNull: im.AfterJSONNull})
		if c.now == filter.Undecided {
			for _, col := range v.filter.Columns() {
				if _, ok := im.After[col]; !ok && !slices.Contains(im.Unchanged, col) {
					c.missing = col
					break
				}
			}
		}
	}
	for _, u := range im.Unchanged {
		if v.proj == nil || v.proj.Has(u) {
			c.holes = true
			break
		}
	}
	return c, nil
}

// canonicalKey is a key image as one string: its JSON with the columns
// sorted (json.Marshal sorts map keys), as the clients key their rows.
func canonicalKey(k map[string]json.RawMessage) (string, error) {
	if k == nil {
		return "", nil
	}
	b, err := json.Marshal(k)
	return string(b), err
}

// project cuts p's row images and column lists to v's columns.
func (v *view) project(p *parsedChange) ([]byte, error) {
	im := &p.im
	top, err := p.fields()
	if err != nil {
		return nil, err
	}
	set := func(name string, val any, empty bool) error {
		if empty {
			delete(top, name)
			return nil
		}
		b, err := json.Marshal(val)
		top[name] = b
		return err
	}
	if im.After != nil {
		if err := set("after", v.proj.Values(im.After), false); err != nil {
			return nil, err
		}
	}
	if im.Before != nil {
		if err := set("before", v.proj.Values(im.Before), false); err != nil {
			return nil, err
		}
	}
	for _, l := range []struct {
		name string
		list []string
	}{{"unchanged", im.Unchanged}, {"afterJsonNull", im.AfterJSONNull}, {"beforeJsonNull", im.BeforeJSONNull}} {
		if l.list == nil {
			continue
		}
		kept := v.proj.Names(l.list)
		if err := set(l.name, kept, len(kept) == 0); err != nil {
			return nil, err
		}
	}
	return json.Marshal(top)
}

// removal is an update's envelope turned into the removal of the row's old
// key from a view the new row is not in: op "delete", key and before the
// old key, no after, and "left":"filter". Position, transaction and tenant
// stay the update's.
func removal(p *parsedChange, oldKey string) ([]byte, error) {
	top, err := p.fields()
	if err != nil {
		return nil, err
	}
	for _, f := range []string{"after", "unchanged", "afterJsonNull", "beforeJsonNull"} {
		delete(top, f)
	}
	top["op"] = json.RawMessage(`"delete"`)
	top["key"] = json.RawMessage(oldKey)
	top["before"] = json.RawMessage(oldKey)
	top["left"] = json.RawMessage(`"filter"`)
	return json.Marshal(top)
}

// viewAction is what a member of a view gets for one change.
type viewAction uint8

const (
	viewSkip   viewAction = iota // nothing: the row is not and was not in the view
	viewSend                     // the change, as the view shows it
	viewRemove                   // the removal of the row's old key
	viewResync                   // the change cannot be judged: the client re-reads
)

// rowSet is what the node knows of the rows one client holds under a view:
// their keys, exactly, while known; once unknown (the client resumed from a
// cursor, was told to resync, or held more rows than the bound) the node
// judges by the change's own images and, where they cannot tell, assumes
// the client may hold the row.
type rowSet struct {
	known bool
	keys  map[string]struct{}
	max   int        // keys at most (0: no bound of its own)
	b     *rowBudget // the node's, shared by every set (nil: none)
	bytes int64      // what the keys count against b
}

// rowBudget bounds the memory of every row set of a node together, so
// that no number of filtered subscriptions can exhaust it: a set that
// would pass it forgets its keys instead.
type rowBudget struct {
	used  atomic.Int64
	limit int64 // 0: no bound
	// overflowed counts the sets that passed their own bound or the
	// node's (a node metric).
	overflowed atomic.Int64
}

// keyCost is what a key counts against a rowBudget: its bytes and about
// what a map entry of it takes besides (BenchmarkViewMemory).
func keyCost(k string) int64 { return int64(len(k)) + 40 }

// newRowSet is the set of a client that holds nothing yet (a fresh
// subscription, or a snapshot about to send its rows).
func newRowSet(max int, b *rowBudget) *rowSet {
	return &rowSet{known: true, keys: map[string]struct{}{}, max: max, b: b}
}

// forget makes the set unknown, and gives its memory back. Like add and
// del, it does nothing on a nil set (a reader the node keeps nothing of).
func (r *rowSet) forget() {
	if r == nil {
		return
	}
	r.release()
	r.known, r.keys = false, nil
}

// reset makes the set known and empty (after a truncate).
func (r *rowSet) reset() {
	r.release()
	r.known, r.keys = true, map[string]struct{}{}
}

func (r *rowSet) release() {
	if r.b != nil && r.bytes != 0 {
		r.b.used.Add(-r.bytes)
	}
	r.bytes = 0
}

func (r *rowSet) add(k string) {
	if r == nil || !r.known {
		return
	}
	if _, ok := r.keys[k]; ok {
		return
	}
	cost := keyCost(k)
	if (r.max > 0 && len(r.keys) >= r.max) || (r.b != nil && r.b.limit > 0 && r.b.used.Load()+cost > r.b.limit) {
		r.forget()
		if r.b != nil {
			r.b.overflowed.Add(1)
		}
		return
	}
	r.keys[k] = struct{}{}
	r.bytes += cost
	if r.b != nil {
		r.b.used.Add(cost)
	}
}

func (r *rowSet) del(k string) {
	if r == nil || !r.known {
		return
	}
	if _, ok := r.keys[k]; ok {
		delete(r.keys, k)
		cost := keyCost(k)
		r.bytes -= cost
		if r.b != nil {
			r.b.used.Add(-cost)
		}
	}
}

// held says whether the client holds the old row of c: 1 yes, 0 no, -1
// cannot tell.
func (r *rowSet) held(c *viewChange) int {
	switch {
	case r != nil && r.known:
		if _, ok := r.keys[c.oldKey]; ok {
			return 1
		}
		return 0
	case c.old == filter.Matches:
		return 1
	case c.old == filter.NoMatch:
		return 0
	}
	return -1
}

// apply decides c for a member whose rows r describes (nil: unknown) and
// updates r. state: the member keeps the table's rows (it subscribed with
// "snapshot":true), so a row it would hold with a hole must be read again.
func (r *rowSet) apply(c *viewChange, state bool) viewAction {
	switch c.op {
	case decoder.OpInsert, decoder.OpRead:
		switch c.now {
		case filter.Matches:
			if c.holes && state {
				r.forget()
				return viewResync
			}
			r.add(c.newKey)
			return viewSend
		case filter.NoMatch:
			return viewSkip
		}
		r.forget()
		return viewResync
	case decoder.OpUpdate:
		held := r.held(c)
		switch c.now {
		case filter.Matches:
			if c.holes && state && held != 1 {
				r.forget()
				return viewResync
			}
			r.del(c.oldKey)
			r.add(c.newKey)
			return viewSend
		case filter.NoMatch:
			if held == 0 {
				return viewSkip
			}
			r.del(c.oldKey)
			return viewRemove
		}
		r.forget()
		return viewResync
	case decoder.OpDelete:
		if r.held(c) == 0 {
			return viewSkip
		}
		r.del(c.oldKey)
		return viewSend
	case decoder.OpTruncate:
		if r != nil && r.known {
			r.reset() // (an unknown set stays unknown: the resync that follows settles it)
		}
	}
	return viewSend
}

// viewCache judges one change once per view in one pass over members,
// decoding it once for all of them.
type viewCache struct {
	p *parsedChange
	m map[string]*viewChange
}

func (vc *viewCache) judge(v *view, env []byte) (*viewChange, error) {
	if c := vc.m[v.text]; c != nil {
		return c, nil
	}
	if vc.p == nil {
		p, err := parseChange(env)
		if err != nil {
			return nil, err
		}
		vc.p = p
	}
	c, err := v.judgeParsed(vc.p)
	if err != nil {
		return nil, err
	}
	if vc.m == nil {
		vc.m = map[string]*viewChange{}
	}
	vc.m[v.text] = c
	return c, nil
}

// openView checks a subscription's filter and column list against topic's
// newest catalog entry: nil for a request of neither, else the view, or
// the error code and message to answer with (bad-filter names the
// problem; unavailable when the catalog cannot be read).
func (n *Node) openView(ctx context.Context, topic string, req viewRequest) (v *view, code, msg string) {
	if req.empty() {
		return nil, "", ""
	}
	schema, table, ok := decoder.SplitEntity(topic)
	if !ok {
		return nil, "bad-topic", "topic is not schema.table"
	}
	e, found, err := n.viewCatalog.get(ctx, n.j, journal.Table{Schema: schema, Name: table})
	if err != nil {
		n.warnEvery("view-catalog", "cannot read the catalog for a filtered subscription", "topic", topic, "err", err)
		return nil, "unavailable", "cannot read the table's columns now; retry"
	}
	v, err = compileView(e, found, req, n.cfg.FilterLimits)
	if err != nil {
		return nil, "bad-filter", err.Error()
	}
	return v, "", ""
}

// newRows is the row set of a member of v that holds nothing yet: none is
// kept for a table whose changes carry their old rows, or with
// MaxFilterRows negative.
func (n *Node) newRows(v *view) *rowSet {
	r := newRowSet(n.cfg.MaxFilterRows, &n.rowBudget)
	if n.cfg.MaxFilterRows < 0 || v.oldRows {
		r.forget()
	}
	return r
}

// viewLocked judges the live change c for m, a member of a view whose
// scope c is in: the change to hold for m (c's envelope as the view shows
// it, or its removal), or false when m gets nothing of it. A change the
// view cannot judge makes m owe a resync at the end of c's transaction
// (endedLocked): m then holds a change with no payload, which carries the
// transaction's end without a frame. t.mu is held.
func (m *member) viewLocked(enc *liveFrames, c *liveChange) (*liveChange, bool) {
	st := &m.s.n.stats
	if m.unjudged {
		// The rest of a transaction a change of which could not be
		// judged: nothing of it is sent; the resync follows its end.
		return &liveChange{seq: c.seq, epoch: c.epoch, op: c.op, commit: c.commit}, true
	}
	vc, err := enc.views.judge(m.view, c.payload)
	action, payload := viewResync, []byte(nil)
	if err == nil {
		action, payload = vc.decide(m.rows, m.snapshot)
	}
	st.countView(action)
	switch action {
	case viewSkip:
		return nil, false
	case viewResync:
		m.rows.forget()
		m.owesResync, m.unjudged = true, true
		return &liveChange{seq: c.seq, epoch: c.epoch, op: c.op, commit: c.commit}, true
	}
	return enc.viewChange(m.view, action, c, payload), true
}

// viewCarry is a view member's change, judged on one catch-up page, whose
// transaction goes on past the page (catchUp).
type viewCarry struct {
	c                     *liveChange // payload nil: a change the view could not judge
	unjudged              bool        // a change of its transaction could not be judged (member.unjudged)
	base, readFrom, epoch int64
}

// viewPageLocked turns a page of entries (readView) into m's frames: each
// entry judged under m's view, in order, updating m's rows. A change is
// sent without an end mark when a later change of its transaction reaches
// m, else with the end mark and the cursor of its transaction's last entry
// in the scope (which m may not get: the view can exclude it). A change
// whose transaction goes on past the page is returned as the carry, for
// the next page; a carry given is judged already and comes first. A
// change the view cannot judge is a nil frame (catchUp makes the client
// re-read at its transaction's end). t.mu is held.
func (m *member) viewPageLocked(p readPage, carry *viewCarry, epoch int64) (readPage, *viewCarry) {
	n := m.s.n
	out := readPage{end: p.end, more: p.more}
	var pend *liveChange
	unjudged := m.unjudged // as member.unjudged, for the transaction in progress
	if carry != nil {
		pend, unjudged = carry.c, carry.unjudged
	}
	emit := func(c *liveChange, end bool, at int64) {
		var f *frame
		if c.payload != nil {
			cur := ""
			if end {
				var err error
				if cur, err = n.j.CursorAt(m.q, epoch, at); err != nil {
					// Cannot happen for the journal's own position; drop
					// what the node knows and let the client re-read.
					c = &liveChange{seq: c.seq, op: c.op, commit: c.commit}
				}
			}
			if c.payload != nil {
				f = changeFrame(m.topic, cur, c.payload, end)
			}
		}
		if !end {
			at = c.seq
		}
		out.frames = append(out.frames, f)
		out.seqs = append(out.seqs, at)
		out.ends = append(out.ends, end)
		if f != nil && c.op == decoder.OpTruncate {
			if out.truncate == nil {
				out.truncate = make([]bool, len(out.frames)-1, len(p.entries)+1)
			}
			out.truncate = append(out.truncate, true)
		} else if out.truncate != nil {
			out.truncate = append(out.truncate, false)
		}
	}
	st := &n.stats
	for _, e := range p.entries {
		action, payload := viewResync, []byte(nil)
		if !unjudged {
			if vc, err := m.view.judge(e.Envelope); err == nil {
				action, payload = vc.decide(m.rows, m.snapshot)
			}
		}
		var x *liveChange
		if !unjudged {
			st.countView(action)
		}
		switch {
		case unjudged:
			x = &liveChange{seq: e.Seq, op: e.Op, commit: e.CommitLSN.String()}
		case action == viewSkip:
		case action == viewResync:
			m.rows.forget()
			unjudged = true
			x = &liveChange{seq: e.Seq, op: e.Op, commit: e.CommitLSN.String()}
		default:
			x = &liveChange{seq: e.Seq, op: e.Op, commit: e.CommitLSN.String(), payload: payload}
		}
		if x != nil {
			if pend != nil {
				emit(pend, false, 0)
			}
			pend = x
		}
		if e.TxnEnd {
			if pend != nil {
				emit(pend, true, e.Seq)
				pend = nil
			}
			unjudged = false
		}
	}
	if pend != nil {
		return out, &viewCarry{c: pend, unjudged: unjudged}
	}
	return out, nil
}

// viewRow is a snapshot row as v shows it (nil: not in the view), recorded
// in held. A row the filter cannot judge (a value not in its type's form)
// fails the snapshot: it can be neither sent nor left out exactly.
func viewRow(v *view, held *rowSet, p *parsedChange, st *syncStats) ([]byte, error) {
	body, err := viewSnapshotChange(v, held, p, st)
	if err == nil && body != nil && len(body) == 0 {
		err = refused("a row of the table holds a value the filter cannot compare; subscribe with a filter that does not test that column")
	}
	return body, err
}

// refusedMissingColumn refuses a snapshot whose filter reads a column the
// table's rows no longer have.
func refusedMissingColumn(col string) error {
	return refused("the table's rows no longer have column %q, which the filter reads (the table changed after the subscription checked its filter); subscribe again with a filter on the table's published columns", col)
}

// viewSnapshotChange is a snapshot's row, or a change after its rows, as v
// shows it to the snapshot's client, whose rows held records (p from
// snapshotFills.fill; nil when it could not be read): nil when the client
// gets nothing of it, empty when the view cannot judge it (the snapshot is
// read again), an error when it never will (the table lost a column the
// filter reads).
func viewSnapshotChange(v *view, held *rowSet, p *parsedChange, st *syncStats) ([]byte, error) {
	var vc *viewChange
	if p != nil {
		vc, _ = v.judgeParsed(p)
	}
	if vc == nil {
		st.countView(viewResync)
		return []byte{}, nil
	}
	action, payload := vc.decide(held, true)
	st.countView(action)
	switch action {
	case viewSkip:
		return nil, nil
	case viewResync:
		if vc.missing != "" {
			return nil, refusedMissingColumn(vc.missing)
		}
		return []byte{}, nil
	}
	return payload, nil
}

// fillBudget bounds the values one filtered snapshot keeps to fill the
// unchanged columns of the changes after its rows (snapshotFills); at most
// --max-concurrent-snapshots snapshots hold them at once.
const fillBudget = 16 << 20

// fillMinBytes: values shorter than this are never kept, as PostgreSQL
// stores such a value inline and so always sends it.
const fillMinBytes = 64

// snapshotFills keeps, during one filtered snapshot, the long values of the
// columns its view keeps, of every row of the snapshot's scope (in the view
// or not) as of the rows and then each change after them. A change after
// the rows that leaves such a value unchanged (a TOASTed value PostgreSQL
// did not resend) is filled from it before the view judges the change, so
// a row that enters the view then arrives whole. Bounded by fillBudget;
// past it the node keeps no more, and a change it cannot fill restarts the
// snapshot.
type snapshotFills struct {
	v      *view
	rows   map[string]map[string]json.RawMessage
	bytes  int
	capped bool
}

func newSnapshotFills(v *view) *snapshotFills {
	return &snapshotFills{v: v, rows: map[string]map[string]json.RawMessage{}}
}

// note records the long values of env's new row image.
func (f *snapshotFills) note(im *envelopeImages, key string) {
	if im.Op == decoder.OpDelete {
		f.forgetKey(key)
		return
	}
	if im.After == nil {
		return
	}
	var kept map[string]json.RawMessage
	for col, val := range im.After {
		if len(val) < fillMinBytes || (f.v.proj != nil && !f.v.proj.Has(col)) {
			continue
		}
		if f.capped || f.bytes+len(val) > fillBudget {
			f.capped = true
			continue
		}
		if kept == nil {
			kept = f.rows[key]
			if kept == nil {
				kept = map[string]json.RawMessage{}
				f.rows[key] = kept
			}
		}
		f.bytes += len(val) - len(kept[col])
		kept[col] = slices.Clone(val)
	}
}

func (f *snapshotFills) forgetKey(key string) {
	for _, val := range f.rows[key] {
		f.bytes -= len(val)
	}
	delete(f.rows, key)
}

// fill reads env, fills its unchanged columns from what f kept of the row
// (the update's old key), records its values, and returns it decoded, as
// every view judges it (nil when it cannot be read). The envelope is
// rewritten only when a value was filled.
func (f *snapshotFills) fill(env []byte) *parsedChange {
	p, err := parseChange(env)
	if err != nil {
		return nil
	}
	if !p.rowOp() {
		return p
	}
	im := &p.im
	oldKey := p.oldKey(f.v.keyCols)
	if len(im.Unchanged) > 0 && im.After != nil {
		known := f.rows[oldKey]
		after := maps.Clone(im.After)
		var still []string
		for _, u := range im.Unchanged {
			if val, ok := known[u]; ok {
				after[u] = val
			} else {
				still = append(still, u)
			}
		}
		if len(still) < len(im.Unchanged) {
			if top, err := p.fields(); err == nil {
				a, err1 := json.Marshal(after)
				top["after"] = a
				delete(top, "unchanged")
				if len(still) > 0 {
					top["unchanged"], _ = json.Marshal(still)
				}
				if b, err2 := json.Marshal(top); err1 == nil && err2 == nil {
					p.raw, p.top, im.After, im.Unchanged = b, nil, after, still
				}
			}
		}
	}
	if oldKey != p.newKey {
		if kept := f.rows[oldKey]; kept != nil {
			delete(f.rows, oldKey)
			f.rows[p.newKey] = kept
		}
	}
	f.note(im, p.newKey)
	return p
}

// maxViewParamBytes bounds a filter or column list given in a URL query;
// the filter's own bound (filter.Limits.MaxBytes) applies after it.
const maxViewParamBytes = 64 << 10

// viewParams reads a filter and a column list from a URL query's
// parameters named filterKey and colsKey: the filter as its JSON, the
// columns as a JSON array or a comma-separated list (present and empty:
// the key columns only). It returns a message for the client when they
// are malformed.
func viewParams(q url.Values, filterKey, colsKey string) (viewRequest, string) {
	var r viewRequest
	if fs, ok := q[filterKey]; ok {
		if len(fs) > 1 {
			return r, "give " + filterKey + " once"
		}
		if len(fs[0]) > maxViewParamBytes {
			return r, fmt.Sprintf("%s is %d bytes, more than the limit of %d", filterKey, len(fs[0]), maxViewParamBytes)
		}
		if !json.Valid([]byte(fs[0])) {
			return r, filterKey + " is not JSON; give the filter's JSON form, URL-encoded (docs/filters.md)"
		}
		r = r.withFilter(json.RawMessage(fs[0]))
	}
	if cs, ok := q[colsKey]; ok {
		if len(cs) > 1 {
			return r, "give " + colsKey + " once"
		}
		c := strings.TrimSpace(cs[0])
		if len(c) > maxViewParamBytes {
			return r, fmt.Sprintf("%s is %d bytes, more than the limit of %d", colsKey, len(c), maxViewParamBytes)
		}
		r.hasCols, r.columns = true, []string{}
		switch {
		case strings.HasPrefix(c, "["):
			if err := json.Unmarshal([]byte(c), &r.columns); err != nil {
				return r, colsKey + " is not a JSON array of column names"
			}
		case c != "":
			r.columns = strings.Split(c, ",")
		}
	}
	return r, ""
}

// viewChanges is a page of GET /v1/changes as v shows it to a reader the
// node knows nothing of: each change judged alone (removals for every row
// that may have left the view). resync: a change could not be judged.
func viewChanges(v *view, entries []journal.Entry, st *syncStats) (out []json.RawMessage, resync bool) {
	out = make([]json.RawMessage, 0, len(entries))
	for _, e := range entries {
		vc, err := v.judge(e.Envelope)
		if err != nil {
			return nil, true
		}
		action, payload := vc.decide(nil, false)
		st.countView(action)
		switch action {
		case viewSkip:
			continue
		case viewResync:
			return nil, true
		}
		out = append(out, payload)
	}
	return out, false
}

// countView counts what a filtered subscription's view made of a change
// (Stats.Filter).
func (st *syncStats) countView(a viewAction) {
	switch a {
	case viewSkip:
		st.filterSkipped.Add(1)
	case viewRemove:
		st.filterRemovals.Add(1)
	case viewResync:
		st.filterResyncs.Add(1)
	}
}

// httpView reads the filter and column list of a GET /v1/snapshot or GET
// /v1/changes request for topic (filter=, columns=), answering a refusal
// itself (400 bad-filter naming the problem, 503 when the catalog cannot be
// read): ok false then. nil without either.
func (n *Node) httpView(w http.ResponseWriter, r *http.Request, topic string) (v *view, ok bool) {
	vreq, msg := viewParams(r.URL.Query(), "filter", "columns")
	if msg != "" {
		writeJSONError(w, http.StatusBadRequest, "bad-filter", msg)
		return nil, false
	}
	v, code, msg := n.openView(r.Context(), topic, vreq)
	if code != "" {
		writeJSONError(w, viewStatus(code), code, msg)
		return nil, false
	}
	return v, true
}

// viewStatus is the HTTP status of openView's error codes.
func viewStatus(code string) int {
	switch code {
	case "bad-filter", "bad-topic":
		return http.StatusBadRequest
	}
	return http.StatusServiceUnavailable
}

// catalogCache keeps the catalog entries filtered subscriptions are checked
// against for a second, so that subscribing (at the inbound frame rate of
// every socket) costs the journal one read per table and second at most.
// An entry a second old is as good as a fresh one: the catalog itself
// follows the source within seconds (docs/sync.md "Scope: the catalog").
type catalogCache struct {
	mu sync.Mutex
	m  map[journal.Table]cachedCatalog
}

type cachedCatalog struct {
	e     journal.CatalogEntry
	found bool
	at    time.Time
}

// catalogCacheTTL and catalogCacheMax: how long an entry is used, and how
// many are kept (the cache starts over past it).
const (
	catalogCacheTTL = time.Second
	catalogCacheMax = 4096
)

func (c *catalogCache) get(ctx context.Context, j *journal.Journal, t journal.Table) (journal.CatalogEntry, bool, error) {
	c.mu.Lock()
	if ce, ok := c.m[t]; ok && time.Since(ce.at) < catalogCacheTTL {
		c.mu.Unlock()
		return ce.e, ce.found, nil
	}
	c.mu.Unlock()
	e, found, err := j.Catalog(ctx, t)
	if err != nil {
		return e, false, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= catalogCacheMax {
		c.m = map[journal.Table]cachedCatalog{}
	}
	c.m[t] = cachedCatalog{e: e, found: found, at: time.Now()}
	c.mu.Unlock()
	return e, found, nil
}
