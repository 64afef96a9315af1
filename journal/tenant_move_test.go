package journal

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/walcast/walcast/decoder"
)

// upd is an update of entity's key to tenant (nil: none) as the decoder
// gives it under REPLICA IDENTITY DEFAULT: the old row's tenant not sent.
func upd(entity, key string, tenant *string) chg {
	c := chg{entity: entity, op: decoder.OpUpdate, key: key, state: decoder.TenantNone, oldState: decoder.TenantUnresolved, tenanted: true}
	if tenant != nil {
		c.tenant, c.state = *tenant, decoder.TenantKnown
	}
	return c
}

// tins is an insert of entity's key in tenant (nil: none), the entity
// having a tenant column.
func tins(entity, key string, tenant *string) chg {
	c := chg{entity: entity, op: decoder.OpInsert, key: key, tenanted: true}
	if tenant != nil {
		c.tenant, c.state = *tenant, decoder.TenantKnown
	}
	return c
}

func strp(s string) *string { return &s }

// seen renders entries as `op key tenant[ moved]`, tenant `-` for none.
func seen(t *testing.T, es []Entry) string {
	t.Helper()
	var out []string
	for _, e := range es {
		env := decodeEnv(t, e)
		var raw map[string]json.RawMessage
		_ = json.Unmarshal(e.Envelope, &raw)
		key, _ := json.Marshal(env.Key)
		tenant := "-"
		if e.HasTenant {
			tenant = fmt.Sprintf("%q", e.Tenant)
		}
		s := fmt.Sprintf("%s %s %s", e.Op, key, tenant)
		if m, ok := raw["moved"]; ok {
			s += " moved=" + string(m)
			if string(raw["before"]) != string(raw["key"]) || raw["after"] != nil {
				t.Errorf("moved delete %s: before must be the key, no after", e.Envelope)
			}
		}
		out = append(out, s)
	}
	return strings.Join(out, "\n")
}

// TestTenantMove: an update that moves a row to another tenant is
// journaled as a delete of the row in its old tenant ("moved":"tenant")
// followed by the update in the new one, whether the old tenant comes from
// the old row (REPLICA IDENTITY FULL) or from the newest journaled change of
// the old key (DEFAULT, also across a key change and within one batch), to
// and from no tenant, with the empty tenant distinct from none; readers
// scoped to either tenant, unscoped and AllTenants see what docs/sync.md
// says.
//
// Keys are looked up in the journal (cache off) or, having been journaled
// by this process, in its cache; both must give the same journal.
// The streamed append path (a batch past the one-round-trip budget) must
// write the same.
func TestTenantMove(t *testing.T) {
	for _, c := range []struct{ cache, streamed bool }{{true, false}, {false, false}, {false, true}} {
		t.Run(fmt.Sprintf("cache=%v,streamed=%v", c.cache, c.streamed), func(t *testing.T) { testTenantMove(t, c.cache, c.streamed) })
	}
}

