package journal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
)

func TestOpenIsIdempotentAndConcurrent(t *testing.T) {
	url := pgtest.NewDatabase(t)
	var wg sync.WaitGroup
	ids := make([][16]byte, 4)
	errs := make([]error, 4)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, err := Open(testCtx(t), Config{URL: url})
			errs[i] = err
			if err == nil {
				ids[i] = j.ID()
				j.Close()
			}
		}()
	}
	wg.Wait()
	for i := range ids {
		if errs[i] != nil {
			t.Fatalf("open %d: %v", i, errs[i])
		}
		if ids[i] != ids[0] || ids[i] == [16]byte{} {
			t.Fatalf("journal ids differ or are zero: %x vs %x", ids[i], ids[0])
		}
	}
	j := openAt(t, url)
	if j.ID() != ids[0] {
		t.Fatal("journal id changed on reopen")
	}
	st, err := j.State(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.Horizon != 0 || st.Floor != 1 || st.Rows != 0 || st.Watermark != 0 || st.Generation != 0 {
		t.Fatalf("fresh state: %+v", st)
	}
}

func TestOpenRejectsNewerSchema(t *testing.T) {
	url := pgtest.NewDatabase(t)
	j := openAt(t, url)
	if _, err := j.exec(testCtx(t), "INSERT INTO "+j.sql.migrations+" (version) VALUES (999)"); err != nil {
		t.Fatal(err)
	}
	_, err := Open(testCtx(t), Config{URL: url})
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("got %v, want ErrSchemaTooNew", err)
	}
	var je *Error
	if !errors.As(err, &je) || je.Fix == "" {
		t.Fatalf("want *Error with a fix, got %#v", err)
	}
}

func TestOpenRejectsShortSecret(t *testing.T) {
	_, err := Open(testCtx(t), Config{URL: "postgres://127.0.0.1:1/x", CursorSecret: []byte("short")})
	if err == nil {
		t.Fatal("short secret accepted")
	}
}

func TestAppendAssignsContiguousSequences(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	lsn := decoder.LSN(1000)
	wantEntity := map[string]int64{}
	var next int64 = 1
	for batch := 0; batch < 20; batch++ {
		var txs []*decoder.Transaction
		n := 0
		for k := 0; k <= batch%4; k++ {
			var cs []chg
			for c := 0; c < 1+(batch+k)%5; c++ {
				ent := fmt.Sprintf("public.t%d", (batch+c)%3)
				cs = append(cs, ins(ent, batch*100+k*10+c))
			}
			lsn += 100
			txs = append(txs, mkTx(uint32(batch*10+k), lsn, testEpoch, cs...))
			n += len(cs)
		}
		res, err := j.Append(ctx, gen, txs)
		if err != nil {
			t.Fatal(err)
		}
		if res.FirstSeq != next || res.LastSeq != next+int64(n)-1 || res.Entries != n || res.Watermark != lsn || res.Transactions != len(txs) {
			t.Fatalf("batch %d: result %+v, want seqs %d..%d watermark %s", batch, res, next, next+int64(n)-1, lsn)
		}
		next += int64(n)
	}
	all, _ := readAll(t, j, Query{AllTenants: true, Limit: 7})
	if int64(len(all)) != next-1 {
		t.Fatalf("read %d entries, want %d", len(all), next-1)
	}
	for i, e := range all {
		if e.Seq != int64(i)+1 {
			t.Fatalf("entry %d has seq %d", i, e.Seq)
		}
		wantEntity[e.Entity]++
		if e.EntitySeq != wantEntity[e.Entity] {
			t.Fatalf("seq %d: entitySeq %d, want %d", e.Seq, e.EntitySeq, wantEntity[e.Entity])
		}
		env := decodeEnv(t, e)
		if env.CommitLSN != e.CommitLSN || env.LSN != e.LSN || !env.CommitTime.Equal(e.CommitTime) {
			t.Fatalf("envelope %s disagrees with entry %+v", e.Envelope, e)
		}
	}
	wm, err := j.Watermark(ctx)
	if err != nil || wm != lsn {
		t.Fatalf("watermark %s, %v; want %s", wm, err, lsn)
	}

	// entitySeq continues across processes: a second Journal (another
	// process after a takeover) continues every entity's sequence.
	j2 := openAt(t, pgtestURL(t, j))
	gen2, err := j2.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res := mustAppend(t, j2, gen2, mkTx(9999, lsn+100, testEpoch, ins("public.t0", 1), ins("public.new", 1)))
	got, _ := readAll(t, j2, Query{AllTenants: true, Cursor: j2.cursorAt(0, res.FirstSeq-1, newScope(Query{AllTenants: true}).hash())})
	if len(got) != 2 || got[0].EntitySeq != wantEntity["public.t0"]+1 || got[1].EntitySeq != 1 {
		t.Fatalf("after takeover: %+v", got)
	}
	// And the first process, once it acquires again, sees the other's
	// entity sequences rather than its stale cache.
	gen3, err := j.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res = mustAppend(t, j, gen3, mkTx(10000, lsn+200, testEpoch, ins("public.new", 2)))
	got, _ = readAll(t, j, Query{AllTenants: true, Cursor: j.cursorAt(0, res.FirstSeq-1, newScope(Query{AllTenants: true}).hash())})
	if len(got) != 1 || got[0].EntitySeq != 2 {
		t.Fatalf("stale entity cache: %+v", got)
	}
}

