package client

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
)

func stateWith(topic string) *State {
	s := NewState(nil)
	s.topics[topic] = &tableState{rows: map[string]Row{}}
	return s
}

func ev(typ, env string) Event {
	return Event{Type: typ, Topic: "t", Change: json.RawMessage(env)}
}

// vals is topic's rows as key → the row's "v" column, for comparisons.
func vals(s *State) map[string]string {
	out := map[string]string{}
	for k, r := range s.Rows("t") {
		out[k] = string(r["v"])
	}
	return out
}

func mustApply(t *testing.T, s *State, evs ...Event) {
	t.Helper()
	for _, e := range evs {
		if err := s.apply(e); err != nil {
			t.Fatalf("%+v: %v", e, err)
		}
	}
}

// A snapshot is built aside: until its snapshot-end Rows shows the state
// before it; then the rows and the catch-up changes replace it at once.
func TestStateSnapshotIsAtomic(t *testing.T) {
	s := stateWith("t")
	mustApply(t, s,
		Event{Type: EventSnapshotBegin, Topic: "t"},
		ev(EventRow, `{"op":"read","key":{"id":1},"after":{"id":1,"v":"a"}}`),
		ev(EventRow, `{"op":"read","key":{"id":2},"after":{"id":2,"v":"b"}}`),
		ev(EventChange, `{"op":"delete","key":{"id":2}}`), // committed while the rows were read
	)
	if ok, _ := s.Ready("t"); ok || s.Len("t") != 0 {
		t.Fatalf("half a snapshot is visible: ready %v, %v", ok, vals(s))
	}
	mustApply(t, s, Event{Type: EventSnapshotEnd, Topic: "t", Cursor: "c1"})
	if ok, cur := s.Ready("t"); !ok || cur != "c1" || !maps.Equal(vals(s), map[string]string{`{"id":1}`: `"a"`}) {
		t.Fatalf("after snapshot-end: ready %v cursor %q rows %v", ok, cur, vals(s))
	}
	// A second snapshot (a resync answered by the node) keeps the old
	// rows visible until it ends.
	mustApply(t, s, Event{Type: EventSnapshotBegin, Topic: "t", Reason: "resync"},
		ev(EventRow, `{"op":"read","key":{"id":3},"after":{"id":3,"v":"c"}}`))
	if !maps.Equal(vals(s), map[string]string{`{"id":1}`: `"a"`}) {
		t.Fatalf("during the second snapshot: %v", vals(s))
	}
	mustApply(t, s, Event{Type: EventSnapshotEnd, Topic: "t", Cursor: "c2"})
	if !maps.Equal(vals(s), map[string]string{`{"id":3}`: `"c"`}) {
		t.Fatalf("after the second snapshot: %v", vals(s))
	}
}

// Changes by op: insert, update with and without a key change, unchanged
// TOAST columns kept, FULL identity (the whole row as key and before),
// delete, truncate; ops State does not know leave the rows alone; a live
// change's cursor becomes the state's.
func TestStateAppliesChanges(t *testing.T) {
	s := stateWith("t")
	mustApply(t, s, Event{Type: EventSnapshotBegin, Topic: "t"}, Event{Type: EventSnapshotEnd, Topic: "t", Cursor: "c0"})
	live := func(env, cursor string) Event { e := ev(EventChange, env); e.Cursor, e.End = cursor, true; return e }
	mustApply(t, s,
		live(`{"op":"insert","key":{"id":1},"after":{"id":1,"v":"a","doc":"big"}}`, "c1"),
		live(`{"op":"insert","key":{"a":1,"b":2},"after":{"a":1,"b":2,"v":"ab"}}`, "c2"),
		// The same key spelled with its columns in another order.
		live(`{"op":"update","key":{"b":2, "a":1},"after":{"a":1,"b":2,"v":"ab2"}}`, "c3"),
		// doc was not sent (unchanged TOAST): the state keeps it.
		live(`{"op":"update","key":{"id":1},"after":{"id":1,"v":"a2"},"unchanged":["doc"]}`, "c4"),
		// A key change: before holds the old key.
		live(`{"op":"update","key":{"id":9},"before":{"id":1},"after":{"id":9,"v":"a3"},"unchanged":["doc"]}`, "c5"),
		live(`{"op":"message","prefix":"x","content":"y"}`, "c6"),
		live(`{"op":"some-op-of-a-later-version","key":{"id":9}}`, "c7"),
	)
	rows := s.Rows("t")
	if len(rows) != 2 || string(rows[`{"id":9}`]["v"]) != `"a3"` || string(rows[`{"id":9}`]["doc"]) != `"big"` || string(rows[`{"a":1,"b":2}`]["v"]) != `"ab2"` {
		t.Fatalf("rows %v", rows)
	}
	if _, cur := s.Ready("t"); cur != "c7" {
		t.Fatalf("cursor %q, want c7", cur)
	}
	// FULL identity: key and before are the whole row.
	mustApply(t, s,
		live(`{"op":"insert","key":{"id":5,"v":"x"},"after":{"id":5,"v":"x"}}`, "c8"),
		live(`{"op":"update","key":{"id":5,"v":"y"},"before":{"id":5,"v":"x"},"after":{"id":5,"v":"y"}}`, "c9"),
	)
	if got := vals(s); got[`{"id":5,"v":"y"}`] != `"y"` || len(got) != 3 {
		t.Fatalf("FULL update: %v", got)
	}
	mustApply(t, s, live(`{"op":"delete","key":{"id":5,"v":"y"}}`, "c10"), live(`{"op":"delete","key":{"id":9}}`, "c11"))
	if got := slices.Sorted(maps.Keys(vals(s))); !slices.Equal(got, []string{`{"a":1,"b":2}`}) {
		t.Fatalf("after deletes: %v", got)
	}
	mustApply(t, s, live(`{"op":"truncate","truncate":{"cascade":false,"restartIdentity":false}}`, "c12"))
	if s.Len("t") != 0 {
		t.Fatalf("after truncate: %v", vals(s))
	}
}

