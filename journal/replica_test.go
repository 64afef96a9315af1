package journal

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
)

// replicaJournal opens a journal on a fresh database of a private primary
// whose reads go to a hot standby of it, and acquires it.
func replicaJournal(t *testing.T, wait time.Duration) (j *Journal, gen int64, primary, standby *pgtest.Cluster, url, readURL string) {
	t.Helper()
	primary = pgtest.Start(t, pgtest.Options{})
	url = primary.NewDatabase(t)
	// The schema first, so the standby has it when the reader opens.
	openAt(t, url).Close()
	standby = primary.StartStandby(t)
	readURL = standby.URL(url[strings.LastIndex(url, "/")+1 : strings.Index(url, "?")])
	j = openAt(t, url, func(c *Config) { c.ReadURL = readURL; c.ReadMaxWait = wait })
	gen, err := j.Acquire(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return j, gen, primary, standby, url, readURL
}

func appendSeqs(t *testing.T, j *Journal, gen int64, from, n int) {
	t.Helper()
	for i := range n {
		x := uint32(1000 + from + i)
		mustAppend(t, j, gen, mkTx(x, decoder.LSN(1_000_000+100*(from+i)), testEpoch, ins("public.t", from+i)))
	}
}

// A standby that lags is read only for what it holds: a cursor ahead of
// it, a read that must reach a known seq and an entry it has not
// replayed are waited for and then read on the journal's server, never
// answered with a resync or ErrNoEntry; a read with nothing to reach is
// served short by the standby; and once it replays again, waiting reads
// are served by it.
func TestReplicaLagIsNeverTakenForTheEnd(t *testing.T) {
	ctx := testCtx(t)
	j, gen, primary, standby, url, readURL := replicaJournal(t, 100*time.Millisecond)
	appendSeqs(t, j, gen, 1, 10)
	if err := standby.CatchUp(ctx, primary); err != nil {
		t.Fatal(err)
	}
	all, atTen := readAll(t, j, Query{})
	if len(all) != 10 {
		t.Fatalf("read %d entries from the caught-up standby, want 10", len(all))
	}
	if err := standby.PauseReplay(ctx); err != nil {
		t.Fatal(err)
	}
	appendSeqs(t, j, gen, 11, 10) // seqs 11..20: on the primary only
	st0, _ := j.ReplicaStats()

	// Short but true: the standby's prefix.
	res := mustRead(t, j, Query{Cursor: atTen})
	if res.ResyncRequired || len(res.Changes) != 0 || res.Horizon != 10 {
		t.Fatalf("read on the paused standby: resync=%v changes=%d horizon=%d, want none at horizon 10", res.ResyncRequired, len(res.Changes), res.Horizon)
	}
	// A read that must reach seq 20.
	res = mustRead(t, j, Query{Cursor: atTen, AtLeast: 20})
	if got := seqs(res.Changes); len(got) != 10 || got[9] != 20 {
		t.Fatalf("read with AtLeast 20: seqs %v, want 11..20", got)
	}
	// A cursor ahead of the standby.
	at20, err := j.CursorAt(Query{}, 0, 20)
	if err != nil {
		t.Fatal(err)
	}
	res = mustRead(t, j, Query{Cursor: at20})
	if res.ResyncRequired {
		t.Fatalf("a cursor ahead of the lagging standby got a resync (%s)", res.Reason)
	}
	// An entry the standby has not replayed.
	e, err := j.EntryAt(ctx, 15)
	if err != nil || e.Seq != 15 {
		t.Fatalf("EntryAt(15) behind the standby: %+v, %v", e, err)
	}
	// Pruned stays pruned, and an entry never written is not retained.
	if _, err := j.EntryAt(ctx, 99); !errors.Is(err, ErrNoEntry) {
		t.Fatalf("EntryAt(99): %v, want ErrNoEntry", err)
	}
	// The xid search of a range the standby holds in part.
	first, ok, _, err := j.FirstSeqInvisible(ctx, 0, 20, []uint64{1000 + 17}, 1000+18)
	if err != nil || !ok || first != 17 {
		t.Fatalf("FirstSeqInvisible over a range past the standby: %d %v %v, want 17", first, ok, err)
	}
	st1, _ := j.ReplicaStats()
	if d := st1.Fallbacks[FallbackBehind] - st0.Fallbacks[FallbackBehind]; d != 5 {
		t.Fatalf("fallbacks behind: %d, want 5 (the read with AtLeast, the cursor ahead, both EntryAt, the xid search)", d)
	}

	// Replay resumes while a read waits: the standby serves it.
	wj := openAt(t, url, func(c *Config) { c.ReadURL = readURL; c.ReadMaxWait = 20 * time.Second })
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = standby.ResumeReplay(context.Background())
	}()
	res = mustRead(t, wj, Query{Cursor: atTen, AtLeast: 20})
	if got := seqs(res.Changes); len(got) != 10 || got[9] != 20 {
		t.Fatalf("read waiting for replay: seqs %v, want 11..20", got)
	}
	ws, _ := wj.ReplicaStats()
	if ws.Waits != 1 || ws.CaughtUp != 1 || ws.Fallbacks[FallbackBehind] != 0 {
		t.Fatalf("waiting reader's stats %+v: want one wait the standby then served", ws)
	}
}

// A read server that holds another journal is refused at Open with the
// flag to fix.
func TestReplicaOfAnotherJournalIsRefused(t *testing.T) {
	a, b := pgtest.NewDatabase(t), pgtest.NewDatabase(t)
	openAt(t, b).Close()
	_, err := Open(testCtx(t), Config{URL: a, ReadURL: b, CursorSecret: testSecret})
	if err == nil || !strings.Contains(err.Error(), "--journal-read-url") {
		t.Fatalf("Open with another journal's server as the read server: %v, want an error naming --journal-read-url", err)
	}
}
