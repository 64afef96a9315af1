package decoder

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

const head = `","commitLsn":"0/2000","xid":700,"commitTime":"2026-11-29T23:21:24.123456Z"`

var usersCols = []col{{"id", 23, true}, {"name", 25, false}, {"doc", 3802, false}}

func TestInsertUpdateDeleteBodies(t *testing.T) {
	f := newFeeder(t, Config{})
	f.feed(
		originMsg(0x99, "upstream"),
		beginMsg(700, 0x1F00),
		relationMsg(false, 0, 16400, "public", "users", 'd', usersCols...),
		insertMsg(false, 0, 16400, "1", "ann", `{"a": [1, 2]}`),
		updateMsg(false, 0, 16400, 0, nil, "1", "anne", unchangedToast),
		updateMsg(false, 0, 16400, 'K', []any{"1", nil, nil}, "2", "anne", nil),
		deleteMsg(false, 0, 16400, 'K', "2", nil, nil),
		commitMsg(0x1F00, 0x2000),
	)
	got := f.take()
	want := [][]string{{
		`{"lsn":"0/1030` + head + `,"entity":"public.users","op":"insert","key":{"id":1},"after":{"id":1,"name":"ann","doc":{"a": [1, 2]}}}`,
		`{"lsn":"0/1040` + head + `,"entity":"public.users","op":"update","key":{"id":1},"after":{"id":1,"name":"anne"},"unchanged":["doc"]}`,
		`{"lsn":"0/1050` + head + `,"entity":"public.users","op":"update","key":{"id":2},"before":{"id":1},"after":{"id":2,"name":"anne","doc":null}}`,
		`{"lsn":"0/1060` + head + `,"entity":"public.users","op":"delete","key":{"id":2},"before":{"id":2}}`,
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got[0], "\n"), strings.Join(want[0], "\n"))
	}
	if !f.d.Idle() {
		t.Fatal("decoder not idle after commit and take")
	}
}

