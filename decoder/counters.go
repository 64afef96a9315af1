package decoder

import (
	"sort"
	"sync"
	"sync/atomic"
)

// ops lists the operations Counters counts, in index order.
var ops = [...]Op{OpInsert, OpUpdate, OpDelete, OpTruncate, OpMessage, OpQuarantine, OpRead, OpSnapshotBegin, OpSnapshotEnd, OpResync}

// opIndex maps an Op to its slot in EntityCounters; -1 for an unknown one.
func opIndex(op Op) int {
	switch op {
	case OpInsert:
		return 0
	case OpUpdate:
		return 1
	case OpDelete:
		return 2
	case OpTruncate:
		return 3
	case OpMessage:
		return 4
	case OpQuarantine:
		return 5
	case OpRead:
		return 6
	case OpSnapshotBegin:
		return 7
	case OpSnapshotEnd:
		return 8
	case OpResync:
		return 9
	}
	return -1
}

// EntityCounters counts one entity's changes by operation. Its counters are
// atomic: one goroutine adds, any other may read.
type EntityCounters struct {
	n [len(ops)]atomic.Uint64
}

// Add counts n changes of op; an unknown op is ignored.
func (c *EntityCounters) Add(op Op, n uint64) {
	if i := opIndex(op); i >= 0 {
		c.n[i].Add(n)
	}
}

// Counters counts changes by entity and operation, for metrics. Entities
// come from the publication's relations (and, for logical decoding messages,
// their prefix: at most MaxMessageEntities distinct ones, the rest counted
// under OtherEntity), so the set stays small; keys, tenants and cursors are
// never counted by.
//
// It is safe for concurrent use: the decoder (or any single writer) adds
// through the *EntityCounters that Entity returns, without locking, while a
// metrics callback reads with Each from another goroutine. A Counters may
// outlive decoders: the replicator passes one to every session's decoder so
// that totals survive reconnects.
type Counters struct {
	mu       sync.Mutex // guards the following fields
	entities map[string]*EntityCounters
	messages int // distinct message entities counted so far
}

// MaxMessageEntities bounds the distinct logical-message prefixes a Counters
// counts by; further prefixes are counted under OtherEntity.
const MaxMessageEntities = 64

// OtherEntity is the entity under which messages past MaxMessageEntities
// distinct prefixes are counted.
const OtherEntity = "(other)"

// NewCounters returns empty counters.
func NewCounters() *Counters {
	return &Counters{entities: make(map[string]*EntityCounters)}
}

// Entity returns the counters of entity, creating them on first use. The
// result stays valid (and counted) for the Counters' lifetime.
func (c *Counters) Entity(entity string) *EntityCounters {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entityLocked(entity)
}

func (c *Counters) entityLocked(entity string) *EntityCounters {
	ec := c.entities[entity]
	if ec == nil {
		ec = &EntityCounters{}
		c.entities[entity] = ec
	}
	return ec
}

// Message returns the counters of a logical decoding message's entity (its
// prefix), creating them on first use; past MaxMessageEntities distinct
// prefixes it returns those of OtherEntity.
func (c *Counters) Message(prefix string) *EntityCounters {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ec := c.entities[prefix]; ec != nil {
		return ec
	}
	if c.messages >= MaxMessageEntities {
		return c.entityLocked(OtherEntity)
	}
	c.messages++
	return c.entityLocked(prefix)
}

// Add counts n changes of (entity, op). It takes a lock: for a hot path,
// keep the *EntityCounters from Entity instead.
func (c *Counters) Add(entity string, op Op, n uint64) {
	c.Entity(entity).Add(op, n)
}

// Each calls fn for every (entity, op) counted at least once, in entity then
// op order, with its current total. fn must not call back into c.
func (c *Counters) Each(fn func(entity string, op Op, n uint64)) {
	c.mu.Lock()
	names := make([]string, 0, len(c.entities))
	for e := range c.entities {
		names = append(names, e)
	}
	ecs := make([]*EntityCounters, len(names))
	sort.Strings(names)
	for i, e := range names {
		ecs[i] = c.entities[e]
	}
	c.mu.Unlock()
	for i, e := range names {
		for k := range ops {
			if n := ecs[i].n[k].Load(); n > 0 {
				fn(e, ops[k], n)
			}
		}
	}
}

// Get returns the total of (entity, op), for tests and reports.
func (c *Counters) Get(entity string, op Op) uint64 {
	c.mu.Lock()
	ec := c.entities[entity]
	c.mu.Unlock()
	i := opIndex(op)
	if ec == nil || i < 0 {
		return 0
	}
	return ec.n[i].Load()
}

// CountChanges reports the transaction's changes grouped by entity and op:
// for an in-memory transaction it calls fn once per run of consecutive
// changes of the same entity and op; for a spilled one, once per entity and
// op, from counts the decoder kept while writing the spill file, which is
// never read for it. It reports false, without calling fn, only for a
// spilled streamed transaction whose changes fell into more than 4096
// (subtransaction, entity, op) groups (a savepoint per row, say): those
// counts are not kept, so that counting never costs memory per row.
func (tx *Transaction) CountChanges(fn func(entity string, op Op, n int)) bool {
	if tx.spill != nil {
		if !tx.spillCounted {
			return false
		}
		for _, c := range tx.spillCounts {
			fn(c.entity, opNames[c.op], c.n)
		}
		return true
	}
	for i := 0; i < len(tx.mem); {
		c := &tx.mem[i]
		j := i + 1
		for j < len(tx.mem) && tx.mem[j].Op == c.Op && tx.mem[j].Entity == c.Entity {
			j++
		}
		fn(c.Entity, c.Op, j-i)
		i = j
	}
	return true
}
