package journal

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal/journaltest"
)

// sameLog fails unless a and b are the same read: bounds, and every entry
// field for field (commit times as instants).
func sameLog(t *testing.T, what string, a, b Log) {
	t.Helper()
	if a.Floor != b.Floor || a.Horizon != b.Horizon || a.Epoch != b.Epoch || a.EpochSeq != b.EpochSeq || len(a.Entries) != len(b.Entries) {
		t.Fatalf("%s: floor %d/%d horizon %d/%d epoch %d/%d epoch seq %d/%d entries %d/%d", what,
			a.Floor, b.Floor, a.Horizon, b.Horizon, a.Epoch, b.Epoch, a.EpochSeq, b.EpochSeq, len(a.Entries), len(b.Entries))
	}
	for i := range a.Entries {
		x, y := a.Entries[i], b.Entries[i]
		if !x.CommitTime.Equal(y.CommitTime) {
			t.Fatalf("%s: entry %d commit time %v, journal %v", what, x.Seq, x.CommitTime, y.CommitTime)
		}
		if !bytes.Equal(x.Envelope, y.Envelope) {
			t.Fatalf("%s: entry %d envelope\n%s\njournal\n%s", what, x.Seq, x.Envelope, y.Envelope)
		}
		x.CommitTime, x.Envelope, y.Envelope = y.CommitTime, nil, nil
		if !reflect.DeepEqual(x, y) {
			t.Fatalf("%s: entry\n%+v\njournal\n%+v", what, x, y)
		}
	}
}

// TestRecentLogMatchesTheJournal: what ReadAfter answers from memory after
// this process's appends (recent.go) is exactly what a read of the journal
// returns — untenanted and tenanted rows, "" and NULL tenants, unresolved
// tenants, moved deletes, a resync that starts an epoch — at every position
// and under every bound; and reads past what the process appended, or
// before what it keeps, go to the journal.
func TestRecentLogMatchesTheJournal(t *testing.T) {
	j, gen, url := newJournal(t)
	other := openAt(t, url) // reads the journal only: it never appends
	ctx := testCtx(t)
	const docs = "public.docs"
	if _, err := j.ReadAfter(ctx, 0, 1); err != nil { // the publisher's first read
		t.Fatal(err)
	}
	lsn := decoder.LSN(100)
	tx := func(cs ...chg) *decoder.Transaction {
		lsn += 100
		return mkTx(uint32(lsn), lsn, testEpoch.Add(1234567), cs...)
	}
	unresolved := chg{entity: docs, op: decoder.OpDelete, key: `{"id":9}`, state: decoder.TenantUnresolved, tenanted: true}
	big := ins("public.a", 7)
	big.pad = 3000
	batches := [][]*decoder.Transaction{
		{tx(ins("public.a", 1), ins("public.b", 2)), tx(ins("public.a", 3))},
		{tx(tins(docs, `{"id":1}`, strp("t1")), tins(docs, `{"id":2}`, strp("")), tins(docs, `{"id":3}`, nil))},
		{tx(upd(docs, `{"id":1}`, strp("t2")), unresolved), tx(big, ins("public.a", 8))},
	}
	check := func(stage string, from int64) {
		t.Helper()
		h := j.recent.hits.Load()
		st, err := j.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for after := from - 1; after <= st.Horizon; after++ {
			for _, b := range []struct{ limit, bytes int }{{1000, 0}, {1, 0}, {2, 0}, {1000, 1}, {1000, 500}, {1000, 3500}} {
				got, err := j.ReadAfterBytes(ctx, after, b.limit, b.bytes)
				if err != nil {
					t.Fatal(err)
				}
				want, err := other.ReadAfterBytes(ctx, after, b.limit, b.bytes)
				if err != nil {
					t.Fatal(err)
				}
				sameLog(t, fmt.Sprintf("%s: after %d limit %d bytes %d", stage, after, b.limit, b.bytes), got, want)
			}
		}
		if j.recent.hits.Load() == h {
			t.Fatalf("%s: no read was answered from memory", stage)
		}
	}
	first := int64(1)
	for i, b := range batches {
		res := mustAppend(t, j, gen, b...)
		check(fmt.Sprintf("batch %d", i), first)
		first = res.LastSeq + 1
	}
	if res := mustAppend(t, j, gen, tx(upd(docs, `{"id":2}`, nil))); res.Moved != 1 {
		t.Fatalf("the move to no tenant: %+v", res)
	}
	check("move to none", 1)

	// A resync starts an epoch: entries of the old one are read from the
	// journal, the new one's from memory, each with its epoch.
	if _, err := j.AppendResync(ctx, gen, Resync{Reason: "same epoch"}); err != nil {
		t.Fatal(err)
	}
	check("resync", 1)
	res, err := j.AppendResync(ctx, gen, Resync{Reason: "new epoch", NewEpoch: true})
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, j, gen, tx(ins("public.a", 20)), tx(ins("public.a", 21)))
	check("new epoch", 1)
	if e, _, err := j.Epoch(ctx); err != nil || e == 0 {
		t.Fatalf("epoch %d (%v) after the resync", e, err)
	}
	if got, err := j.ReadAfter(ctx, res.FirstSeq-1, 10); err != nil || got.EpochSeq != res.FirstSeq || got.Entries[0].Op != decoder.OpResync {
		t.Fatalf("read of the resync: %+v (%v)", got, err)
	}
}