func testTenantMove(t *testing.T, cache, streamed bool) {
	j, gen, _ := newJournal(t)
	if !cache {
		j.keys.max = 0
	}
	if streamed {
		j.oneShotBytes = 1
	}
	const docs, full, nulls = "public.docs", "public.full", "public.nulls"
	var end decoder.LSN = 1000
	tx := func(cs ...chg) *decoder.Transaction {
		end += 100
		return mkTx(uint32(end), end, testEpoch, cs...)
	}
	a, b := strp("a"), strp("b")

	// From no tenant first, in an entity whose first change has no tenant
	// (its keys are findable all the same).
	mustAppend(t, j, gen, tx(tins(nulls, `{"id":5}`, nil)))
	mustAppend(t, j, gen,
		tx(tins(docs, `{"id":1}`, a), tins(docs, `{"id":2}`, a), tins(docs, `{"id":4}`, a), tins(docs, `{"id":6}`, strp(""))))
	// A row a snapshot backfill read (walcast snapshot start) is known too.
	read := tins(docs, `{"id":10}`, a)
	read.op = decoder.OpRead
	mustAppend(t, j, gen, tx(read))
	moves := []struct {
		name  string
		txs   []*decoder.Transaction
		moved int
	}{
		{"DEFAULT", []*decoder.Transaction{tx(upd(docs, `{"id":1}`, b))}, 1},
		{"no move", []*decoder.Transaction{tx(upd(docs, `{"id":1}`, b))}, 0},
		{"key change", []*decoder.Transaction{tx(func() chg { c := upd(docs, `{"id":20}`, b); c.oldKey = `{"id":2}`; return c }())}, 1},
		{"one batch", []*decoder.Transaction{tx(tins(docs, `{"id":3}`, a)), tx(upd(docs, `{"id":3}`, b), upd(docs, `{"id":3}`, a))}, 2},
		{"to none", []*decoder.Transaction{tx(upd(docs, `{"id":4}`, nil))}, 1},
		{"from none", []*decoder.Transaction{tx(upd(nulls, `{"id":5}`, a))}, 1},
		{"empty to none", []*decoder.Transaction{tx(upd(docs, `{"id":6}`, nil))}, 1},
		{"old tenant unknown", []*decoder.Transaction{tx(upd(docs, `{"id":7}`, b))}, 0},
		{"backfilled", []*decoder.Transaction{tx(upd(docs, `{"id":10}`, b))}, 1},
		{"FULL", []*decoder.Transaction{tx(chg{entity: full, op: decoder.OpUpdate, key: `{"id":8,"t":"b"}`, oldKey: `{"id":8,"t":"a"}`,
			tenant: "b", state: decoder.TenantKnown, oldTenant: "a", oldState: decoder.TenantKnown, tenanted: true})}, 1},
		{"without the old row's state", []*decoder.Transaction{tx(chg{entity: "public.legacy", op: decoder.OpUpdate, key: `{"id":9}`,
			tenant: "b", state: decoder.TenantKnown})}, 0},
	}
	for _, m := range moves {
		if res := mustAppend(t, j, gen, m.txs...); res.Moved != m.moved {
			t.Errorf("%s: Moved %d, want %d (%+v)", m.name, res.Moved, m.moved, res)
		}
	}
	// A key-only delete of the moved key routes to its new tenant.
	if res := mustAppend(t, j, gen, tx(chg{entity: docs, op: decoder.OpDelete, key: `{"id":20}`, state: decoder.TenantUnresolved, tenanted: true})); res.TenantUnknown != 0 {
		t.Errorf("delete of the moved key: %+v", res)
	}

	all, _ := readAll(t, j, Query{AllTenants: true})
	entitySeq := map[string]int64{}
	for i, e := range all {
		entitySeq[e.Entity]++
		if e.Seq != int64(i+1) || e.EntitySeq != entitySeq[e.Entity] {
			t.Fatalf("entry %d: seq %d entitySeq %d", i, e.Seq, e.EntitySeq)
		}
	}
	want := map[string]string{
		"all": `insert {"id":5} -
insert {"id":1} "a"
insert {"id":2} "a"
insert {"id":4} "a"
insert {"id":6} ""
read {"id":10} "a"
delete {"id":1} "a" moved="tenant"
update {"id":1} "b"
update {"id":1} "b"
delete {"id":2} "a" moved="tenant"
update {"id":20} "b"
insert {"id":3} "a"
delete {"id":3} "a" moved="tenant"
update {"id":3} "b"
delete {"id":3} "b" moved="tenant"
update {"id":3} "a"
delete {"id":4} "a" moved="tenant"
update {"id":4} -
delete {"id":5} - moved="tenant"
update {"id":5} "a"
delete {"id":6} "" moved="tenant"
update {"id":6} -
update {"id":7} "b"
delete {"id":10} "a" moved="tenant"
update {"id":10} "b"
delete {"id":8,"t":"a"} "a" moved="tenant"
update {"id":8,"t":"b"} "b"
update {"id":9} "b"
delete {"id":20} "b"`,
		"a": `insert {"id":5} -
insert {"id":1} "a"
insert {"id":2} "a"
insert {"id":4} "a"
read {"id":10} "a"
delete {"id":1} "a" moved="tenant"
delete {"id":2} "a" moved="tenant"
insert {"id":3} "a"
delete {"id":3} "a" moved="tenant"
update {"id":3} "a"
delete {"id":4} "a" moved="tenant"
update {"id":4} -
delete {"id":5} - moved="tenant"
update {"id":5} "a"
update {"id":6} -
delete {"id":10} "a" moved="tenant"
delete {"id":8,"t":"a"} "a" moved="tenant"`,
		"b": `insert {"id":5} -
update {"id":1} "b"
update {"id":1} "b"
update {"id":20} "b"
update {"id":3} "b"
delete {"id":3} "b" moved="tenant"
update {"id":4} -
delete {"id":5} - moved="tenant"
update {"id":6} -
update {"id":7} "b"
update {"id":10} "b"
update {"id":8,"t":"b"} "b"
update {"id":9} "b"
delete {"id":20} "b"`,
		"": `insert {"id":5} -
update {"id":4} -
delete {"id":5} - moved="tenant"
update {"id":6} -`,
	}
	for _, scope := range []string{"all", "a", "b", ""} {
		es := all
		if scope != "all" {
			es, _ = readAll(t, j, Query{Tenant: scope})
		}
		if got := seen(t, es); got != want[scope] {
			t.Errorf("reader %q sees:\n%s\nwant:\n%s", scope, got, want[scope])
		}
	}
}

// TestTenantMoveAfterAnotherAppender: a process that appended again after
// another one did forgets the keys it remembered, or it would take a row's
// old tenant from before the other's changes.
func TestTenantMoveAfterAnotherAppender(t *testing.T) {
	j1, gen1, url := newJournal(t)
	const docs = "public.docs"
	a, b, c := strp("a"), strp("b"), strp("c")
	mustAppend(t, j1, gen1, mkTx(1, 100, testEpoch, tins(docs, `{"id":1}`, a)))
	j2 := openAt(t, url)
	gen2, err := j2.Acquire(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if res := mustAppend(t, j2, gen2, mkTx(2, 200, testEpoch, upd(docs, `{"id":1}`, b))); res.Moved != 1 {
		t.Fatalf("the second appender's move: %+v", res)
	}
	gen3, err := j1.Acquire(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if res := mustAppend(t, j1, gen3, mkTx(3, 300, testEpoch, upd(docs, `{"id":1}`, c))); res.Moved != 1 {
		t.Fatalf("the first appender's move: %+v", res)
	}
	all, _ := readAll(t, j1, Query{AllTenants: true})
	want := `insert {"id":1} "a"
delete {"id":1} "a" moved="tenant"
update {"id":1} "b"
delete {"id":1} "b" moved="tenant"
update {"id":1} "c"`
	if got := seen(t, all); got != want {
		t.Fatalf("journal:\n%s\nwant:\n%s", got, want)
	}
}
