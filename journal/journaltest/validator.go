// Package journaltest holds test helpers for walcast's journal and for the
// fault tests of the packages above it: a validator of the completeness and
// order of an emitted stream. It imports nothing of walcast, so any test can
// use it.
package journaltest

import (
	"errors"
	"fmt"
	"sync"
)

// Item is one change as a stream delivered it.
type Item struct {
	Seq       int64  // journal seq
	Entity    string // entity of the change
	EntitySeq int64  // per-entity sequence
	// ID identifies the source change independently of the journal (for
	// example its LSN and entity, or a value the test wrote into the row), so
	// a change journaled twice is caught even under two seqs.
	ID string
}

// Validator checks a stream against the changes known to be committed: every
// committed change delivered exactly once, in commit order, nothing that was
// not committed, seq strictly increasing and entitySeq strictly increasing
// per entity. With Contiguous (a reader of the unfiltered log, or of one
// entity for entitySeq) it also requires seq and entitySeq to step by one.
//
// Commit and Observe may be called from different goroutines, in any
// interleaving: a reader may observe a change before the writer has recorded
// it as committed. Check judges the whole history.
type Validator struct {
	// ContiguousSeq requires each observed seq to be the previous plus one.
	ContiguousSeq bool
	// ContiguousEntitySeq requires each entity's entitySeq to step by one.
	ContiguousEntitySeq bool

	mu            sync.Mutex // guards the following fields
	committed     []string
	commitIdx     map[string]int
	observed      []Item
	seenID        map[string]int64 // ID → seq first observed
	lastSeq       int64
	lastEntitySeq map[string]int64
	errs          []error
}

// New returns a validator that requires contiguous seq and entitySeq (an
// unfiltered reader).
func New() *Validator { return &Validator{ContiguousSeq: true, ContiguousEntitySeq: true} }

func (v *Validator) init() {
	if v.commitIdx == nil {
		v.commitIdx = map[string]int{}
		v.seenID = map[string]int64{}
		v.lastEntitySeq = map[string]int64{}
	}
}

func (v *Validator) failf(format string, args ...any) {
	if len(v.errs) < 20 {
		v.errs = append(v.errs, fmt.Errorf(format, args...))
	}
}

// Commit records changes as committed, in commit order.
func (v *Validator) Commit(ids ...string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.init()
	for _, id := range ids {
		if _, dup := v.commitIdx[id]; dup {
			v.failf("change %q committed twice (test bug)", id)
			continue
		}
		v.commitIdx[id] = len(v.committed)
		v.committed = append(v.committed, id)
	}
}

// Observe records items as delivered, in delivery order.
func (v *Validator) Observe(items ...Item) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.init()
	for _, it := range items {
		if prev, dup := v.seenID[it.ID]; dup {
			v.failf("change %q delivered twice (seq %d and %d)", it.ID, prev, it.Seq)
		} else {
			v.seenID[it.ID] = it.Seq
		}
		if len(v.observed) > 0 {
			switch {
			case it.Seq <= v.lastSeq:
				v.failf("seq went from %d to %d (change %q)", v.lastSeq, it.Seq, it.ID)
			case v.ContiguousSeq && it.Seq != v.lastSeq+1:
				v.failf("seq gap: %d follows %d (change %q)", it.Seq, v.lastSeq, it.ID)
			}
		}
		if last, ok := v.lastEntitySeq[it.Entity]; ok {
			switch {
			case it.EntitySeq <= last:
				v.failf("entitySeq of %q went from %d to %d", it.Entity, last, it.EntitySeq)
			case v.ContiguousEntitySeq && it.EntitySeq != last+1:
				v.failf("entitySeq gap in %q: %d follows %d", it.Entity, it.EntitySeq, last)
			}
		}
		v.lastEntitySeq[it.Entity] = it.EntitySeq
		v.lastSeq = it.Seq
		v.observed = append(v.observed, it)
	}
}

// Observed returns how many items were observed.
func (v *Validator) Observed() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.observed)
}

// Check reports every violation: those seen by Observe, committed changes
// never delivered, delivered changes never committed, and changes delivered
// out of commit order. Call it once the stream has been drained.
func (v *Validator) Check() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.init()
	errs := append([]error(nil), v.errs...)
	add := func(format string, args ...any) {
		if len(errs) < 40 {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	missing := 0
	for _, id := range v.committed {
		if _, ok := v.seenID[id]; !ok {
			if missing < 5 {
				add("committed change %q never delivered", id)
			}
			missing++
		}
	}
	if missing > 5 {
		add("… %d committed changes never delivered in all", missing)
	}
	last := -1
	for _, it := range v.observed {
		idx, ok := v.commitIdx[it.ID]
		if !ok {
			add("delivered change %q (seq %d) was never committed", it.ID, it.Seq)
			continue
		}
		if idx < last {
			add("change %q (seq %d) delivered after a change committed later", it.ID, it.Seq)
		}
		last = max(last, idx)
	}
	return errors.Join(errs...)
}
