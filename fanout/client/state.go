package client

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"
)

// Row is one row of a topic's state: its columns as the envelope's after
// carries them (DESIGN §3 value forms).
type Row map[string]json.RawMessage

// State keeps the current rows of the topics it subscribes (with
// SubscribeSnapshot), keyed by each row's replica-identity key: it applies
// a snapshot's rows and the changes that follow to a map, answers a resync
// with a fresh snapshot, and can be asked for the rows at any time.
//
// Rows returns the state as of the last completed snapshot plus every
// transaction after it, never a half-read snapshot nor half a transaction:
// a snapshot is built aside and replaces the state at its snapshot-end,
// and a transaction's changes are applied together when Next returns its
// last one (Event.End). Read events with State.Next
// instead of Client.Next; each event is applied before it is returned.
//
// Keys are the envelope's key object in a canonical form (JSON with the
// column names sorted), the same for a row and for every later change of
// it. An update that changes the key (or moves the row out of the
// client's tenant, which the journal delivers as a delete) removes the old
// key. A row that leaves a filtered subscription's filter comes as a
// delete of its old key marked "left":"filter", and is removed the same
// way. Columns an update leaves unchanged (TOASTed values Postgres did not
// send, the envelope's "unchanged") keep the value the state held.
type State struct {
	c *Client

	mu     sync.Mutex
	topics map[string]*tableState
}

type tableState struct {
	rows    map[string]Row
	pending map[string]Row // the snapshot being read, nil outside one
	ready   bool           // a snapshot has completed
	cursor  string         // where rows is exact as of
	txn     []*envelope    // the live transaction being returned, applied at its end
}

// NewState keeps state for c's snapshot topics. Read c's events only
// through it.
func NewState(c *Client) *State {
	return &State{c: c, topics: map[string]*tableState{}}
}

// Subscribe follows topic's rows, then its changes.
func (s *State) Subscribe(topic string) error {
	return s.SubscribeWith(topic, SubscribeOptions{})
}

// SubscribeWith follows the rows of topic that o.Filter matches, with the
// columns o.Columns lists (Client.SubscribeWith), then their changes; a
// snapshot is always asked for (o.Snapshot is ignored). A row that stops
// matching the filter arrives as a removal (a delete marked
// "left":"filter") and leaves the state like a deleted row. The filter and
// column list go with every fresh snapshot State asks for after a resync.
func (s *State) SubscribeWith(topic string, o SubscribeOptions) error {
	s.mu.Lock()
	if s.topics[topic] == nil {
		s.topics[topic] = &tableState{rows: map[string]Row{}}
	}
	s.mu.Unlock()
	o.Snapshot = true
	return s.c.SubscribeWith(topic, o)
}

// Unsubscribe stops following topic and forgets its rows.
func (s *State) Unsubscribe(topic string) error {
	s.mu.Lock()
	delete(s.topics, topic)
	s.mu.Unlock()
	return s.c.Unsubscribe(topic)
}

// Next returns the client's next event once State has applied it. A
// resync (which a node with --database-url answers with a snapshot itself;
// one without sends a plain resync) is answered by asking for a fresh
// snapshot. An envelope State cannot read is returned as an error, with the
// event; the state then lacks that change, so the caller should
// resubscribe.
func (s *State) Next(ctx context.Context) (Event, error) {
	ev, err := s.c.Next(ctx)
	if err != nil {
		return ev, err
	}
	if err := s.apply(ev); err != nil {
		return ev, err
	}
	if ev.Type == EventResync && s.followed(ev.Topic) {
		if err := s.c.resnapshot(ev.Topic); err != nil {
			return ev, fmt.Errorf("ask for a fresh snapshot of %s after a resync: %w", ev.Topic, err)
		}
	}
	return ev, nil
}

func (s *State) followed(topic string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.topics[topic] != nil
}

// Rows returns a copy of topic's rows, keyed by canonical key.
func (s *State) Rows(topic string) map[string]Row {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.topics[topic]
	if t == nil {
		return nil
	}
	out := make(map[string]Row, len(t.rows))
	for k, r := range t.rows {
		out[k] = maps.Clone(r)
	}
	return out
}

