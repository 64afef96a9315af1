package journal

import (
	"testing"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
)

// mkTx8 is mkTx for a transaction whose full 64-bit xid is x8.
func mkTx8(x8 uint64, end decoder.LSN, changes ...chg) *decoder.Transaction {
	tx := mkTx(uint32(x8), end, testEpoch, changes...)
	tx.Xid8 = x8
	return tx
}

// The journal keeps each entry's full xid (xid8) beside the 32-bit one the
// envelope carries, and reads it back: 0 for an entry of no transaction,
// none (HasXid8 false) when the transaction's full xid was not given or
// does not extend its 32-bit xid.
func TestXid8Recorded(t *testing.T) {
	j, gen, _ := newJournal(t)
	const epoch5 = 5 << 32
	txs := []*decoder.Transaction{
		mkTx8(epoch5|(1<<32-1), 0x100, ins("public.a", 1)), // the last xid of epoch 5
		mkTx8(6<<32|3, 0x200, ins("public.a", 2)),          // the first normal xid of epoch 6
		mkTx(77, 0x300, testEpoch, ins("public.a", 3)),     // no full xid given
		mkTx(0, 0x400, testEpoch, ins("public.a", 4)),      // no transaction
	}
	mismatched := mkTx(78, 0x500, testEpoch, ins("public.a", 5))
	mismatched.Xid8 = epoch5 | 79 // not an extension of 78
	txs = append(txs, mismatched)
	res := mustAppend(t, j, gen, txs...)
	want := []struct {
		x8  uint64
		has bool
	}{{epoch5 | (1<<32 - 1), true}, {6<<32 | 3, true}, {0, false}, {0, true}, {0, false}}

	got := mustRead(t, j, Query{Entities: []string{"public.a"}, FromOldest: true}).Changes
	if len(got) != len(want) {
		t.Fatalf("read %d entries, want %d", len(got), len(want))
	}
	for i, e := range got {
		if e.Xid8 != want[i].x8 || e.HasXid8 != want[i].has {
			t.Errorf("Changes: entry %d: xid8 %d (%v), want %d (%v)", e.Seq, e.Xid8, e.HasXid8, want[i].x8, want[i].has)
		}
		at, err := j.EntryAt(testCtx(t), res.FirstSeq+int64(i))
		if err != nil {
			t.Fatal(err)
		}
		if at.Xid8 != want[i].x8 || at.HasXid8 != want[i].has {
			t.Errorf("EntryAt: entry %d: xid8 %d (%v), want %d (%v)", at.Seq, at.Xid8, at.HasXid8, want[i].x8, want[i].has)
		}
		// The envelope keeps pgoutput's 32 bits.
		if env := decodeEnv(t, e); env.Xid != txs[i].Xid {
			t.Errorf("entry %d: envelope xid %d, want %d", e.Seq, env.Xid, txs[i].Xid)
		}
	}
}

// FirstSeqInvisible compares full xids: an entry of a transaction 2^31 and
// more xids older than the snapshot is visible (32 bits alone would place
// it after xmax); entries of transactions in xip or at or past xmax are
// not, whatever their epochs. Entries journaled before xid8 was recorded
// are compared by their 32 bits, as before.
func TestFirstSeqInvisibleFullXids(t *testing.T) {
	j, gen, url := newJournal(t)
	ctx := testCtx(t)
	const (
		xmin  = 7<<32 | 1<<31 + 1000 // the snapshot: xmin, one in progress, xmax
		inXip = 7<<32 | 1<<31 + 1010
		xmax  = 7<<32 | 1<<31 + 1020
	)
	aged := uint64(xmax - 1<<31 - 500) // 2^31+500 before xmax: 7<<32 | 520
	older := uint64(xmax - 1<<32 - 5)  // a whole epoch and more before: same 32 bits as xmax-5
	res := mustAppend(t, j, gen,
		mkTx8(aged, 0x100, ins("public.a", 1)),
		mkTx8(older, 0x200, ins("public.a", 2)),
		mkTx8(xmin-1, 0x300, ins("public.a", 3)),
		mkTx8(inXip, 0x400, ins("public.a", 4)),
		mkTx8(xmax+3, 0x500, ins("public.a", 5)),
	)
	s := res.FirstSeq // the seq of the aged entry; the others follow
	for _, tc := range []struct {
		name     string
		from, to int64
		xip      []uint64
		xmax     uint64
		want     int64 // 0: none
	}{
		{"aged and older entries are visible", s - 1, s + 2, []uint64{inXip}, xmax, 0},
		{"in progress at the snapshot", s - 1, s + 4, []uint64{inXip}, xmax, s + 3},
		{"not listed in xip, at or past xmax", s - 1, s + 4, nil, xmax, s + 4},
		{"in xip of another epoch does not match", s - 1, s + 3, []uint64{inXip + 1<<32}, xmax + 1<<32, 0},
		{"a snapshot no newer than the aged entry does not see it", s - 1, s + 4, nil, aged, s},
	} {
		first, found, _, err := j.FirstSeqInvisible(ctx, tc.from, tc.to, tc.xip, tc.xmax)
		if err != nil {
			t.Fatal(err)
		}
		if tc.want == 0 && found || tc.want != 0 && (!found || first != tc.want) {
			t.Errorf("%s: first %d (found %v), want %d", tc.name, first, found, tc.want)
		}
	}

	// Entries journaled before the journal recorded full xids: only their
	// 32 bits are known, and are compared modulo 2^32 near xmax.
	pgtest.MustExec(t, url, `UPDATE walcast.chunks SET xid8 = array_fill(NULL::bigint, ARRAY[(last_seq - first_seq + 1)::int])`)
	if first, found, _, err := j.FirstSeqInvisible(ctx, s-1, s+4, nil, xmax); err != nil || !found || first != s {
		t.Errorf("without xid8: first %d (found %v, %v), want the aged entry %d, read as after xmax", first, found, err, s)
	}
	if first, found, _, err := j.FirstSeqInvisible(ctx, s+1, s+4, []uint64{inXip}, xmax); err != nil || !found || first != s+3 {
		t.Errorf("without xid8: first %d (found %v, %v), want %d, in xip by its 32 bits", first, found, err, s+3)
	}
}