func TestReplicaIdentityFull(t *testing.T) {
	f := newFeeder(t, Config{})
	full := []col{{"id", 23, true}, {"big", 25, true}, {"n", 23, true}}
	f.feed(
		beginMsg(700, 0x1F00),
		relationMsg(false, 0, 1, "s", "t", 'f', full...),
		// Unchanged TOAST in the new row is filled from the old row.
		updateMsg(false, 0, 1, 'O', []any{"1", "xxx", "5"}, "1", unchangedToast, "6"),
		// Without an old value it stays unchanged, never null.
		updateMsg(false, 0, 1, 'O', []any{"1", unchangedToast, "6"}, "1", unchangedToast, "7"),
		deleteMsg(false, 0, 1, 'O', "1", "xxx", "7"),
		commitMsg(0x1F00, 0x2000),
	)
	got := f.take()[0]
	want := []string{
		`{"lsn":"0/1020` + head + `,"entity":"s.t","op":"update","key":{"id":1,"big":"xxx","n":6},"before":{"id":1,"big":"xxx","n":5},"after":{"id":1,"big":"xxx","n":6}}`,
		`{"lsn":"0/1030` + head + `,"entity":"s.t","op":"update","key":{"id":1,"n":7},"before":{"id":1,"n":6},"after":{"id":1,"n":7},"unchanged":["big"]}`,
		`{"lsn":"0/1040` + head + `,"entity":"s.t","op":"delete","key":{"id":1,"big":"xxx","n":7},"before":{"id":1,"big":"xxx","n":7}}`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestNoKeyRelation(t *testing.T) {
	f := newFeeder(t, Config{})
	f.feed(
		beginMsg(700, 0x1F00),
		relationMsg(false, 0, 1, "s", "nokey", 'n', col{"v", 25, false}),
		insertMsg(false, 0, 1, "x"),
		commitMsg(0x1F00, 0x2000),
	)
	got := f.take()[0][0]
	if want := `{"lsn":"0/1020` + head + `,"entity":"s.nokey","op":"insert","after":{"v":"x"}}`; got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}

func TestTruncate(t *testing.T) {
	f := newFeeder(t, Config{SkipRelations: map[uint32]bool{3: true}})
	f.feed(
		beginMsg(700, 0x1F00),
		relationMsg(false, 0, 1, "public", "a", 'd', col{"id", 23, true}),
		relationMsg(false, 0, 2, "public", "b", 'd', col{"id", 23, true}),
		relationMsg(false, 0, 3, "walcast", "journal", 'd', col{"id", 23, true}),
		truncateMsg(false, 0, 3, 1, 3, 2),
		truncateMsg(false, 0, 0, 1),
		commitMsg(0x1F00, 0x2000),
	)
	got := f.take()[0]
	want := []string{
		`{"lsn":"0/1040` + head + `,"entity":"public.a","op":"truncate","truncate":{"cascade":true,"restartIdentity":true}}`,
		`{"lsn":"0/1040` + head + `,"entity":"public.b","op":"truncate","truncate":{"cascade":true,"restartIdentity":true}}`,
		`{"lsn":"0/1050` + head + `,"entity":"public.a","op":"truncate","truncate":{"cascade":false,"restartIdentity":false}}`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestJournalRelationsDropped: journal tables are skipped by relation OID,
// never by schema name, so a table in a schema that happens to share the
// journal's name (the journal living in another database) is data.
func TestJournalRelationsDropped(t *testing.T) {
	f := newFeeder(t, Config{SkipRelations: map[uint32]bool{1: true}})
	f.feed(
		beginMsg(700, 0x1F00),
		relationMsg(false, 0, 1, "walcast", "entries", 'd', col{"id", 23, true}),
		relationMsg(false, 0, 2, "walcast", "x", 'd', col{"id", 23, true}),
		insertMsg(false, 0, 1, "1"),
		updateMsg(false, 0, 1, 0, nil, "1"),
		deleteMsg(false, 0, 1, 'K', "1"),
		insertMsg(false, 0, 2, "1"),
		commitMsg(0x1F00, 0x2000),
	)
	got := f.take()
	if len(got) != 1 || len(got[0]) != 1 || !strings.Contains(got[0][0], `"entity":"walcast.x"`) {
		t.Fatalf("got %q", got)
	}
}

func TestMessages(t *testing.T) {
	f := newFeeder(t, Config{})
	f.feed(
		messageMsg(false, 0, false, 0x1000, "walcast.ping", "not json"),
		messageMsg(false, 0, false, 0x1010, "other.ping", "{}"),
		beginMsg(700, 0x1F00),
		messageMsg(false, 0, true, 0x1030, "walcast.evt", `{"k":"v"}`),
		messageMsg(false, 0, true, 0x1040, "walcastX", `{}`),
		commitMsg(0x1F00, 0x2000),
	)
	got := f.take()
	want := [][]string{
		{`{"lsn":"0/1000","commitLsn":"0/1000","xid":0,"commitTime":"2026-11-29T23:21:24.123456Z","entity":"walcast.ping","op":"message","prefix":"walcast.ping","content":"bm90IGpzb24=","transactional":false}`},
		{`{"lsn":"0/1030` + head + `,"entity":"walcast.evt","op":"message","prefix":"walcast.evt","content":{"k":"v"},"transactional":true}`},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
}

func TestTypesFromTypeMessages(t *testing.T) {
	f := newFeeder(t, Config{})
	f.feed(
		beginMsg(700, 0x1F00),
		typeMsg(false, 0, 20001, "public", "mood"),
		typeMsg(false, 0, 20002, "public", "_mood"),
		relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 23, true}, col{"m", 20001, false}, col{"ms", 20002, false}, col{"x", 99999, false}),
		insertMsg(false, 0, 1, "1", "happy", `{happy,"very sad",NULL}`, "(1,2)"),
		commitMsg(0x1F00, 0x2000),
	)
	got := f.take()[0][0]
	want := `"after":{"id":1,"m":"happy","ms":["happy","very sad",null],"x":"(1,2)"}}`
	if !strings.HasSuffix(got, want) {
		t.Fatalf("got %s\nwant suffix %s", got, want)
	}
}

func TestRelationChangesMidStream(t *testing.T) {
	f := newFeeder(t, Config{})
	f.feed(
		beginMsg(700, 0x1F00),
		relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 23, true}, col{"a", 25, false}),
		insertMsg(false, 0, 1, "1", "x"),
		relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 23, true}, col{"a", 23, false}, col{"b", 16, false}),
		insertMsg(false, 0, 1, "2", "5", "t"),
		relationMsg(false, 0, 1, "public", "t2", 'd', col{"id", 23, true}),
		insertMsg(false, 0, 1, "3"),
		commitMsg(0x1F00, 0x2000),
	)
	got := f.take()[0]
	for i, want := range []string{
		`"entity":"public.t","op":"insert","key":{"id":1},"after":{"id":1,"a":"x"}}`,
		`"entity":"public.t","op":"insert","key":{"id":2},"after":{"id":2,"a":5,"b":true}}`,
		`"entity":"public.t2","op":"insert","key":{"id":3},"after":{"id":3}}`,
	} {
		if !strings.HasSuffix(got[i], want) {
			t.Errorf("change %d: %s\nwant suffix %s", i, got[i], want)
		}
	}
}