// What State cannot apply is an error, not a silent guess.
func TestStateRejectsBadEnvelopes(t *testing.T) {
	s := stateWith("t")
	for _, bad := range []Event{
		ev(EventRow, `{"op":"read","key":{"id":1},"after":{"id":1}}`), // a row outside a snapshot
		ev(EventChange, `not json`),
		ev(EventChange, `{"op":"insert","after":{"id":1}}`),     // no key
		ev(EventChange, `{"op":"update","key":{"id":1}}`),       // no after
		ev(EventChange, `{"op":"insert","key":[1],"after":{}}`), // a key that is not an object
	} {
		bad.End = true
		if err := s.apply(bad); err == nil {
			t.Errorf("%s: applied", bad.Change)
		}
	}
	if s.Len("t") != 0 {
		t.Fatalf("rows %v", vals(s))
	}
	// Topics State does not follow are ignored.
	if err := s.apply(Event{Type: EventChange, Topic: "other", Change: json.RawMessage(`garbage`)}); err != nil {
		t.Fatal(err)
	}
}

// A transaction's changes reach Rows together: the ones before its end are
// held and applied with the last (Event.End), under one lock.
func TestStateAppliesTransactionsWhole(t *testing.T) {
	s := stateWith("t")
	mustApply(t, s, Event{Type: EventSnapshotBegin, Topic: "t"}, Event{Type: EventSnapshotEnd, Topic: "t", Cursor: "c0"})
	mustApply(t, s,
		ev(EventChange, `{"op":"insert","key":{"id":1},"after":{"id":1,"v":"a"}}`),
		ev(EventChange, `{"op":"insert","key":{"id":2},"after":{"id":2,"v":"b"}}`))
	if s.Len("t") != 0 {
		t.Fatalf("half a transaction is visible: %v", vals(s))
	}
	end := ev(EventChange, `{"op":"delete","key":{"id":1}}`)
	end.Cursor, end.End = "c1", true
	mustApply(t, s, end)
	if ok, cur := s.Ready("t"); !ok || cur != "c1" || !maps.Equal(vals(s), map[string]string{`{"id":2}`: `"b"`}) {
		t.Fatalf("after the transaction: cursor %q rows %v", cur, vals(s))
	}
	// A resync drops a transaction whose end never came.
	mustApply(t, s, ev(EventChange, `{"op":"insert","key":{"id":3},"after":{"id":3,"v":"c"}}`),
		Event{Type: EventResync, Topic: "t", Cursor: "c2"}, end)
	if !maps.Equal(vals(s), map[string]string{`{"id":2}`: `"b"`}) {
		t.Fatalf("after a resync: %v", vals(s))
	}
}

// A row that leaves a filter comes as a delete of its old key marked
// "left":"filter" (key and before the old key, no after): State removes it,
// inside a transaction as well as at its end.
func TestStateAppliesRemovals(t *testing.T) {
	s := stateWith("t")
	mustApply(t, s, Event{Type: EventSnapshotBegin, Topic: "t"},
		ev(EventRow, `{"op":"read","key":{"id":1},"after":{"id":1,"v":"a"}}`),
		ev(EventRow, `{"op":"read","key":{"id":2},"after":{"id":2,"v":"b"}}`),
		ev(EventRow, `{"op":"read","key":{"id":3},"after":{"id":3,"v":"c"}}`),
		Event{Type: EventSnapshotEnd, Topic: "t", Cursor: "c0"})
	end := ev(EventChange, `{"op":"delete","key":{"id":2},"before":{"id":2},"left":"filter"}`)
	end.Cursor, end.End = "c1", true
	mustApply(t, s, ev(EventChange, `{"op":"delete","key":{"id":1},"before":{"id":1},"left":"filter"}`), end)
	if !maps.Equal(vals(s), map[string]string{`{"id":3}`: `"c"`}) {
		t.Fatalf("after removals: %v", vals(s))
	}
}