// A journal of the schema before xid8 gains the column on open: the
// entries it held have no full xid (HasXid8 false), the ones appended after
// have theirs.
func TestXid8Migration(t *testing.T) {
	j, gen, url := newJournal(t)
	ctx := testCtx(t)
	mustAppend(t, j, gen, mkTx8(3<<32|10, 0x100, ins("public.a", 1)))
	// Back to version 6.
	pgtest.MustExec(t, url, unchunkSQL, `ALTER TABLE walcast.entries DROP COLUMN xid8`, `DELETE FROM walcast.migrations WHERE version >= 8`)
	j2 := openAt(t, url)
	gen2, err := j2.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, j2, gen2, mkTx8(3<<32|11, 0x200, ins("public.a", 2)))
	got := mustRead(t, j2, Query{Entities: []string{"public.a"}, FromOldest: true}).Changes
	if len(got) != 2 || got[0].HasXid8 || !got[1].HasXid8 || got[1].Xid8 != 3<<32|11 {
		t.Fatalf("after the migration: %+v", got)
	}
}

// FirstSeqAfterLSN finds the first entry whose commit ends past an LSN (a
// standby's replay position), all of a transaction's entries sharing its
// commit LSN, and never reaches below the retained floor.
func TestFirstSeqAfterLSN(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	res := mustAppend(t, j, gen,
		mkTx(1, 0x100, testEpoch, ins("public.a", 1)),
		mkTx(2, 0x200, testEpoch, ins("public.a", 2), ins("public.a", 3)),
		mkTx(3, 0x300, testEpoch, ins("public.a", 4)),
	)
	s := res.FirstSeq // seqs s (0x100), s+1 and s+2 (0x200), s+3 (0x300)
	for _, tc := range []struct {
		name string
		lsn  decoder.LSN
		want int64 // 0: none
	}{
		{"before everything", 0x50, s},
		{"at the first commit's end", 0x100, s + 1},
		{"inside the second transaction", 0x1ff, s + 1},
		{"at the last commit's end", 0x300, 0},
	} {
		first, ok, readFrom, err := j.FirstSeqAfterLSN(ctx, 0, s+3, tc.lsn)
		if err != nil || ok != (tc.want != 0) || (ok && first != tc.want) || readFrom != s-1 {
			t.Errorf("%s: %d %v from %d (%v), want %d from %d", tc.name, first, ok, readFrom, err, tc.want, s-1)
		}
	}
	if _, err := j.Prune(ctx, Retention{MaxRows: 2}); err != nil {
		t.Fatal(err)
	}
	first, ok, readFrom, err := j.FirstSeqAfterLSN(ctx, 0, s+3, 0x50)
	if err != nil || !ok || first != s+2 || readFrom != s+1 {
		t.Fatalf("after pruning to 2 entries: %d %v from %d (%v), want %d from %d", first, ok, readFrom, err, s+2, s+1)
	}
}
