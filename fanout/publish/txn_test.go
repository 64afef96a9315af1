package publish

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
)

// TestPublishMarksTransactionEnds: Walcast-Txn-End is "entity" on the last
// message of each entity in a transaction and "tenant" on the last of each
// other subject, however the publisher's batches (3 entries here) cut the
// transactions: a batch that ends inside one is decided from the rest of
// it in the journal.
func TestPublishMarksTransactionEnds(t *testing.T) {
	f := newPubFixture(t)
	col := f.subscribe(f.connect())
	type in struct {
		entity, tenant string
		id             int
	}
	txs := [][]in{
		{{"public.orders", "", 1}, {"public.orders", "acme", 2}, {"public.orders", "", 3}, {"public.items", "", 4},
			{"public.orders", "acme", 5}, {"public.items", "", 6}, {"public.orders", "beta", 7}},
		{{"public.orders", "", 8}},
		{{"public.items", "acme", 9}, {"public.items", "acme", 10}, {"public.items", "acme", 11}, {"public.items", "acme", 12}, {"public.items", "", 13}},
		{{"public.orders", "acme", 14}, {"public.orders", "acme", 15}},
	}
	var want []string
	for _, tx := range txs {
		chs := make([]decoder.Change, len(tx))
		for i, c := range tx {
			chs[i] = change(0, c.entity, decoder.OpInsert, c.id, c.tenant, "")
			mark := bus.TxnEndEntity
			for _, o := range tx[i+1:] {
				if o.entity == c.entity {
					mark = bus.TxnEndTenant
					if o.tenant == c.tenant {
						mark = ""
						break
					}
				}
			}
			want = append(want, mark)
		}
		f.appendTx(chs...)
	}
	p := New(Config{BatchSize: 3}, f.j, f.connect())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = p.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	waitUntil(t, "all published", 20*time.Second, func() bool { return len(col.snapshot()) >= len(want) })
	for i, m := range col.snapshot() {
		if got := m.Header.Get(bus.HeaderTxnEnd); got != want[i] {
			t.Errorf("message %d (%s): Walcast-Txn-End %q, want %q", i+1, m.Subject, got, want[i])
		}
	}
}
