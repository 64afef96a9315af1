package journal

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
)

// chunkJournalFixture appends 3,000 untenanted inserts over three entities
// (in appends of 1,000 and 2,000, so chunks end at the byte or entry bound
// and at each append), then tenanted inserts whose keys a later key-only
// delete must find, and returns every entry as an unscoped reader of all
// tenants sees it.
func chunkJournalFixture(t *testing.T, j *Journal, gen int64, end *decoder.LSN) []Entry {
	t.Helper()
	tx := func(cs ...chg) *decoder.Transaction {
		*end += 100
		return mkTx(uint32(*end), *end, testEpoch, cs...)
	}
	for _, n := range []int{1000, 2000} {
		var txs []*decoder.Transaction
		for i := 0; i < n; i += 10 {
			var cs []chg
			for k := 0; k < 10; k++ {
				c := ins(fmt.Sprintf("public.e%d", (i+k)%3), i+k)
				c.pad = 150
				cs = append(cs, c)
			}
			txs = append(txs, tx(cs...))
		}
		mustAppend(t, j, gen, txs...)
	}
	mustAppend(t, j, gen, tx(tins("public.docs", `{"id":1}`, strp("a")), tins("public.docs", `{"id":2}`, strp("b"))))
	all, _ := readAll(t, j, Query{AllTenants: true})
	if len(all) != 3002 {
		t.Fatalf("fixture: %d entries, want 3002", len(all))
	}
	return all
}

func sameEntries(t *testing.T, what string, got, want []Entry) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d entries, want %d", what, len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Seq != w.Seq || g.Entity != w.Entity || g.EntitySeq != w.EntitySeq || g.Op != w.Op || g.Tenant != w.Tenant ||
			g.HasTenant != w.HasTenant || g.LSN != w.LSN || g.CommitLSN != w.CommitLSN || !g.CommitTime.Equal(w.CommitTime) ||
			g.Xid8 != w.Xid8 || g.HasXid8 != w.HasXid8 || !bytes.Equal(g.Envelope, w.Envelope) {
			t.Fatalf("%s: entry %d\n got %+v\nwant %+v", what, i, g, w)
		}
	}
}

// TestChunkedJournal: entries are stored many to a row, and every read —
// by cursor, by entity, by tenant, by seq, the publisher's — sees each
// entry once, in seq order, across chunk boundaries.
func TestChunkedJournal(t *testing.T) {
	j, gen, url := newJournal(t)
	var end decoder.LSN = 1000
	all := chunkJournalFixture(t, j, gen, &end)
	var chunks, maxN int64
	pgtest.MustQueryRow(t, url, `SELECT count(*), max(last_seq - first_seq + 1) FROM walcast.chunks`, nil, &chunks, &maxN)
	if chunks < 4 || chunks > 100 || maxN > chunkEntries {
		t.Fatalf("%d chunks of at most %d entries for 3,002 entries", chunks, maxN)
	}
	// The publisher's read, from every start.
	for _, after := range []int64{0, 1, 999, 1000, 1023, 1024, 2999} {
		l, err := j.ReadAfterBytes(testCtx(t), after, 50, 0)
		if err != nil {
			t.Fatal(err)
		}
		sameEntries(t, fmt.Sprintf("ReadAfter(%d)", after), l.Entries, all[after:min(after+50, int64(len(all)))])
	}
	// One entity, paged.
	var e1 []Entry
	for _, e := range all {
		if e.Entity == "public.e1" {
			e1 = append(e1, e)
		}
	}
	got, _ := readAll(t, j, Query{Entities: []string{"public.e1"}, Limit: 97})
	sameEntries(t, "entity public.e1", got, e1)
	for _, seq := range []int64{1, 1000, 1001, 3002} {
		e, err := j.EntryAt(testCtx(t), seq)
		if err != nil {
			t.Fatal(err)
		}
		sameEntries(t, fmt.Sprintf("EntryAt(%d)", seq), []Entry{e}, all[seq-1:seq])
	}
	if _, err := j.EntryAt(testCtx(t), 3003); err == nil {
		t.Fatal("EntryAt past the horizon found an entry")
	}
	var n int64
	pgtest.MustQueryRow(t, url, `SELECT count(*) FROM walcast.entries WHERE entity = 'public.e1'`, nil, &n)
	if n != int64(len(e1)) {
		t.Fatalf("the entries view holds %d entries of public.e1, want %d", n, len(e1))
	}
}

