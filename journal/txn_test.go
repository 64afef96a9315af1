package journal

import (
	"context"
	"fmt"
	"testing"

	"github.com/walcast/walcast/decoder"
)

// TestTxnEndsByScope: Changes marks the last entry of each transaction
// among the entries of the query's scope, whatever the page size, and
// looks past a scan window that stops inside a transaction (TxnRest).
func TestTxnEndsByScope(t *testing.T) {
	j, gen, _ := newJournal(t)
	const ent = "public.orders"
	c := func(id int, tenant string) chg {
		st := decoder.TenantKnown
		if tenant == "" {
			st = decoder.TenantNone
		}
		return chg{entity: ent, op: decoder.OpInsert, key: fmt.Sprintf(`{"id":%d}`, id), tenant: tenant, state: st}
	}
	other := chg{entity: "public.other", op: decoder.OpInsert, key: `{"id":1}`}
	mustAppend(t, j, gen,
		// seqs 1..6: A, B, none, other, B, A
		mkTx(1, 100, testEpoch, c(1, "A"), c(2, "B"), c(3, ""), other, c(4, "B"), c(5, "A")),
		// seqs 7..9: none, B, B
		mkTx(2, 200, testEpoch, c(6, ""), c(7, "B"), c(8, "B")),
	)
	ends := func(q Query, limit int) map[int64]bool {
		q.Entities, q.FromOldest, q.Limit = []string{ent}, true, limit
		out := map[int64]bool{}
		for range 20 {
			res, err := j.Changes(context.Background(), q)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range res.Changes {
				out[e.Seq] = e.TxnEnd
			}
			if !res.More {
				return out
			}
			q.Cursor, q.FromOldest = res.Cursor, false
		}
		t.Fatal("no end of the journal")
		return nil
	}
	for _, tc := range []struct {
		name string
		q    Query
		want map[int64]bool
	}{
		{"tenant A", Query{Tenant: "A"}, map[int64]bool{1: false, 3: false, 6: true, 7: true}},
		{"tenant B", Query{Tenant: "B"}, map[int64]bool{2: false, 3: false, 5: true, 7: false, 8: false, 9: true}},
		{"no tenant", Query{}, map[int64]bool{3: true, 7: true}},
		{"all tenants", Query{AllTenants: true}, map[int64]bool{1: false, 2: false, 3: false, 5: false, 6: true, 7: false, 8: false, 9: true}},
	} {
		for _, limit := range []int{1, 2, 100} {
			if got := ends(tc.q, limit); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("%s, limit %d: ends %v, want %v", tc.name, limit, got, tc.want)
			}
		}
	}
	// TxnRest: the classes after seq 2 in the first transaction.
	rest, err := j.TxnRest(context.Background(), 2, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := map[TxnMember]int64{{Entity: ent}: 3, {Entity: "public.other"}: 4, {Entity: ent, Tenant: "B", HasTenant: true}: 5, {Entity: ent, Tenant: "A", HasTenant: true}: 6}
	if fmt.Sprint(rest) != fmt.Sprint(want) {
		t.Fatalf("TxnRest %v, want %v", rest, want)
	}
}

// TestTxnEndPastTheScanWindow: a filtered read scans a bounded window; an
// entry whose transaction goes on past it, with another entry of the
// scope beyond the window, is not its transaction's end.
func TestTxnEndPastTheScanWindow(t *testing.T) {
	j, gen, _ := newJournal(t)
	const ent = "public.orders"
	a := func(id int) chg {
		return chg{entity: ent, op: decoder.OpInsert, key: fmt.Sprintf(`{"id":%d}`, id), tenant: "A", state: decoder.TenantKnown}
	}
	chs := []chg{a(1)}
	for i := range int(scanWindow(1)) + 10 {
		chs = append(chs, chg{entity: "public.other", op: decoder.OpInsert, key: fmt.Sprintf(`{"id":%d}`, i)})
	}
	chs = append(chs, a(2))
	mustAppend(t, j, gen, mkTx(1, 100000, testEpoch, chs...))
	q := Query{Entities: []string{ent}, Tenant: "A", FromOldest: true, Limit: 1}
	var ends []bool
	for range 10 {
		res, err := j.Changes(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range res.Changes {
			ends = append(ends, e.TxnEnd)
		}
		if !res.More {
			break
		}
		q.Cursor, q.FromOldest = res.Cursor, false
	}
	if fmt.Sprint(ends) != "[false true]" {
		t.Fatalf("ends %v, want [false true]", ends)
	}
}