func TestTenant(t *testing.T) {
	f := newFeeder(t, Config{TenantColumn: "org"})
	cols := []col{{"id", 23, true}, {"org", 25, false}, {"v", 25, false}}
	f.feed(
		beginMsg(700, 0x1F00),
		relationMsg(false, 0, 1, "public", "t", 'd', cols...),
		relationMsg(false, 0, 2, "public", "plain", 'd', col{"id", 23, true}),
		relationMsg(false, 0, 3, "public", "full", 'f', col{"id", 23, true}, col{"org", 25, true}),
		insertMsg(false, 0, 1, "1", "acme", "x"),
		insertMsg(false, 0, 1, "2", nil, "x"),
		updateMsg(false, 0, 1, 0, nil, "1", unchangedToast, "y"),
		updateMsg(false, 0, 1, 'K', []any{"9", nil, nil}, "1", unchangedToast, "y"),
		deleteMsg(false, 0, 1, 'K', "1", nil, nil),
		insertMsg(false, 0, 2, "1"),
		deleteMsg(false, 0, 3, 'O', "1", "acme"),
		commitMsg(0x1F00, 0x2000),
	)
	txs := f.d.Committed(nil)
	if len(txs) != 1 {
		t.Fatalf("%d transactions", len(txs))
	}
	var states []TenantState
	var tenants []string
	it := txs[0].Changes()
	for it.Next() {
		c := it.Change()
		checkChange(t, c)
		states = append(states, c.TenantState)
		tenants = append(tenants, c.Tenant)
	}
	wantS := []TenantState{TenantKnown, TenantNone, TenantUnresolved, TenantUnresolved, TenantUnresolved, TenantNone, TenantKnown}
	wantT := []string{"acme", "", "", "", "", "", "acme"}
	if !reflect.DeepEqual(states, wantS) || !reflect.DeepEqual(tenants, wantT) {
		t.Fatalf("states %v tenants %q", states, tenants)
	}
}

