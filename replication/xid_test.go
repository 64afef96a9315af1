package replication

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
)

func TestWidenXid(t *testing.T) {
	const e5 = 5 << 32
	for _, tc := range []struct {
		x    uint32
		ref  uint64
		want uint64
	}{
		{100, e5 | 100, e5 | 100},
		{99, e5 | 100, e5 | 99},
		{100 + 1<<31 - 1, e5 | 100, e5 | (100 + 1<<31 - 1)},    // the last xid after ref
		{100 + 1<<31, e5 | 100, 4<<32 | (1<<32 + 100 - 1<<31)}, // 2^31 after in 32 bits: 2^31 before
		{1<<32 - 1, e5 | 5, 4<<32 | (1<<32 - 1)},               // just before an epoch began
		{3, 1<<32 - 10, 1<<32 | 3},                             // just after the first epoch ended
		{1<<32 - 20, 1<<32 - 10, 1<<32 - 20},
		{1<<32 - 5, 1<<32 | 10, 1<<32 - 5}, // the reference in epoch 1, the xid still in epoch 0
		{1<<31 + 5, 1<<31 + 10, 1<<31 + 5}, // around 2^31 of the first epoch
		{1<<31 + 15, 1<<31 + 10, 1<<31 + 15},
		{1<<32 - 5, 1000, 1<<32 - 5}, // the first epoch has nothing before 0
		{0, e5 | 100, 0},             // no transaction
	} {
		if got := widenXid(tc.x, tc.ref); got != tc.want {
			t.Errorf("widenXid(%d, %d) = %d (epoch %d, %d), want %d (epoch %d, %d)",
				tc.x, tc.ref, got, got>>32, uint32(got), tc.want, tc.want>>32, uint32(tc.want))
		}
	}
	// Every xid within [ref - 2^31, ref + 2^31) comes back whole.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		ref := 1<<31 + rng.Uint64N(1<<40)
		x := ref - 1<<31 + rng.Uint64N(1<<32)
		if uint32(x) == 0 {
			continue
		}
		if got := widenXid(uint32(x), ref); got != x {
			t.Fatalf("widenXid(%d, %d) = %d, want %d", uint32(x), ref, got, x)
		}
	}
}