// pgtestURL returns the URL a journal was opened with.
func pgtestURL(t testing.TB, j *Journal) string {
	t.Helper()
	c := j.connCfg
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", c.User, c.Host, c.Port, c.Database)
}

func TestAppendSkipsReplays(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	a := mkTx(1, 100, testEpoch, ins("public.a", 1))
	b := mkTx(2, 200, testEpoch, ins("public.a", 2), ins("public.a", 3))
	res := mustAppend(t, j, gen, a, b)
	if res.Entries != 3 || res.Watermark != 200 {
		t.Fatalf("%+v", res)
	}
	// A restart resends a and b, then c; within the batch a stale repeat of b.
	c := mkTx(3, 300, testEpoch, ins("public.a", 4))
	res = mustAppend(t, j, gen, a, b, c, b)
	if res.Entries != 1 || res.Skipped != 3 || res.Transactions != 1 || res.FirstSeq != 4 || res.Watermark != 300 {
		t.Fatalf("replay: %+v", res)
	}
	// A batch made only of replays writes nothing and keeps the watermark.
	res = mustAppend(t, j, gen, a, c)
	if res.Entries != 0 || res.Skipped != 2 || res.Watermark != 300 || res.FirstSeq != 0 {
		t.Fatalf("all replays: %+v", res)
	}
	all, _ := readAll(t, j, Query{AllTenants: true})
	if len(all) != 4 {
		t.Fatalf("journal holds %d entries, want 4", len(all))
	}
	// An empty transaction above the watermark advances it without an entry.
	res = mustAppend(t, j, gen, mkTx(4, 400, testEpoch))
	if res.Entries != 0 || res.Watermark != 400 || res.Transactions != 1 {
		t.Fatalf("empty tx: %+v", res)
	}
	res, err := j.Advance(ctx, gen, 450)
	if err != nil || res.Watermark != 450 {
		t.Fatalf("advance: %+v %v", res, err)
	}
	res, err = j.Advance(ctx, gen, 420)
	if err != nil || res.Watermark != 450 {
		t.Fatalf("advance backwards: %+v %v", res, err)
	}
}

func TestAppendRejectsBadBody(t *testing.T) {
	j, gen, _ := newJournal(t)
	good := mkTx(1, 100, testEpoch, ins("public.a", 1), ins("public.a", 2))
	bad := mkTx(2, 200, testEpoch, ins("public.a", 3))
	it := bad.Changes()
	it.Next()
	it.Change().Body = []byte(`{}`)
	_, err := j.Append(testCtx(t), gen, []*decoder.Transaction{good, bad})
	if err == nil {
		t.Fatal("bad body accepted")
	}
	st, _ := j.State(testCtx(t))
	if st.Horizon != 0 || st.Watermark != 0 || st.Rows != 0 {
		t.Fatalf("a failed append left state behind: %+v", st)
	}
	assertEntryCount(t, j, 0)
	res := mustAppend(t, j, gen, good)
	if res.FirstSeq != 1 || res.LastSeq != 2 {
		t.Fatalf("after failure: %+v", res)
	}
}

