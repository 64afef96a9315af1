package sync

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

// visible is pg_visible_in_snapshot on 64-bit xids: transactions 2^31 and
// more xids older than the snapshot are visible (their 32 bits alone would
// place them after xmax), epochs count, and a snapshot that spans the end
// of an epoch compares across it.
func TestSnapshotVisible(t *testing.T) {
	const e7 = 7 << 32
	mid := pgSnapshot{xmin: e7 | 1<<31 + 1000, xmax: e7 | 1<<31 + 1020, xip: map[uint64]struct{}{e7 | 1<<31 + 1010: {}}}
	span := pgSnapshot{xmin: 1<<32 - 5, xmax: 1<<32 + 5, xip: map[uint64]struct{}{1<<32 - 1: {}, 1<<32 + 2: {}}}
	for _, tc := range []struct {
		name string
		snap pgSnapshot
		x    uint64
		want bool
	}{
		{"2^31+500 before xmax", mid, mid.xmax - 1<<31 - 500, true},
		{"exactly 2^31 before xmax", mid, mid.xmax - 1<<31, true},
		{"an epoch and 5 before xmax", mid, mid.xmax - 1<<32 - 5, true},
		{"just before xmin", mid, mid.xmin - 1, true},
		{"between xmin and xmax, completed", mid, mid.xmin + 5, true},
		{"in progress", mid, e7 | 1<<31 + 1010, false},
		{"in progress in 32 bits, an epoch before in 64", mid, e7 | 1<<31 + 1010 - 1<<32, true},
		{"at xmax", mid, mid.xmax, false},
		{"an epoch after xmax, the 32 bits of a visible one", mid, mid.xmin - 1 + 1<<32, false},
		{"no transaction", mid, 0, true},
		{"in progress before the epoch's end", span, 1<<32 - 1, false},
		{"completed before the epoch's end", span, 1<<32 - 2, true},
		{"completed after the epoch's end", span, 1<<32 + 1, true},
		{"in progress after the epoch's end", span, 1<<32 + 2, false},
		{"past xmax after the epoch's end", span, 1<<32 + 5, false},
	} {
		if got := tc.snap.visible(tc.x); got != tc.want {
			t.Errorf("%s: visible(%d) = %v, want %v", tc.name, tc.x, got, tc.want)
		}
	}

	// An entry journaled with its full xid is judged by it; one journaled
	// before the journal recorded full xids, by its 32 bits widened near
	// xmax (right for transactions less than 2^31 xids older).
	aged := journal.Entry{Xid8: mid.xmax - 1<<31 - 500, HasXid8: true}
	if !mid.sees(aged, uint32(aged.Xid8)) {
		t.Error("an entry 2^31+500 xids older than the snapshot, with its full xid: not seen")
	}
	legacy, inXip := journal.Entry{}, uint64(e7|1<<31+1010)
	if !mid.sees(legacy, uint32(mid.xmin-1)) || mid.sees(legacy, uint32(inXip)) || mid.sees(legacy, uint32(mid.xmax)) {
		t.Error("an entry without its full xid is not judged by its 32 bits near xmax")
	}
	if got := mid.full(uint32(mid.xmin - 1)); got != mid.xmin-1 {
		t.Errorf("full(%d) = %d, want %d", uint32(mid.xmin-1), got, mid.xmin-1)
	}
}

// A snapshot's catch-up start is moved back only by an entry of a
// transaction the snapshot does not see, compared by full xids: a look-back
// window full of entries 2^31+ xids older than the snapshot (which 32-bit
// xids read as after xmax) leaves it at snapshotLookback before H0; an
// entry whose xid is in xip, or at or past xmax, moves it to that entry;
// one with the 32 bits of an xip member but an epoch earlier does not.
func TestCatchUpStartAgedEntries(t *testing.T) {
	e := newSyncEnv(t)
	rows := make([]row, 0, 100)
	for tx := range 30 {
		rows = rows[:0]
		for i := range 100 {
			rows = append(rows, ins(orders, tx*100+i))
		}
		e.appendRows(rows...)
	}
	const (
		h0   = 3000
		held = 301 // the first entry of the fourth transaction
	)
	snap := pgSnapshot{xmin: 7<<32 | 1<<31 + 1000, xmax: 7<<32 | 1<<31 + 1020, xip: map[uint64]struct{}{7<<32 | 1<<31 + 1010: {}}}
	aged := snap.xmax - 1<<31 - 500
	// setXid gives entries first..last the transaction id x8 (and its 32
	// bits); x8 0 with legacy leaves xid8 unknown, as entries journaled
	// before full xids were.
	setXid := func(first, last int64, x8 uint64, legacy bool) {
		t.Helper()
		xid8 := strconv.FormatInt(int64(x8), 10)
		if legacy {
			xid8 = "NULL"
		}
		// Element i of a chunk's arrays is seq first_seq+i-1.
		set := func(col, v string) string {
			return col + ` = (SELECT array_agg(CASE WHEN c.first_seq + u.i - 1 BETWEEN ` + strconv.FormatInt(first, 10) + ` AND ` +
				strconv.FormatInt(last, 10) + ` THEN ` + v + ` ELSE u.x END ORDER BY u.i) FROM unnest(c.` + col + `) WITH ORDINALITY AS u(x, i))`
		}
		pgtest.MustExec(t, e.url, `UPDATE walcast.chunks c SET `+set("xid8", xid8+"::bigint")+`, `+set("xid", strconv.FormatInt(int64(uint32(x8)), 10))+
			` WHERE c.last_seq >= `+strconv.FormatInt(first, 10)+` AND c.first_seq <= `+strconv.FormatInt(last, 10))
	}
	ctx := syncCtx(t)
	check := func(name string, want int64) {
		t.Helper()
		got, err := catchUpStart(ctx, e.j, h0, snap)
		if err != nil || got != want {
			t.Errorf("%s: start %d (%v), want %d", name, got, err, want)
		}
	}
	for tx := range int64(30) {
		setXid(tx*100+1, tx*100+100, aged+uint64(tx), false)
	}
	check("every entry 2^31+ xids older than the snapshot", h0-snapshotLookback)
	setXid(held, held+99, 7<<32|1<<31+1010, false)
	check("a transaction in progress at the snapshot", held-1)
	setXid(held, held+99, snap.xmax+2, false)
	check("a transaction past xmax", held-1)
	setXid(held, held+99, 7<<32|1<<31+1010-1<<32, false)
	check("the 32 bits of one in progress, an epoch earlier", h0-snapshotLookback)

	// Entries journaled before the journal recorded full xids: compared by
	// their 32 bits near xmax.
	setXid(held, held+99, 7<<32|1<<31+1010, true)
	check("without its full xid, in xip by its 32 bits", held-1)
	setXid(held, held+99, snap.xmin-100, true)
	check("without its full xid, 100 before xmin", h0-snapshotLookback)
}