// TestStreamedInterleaved: two streamed transactions interleave with each
// other and with an ordinary one; each is assembled in its own order and
// delivered at its commit.
func TestStreamedInterleaved(t *testing.T) {
	f := newFeeder(t, Config{})
	rel := func(x uint32) []byte { return relationMsg(true, x, 1, "public", "t", 'd', col{"id", 23, true}) }
	f.feed(
		streamStartMsg(10, true), rel(10), insertMsg(true, 10, 1, "1"), insertMsg(true, 10, 1, "2"), streamStopMsg(),
		streamStartMsg(20, true), rel(20), insertMsg(true, 20, 1, "100"), streamStopMsg(),
		beginMsg(30, 0x1F00), insertMsg(false, 0, 1, "300"), commitMsg(0x1F00, 0x2000),
		streamStartMsg(10, false), insertMsg(true, 11, 1, "3"), streamStopMsg(),
		streamStartMsg(20, false), insertMsg(true, 20, 1, "101"), streamStopMsg(),
		streamCommitMsg(20, 0x3000, 0x3010),
		streamStartMsg(10, false), insertMsg(true, 10, 1, "4"), streamStopMsg(),
		streamCommitMsg(10, 0x4000, 0x4010),
	)
	txs := f.d.Committed(nil)
	var got [][]string
	var xids []uint32
	for _, tx := range txs {
		var ids []string
		it := tx.Changes()
		for it.Next() {
			b := string(it.Change().Body)
			ids = append(ids, b[strings.Index(b, `"key":{"id":`)+12:strings.Index(b, `},"after"`)])
		}
		got = append(got, ids)
		xids = append(xids, tx.Xid)
		tx.Close()
	}
	want := [][]string{{"300"}, {"100", "101"}, {"1", "2", "3", "4"}}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(xids, []uint32{30, 20, 10}) {
		t.Fatalf("got %v xids %v", got, xids)
	}
	if txs[2].EndLSN != 0x4010 || txs[2].CommitLSN != 0x4000 || !txs[2].CommitTime.Equal(testTime) {
		t.Fatalf("commit fields %+v", txs[2])
	}
}

// streamSubAbort drives a streamed transaction with a rolled-back
// subtransaction: 3 rows in the top level, 2 in subxact 11 (aborted), 1 in
// subxact 12, with the decoder's budget forcing a spill when budget is small.
func streamSubAbort(t *testing.T, budget int64) (*feeder, []string) {
	dir := t.TempDir()
	f := newFeeder(t, Config{MemoryBudget: budget, SpillDir: dir})
	f.feed(
		streamStartMsg(10, true),
		relationMsg(true, 10, 1, "public", "t", 'd', col{"id", 23, true}, col{"pad", 25, false}),
		insertMsg(true, 10, 1, "1", strings.Repeat("p", 300)),
		insertMsg(true, 10, 1, "2", "p"),
		insertMsg(true, 11, 1, "3", "p"),
		streamStopMsg(),
		streamStartMsg(10, false),
		insertMsg(true, 11, 1, "4", "p"),
		insertMsg(true, 10, 1, "5", "p"),
		streamStopMsg(),
		streamAbortMsg(10, 11),
		streamAbortMsg(10, 99), // a subtransaction that changed nothing
		streamStartMsg(10, false),
		insertMsg(true, 12, 1, "6", "p"),
		streamStopMsg(),
		streamCommitMsg(10, 0x4000, 0x4010),
	)
	txs := f.d.Committed(nil)
	if len(txs) != 1 {
		t.Fatalf("%d transactions", len(txs))
	}
	var ids []string
	for _, b := range bodies(t, txs[0]) {
		ids = append(ids, b[strings.Index(b, `"key":{"id":`)+12:strings.Index(b, `},"after"`)])
	}
	// A second iteration reads the same changes again.
	if again := bodies(t, txs[0]); len(again) != len(ids) {
		t.Fatalf("second iteration: %d changes, first %d", len(again), len(ids))
	}
	spilled := txs[0].spill != nil
	if err := txs[0].Close(); err != nil {
		t.Fatal(err)
	}
	if it := txs[0].Changes(); spilled && (it.Next() || it.Err() == nil) {
		t.Fatal("iterating a closed spilled transaction did not fail")
	}
	return f, ids
}

func TestStreamSubtransactionAbort(t *testing.T) {
	f, ids := streamSubAbort(t, 1<<20)
	if want := []string{"1", "2", "5", "6"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("ids %v, want %v", ids, want)
	}
	if f.d.Stats().Spilled != 0 {
		t.Fatal("spilled under a large budget")
	}
}