func assertEntryCount(t testing.TB, j *Journal, want int64) {
	t.Helper()
	var n, es int64
	if err := j.queryRow(testCtx(t), "SELECT (SELECT count(*) FROM "+j.sql.entries+"), (SELECT coalesce(sum(last_seq), 0) FROM "+j.sql.entitySeqs+")", nil, &n, &es); err != nil {
		t.Fatal(err)
	}
	if n != want || es != want {
		t.Fatalf("entries: %d rows, entity seqs sum %d; want %d", n, es, want)
	}
}

func TestFencingRejectsStaleGeneration(t *testing.T) {
	j, gen, url := newJournal(t)
	ctx := testCtx(t)
	mustAppend(t, j, gen, mkTx(1, 100, testEpoch, ins("public.a", 1)))
	other := openAt(t, url)
	gen2, err := other.Acquire(ctx)
	if err != nil || gen2 != gen+1 {
		t.Fatalf("acquire: %d %v", gen2, err)
	}
	_, err = j.Append(ctx, gen, []*decoder.Transaction{mkTx(2, 200, testEpoch, ins("public.a", 2))})
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("stale append: %v, want ErrFenced", err)
	}
	var je *Error
	if !errors.As(err, &je) || je.Op != "journal.Append" || je.Fix == "" {
		t.Fatalf("want *Error with op and fix, got %#v", err)
	}
	for _, f := range []func() error{
		func() error { _, err := j.Advance(ctx, gen, 500); return err },
		func() error { _, err := j.AppendResync(ctx, gen, Resync{Reason: "x"}); return err },
		func() error { return j.SetSource(ctx, gen, Source{SystemID: "1"}) },
		func() error { _, err := j.Append(ctx, 0, nil); return err },
	} {
		if err := f(); !errors.Is(err, ErrFenced) {
			t.Fatalf("got %v, want ErrFenced", err)
		}
	}
	st, _ := other.State(ctx)
	if st.Horizon != 1 || st.Watermark != 100 || st.Source.SystemID != "" {
		t.Fatalf("fenced calls wrote: %+v", st)
	}
	mustAppend(t, other, gen2, mkTx(2, 200, testEpoch, ins("public.a", 2)))
}

// TestFencingRace races Acquire (from a second process) against a stream of
// appends from the first: every append of the old generation that succeeds
// is ordered before the new leader's first entry, and none succeeds after.
func TestFencingRace(t *testing.T) {
	for round := 0; round < 5; round++ {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			old, gen, url := newJournal(t)
			leader := openAt(t, url)
			ctx := testCtx(t)
			var (
				mu        sync.Mutex
				maxOldSeq int64
				fencedAt  = -1
			)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := 0; i < 400; i++ {
					res, err := old.Append(ctx, gen, []*decoder.Transaction{mkTx(uint32(i), decoder.LSN(1000+i*10), testEpoch, ins("public.a", i))})
					mu.Lock()
					switch {
					case err == nil && fencedAt >= 0:
						t.Errorf("append %d succeeded after being fenced at %d", i, fencedAt)
					case err == nil:
						maxOldSeq = max(maxOldSeq, res.LastSeq)
					case errors.Is(err, ErrFenced):
						if fencedAt < 0 {
							fencedAt = i
						}
					default:
						t.Errorf("append %d: %v", i, err)
					}
					stop := fencedAt >= 0 && i > fencedAt+20
					mu.Unlock()
					if stop {
						return
					}
				}
			}()
			time.Sleep(time.Duration(round*7) * time.Millisecond)
			gen2, err := leader.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			res, err := leader.Append(ctx, gen2, []*decoder.Transaction{mkTx(1, 1_000_000, testEpoch, ins("public.leader", 1))})
			if err != nil {
				t.Fatal(err)
			}
			<-done
			mu.Lock()
			defer mu.Unlock()
			if fencedAt < 0 {
				t.Fatal("old appender was never fenced")
			}
			if maxOldSeq >= res.FirstSeq {
				t.Fatalf("old generation wrote seq %d after the new leader's first entry %d", maxOldSeq, res.FirstSeq)
			}
			all, _ := readAll(t, leader, Query{AllTenants: true})
			if int64(len(all)) != res.LastSeq || all[len(all)-1].Entity != "public.leader" {
				t.Fatalf("journal holds %d entries, last %+v; want %d ending with the leader's", len(all), all[len(all)-1], res.LastSeq)
			}
		})
	}
}