// TestRecentLogForgets: the recent log never answers with what the
// journal no longer says — after another appender took over, after a
// restore is seen, after a failed append — and keeps within its bounds.
func TestRecentLogForgets(t *testing.T) {
	j, gen, url := newJournal(t)
	ctx := testCtx(t)
	var lsn decoder.LSN
	if _, err := j.ReadAfter(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}
	appendN(t, j, gen, &lsn, "public.a", 3) // 1..3
	hit := func(after int64) bool {
		t.Helper()
		h := j.recent.hits.Load()
		if _, err := j.ReadAfter(ctx, after, 100); err != nil {
			t.Fatal(err)
		}
		return j.recent.hits.Load() != h
	}
	if !hit(0) || !hit(2) || hit(3) {
		t.Fatal("after appending 1..3 the log should answer reads after 0 and 2, not after 3")
	}

	// A restore: the journal loses seqs 4 and 5; a read that sees it
	// (here the read past the horizon, the publisher's when caught up)
	// makes the log forget them, and the restored journal's own seq 4 is
	// what is read.
	restore, err := journaltest.Backup(ctx, url, DefaultSchema)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, j, gen, &lsn, "public.a", 2) // 4, 5: lost
	if err := restore(ctx); err != nil {
		t.Fatal(err)
	}
	if hit(5) {
		t.Fatal("a read after the horizon was answered from memory")
	}
	if hit(3) {
		t.Fatal("after the journal was seen restored, the log still answered for its lost seqs")
	}

	// Another appender takes over and appends seq 4 of its own; this
	// process's failed append forgets everything.
	j2 := openAt(t, url)
	gen2, err := j2.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lsn += 100
	mustAppend(t, j2, gen2, mkTx(77, lsn, testEpoch, ins("public.other", 77)))
	if _, err := j.Append(ctx, gen, []*decoder.Transaction{mkTx(78, lsn+10, testEpoch, ins("public.a", 78))}); err == nil {
		t.Fatal("the fenced appender appended")
	}
	got, err := j.ReadAfter(ctx, 3, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Entries) != 1 || got.Entries[0].Entity != "public.other" {
		t.Fatalf("after the takeover: %+v, want the new appender's seq 4", got.Entries)
	}

	// Appends larger than the log are not kept; the log holds at most its
	// bounds, newest appends first.
	j, gen3, _ := newJournal(t)
	if _, err := j.ReadAfter(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}
	pad := ins("public.a", 1)
	pad.pad = recentMaxBytes
	lsn += 100
	res := mustAppend(t, j, gen3, mkTx(90, lsn, testEpoch, pad))
	if hit(res.FirstSeq - 1) {
		t.Fatal("an append larger than the log was answered from memory")
	}
	// A reader far behind: appends are not kept (copying them would
	// only tax the catch-up).
	batches := recentMaxEntries/500 + 8 // more than the log holds
	for i := 0; i < batches; i++ {
		appendN(t, j, gen3, &lsn, "public.a", 500)
	}
	j.recent.mu.Lock()
	kept := j.recent.entries
	j.recent.mu.Unlock()
	if kept != 0 {
		t.Fatalf("%d entries kept with the only reader %d entries behind", kept, batches*500)
	}
	// A reader that keeps up (the publisher after each append's wake-up).
	for i := 0; i < batches; i++ {
		res := appendN(t, j, gen3, &lsn, "public.a", 500)
		if _, err := j.ReadAfter(ctx, res.FirstSeq-1, 1); err != nil {
			t.Fatal(err)
		}
	}
	j.recent.mu.Lock()
	n, b, oldest, next := j.recent.entries, j.recent.bytes, j.recent.chunks[0].entries[0].Seq, j.recent.next
	j.recent.mu.Unlock()
	if n > recentMaxEntries || b > recentMaxBytes || next != res.FirstSeq+1+int64(2*batches*500) || oldest <= res.FirstSeq+int64(batches*500) {
		t.Fatalf("log holds %d entries, %d bytes, seqs %d..%d", n, b, oldest, next-1)
	}
	if hit(oldest-2) || !hit(oldest-1) || !hit(next-2) {
		t.Fatalf("the log should answer from seq %d on only", oldest)
	}
	all, err := j.ReadAfter(ctx, oldest-1, MaxLimit)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range all.Entries {
		if e.Seq != oldest+int64(i) || !strings.Contains(string(e.Envelope), fmt.Sprintf(`"seq":%d,`, e.Seq)) {
			t.Fatalf("read across the log's start: entry %d is seq %d %s", i, e.Seq, e.Envelope)
		}
	}
}