func TestStreamSubtransactionAbortSpilled(t *testing.T) {
	f, ids := streamSubAbort(t, 200)
	if want := []string{"1", "2", "5", "6"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("ids %v, want %v", ids, want)
	}
	if f.d.Stats().Spilled != 1 {
		t.Fatalf("spilled %d transactions, want 1", f.d.Stats().Spilled)
	}
	if ents, _ := os.ReadDir(f.d.cfg.SpillDir); len(ents) != 0 {
		t.Fatalf("spill files left after Close: %v", ents)
	}
}

func TestStreamAbortDeletesSpill(t *testing.T) {
	dir := t.TempDir()
	f := newFeeder(t, Config{MemoryBudget: 100, SpillDir: dir})
	f.feed(
		streamStartMsg(10, true),
		relationMsg(true, 10, 1, "public", "t", 'd', col{"id", 23, true}),
		insertMsg(true, 10, 1, "1"), insertMsg(true, 10, 1, "2"),
		streamStopMsg(),
	)
	// Spill files are unlinked as soon as they are created: none is
	// visible, even while the transaction is open.
	if ents, _ := os.ReadDir(dir); len(ents) != 0 || f.d.Stats().Spilled != 1 {
		t.Fatalf("want a spilled transaction and no visible spill file, have %v (spilled %d)", ents, f.d.Stats().Spilled)
	}
	f.feed(streamAbortMsg(10, 10))
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("spill file left after abort: %v", ents)
	}
	if got := f.take(); len(got) != 0 || !f.d.Idle() {
		t.Fatalf("aborted transaction delivered: %v", got)
	}
	// Reset discards a spilled partial transaction too.
	f.feed(
		streamStartMsg(11, true),
		relationMsg(true, 11, 1, "public", "t", 'd', col{"id", 23, true}),
		insertMsg(true, 11, 1, "1"), insertMsg(true, 11, 1, "2"),
	)
	if err := f.d.Reset(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 || !f.d.Idle() {
		t.Fatalf("Reset left spill files %v or state", ents)
	}
	// After Reset the relation cache is empty.
	f.feed(beginMsg(1, 0x100))
	err := f.d.Decode(0x5000, insertMsg(false, 0, 1, "1"))
	if !errors.Is(err, ErrUnknownRelation) {
		t.Fatalf("insert after Reset: %v, want ErrUnknownRelation", err)
	}
}

func TestOrdinaryTransactionSpills(t *testing.T) {
	f := newFeeder(t, Config{MemoryBudget: 4 << 10})
	f.feed(beginMsg(5, 0x1F00), relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 20, true}))
	for i := 0; i < 1000; i++ {
		f.feed(insertMsg(false, 0, 1, utoa(uint32(i))))
	}
	f.feed(commitMsg(0x1F00, 0x2000))
	got := f.take()
	if len(got) != 1 || len(got[0]) != 1000 || f.d.Stats().Spilled != 1 {
		t.Fatalf("%d txs, spilled %d", len(got), f.d.Stats().Spilled)
	}
	if high := f.d.Stats().BufferedHigh; high > 5<<10 {
		t.Fatalf("buffered %d bytes with a 4 KiB budget", high)
	}
	if !strings.Contains(got[0][999], `"key":{"id":999}`) {
		t.Fatalf("last change %s", got[0][999])
	}
}

func TestUnknownMessageSkipped(t *testing.T) {
	f := newFeeder(t, Config{})
	f.feed([]byte("Zwhatever"), originMsg(1, "x"))
	if !f.d.Idle() {
		t.Fatal("not idle")
	}
}

