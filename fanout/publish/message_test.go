package publish

import (
	"fmt"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// benchEntries are n entries as the catch-up benchmark journals them:
// ~250-byte envelopes of one entity in 1,000-entry transactions.
func benchEntries(n int) []journal.Entry {
	es := make([]journal.Entry, n)
	for i := range es {
		lsn := decoder.LSN(0x1000000 + 0x10000*(i/1000+1))
		es[i] = journal.Entry{Seq: int64(i + 1), Entity: "public.orders", EntitySeq: int64(i + 1), Op: decoder.OpInsert,
			LSN: lsn - 1, CommitLSN: lsn, CommitTime: time.Now(), Epoch: 0x1234,
			Envelope: fmt.Appendf(nil, `{"seq":%d,"entity":"public.orders","op":"insert","key":{"id":%d},"after":{"id":%d,"status":"paid","customer":"acme","total":"42.00","note":"a benchmark row of some length"}}`, i+1, i, i)}
	}
	return es
}

// BenchmarkMessage: building the NATS message of one entry (subject,
// headers, payload check), the publisher's per-entry work besides the
// connection's.
//
//	go test ./fanout/publish -run '^$' -bench 'Message$' -benchmem
func BenchmarkMessage(b *testing.B) {
	p := &Publisher{cfg: Config{Prefix: "walcast"}, id: "0123456789abcdef0123456789abcdef"}
	es := benchEntries(1000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if m, _ := p.message(&es[i%len(es)], 1<<20, ""); m == nil {
			b.Fatal("no message")
		}
	}
}