// TestCancelledAppendLeavesNothing cancels appends of a large batch at
// varying points; each either commits whole or leaves no trace.
func TestCancelledAppendLeavesNothing(t *testing.T) {
	j, gen, _ := newJournal(t)
	var cs []chg
	for i := 0; i < 20000; i++ {
		c := ins(fmt.Sprintf("public.t%d", i%7), i)
		c.pad = 200
		cs = append(cs, c)
	}
	big := mkTx(1, 1_000_000, testEpoch, cs...)
	cancelled := 0
	for attempt := 0; attempt < 40 && cancelled < 3; attempt++ {
		ctx, cancel := context.WithCancel(context.Background())
		timer := time.AfterFunc(time.Duration(1+attempt*3)*time.Millisecond, cancel)
		_, err := j.Append(ctx, gen, []*decoder.Transaction{big})
		timer.Stop()
		cancel()
		st, serr := j.State(testCtx(t))
		if serr != nil {
			t.Fatal(serr)
		}
		if err == nil {
			// Committed whole before the cancel landed: undo by starting over
			// on a fresh journal.
			if st.Horizon != 20000 {
				t.Fatalf("committed append left horizon %d", st.Horizon)
			}
			j, gen, _ = newJournal(t)
			continue
		}
		cancelled++
		if st.Horizon != 0 || st.Watermark != 0 || st.Rows != 0 || st.Bytes != 0 {
			t.Fatalf("cancelled append (%v) left state: %+v", err, st)
		}
		assertEntryCount(t, j, 0)
	}
	if cancelled == 0 {
		t.Fatal("no append was ever cancelled mid-way")
	}
	res := mustAppend(t, j, gen, big)
	if res.FirstSeq != 1 || res.LastSeq != 20000 {
		t.Fatalf("after cancellations: %+v", res)
	}
}