func TestSequenceErrors(t *testing.T) {
	cases := map[string][][]byte{
		"change outside txn":    {relationMsg(false, 0, 1, "s", "t", 'd', col{"id", 23, true}), insertMsg(false, 0, 1, "1")},
		"commit outside":        {commitMsg(1, 2)},
		"nested begin":          {beginMsg(1, 1), beginMsg(2, 2)},
		"chunk without first":   {streamStartMsg(5, false)},
		"stream commit unknown": {streamCommitMsg(5, 1, 2)},
		"stop outside":          {streamStopMsg()},
		"txn message outside":   {messageMsg(false, 0, true, 1, "walcast.x", "{}")},
	}
	for name, msgs := range cases {
		t.Run(name, func(t *testing.T) {
			d := New(Config{SpillDir: t.TempDir()})
			defer d.Close()
			var err error
			for i, m := range msgs {
				if err = d.Decode(LSN(i), m); err != nil {
					break
				}
			}
			var pe *ProtocolError
			if !errors.As(err, &pe) || !errors.Is(err, ErrSequence) {
				t.Fatalf("err = %v, want a ProtocolError wrapping ErrSequence", err)
			}
		})
	}
}

// TestTruncatedMessages cuts every valid message at every length: each cut
// is a ProtocolError naming the type and an offset within the payload.
func TestTruncatedMessages(t *testing.T) {
	rel := relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 23, true}, col{"v", 25, false})
	msgs := [][]byte{
		beginMsg(1, 2), rel, insertMsg(false, 0, 1, "1", "x"),
		updateMsg(false, 0, 1, 'O', []any{"1", "x"}, "1", "y"), deleteMsg(false, 0, 1, 'K', "1", nil),
		truncateMsg(false, 0, 1, 1), messageMsg(false, 0, true, 5, "walcast.m", "{}"),
		typeMsg(false, 0, 20000, "public", "e"), originMsg(7, "o"), commitMsg(1, 2),
		streamStartMsg(3, true), streamCommitMsg(3, 1, 2), streamAbortMsg(3, 3),
	}
	for _, m := range msgs {
		for cut := 1; cut < len(m); cut++ {
			d := New(Config{SpillDir: t.TempDir()})
			if err := d.Decode(0x10, rel); err != nil {
				t.Fatal(err)
			}
			if err := d.Decode(0x20, beginMsg(1, 2)); err != nil {
				t.Fatal(err)
			}
			if m[0] == 'S' || m[0] == 'c' || m[0] == 'A' || m[0] == 'B' {
				d.Reset()
			}
			err := d.Decode(0x30, m[:cut])
			var pe *ProtocolError
			if !errors.As(err, &pe) || pe.Type != m[0] || pe.Offset > cut || pe.WAL != 0x30 {
				t.Fatalf("%q cut at %d: err %v", m[0], cut, err)
			}
			if !errors.Is(err, ErrTruncated) {
				t.Fatalf("%q cut at %d: %v, want ErrTruncated", m[0], cut, err)
			}
			if !strings.Contains(err.Error(), "'"+string(m[0])+"'") || !strings.Contains(err.Error(), "offset") {
				t.Fatalf("error text %q", err)
			}
			d.Close()
		}
	}
}

func TestMalformed(t *testing.T) {
	d := New(Config{SpillDir: t.TempDir()})
	defer d.Close()
	rel := relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 23, true}, col{"v", 25, false})
	for _, m := range [][]byte{rel, beginMsg(1, 2)} {
		if err := d.Decode(1, m); err != nil {
			t.Fatal(err)
		}
	}
	for name, m := range map[string][]byte{
		"column count": insertMsg(false, 0, 1, "1"),
		"column kind":  msgOf('I').u32(1).u8('N').u16(2).u8('x').b,
		"no N":         msgOf('I').u32(1).u8('K').b,
		"delete N":     msgOf('D').u32(1).u8('N').raw(tuple("1", "2")).b,
	} {
		err := d.Decode(2, m)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if err := d.Decode(3, nil); !errors.Is(err, ErrTruncated) {
		t.Errorf("empty payload: %v", err)
	}
}