// On a source whose xid counter crosses 2^32 (the end of epoch 0) while it
// is streamed, every journaled entry carries the full 64-bit xid its
// transaction saw as pg_current_xact_id() — recorded in the row itself —
// while the envelope keeps pgoutput's 32 bits. The source also burns xids
// on a table it does not publish, and pauses past the reference's refresh
// interval, so the widening uses references read at the session's start
// and later; and one large transaction arrives streamed, in pieces.
func TestJournalsFullXidsAcrossAnEpoch(t *testing.T) {
	c := pgtest.Start(t, pgtest.Options{NextXid: 1<<32 - 400, Settings: map[string]string{"logical_decoding_work_mem": "'64kB'"}})
	f := newFixtureOn(t, c.NewDatabase(t))
	run := f.start(f.config())
	waitFor(t, "active role", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	w := newWorkload(t, f.url)
	want := map[string]bool{} // ids written
	write := func(id int) {
		w.tx(t, true, fmt.Sprintf("INSERT INTO items VALUES (%d, pg_current_xact_id()::text, 0)", id))
		want[strconv.Itoa(id)] = true
		for range 7 {
			w.tx(t, true, "INSERT INTO unpublished (pad) VALUES ('x')")
		}
	}
	for id := range 30 {
		write(id)
	}
	time.Sleep(xidRefreshEvery + 500*time.Millisecond)
	if _, at := run.r.xids.read(); time.Since(at) > xidRefreshEvery+100*time.Millisecond {
		t.Fatalf("the reference was read %s ago, not again every %s", time.Since(at), xidRefreshEvery)
	}
	for id := 30; id < 60; id++ {
		write(id)
	}
	// A transaction whose change is made in a subtransaction, and an
	// update recording its own xid: they carry the top-level xid.
	w.tx(t, true, "SAVEPOINT s", "INSERT INTO items VALUES (60, pg_current_xact_id()::text, 0)", "RELEASE s")
	w.tx(t, true, "UPDATE items SET val = pg_current_xact_id()::text, n = 1 WHERE id = 0")
	want["60"] = true
	const big = 3000
	w.tx(t, true, fmt.Sprintf("INSERT INTO other SELECT g, pg_current_xact_id()::text FROM generate_series(1, %d) g", big))

	var seen map[string]bool
	var before, after, others int
	waitFor(t, "every write journaled", 30*time.Second, func() bool {
		seen, before, after, others = map[string]bool{}, 0, 0, 0
		for _, e := range f.entries() {
			var env decoder.Envelope
			if err := json.Unmarshal(e.Envelope, &env); err != nil {
				t.Fatal(err)
			}
			var recorded string
			if err := json.Unmarshal(env.After["val"], &recorded); err != nil {
				t.Fatal(err)
			}
			x8, err := strconv.ParseUint(recorded, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			if !e.HasXid8 || e.Xid8 != x8 || env.Xid != uint32(x8) {
				t.Fatalf("entry %d (%s): journaled xid8 %d (known %v), envelope xid %d; the transaction's was %d",
					e.Seq, e.Op, e.Xid8, e.HasXid8, env.Xid, x8)
			}
			switch {
			case e.Entity == "public.other":
				others++
			case x8 < 1<<32:
				before++
			default:
				after++
			}
			if e.Entity == "public.items" && e.Op == decoder.OpInsert {
				seen[string(env.Key["id"])] = true
			}
		}
		return len(seen) == len(want) && before+after == len(want)+1 && others == big
	})
	if before == 0 || after == 0 {
		t.Fatalf("%d entries before 2^32 and %d after: the writes did not cross the epoch", before, after)
	}
	var streamed int64
	pgtest.MustQueryRow(t, f.url, `SELECT coalesce(sum(stream_txns), 0) FROM pg_stat_replication_slots WHERE slot_name = 'walcast'`, nil, &streamed)
	if streamed == 0 {
		t.Fatal("the large transaction was not streamed")
	}
	var next uint64
	pgtest.MustQueryRow(t, f.url, "SELECT pg_current_xact_id()::text::int8", nil, &next)
	if next < 1<<32 {
		t.Fatalf("the source's xid counter is at %d, still in epoch 0", next)
	}
}

// The writer widens against the reference read before while no fresh one
// can be read, for at most xidMaxAge: past that the append fails (and the
// session with it) rather than widen against a stale value. A refresh that
// cannot reach the source leaves the reference as it was.
func TestXidClockStaleReference(t *testing.T) {
	f := &fixture{t: t}
	r, err := New(Config{DatabaseURL: "postgres://walcast@127.0.0.1:1/none?sslmode=disable&connect_timeout=1", Publication: "pub", Slot: "walcast",
		Logger: f.config().Logger}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const ref = 9<<32 | 1<<31
	c := &xidClock{r: r, ref: ref, at: time.Now().Add(-xidMaxAge / 2)}
	if err := c.refresh(t.Context()); err == nil {
		t.Fatal("a refresh from an unreachable source succeeded")
	}
	tx := decoder.NewTransaction(1<<31-5, 1, 2, time.Now(), nil)
	if err := c.widen([]*decoder.Transaction{tx}); err != nil {
		t.Fatalf("a reference %s old: %v", xidMaxAge/2, err)
	}
	if tx.Xid8 != ref-5 {
		t.Fatalf("widened to %d, want %d", tx.Xid8, uint64(ref-5))
	}
	c.at = time.Now().Add(-xidMaxAge - time.Second)
	if err := c.widen([]*decoder.Transaction{tx}); err == nil {
		t.Fatalf("a reference older than %s was used", xidMaxAge)
	}
}
