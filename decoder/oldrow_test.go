package decoder

import (
	"fmt"
	"testing"
)

// oldRow is what a change says of the row an update replaced.
type oldRow struct {
	tenanted bool
	oldKey   string
	state    TenantState
	tenant   string
}

func oldRows(t *testing.T, tx *Transaction) []oldRow {
	t.Helper()
	var out []oldRow
	it := tx.Changes()
	for it.Next() {
		c := it.Change()
		checkChange(t, c)
		out = append(out, oldRow{c.Tenanted, string(c.OldKey), c.OldTenantState, c.OldTenant})
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestUpdateOldRow: an update says what the journal needs to see a row
// change tenant — the old key when Postgres sent one that differs (a key
// change, REPLICA IDENTITY FULL), the old tenant when the old row carried
// the tenant column — the same in memory, spilled and copied by a
// TxBuilder; every change of an entity with a tenant column is Tenanted.
func TestUpdateOldRow(t *testing.T) {
	decode := func(budget int64) ([]oldRow, *Transaction, Stats) {
		f := newFeeder(t, Config{TenantColumn: "org", MemoryBudget: budget})
		f.feed(
			beginMsg(700, 0x1F00),
			relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 23, true}, col{"org", 25, false}, col{"v", 25, false}),
			relationMsg(false, 0, 2, "public", "f", 'f', col{"id", 23, true}, col{"org", 25, true}, col{"v", 25, true}),
			relationMsg(false, 0, 3, "public", "k", 'd', col{"org", 25, true}, col{"id", 23, true}, col{"v", 25, false}),
			relationMsg(false, 0, 4, "public", "plain", 'd', col{"id", 23, true}, col{"v", 25, false}),
			insertMsg(false, 0, 1, "1", "acme", "x"),
			updateMsg(false, 0, 1, 0, nil, "1", "beta", "y"),
			updateMsg(false, 0, 1, 'K', []any{"9", nil, nil}, "1", "beta", "y"),
			updateMsg(false, 0, 2, 'O', []any{"1", "acme", "x"}, "1", "beta", "x"),
			updateMsg(false, 0, 2, 'O', []any{"1", nil, "x"}, "1", "beta", "x"),
			updateMsg(false, 0, 2, 'O', []any{"1", "beta", "x"}, "1", "beta", "z"),
			updateMsg(false, 0, 2, 'O', []any{"1", "beta", "x"}, "1", nil, "x"),
			updateMsg(false, 0, 3, 'K', []any{"acme", "1", nil}, "beta", "1", "x"),
			updateMsg(false, 0, 3, 0, nil, "beta", "1", "y"),
			updateMsg(false, 0, 4, 'K', []any{"2", nil}, "1", "y"),
			deleteMsg(false, 0, 1, 'K', "1", nil, nil),
			commitMsg(0x1F00, 0x2000),
		)
		txs := f.d.Committed(nil)
		if len(txs) != 1 {
			t.Fatalf("%d transactions", len(txs))
		}
		t.Cleanup(func() { txs[0].Close() })
		return oldRows(t, txs[0]), txs[0], f.d.Stats()
	}
	want := []oldRow{
		{true, "", TenantNone, ""},                                   // insert
		{true, "", TenantUnresolved, ""},                             // DEFAULT, no old row
		{true, `{"id":9}`, TenantUnresolved, ""},                     // DEFAULT key change
		{true, `{"id":1,"org":"acme","v":"x"}`, TenantKnown, "acme"}, // FULL
		{true, `{"id":1,"org":null,"v":"x"}`, TenantNone, ""},        // FULL, from no tenant
		{true, `{"id":1,"org":"beta","v":"x"}`, TenantKnown, "beta"}, // FULL, same tenant
		{true, `{"id":1,"org":"beta","v":"x"}`, TenantKnown, "beta"}, // FULL, to no tenant
		{true, `{"org":"acme","id":1}`, TenantKnown, "acme"},         // the tenant in the key
		{true, "", TenantKnown, "beta"},                              // the same, key unchanged: no old row
		{false, `{"id":2}`, TenantNone, ""},                          // no tenant column
		{true, "", TenantNone, ""},                                   // delete
	}
	mem, memTx, st := decode(1 << 30)
	if st.Spilled != 0 {
		t.Fatal("spilled under a 1 GiB budget")
	}
	spilled, _, st := decode(1)
	if st.Spilled == 0 {
		t.Fatal("did not spill under a 1-byte budget")
	}
	b := NewTxBuilder(memTx.Xid, memTx.CommitLSN, memTx.EndLSN, memTx.CommitTime)
	for it := memTx.Changes(); it.Next(); {
		b.Copy(it.Change())
	}
	copied := oldRows(t, b.Transaction())
	for name, got := range map[string][]oldRow{"in memory": mem, "spilled": spilled, "copied": copied} {
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s:\n got %v\nwant %v", name, got, want)
		}
	}
}