// On a standby, visibility follows the replay position read before the
// snapshot, not the (empty) in-progress list: a commit replayed by then
// is in the rows, one after it is not unless its xid is below xmin, and
// an entry past the received position or at or past xmax ends the
// filtering.
func TestStandbySnapshotVisibility(t *testing.T) {
	snap := pgSnapshot{xmin: 100, xmax: 200, xip: map[uint64]struct{}{}, standby: true, replayed: 0x5000}
	walAt := decoder.LSN(0x6000) // received
	for _, tc := range []struct {
		name       string
		e          journal.Entry
		sees, past bool
	}{
		{"replayed before the snapshot", journal.Entry{CommitLSN: 0x5000, Xid8: 150, HasXid8: true}, true, false},
		{"replayed after, xid below xmax (the primary's rule would call it visible)", journal.Entry{CommitLSN: 0x5001, Xid8: 150, HasXid8: true}, false, false},
		{"xid below xmin: completed before the snapshot", journal.Entry{CommitLSN: 0x5800, Xid8: 99, HasXid8: true}, true, false},
		{"xid at xmax", journal.Entry{CommitLSN: 0x5800, Xid8: 200, HasXid8: true}, false, true},
		{"past the received position", journal.Entry{CommitLSN: 0x6001, Xid8: 150, HasXid8: true}, false, true},
		{"no full xid: the replay position alone", journal.Entry{CommitLSN: 0x4000}, true, false},
		{"no transaction (a message) after the replay position", journal.Entry{CommitLSN: 0x5500, HasXid8: true}, false, false},
	} {
		if got := snap.sees(tc.e, uint32(tc.e.Xid8)); got != tc.sees {
			t.Errorf("%s: sees %v, want %v", tc.name, got, tc.sees)
		}
		if got := snap.past(tc.e, walAt); got != tc.past {
			t.Errorf("%s: past %v, want %v", tc.name, got, tc.past)
		}
	}
}

// A standby snapshot's catch-up starts just before the first entry past
// the replay position, however far back; a standby behind everything the
// journal retains is refused, not joined with a hole.
func TestStandbyCatchUpStart(t *testing.T) {
	e := newSyncEnv(t)
	ctx := syncCtx(t)
	var es []journal.Entry
	for i := range 10 {
		es = append(es, e.appendRows(ins(orders, i+1))...)
	}
	h0 := es[9].Seq
	snap := pgSnapshot{xmax: 1 << 40, xip: map[uint64]struct{}{}, standby: true}
	for _, tc := range []struct {
		name     string
		replayed decoder.LSN
		want     int64
	}{
		{"caught up", es[9].CommitLSN, h0},
		{"three behind", es[6].CommitLSN, es[6].Seq},
		{"behind all but the first", es[0].CommitLSN, es[0].Seq},
		{"behind everything of a journal that pruned nothing", es[0].CommitLSN - 1, es[0].Seq - 1},
	} {
		snap.replayed = tc.replayed
		if got, err := catchUpStart(ctx, e.j, h0, snap); err != nil || got != tc.want {
			t.Errorf("%s: start %d (%v), want %d", tc.name, got, err, tc.want)
		}
	}
	if _, err := e.j.Prune(ctx, journal.Retention{MaxRows: 5}); err != nil {
		t.Fatal(err)
	}
	snap.replayed = es[2].CommitLSN // its next entries are pruned
	var ref *errSnapshotRefused
	if _, err := catchUpStart(ctx, e.j, h0, snap); !errors.As(err, &ref) || !strings.Contains(err.Error(), "replay lag") {
		t.Fatalf("a standby behind the retained floor: %v, want a refusal naming the replay lag", err)
	}
}