func TestSourceAndPublished(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	want := Source{SystemID: "7311111111111111111", Timeline: 2, Slot: "walcast"}
	if err := j.SetSource(ctx, gen, want); err != nil {
		t.Fatal(err)
	}
	got, err := j.Source(ctx)
	if err != nil || got != want {
		t.Fatalf("source %+v %v", got, err)
	}
	if err := j.SetPublished(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := j.SetPublished(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if p, err := j.Published(ctx); err != nil || p != 10 {
		t.Fatalf("published %d %v", p, err)
	}
}

// TestStaleCacheRetriesUnderLock makes a second Journal append under the
// same generation behind the first one's back: the first one's optimistic
// append finds the meta row changed, rolls back and redoes the batch under
// the lock, with correct sequences.
func TestStaleCacheRetriesUnderLock(t *testing.T) {
	j, gen, url := newJournal(t)
	other := openAt(t, url)
	mustAppend(t, j, gen, mkTx(1, 100, testEpoch, ins("public.a", 1))) // j's cache is warm
	mustAppend(t, other, gen, mkTx(2, 200, testEpoch, ins("public.a", 2), ins("public.b", 1)))
	res := mustAppend(t, j, gen, mkTx(3, 300, testEpoch, ins("public.a", 3)), mkTx(2, 200, testEpoch, ins("public.a", 2)))
	if res.FirstSeq != 4 || res.LastSeq != 4 || res.Skipped != 1 || res.Watermark != 300 {
		t.Fatalf("after a stale cache: %+v", res)
	}
	// Advance moves only the watermark; the cache must notice that too.
	if _, err := other.Advance(testCtx(t), gen, 1000); err != nil {
		t.Fatal(err)
	}
	res = mustAppend(t, j, gen, mkTx(4, 900, testEpoch, ins("public.a", 4)))
	if res.Entries != 0 || res.Skipped != 1 || res.Watermark != 1000 {
		t.Fatalf("append below a watermark advanced elsewhere: %+v", res)
	}
	all, _ := readAll(t, j, Query{AllTenants: true})
	var got []string
	for _, e := range all {
		got = append(got, fmt.Sprintf("%d:%s#%d", e.Seq, e.Entity, e.EntitySeq))
	}
	if fmt.Sprint(got) != "[1:public.a#1 2:public.a#2 3:public.b#1 4:public.a#3]" {
		t.Fatalf("journal: %v", got)
	}
}

// TestStreamedAppend forces the streaming path (batches larger than the
// one-round-trip budget) and checks it writes the same journal.
func TestStreamedAppend(t *testing.T) {
	j, gen, url := newJournal(t)
	j.oneShotBytes = 1
	var cs []chg
	for i := 0; i < 3000; i++ {
		c := ins(fmt.Sprintf("public.t%d", i%3), i)
		c.pad = 100
		cs = append(cs, c)
	}
	cs[0].tenant, cs[0].state = "A", decoder.TenantKnown
	cs = append(cs, chg{entity: "public.t0", op: decoder.OpDelete, key: `{"id":0}`, state: decoder.TenantUnresolved})
	res := mustAppend(t, j, gen, mkTx(1, 100000, testEpoch, cs[:1500]...), mkTx(2, 200000, testEpoch, cs[1500:]...))
	if res.FirstSeq != 1 || res.LastSeq != 3001 || res.TenantUnknown != 0 {
		t.Fatalf("%+v", res)
	}
	// Fenced on the streaming path too, with nothing written.
	leader := openAt(t, url)
	if _, err := leader.Acquire(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Append(testCtx(t), gen, []*decoder.Transaction{mkTx(3, 300000, testEpoch, cs[1:10]...)}); !errors.Is(err, ErrFenced) {
		t.Fatalf("got %v, want ErrFenced", err)
	}
	all, _ := readAll(t, j, Query{AllTenants: true})
	if len(all) != 3001 {
		t.Fatalf("journal holds %d entries", len(all))
	}
	counts := map[string]int64{}
	for i, e := range all {
		counts[e.Entity]++
		if e.Seq != int64(i+1) || e.EntitySeq != counts[e.Entity] {
			t.Fatalf("entry %d: %+v", i, e)
		}
		decodeEnv(t, e)
	}
	if last := all[3000]; last.Op != decoder.OpDelete || last.Tenant != "A" || last.TenantUnknown {
		t.Fatalf("key-only delete not routed to its tenant: %+v", last)
	}
}

// TestSurvivesTerminatedConnections ends every journal session on the server
// (as a restart or a failover would); the next calls reconnect instead of
// failing on dead pooled connections.
func TestSurvivesTerminatedConnections(t *testing.T) {
	old := pingAfter
	pingAfter = 0
	t.Cleanup(func() { pingAfter = old })
	j, gen, url := newJournal(t)
	ctx := testCtx(t)
	mustAppend(t, j, gen, mkTx(1, 100, testEpoch, ins("public.a", 1)))
	if _, err := j.Wait(ctx, 0); err != nil {
		t.Fatal(err)
	}
	admin := openAt(t, url, func(c *Config) { c.Schema = "admin_unused" })
	var killed int
	if err := admin.queryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`, nil, &killed); err != nil {
		t.Fatal(err)
	}
	if killed < 2 {
		t.Fatalf("terminated %d sessions, want the pooled and the LISTEN one", killed)
	}
	res := mustAppend(t, j, gen, mkTx(2, 200, testEpoch, ins("public.a", 2)))
	if res.FirstSeq != 2 {
		t.Fatalf("%+v", res)
	}
	// The listener reconnects too and sees the new horizon.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if h, err := j.Wait(wctx, 1); err != nil || h != 2 {
		t.Fatalf("wait after reconnect: %d %v", h, err)
	}
}

// TestKilledBackendMidAppendLeavesNothing terminates the server process of
// an append while its COPY runs — a crash of the journal's session — and
// checks that nothing of the batch is visible and the next append continues
// the sequence.
func TestKilledBackendMidAppendLeavesNothing(t *testing.T) {
	j, gen, url := newJournal(t)
	admin := openAt(t, url, func(c *Config) { c.Schema = "admin_unused" })
	ctx := testCtx(t)
	mustAppend(t, j, gen, mkTx(1, 100, testEpoch, ins("public.a", 0)))
	var cs []chg
	for i := 1; i <= 30000; i++ {
		c := ins(fmt.Sprintf("public.t%d", i%5), i)
		c.pad = 300
		cs = append(cs, c)
	}
	big := mkTx(2, 10_000_000, testEpoch, cs...)
	killed := 0
	for attempt := 0; attempt < 10 && killed == 0; attempt++ {
		done := make(chan error, 1)
		go func() { _, err := j.Append(ctx, gen, []*decoder.Transaction{big}); done <- err }()
		var err error
	poll:
		for {
			select {
			case err = <-done:
				break poll
			default:
			}
			var n int
			if qerr := admin.queryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND state = 'active' AND query LIKE '%COPY%chunks%'
				AND pid <> pg_backend_pid()`, nil, &n); qerr != nil {
				t.Fatal(qerr)
			}
			if n > 0 {
				err = <-done
				break poll
			}
		}
		st, serr := admin.queryRowState(ctx, j)
		if serr != nil {
			t.Fatal(serr)
		}
		if err == nil { // the append won the race; start over
			if st.Horizon != 30001 {
				t.Fatalf("committed append left horizon %d", st.Horizon)
			}
			j, gen, url = newJournal(t)
			admin = openAt(t, url, func(c *Config) { c.Schema = "admin_unused" })
			mustAppend(t, j, gen, mkTx(1, 100, testEpoch, ins("public.a", 0)))
			continue
		}
		killed++
		if st.Horizon != 1 || st.Watermark != 100 || st.Rows != 1 {
			t.Fatalf("killed append (%v) left state: %+v", err, st)
		}
		assertEntryCount(t, j, 1)
	}
	if killed == 0 {
		t.Fatal("no append was ever killed mid-COPY")
	}
	res := mustAppend(t, j, gen, big)
	if res.FirstSeq != 2 || res.LastSeq != 30001 {
		t.Fatalf("after the crash: %+v", res)
	}
}