// TestPayloadNotRetained decodes every message from one reused buffer,
// scribbling over it after each call: the output must not change.
func TestPayloadNotRetained(t *testing.T) {
	d := New(Config{SpillDir: t.TempDir(), TenantColumn: "name", Now: func() time.Time { return testTime }})
	defer d.Close()
	buf := make([]byte, 0, 4096)
	msgs := [][]byte{
		typeMsg(false, 0, 20001, "public", "mood"),
		beginMsg(700, 0x1F00),
		relationMsg(false, 0, 16400, "public", "users", 'd', usersCols...),
		insertMsg(false, 0, 16400, "1", "ann", `{"a": [1, 2]}`),
		messageMsg(false, 0, true, 0x1030, "walcast.evt", `{"k":"v"}`),
		commitMsg(0x1F00, 0x2000),
	}
	for i, m := range msgs {
		buf = append(buf[:0], m...)
		if err := d.Decode(LSN(0x1000+i*0x10), buf); err != nil {
			t.Fatal(err)
		}
		for j := range buf {
			buf[j] = 'X'
		}
	}
	got := bodies(t, d.Committed(nil)[0])
	want := []string{
		`{"lsn":"0/1030` + head + `,"entity":"public.users","op":"insert","key":{"id":1},"after":{"id":1,"name":"ann","doc":{"a": [1, 2]}},"tenant":"ann"}`,
		`{"lsn":"0/1040` + head + `,"entity":"walcast.evt","op":"message","prefix":"walcast.evt","content":{"k":"v"},"transactional":true}`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestSpillDirError: a spill file that cannot be created does not fail
// Decode (the same transaction would fail again after every reconnect):
// the transaction commits as a quarantine entry naming the spill error.
func TestSpillDirError(t *testing.T) {
	d := New(Config{MemoryBudget: 10, SpillDir: "/nonexistent/walcast-spill"})
	defer d.Close()
	for _, m := range [][]byte{beginMsg(1, 2), relationMsg(false, 0, 1, "s", "t", 'd', col{"id", 23, true}), insertMsg(false, 0, 1, "1"), commitMsg(2, 3)} {
		if err := d.Decode(1, m); err != nil {
			t.Fatal(err)
		}
	}
	txs := d.Committed(nil)
	if got := bodies(t, txs[0]); len(got) != 1 || !strings.Contains(got[0], `"reason":"spill-failed"`) || !strings.Contains(got[0], "/nonexistent/walcast-spill") {
		t.Fatalf("got %v, want a quarantine entry naming the spill error", got)
	}
}

// TestStreamedTypeTruncateMessage: Type, Truncate and transactional Message
// messages inside a stream carry the xid prefix; a subtransaction abort
// removes its message and truncate too.
func TestStreamedTypeTruncateMessage(t *testing.T) {
	f := newFeeder(t, Config{})
	f.feed(
		streamStartMsg(10, true),
		typeMsg(true, 10, 20002, "public", "_mood"),
		relationMsg(true, 10, 1, "public", "t", 'd', col{"id", 23, true}, col{"ms", 20002, false}),
		insertMsg(true, 10, 1, "1", "{a,b}"),
		messageMsg(true, 10, true, 0x1030, "walcast.keep", `1`),
		messageMsg(true, 11, true, 0x1040, "walcast.gone", `2`),
		truncateMsg(true, 11, 2, 1),
		truncateMsg(true, 12, 1, 1),
		streamStopMsg(),
		streamAbortMsg(10, 11),
		streamCommitMsg(10, 0x1F00, 0x2000),
	)
	got := f.take()
	h := `","commitLsn":"0/2000","xid":10,"commitTime":"2026-11-29T23:21:24.123456Z"`
	want := [][]string{{
		`{"lsn":"0/1030` + h + `,"entity":"public.t","op":"insert","key":{"id":1},"after":{"id":1,"ms":["a","b"]}}`,
		`{"lsn":"0/1040` + h + `,"entity":"walcast.keep","op":"message","prefix":"walcast.keep","content":1,"transactional":true}`,
		`{"lsn":"0/1070` + h + `,"entity":"public.t","op":"truncate","truncate":{"cascade":true,"restartIdentity":false}}`,
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
}