// Len is how many rows topic has.
func (s *State) Len(topic string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.topics[topic]; t != nil {
		return len(t.rows)
	}
	return 0
}

// Ready reports whether topic's first snapshot has completed, and the
// cursor its rows are exact as of (the snapshot-end's, or the last live
// change's).
func (s *State) Ready(topic string) (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.topics[topic]; t != nil {
		return t.ready, t.cursor
	}
	return false, ""
}

// envelope is the part of a change envelope State reads.
type envelope struct {
	Op        string                     `json:"op"`
	Key       map[string]json.RawMessage `json:"key"`
	Before    map[string]json.RawMessage `json:"before"`
	After     map[string]json.RawMessage `json:"after"`
	Unchanged []string                   `json:"unchanged"`
}

func (s *State) apply(ev Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.topics[ev.Topic]
	if t == nil {
		return nil
	}
	switch ev.Type {
	case EventSnapshotBegin:
		t.pending, t.txn = map[string]Row{}, nil
	case EventSnapshotEnd:
		if t.pending != nil {
			t.rows, t.pending = t.pending, nil
		}
		t.ready, t.cursor = true, ev.Cursor
	case EventResync:
		// The rows are no longer known to be right; keep showing them
		// until the fresh snapshot completes.
		t.pending, t.txn = nil, nil
	case EventRow, EventChange:
		var e envelope
		if err := json.Unmarshal(ev.Change, &e); err != nil {
			return fmt.Errorf("state of %s: unreadable envelope: %w", ev.Topic, err)
		}
		rows := t.rows
		if t.pending != nil {
			rows = t.pending
		} else if ev.Type == EventRow {
			return fmt.Errorf("state of %s: a row outside a snapshot", ev.Topic)
		} else if !ev.End {
			t.txn = append(t.txn, &e) // applied with the rest of its transaction
			return nil
		}
		txn := append(t.txn, &e)
		t.txn = nil
		if t.pending != nil {
			txn = txn[len(txn)-1:]
		}
		for _, e := range txn {
			if err := applyEnvelope(rows, e); err != nil {
				return fmt.Errorf("state of %s: %w", ev.Topic, err)
			}
		}
		if t.pending == nil && ev.Cursor != "" {
			t.cursor = ev.Cursor
		}
	}
	return nil
}

// applyEnvelope applies one envelope to rows. Ops it does not know (message,
// markers, ops added later) leave rows as they are.
func applyEnvelope(rows map[string]Row, e *envelope) error {
	switch e.Op {
	case "insert", "read", "update", "delete":
	case "truncate":
		clear(rows)
		return nil
	default:
		return nil
	}
	if len(e.Key) == 0 {
		return fmt.Errorf("%s without a key", e.Op)
	}
	key, err := canonicalKey(e.Key)
	if err != nil {
		return err
	}
	if e.Op == "delete" {
		delete(rows, key)
		return nil
	}
	if e.After == nil {
		return fmt.Errorf("%s of %s without after", e.Op, key)
	}
	old := key
	if e.Op == "update" && e.Before != nil {
		// The old row's key: the key's columns as before holds them (the
		// old key under DEFAULT when it changed; the whole old row under
		// FULL).
		ok := make(map[string]json.RawMessage, len(e.Key))
		for col := range e.Key {
			if v, has := e.Before[col]; has {
				ok[col] = v
			}
		}
		if len(ok) == len(e.Key) {
			if old, err = canonicalKey(ok); err != nil {
				return err
			}
		}
	}
	row := Row(maps.Clone(e.After))
	if prev, had := rows[old]; had {
		for _, col := range e.Unchanged {
			if v, known := prev[col]; known {
				row[col] = v
			}
		}
		if old != key {
			delete(rows, old)
		}
	}
	rows[key] = row
	return nil
}

// canonicalKey is the key object as JSON with sorted names and compacted
// values, so that the same key spelled by two envelopes is one map key.
func canonicalKey(k map[string]json.RawMessage) (string, error) {
	b, err := json.Marshal(k) // sorts the names; compacts each value
	if err != nil {
		return "", fmt.Errorf("unreadable key: %w", err)
	}
	return string(b), nil
}