// queryRowState reads j's state through another journal's connections.
func (a *Journal) queryRowState(ctx context.Context, j *Journal) (State, error) {
	var s State
	var wm int64
	err := a.queryRow(ctx, `SELECT m.watermark, m.next_seq - 1, m.next_seq - r.floor FROM `+j.sql.meta+` m, `+j.sql.retention+` r`, nil,
		&wm, &s.Horizon, &s.Rows)
	s.Watermark = decoder.LSN(wm)
	return s, err
}

// TestOpenReadOnly: a read-only Open finds an existing journal at this
// version, and otherwise fails with what to run, without creating or
// migrating anything.
func TestOpenReadOnly(t *testing.T) {
	ctx := testCtx(t)
	url := pgtest.NewDatabase(t)
	readOnly := func(c *Config) { c.ReadOnly = true }
	fails := func(want error) {
		t.Helper()
		j, err := Open(ctx, Config{URL: url, ReadOnly: true})
		if err == nil {
			j.Close()
			t.Fatalf("read-only Open succeeded, want %v", want)
		}
		var je *Error
		if !errors.Is(err, want) || !errors.As(err, &je) || je.Fix == "" {
			t.Fatalf("read-only Open: got %v, want %v with a fix", err, want)
		}
	}
	schemaExists := func() bool {
		var ok bool
		pgtest.MustQueryRow(t, url, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", []any{DefaultSchema}, &ok)
		return ok
	}

	fails(ErrNoJournal)
	if schemaExists() {
		t.Fatal("a read-only Open of a database without a journal created its schema")
	}

	j := openAt(t, url)
	r := openAt(t, url, readOnly)
	if r.ID() != j.ID() {
		t.Fatalf("read-only Open read journal id %x, want %x", r.ID(), j.ID())
	}

	// An older journal is not migrated by a read-only Open.
	last := len(migrations) - 1
	if _, err := j.exec(ctx, "DELETE FROM "+j.sql.migrations+" WHERE version = $1", last); err != nil {
		t.Fatal(err)
	}
	fails(ErrSchemaTooOld)
	var have int
	pgtest.MustQueryRow(t, url, "SELECT max(version) FROM "+j.sql.migrations, nil, &have)
	if have != last-1 {
		t.Fatalf("after a read-only Open the journal is at version %d, want %d (untouched)", have, last-1)
	}
	if _, err := j.exec(ctx, "INSERT INTO "+j.sql.migrations+" (version) VALUES ($1), ($2)", last, last+1); err != nil {
		t.Fatal(err)
	}
	fails(ErrSchemaTooNew)
}
