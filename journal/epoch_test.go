package journal

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal/journaltest"
)

// TestEpochRestoredJournal is the restore of DESIGN §5: a journal restored
// from a backup assigns seqs again that readers already saw. Before epochs a
// cursor of the lost history (position 4) was taken as a position of the
// new one, so the reader silently skipped the new seq 4; now every cursor of
// the old epoch gets a resync, and the same seq in two epochs has two
// message epochs.
func TestEpochRestoredJournal(t *testing.T) {
	j, gen, url := newJournal(t)
	ctx := testCtx(t)
	var lsn decoder.LSN
	sh := newScope(Query{AllTenants: true}).hash()

	appendN(t, j, gen, &lsn, "public.a", 2) // seqs 1, 2
	if e, first, err := j.Epoch(ctx); err != nil || e != 0 || first != 1 {
		t.Fatalf("first epoch = %d from %d (%v), want 0 from 1", e, first, err)
	}
	restore, err := journaltest.Backup(ctx, url, DefaultSchema)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, j, gen, &lsn, "public.a", 2) // seqs 3, 4: lost with the restore
	lost := mustRead(t, j, Query{AllTenants: true, Cursor: j.cursorAt(0, 2, sh)})
	if len(lost.Changes) != 2 {
		t.Fatalf("read %d changes before the restore", len(lost.Changes))
	}
	oldCursor := lost.Cursor // position 4, epoch 0

	if err := restore(ctx); err != nil {
		t.Fatal(err)
	}
	// The process that appended seqs 3 and 4 finds the journal behind what
	// it committed: it must not journal on after the hole.
	lsn += 10
	if _, err := j.Append(ctx, gen, []*decoder.Transaction{mkTx(99, lsn, testEpoch, ins("public.a", 99))}); !errors.Is(err, ErrJournalRewound) {
		t.Fatalf("append on a rewound journal: %v, want ErrJournalRewound", err)
	}
	// The replicator finds its slot ahead of the restored watermark and, with
	// --recreate-lost-slot, journals a resync that resets the history.
	res, err := j.AppendResync(ctx, gen, Resync{Reason: "journal restored", Watermark: lsn, ResetWatermark: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.FirstSeq != 3 {
		t.Fatalf("resync entry at seq %d, want 3 (the restored journal's next)", res.FirstSeq)
	}
	st, err := j.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Epoch == 0 || st.EpochSeq != 3 {
		t.Fatalf("after the reset: epoch %d from seq %d, want a new epoch from seq 3", st.Epoch, st.EpochSeq)
	}
	appendN(t, j, gen, &lsn, "public.a", 2) // seqs 4, 5 of the new epoch

	// The old cursor's position 4 exists in the new history too; it is
	// still a resync, at the new epoch's horizon.
	got := mustRead(t, j, Query{AllTenants: true, Cursor: oldCursor})
	if !got.ResyncRequired || got.Reason != ResyncEpoch || len(got.Changes) != 0 {
		t.Fatalf("old-epoch cursor: %+v, want a resync for epoch", got)
	}
	if got.Epoch != st.Epoch || got.Horizon != 5 {
		t.Fatalf("resync read: epoch %d horizon %d", got.Epoch, got.Horizon)
	}
	next := mustRead(t, j, Query{AllTenants: true, Cursor: got.ResyncCursor})
	if next.ResyncRequired || len(next.Changes) != 0 || next.Epoch != st.Epoch {
		t.Fatalf("read from the resync cursor: %+v", next)
	}
	// A cursor of the new epoch at position 3 reads the new seqs 4 and 5.
	fresh := mustRead(t, j, Query{AllTenants: true, Cursor: j.cursorAt(st.Epoch, 3, sh)})
	if fresh.ResyncRequired || len(fresh.Changes) != 2 || fresh.Changes[0].Seq != 4 {
		t.Fatalf("new epoch from 3: %+v", fresh)
	}
	// A cursor naming the new epoch but forged for position 4 of the old
	// one cannot exist (the HMAC covers the epoch); and one of epoch 0 at
	// position 2, before the fork, resyncs too: the resync entry at 3
	// starts the new epoch.
	if r := mustRead(t, j, Query{AllTenants: true, Cursor: j.cursorAt(0, 2, sh)}); !r.ResyncRequired || r.Reason != ResyncEpoch {
		t.Fatalf("epoch-0 cursor before the fork: %+v", r)
	}

	// The publisher's read labels each entry with its own epoch: seqs 1-2
	// keep epoch 0 (their message ids do not change), 3-5 the new one.
	lg, err := j.ReadAfter(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(lg.Entries) != 5 || lg.Epoch != st.Epoch || lg.EpochSeq != 3 {
		t.Fatalf("log: %d entries, epoch %d from %d", len(lg.Entries), lg.Epoch, lg.EpochSeq)
	}
	for _, e := range lg.Entries {
		want := st.Epoch
		if e.Seq < 3 {
			want = 0
		}
		if e.Epoch != want {
			t.Fatalf("seq %d labelled epoch %d, want %d", e.Seq, e.Epoch, want)
		}
	}
}

// TestEpochWaitWakesOnReset: a waiter parked above the restored horizon is
// woken by the reset instead of waiting for seqs the new history may take
// long to reach.
func TestEpochWaitWakesOnReset(t *testing.T) {
	j, gen, url := newJournal(t)
	ctx := testCtx(t)
	var lsn decoder.LSN
	appendN(t, j, gen, &lsn, "public.a", 1)
	restore, err := journaltest.Backup(ctx, url, DefaultSchema)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, j, gen, &lsn, "public.a", 5) // horizon 6
	if h, err := j.Wait(ctx, 5); err != nil || h != 6 {
		t.Fatalf("Wait = %d %v", h, err)
	}
	woke := make(chan int64, 1)
	go func() {
		h, _ := j.Wait(ctx, 6)
		woke <- h
	}()
	if err := restore(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := j.AppendResync(ctx, gen, Resync{Reason: "journal restored", Watermark: lsn, ResetWatermark: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case h := <-woke:
		if h != 2 {
			t.Fatalf("woken with horizon %d, want 2 (the resync entry)", h)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Wait above the restored horizon never woke")
	}
}

// TestCursorV1StillReads: a cursor issued before epochs (version 1) is a
// cursor of epoch 0 and keeps working until the epoch changes.
func TestCursorV1StillReads(t *testing.T) {
	j, gen, _ := newJournal(t)
	var lsn decoder.LSN
	appendN(t, j, gen, &lsn, "public.a", 3)
	sh := newScope(Query{AllTenants: true}).hash()
	b := make([]byte, cursorV1Payload)
	b[0] = 1
	copy(b[1:17], j.id[:])
	binary.BigEndian.PutUint64(b[17:25], 1)
	copy(b[25:41], sh[:])
	b = append(b, mac(cursorV1Label, testSecret, b)...)
	v1 := base64.RawURLEncoding.EncodeToString(b)
	res := mustRead(t, j, Query{AllTenants: true, Cursor: v1})
	if res.ResyncRequired || len(res.Changes) != 2 || res.Changes[0].Seq != 2 {
		t.Fatalf("v1 cursor at 1: %+v", res)
	}
	// A v1 body under the v2 label (or a version byte that lies) is forged.
	b[0] = 2
	copy(b[cursorV1Payload:], mac(cursorV1Label, testSecret, b[:cursorV1Payload]))
	if _, err := j.Changes(testCtx(t), Query{AllTenants: true, Cursor: base64.RawURLEncoding.EncodeToString(b)}); err == nil {
		t.Fatal("a v1-length cursor claiming version 2 was accepted")
	}
}

func TestEpochHex(t *testing.T) {
	for _, c := range []struct {
		e    int64
		want string
	}{{0, "0000000000000000"}, {1, "0000000000000001"}, {0x7fffffffffffffff, "7fffffffffffffff"}, {0xabc, "0000000000000abc"}} {
		if got := EpochHex(c.e); got != c.want {
			t.Errorf("EpochHex(%d) = %q, want %q", c.e, got, c.want)
		}
	}
	for range 100 {
		e, err := newEpoch()
		if err != nil || e <= 0 {
			t.Fatalf("newEpoch = %d %v", e, err)
		}
	}
}