// TestChunksMigration: a journal of one row per entry (the form before
// chunks) is regrouped on open: every read returns what it returned
// before, byte for byte; a key journaled before the migration still
// routes a key-only delete to its tenant; appends go on from the next seq.
func TestChunksMigration(t *testing.T) {
	j, gen, url := newJournal(t)
	var end decoder.LSN = 1000
	before := chunkJournalFixture(t, j, gen, &end)
	l0, err := j.ReadAfterBytes(testCtx(t), 990, 40, 0)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.MustExec(t, url, unchunkSQL)
	var rows int64
	pgtest.MustQueryRow(t, url, `SELECT count(*) FROM walcast.entries`, nil, &rows)
	if rows != 3002 {
		t.Fatalf("the entries table of the old form holds %d rows", rows)
	}

	j2 := openAt(t, url)
	j2.keys.max = 0 // tenants of keys come from the journal, not a cache
	gen2, err := j2.Acquire(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	var kind string
	pgtest.MustQueryRow(t, url, `SELECT relkind::text FROM pg_class WHERE oid = 'walcast.entries'::regclass`, nil, &kind)
	if kind != "v" {
		t.Fatalf("walcast.entries is of kind %q after the migration, want a view", kind)
	}
	after, _ := readAll(t, j2, Query{AllTenants: true})
	sameEntries(t, "after the migration", after, before)
	l1, err := j2.ReadAfterBytes(testCtx(t), 990, 40, 0)
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, "ReadAfter after the migration", l1.Entries, l0.Entries)

	end += 100
	del := chg{entity: "public.docs", op: decoder.OpDelete, key: `{"id":2}`, state: decoder.TenantUnresolved, tenanted: true}
	res := mustAppend(t, j2, gen2, mkTx(uint32(end), end, testEpoch, del))
	if res.FirstSeq != 3003 || res.TenantUnknown != 0 {
		t.Fatalf("append after the migration: %+v", res)
	}
	e, err := j2.EntryAt(testCtx(t), 3003)
	if err != nil {
		t.Fatal(err)
	}
	if !e.HasTenant || e.Tenant != "b" {
		t.Fatalf("key-only delete after the migration: tenant %q (%v), want b", e.Tenant, e.HasTenant)
	}
}

// TestChunkPartlyPruned: retention moves the floor entry by entry inside a
// chunk; no read returns an entry below the floor, and the chunk goes once
// the floor passes its end.
func TestChunkPartlyPruned(t *testing.T) {
	j, gen, url := newJournal(t)
	var end decoder.LSN = 1000
	all := chunkJournalFixture(t, j, gen, &end)
	if _, err := j.Prune(testCtx(t), Retention{MaxRows: 3002 - 500, BatchSize: 10000}); err != nil {
		t.Fatal(err)
	}
	got, _ := readAll(t, j, Query{AllTenants: true})
	sameEntries(t, "after pruning 500", got, all[500:])
	if _, err := j.EntryAt(testCtx(t), 500); err == nil {
		t.Fatal("EntryAt(500) found a pruned entry")
	}
	var first, n int64
	pgtest.MustQueryRow(t, url, `SELECT min(first_seq), (SELECT count(*) FROM walcast.entries) FROM walcast.chunks`, nil, &first, &n)
	if first > 501 || n != 3002-500 {
		t.Fatalf("first stored seq %d, view rows %d", first, n)
	}
	if _, err := j.Prune(testCtx(t), Retention{MaxRows: 2, BatchSize: 10000}); err != nil {
		t.Fatal(err)
	}
	pgtest.MustQueryRow(t, url, `SELECT min(first_seq), (SELECT count(*) FROM walcast.entries) FROM walcast.chunks`, nil, &first, &n)
	if first < 2000 || n != 2 {
		t.Fatalf("after pruning all but 2: first stored seq %d, view rows %d", first, n)
	}
}
