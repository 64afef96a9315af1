package journal

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal/journaltest"
)

// appendN appends n single-change transactions to entity, returning the
// result.
func appendN(t testing.TB, j *Journal, gen int64, lsn *decoder.LSN, entity string, n int) AppendResult {
	t.Helper()
	txs := make([]*decoder.Transaction, n)
	for i := range txs {
		*lsn += 10
		txs[i] = mkTx(uint32(*lsn), *lsn, testEpoch, ins(entity, int(*lsn)))
	}
	return mustAppend(t, j, gen, txs...)
}

func TestEmptyCursorStartsAtHorizonOrOldest(t *testing.T) {
	j, gen, _ := newJournal(t)
	var lsn decoder.LSN
	appendN(t, j, gen, &lsn, "public.a", 5)
	res := mustRead(t, j, Query{AllTenants: true})
	if len(res.Changes) != 0 || res.ResyncRequired || res.Horizon != 5 {
		t.Fatalf("empty cursor: %+v", res)
	}
	appendN(t, j, gen, &lsn, "public.a", 2)
	res = mustRead(t, j, Query{AllTenants: true, Cursor: res.Cursor})
	if got := seqs(res.Changes); len(got) != 2 || got[0] != 6 {
		t.Fatalf("from horizon cursor: %v", got)
	}
	res = mustRead(t, j, Query{AllTenants: true, FromOldest: true})
	if got := seqs(res.Changes); len(got) != 7 || got[0] != 1 {
		t.Fatalf("from oldest: %v", got)
	}
	hc, err := j.HorizonCursor(testCtx(t), Query{AllTenants: true})
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := j.CursorPosition(hc); p != 7 {
		t.Fatalf("horizon cursor at %d", p)
	}
}

func TestLimitAndCursorAdvance(t *testing.T) {
	j, gen, _ := newJournal(t)
	var lsn decoder.LSN
	appendN(t, j, gen, &lsn, "public.a", 3)
	appendN(t, j, gen, &lsn, "public.b", 3)
	q := Query{Entities: []string{"public.a"}, Limit: 2, FromOldest: true}
	res := mustRead(t, j, q)
	if got := seqs(res.Changes); fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("page 1: %v", got)
	}
	if p, _ := j.CursorPosition(res.Cursor); p != 2 {
		t.Fatalf("full page cursor at %d, want 2", p)
	}
	q.Cursor, q.FromOldest = res.Cursor, false
	res = mustRead(t, j, q)
	if got := seqs(res.Changes); fmt.Sprint(got) != "[3]" {
		t.Fatalf("page 2: %v", got)
	}
	// Fewer than Limit matched: the filtered reader moves to the horizon.
	if p, _ := j.CursorPosition(res.Cursor); p != 6 {
		t.Fatalf("short page cursor at %d, want 6", p)
	}
}

func TestResync(t *testing.T) {
	ctx := testCtx(t)
	j, gen, url := newJournal(t)
	var lsn decoder.LSN
	all := Query{AllTenants: true}
	sh := newScope(all).hash()
	appendN(t, j, gen, &lsn, "public.a", 10)
	at3 := j.cursorAt(0, 3, sh)

	check := func(t *testing.T, j *Journal, q Query, reason ResyncReason, horizon int64) {
		t.Helper()
		res, err := j.Changes(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if !res.ResyncRequired || res.Reason != reason || len(res.Changes) != 0 || res.Cursor != q.Cursor {
			t.Fatalf("want resync %q with no changes and the cursor unadvanced, got %+v", reason, res)
		}
		if p, err := j.CursorPosition(res.ResyncCursor); err != nil || p != horizon {
			t.Fatalf("resync cursor at %d (%v), want horizon %d", p, err, horizon)
		}
		// The resync cursor works and continues from the horizon.
		again := mustRead(t, j, Query{Cursor: res.ResyncCursor, Entities: q.Entities, Tenant: q.Tenant, AllTenants: q.AllTenants})
		if again.ResyncRequired || len(again.Changes) != 0 {
			t.Fatalf("read from resync cursor: %+v", again)
		}
	}

	t.Run("ahead of horizon", func(t *testing.T) {
		check(t, j, Query{AllTenants: true, Cursor: j.cursorAt(0, 11, sh)}, ResyncAhead, 10)
		if res := mustRead(t, j, Query{AllTenants: true, Cursor: j.cursorAt(0, 10, sh)}); res.ResyncRequired {
			t.Fatal("cursor at horizon resynced")
		}
	})
	t.Run("pruned", func(t *testing.T) {
		if _, err := j.Prune(ctx, Retention{MaxRows: 6}); err != nil { // floor 5
			t.Fatal(err)
		}
		check(t, j, Query{AllTenants: true, Cursor: at3}, ResyncPruned, 10)
		res := mustRead(t, j, Query{AllTenants: true, Cursor: j.cursorAt(0, 4, sh)}) // floor-1: nothing lost
		if res.ResyncRequired || len(res.Changes) != 6 || res.Changes[0].Seq != 5 {
			t.Fatalf("cursor at floor-1: %+v", res)
		}
	})
	t.Run("foreign journal", func(t *testing.T) {
		other := openAt(t, url, func(c *Config) { c.Schema = "other" })
		foreign := other.cursorAt(0, 3, sh)
		check(t, j, Query{AllTenants: true, Cursor: foreign}, ResyncForeignJournal, 10)
		strict := openAt(t, url, func(c *Config) { c.RejectForeignJournal = true })
		_, err := strict.Changes(ctx, Query{AllTenants: true, Cursor: foreign})
		if !errors.Is(err, ErrForeignJournal) {
			t.Fatalf("strict: %v, want ErrForeignJournal", err)
		}
	})
	t.Run("rotated secret", func(t *testing.T) {
		rotated := openAt(t, url, func(c *Config) {
			c.CursorSecret = []byte("the-new-secret-0123456789")
			c.PreviousCursorSecrets = [][]byte{testSecret}
		})
		check(t, rotated, Query{AllTenants: true, Cursor: j.cursorAt(0, 8, sh)}, ResyncSecretRotated, 10)
		forgotten := openAt(t, url, func(c *Config) { c.CursorSecret = []byte("the-new-secret-0123456789") })
		if _, err := forgotten.Changes(ctx, Query{AllTenants: true, Cursor: j.cursorAt(0, 8, sh)}); !errors.Is(err, ErrCursorTampered) {
			t.Fatalf("unknown secret: %v, want ErrCursorTampered", err)
		}
	})
	t.Run("after a resync entry", func(t *testing.T) {
		before := j.cursorAt(0, 9, sh)
		res, err := j.AppendResync(ctx, gen, Resync{Reason: "slot lost"})
		if err != nil || res.FirstSeq != 11 {
			t.Fatalf("%+v %v", res, err)
		}
		appendN(t, j, gen, &lsn, "public.a", 2) // 12, 13
		check(t, j, Query{AllTenants: true, Cursor: before}, ResyncEntry, 13)
		check(t, j, Query{AllTenants: true, Cursor: j.cursorAt(0, 10, sh)}, ResyncEntry, 13)
		after := mustRead(t, j, Query{AllTenants: true, Cursor: j.cursorAt(0, 11, sh)})
		if after.ResyncRequired || fmt.Sprint(seqs(after.Changes)) != "[12 13]" {
			t.Fatalf("after the resync entry: %+v", after)
		}
		oldest := mustRead(t, j, Query{AllTenants: true, FromOldest: true})
		if fmt.Sprint(seqs(oldest.Changes)) != "[12 13]" {
			t.Fatalf("FromOldest must start after the resync entry: %v", seqs(oldest.Changes))
		}
		e := rawEntry(t, j, 11)
		env := decodeEnv(t, e)
		if env.Op != decoder.OpResync || !strings.Contains(string(e.Envelope), `"reason":"slot lost"`) {
			t.Fatalf("resync envelope: %s", e.Envelope)
		}
	})
}

// rawEntry reads one entry by seq, bypassing cursors.
func rawEntry(t testing.TB, j *Journal, seq int64) Entry {
	t.Helper()
	var e Entry
	var tenant *string
	var lsn, commitLSN int64
	err := j.queryRow(testCtx(t), "SELECT seq, entity, entity_seq, tenant, tenant_unknown, op, lsn, commit_lsn, commit_time, envelope FROM "+
		j.sql.entries+" WHERE seq = $1", []any{seq}, &e.Seq, &e.Entity, &e.EntitySeq, &tenant, &e.TenantUnknown, &e.Op, &lsn, &commitLSN, &e.CommitTime, &e.Envelope)
	if err != nil {
		t.Fatalf("entry %d: %v", seq, err)
	}
	if tenant != nil {
		e.Tenant = *tenant
	}
	e.LSN, e.CommitLSN = decoder.LSN(lsn), decoder.LSN(commitLSN)
	return e
}

func TestAppendResyncResetsWatermarkAndSource(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	mustAppend(t, j, gen, mkTx(1, 5000, testEpoch, ins("public.a", 1)))
	src := Source{SystemID: "42", Timeline: 3, Slot: "walcast"}
	res, err := j.AppendResync(ctx, gen, Resync{Reason: "restored backup", Watermark: 100, ResetWatermark: true, Source: &src})
	if err != nil || res.Watermark != 100 {
		t.Fatalf("%+v %v", res, err)
	}
	st, _ := j.State(ctx)
	if st.Watermark != 100 || st.Source != src || st.ResyncSeq != 2 {
		t.Fatalf("state %+v", st)
	}
	// Transactions of the new source, below the old watermark, are journaled.
	res = mustAppend(t, j, gen, mkTx(2, 200, testEpoch, ins("public.a", 2)))
	if res.Entries != 1 {
		t.Fatalf("new source's transaction skipped: %+v", res)
	}
}

func TestFiltersNeverCauseOrHideResync(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	var lsn decoder.LSN
	qa := Query{Entities: []string{"public.a"}, FromOldest: true}
	appendN(t, j, gen, &lsn, "public.a", 1)
	res := mustRead(t, j, qa) // seq 1; cursor to horizon
	appendN(t, j, gen, &lsn, "public.b", 50)
	res = mustRead(t, j, Query{Entities: qa.Entities, Cursor: res.Cursor})
	if len(res.Changes) != 0 || res.ResyncRequired {
		t.Fatalf("%+v", res)
	}
	lagging := j.cursorAt(0, 1, newScope(qa).hash()) // a reader that stopped at seq 1
	if _, err := j.Prune(ctx, Retention{MaxRows: 10}); err != nil {
		t.Fatal(err)
	}
	// Never cause: the polling filtered reader is past the pruned range,
	// although every entry it matched is gone.
	res = mustRead(t, j, Query{Entities: qa.Entities, Cursor: res.Cursor})
	if res.ResyncRequired {
		t.Fatalf("filter caused a resync: %+v", res)
	}
	// Never hide: the lagging reader lost only other entities' entries, but
	// its position is gone all the same.
	res = mustRead(t, j, Query{Entities: qa.Entities, Cursor: lagging})
	if !res.ResyncRequired || res.Reason != ResyncPruned {
		t.Fatalf("filter hid a resync: %+v", res)
	}
	// Same for a tenant filter: tenant T's reader whose pruned range held
	// only other tenants' rows.
	qt := Query{Tenant: "t1"}
	res = mustRead(t, j, Query{Tenant: "t1", Cursor: j.cursorAt(0, 2, newScope(qt).hash())})
	if !res.ResyncRequired || res.Reason != ResyncPruned {
		t.Fatalf("tenant filter hid a resync: %+v", res)
	}
}

func TestCursorRejections(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	var lsn decoder.LSN
	appendN(t, j, gen, &lsn, "public.a", 3)
	q := Query{Entities: []string{"public.a", "public.b"}, Tenant: "acme", FromOldest: true}
	res := mustRead(t, j, q)
	cur := res.Cursor

	// Scope is canonical: order and duplicates of entities do not matter.
	if _, err := j.Changes(ctx, Query{Entities: []string{"public.b", "public.a", "public.a"}, Tenant: "acme", Cursor: cur}); err != nil {
		t.Fatalf("same scope, other spelling: %v", err)
	}
	for name, q2 := range map[string]Query{
		"other entities":  {Entities: []string{"public.a"}, Tenant: "acme"},
		"other tenant":    {Entities: q.Entities, Tenant: "evil"},
		"unscoped":        {Entities: q.Entities},
		"all tenants":     {Entities: q.Entities, AllTenants: true},
		"all entities":    {Tenant: "acme"},
		"entity boundary": {Entities: []string{"public.apublic.b"}, Tenant: "acme"},
	} {
		q2.Cursor = cur
		if _, err := j.Changes(ctx, q2); !errors.Is(err, ErrCursorScope) {
			t.Errorf("%s: %v, want ErrCursorScope", name, err)
		}
	}
	tampered := []string{"", "x", cur[:len(cur)-1], cur + "A", strings.Repeat("A", len(cur)), "!" + cur[1:]}
	for i := range cur { // every single-character change
		b := []byte(cur)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		tampered = append(tampered, string(b))
	}
	for _, c := range tampered[1:] {
		_, err := j.Changes(ctx, Query{Entities: q.Entities, Tenant: "acme", Cursor: c})
		if !errors.Is(err, ErrCursorTampered) {
			t.Fatalf("tampered cursor %q: %v, want ErrCursorTampered", c, err)
		}
		var je *Error
		if !errors.As(err, &je) || je.Op != "journal.Changes" {
			t.Fatalf("want *Error, got %#v", err)
		}
	}
	noSecret := openAt(t, pgtestURL(t, j), func(c *Config) { c.CursorSecret = nil })
	if _, err := noSecret.Changes(ctx, Query{}); !errors.Is(err, ErrNoCursorSecret) {
		t.Fatalf("no secret: %v", err)
	}
}

func TestTenancy(t *testing.T) {
	j, gen, _ := newJournal(t)
	const ent = "public.orders"
	known := func(id int, tenant string) chg {
		return chg{entity: ent, op: decoder.OpInsert, key: fmt.Sprintf(`{"id":%d}`, id), tenant: tenant, state: decoder.TenantKnown}
	}
	none := func(id int) chg {
		return chg{entity: ent, op: decoder.OpUpdate, key: fmt.Sprintf(`{"id":%d}`, id), state: decoder.TenantNone}
	}
	del := func(id int) chg {
		return chg{entity: ent, op: decoder.OpDelete, key: fmt.Sprintf(`{"id":%d}`, id), state: decoder.TenantUnresolved}
	}
	mustAppend(t, j, gen,
		mkTx(1, 100, testEpoch, known(1, "A"), known(2, "B"), none(3), known(4, "A")),
		mkTx(2, 200, testEpoch, known(4, "B")), // key 4 moved to tenant B
		mkTx(3, 300, testEpoch, chg{entity: "public.plain", op: decoder.OpInsert, key: `{"id":1}`}),
	)
	res := mustAppend(t, j, gen,
		mkTx(4, 400, testEpoch,
			del(1),          // journaled before: A
			del(4),          // newest journaled change: B
			del(3),          // newest change had no tenant: none
			del(99),         // never seen: unknown
			known(5, "B"),   // same batch…
			del(5),          // …resolves from it: B
			none(6), del(6), // same batch, no tenant
			known(7, `we"ird`), // a tenant needing JSON escaping
			del(7),
		),
	)
	if res.TenantUnknown != 1 {
		t.Fatalf("TenantUnknown = %d, want 1", res.TenantUnknown)
	}
	all, _ := readAll(t, j, Query{AllTenants: true})
	byDesc := map[string]Entry{}
	for _, e := range all {
		env := decodeEnv(t, e) // also checks envelope tenant == row tenant
		key := string(env.Key["id"])
		byDesc[fmt.Sprintf("%s/%s/%s", e.Entity, e.Op, key)] = e
	}
	for desc, want := range map[string]struct {
		tenant  string
		unknown bool
	}{
		ent + "/delete/1":  {"A", false},
		ent + "/delete/4":  {"B", false},
		ent + "/delete/3":  {"", false},
		ent + "/delete/99": {"", true},
		ent + "/delete/5":  {"B", false},
		ent + "/delete/6":  {"", false},
		ent + "/delete/7":  {`we"ird`, false},
	} {
		e, ok := byDesc[desc]
		if !ok {
			t.Fatalf("%s not journaled", desc)
		}
		if e.Tenant != want.tenant || e.TenantUnknown != want.unknown {
			t.Errorf("%s: tenant %q unknown %v, want %q %v (%s)", desc, e.Tenant, e.TenantUnknown, want.tenant, want.unknown, e.Envelope)
		}
	}
	if e := byDesc[ent+"/delete/99"]; !strings.HasSuffix(string(e.Envelope), `,"tenantUnknown":true}`) {
		t.Fatalf("unknown tenant envelope: %s", e.Envelope)
	}

	visible := func(q Query) map[string]bool {
		es, _ := readAll(t, j, q)
		out := map[string]bool{}
		for _, e := range es {
			if e.TenantUnknown {
				out["unknown"] = true
			} else {
				out["tenant:"+e.Tenant] = true
			}
		}
		return out
	}
	if got := visible(Query{Tenant: "A"}); fmt.Sprint(got) != "map[tenant::true tenant:A:true]" {
		t.Errorf("tenant A sees %v", got)
	}
	if got := visible(Query{Tenant: "B"}); fmt.Sprint(got) != "map[tenant::true tenant:B:true]" {
		t.Errorf("tenant B sees %v", got)
	}
	if got := visible(Query{}); fmt.Sprint(got) != "map[tenant::true]" {
		t.Errorf("unscoped sees %v", got)
	}
	if got := visible(Query{Tenant: "C"}); fmt.Sprint(got) != "map[tenant::true]" {
		t.Errorf("tenant C sees %v", got)
	}
	if got := visible(Query{AllTenants: true}); !got["unknown"] || !got["tenant:A"] || !got["tenant:B"] {
		t.Errorf("all tenants sees %v", got)
	}
	// The untenanted entity is visible to everyone.
	for _, q := range []Query{{Tenant: "A", Entities: []string{"public.plain"}}, {Entities: []string{"public.plain"}}} {
		if es, _ := readAll(t, j, q); len(es) != 1 {
			t.Errorf("%+v sees %d rows of an untenanted entity", q, len(es))
		}
	}
}

// TestPollingSeesEveryEntryOnce polls with returned cursors while appends
// and pruning run: every reader sees every committed entry exactly once, in
// order (journaltest.Validator).
func TestPollingSeesEveryEntryOnce(t *testing.T) {
	j, gen, url := newJournal(t)
	readerJ := openAt(t, url) // readers and pruner in another "process"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const batches, retain = 150, 400
	entities := []string{"public.a", "public.b", "public.c"}
	type reader struct {
		q   Query
		v   *journaltest.Validator
		pos atomic.Int64 // last seq seen (for throttling the appender)
	}
	readers := []*reader{
		{q: Query{AllTenants: true, Limit: 37}, v: journaltest.New()},
		{q: Query{AllTenants: true, Limit: 500}, v: journaltest.New()},
		{q: Query{AllTenants: true, Entities: []string{"public.b"}, Limit: 20}, v: &journaltest.Validator{ContiguousEntitySeq: true}},
	}
	idOf := func(e Entry) string { return fmt.Sprintf("%s@%s", e.Entity, e.LSN) }
	var appended atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 10)
	appDone := make(chan struct{})
	wg.Add(1)
	go func() { // appender
		defer wg.Done()
		defer close(appDone)
		lsn := decoder.LSN(0)
		for b := 0; b < batches; b++ {
			var txs []*decoder.Transaction
			var ids []string
			var idsB []string
			for k := 0; k < 1+b%3; k++ {
				var cs []chg
				for c := 0; c < 1+(b+k)%4; c++ {
					cs = append(cs, ins(entities[(b+c)%3], b))
				}
				lsn += 100
				tx := mkTx(uint32(b), lsn, testEpoch, cs...)
				it := tx.Changes()
				for it.Next() {
					id := fmt.Sprintf("%s@%s", it.Change().Entity, it.Change().LSN)
					ids = append(ids, id)
					if it.Change().Entity == "public.b" {
						idsB = append(idsB, id)
					}
				}
				txs = append(txs, tx)
			}
			res, err := j.Append(ctx, gen, txs)
			if err != nil {
				errc <- err
				return
			}
			readers[0].v.Commit(ids...)
			readers[1].v.Commit(ids...)
			readers[2].v.Commit(idsB...)
			appended.Store(res.LastSeq)
			// Keep every reader within reach of retention.
			for _, r := range readers {
				for r.pos.Load() < res.LastSeq-retain/2 && ctx.Err() == nil {
					time.Sleep(time.Millisecond)
				}
			}
		}
	}()
	stopPrune := make(chan struct{})
	var pwg sync.WaitGroup
	pwg.Add(1)
	go func() { // pruner
		defer pwg.Done()
		for {
			if _, err := readerJ.Prune(ctx, Retention{MaxRows: retain, BatchSize: 50}); err != nil {
				errc <- err
				return
			}
			select {
			case <-stopPrune:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	for _, r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := r.q
			q.FromOldest = true
			for {
				res, err := readerJ.Changes(ctx, q)
				if err != nil {
					errc <- err
					return
				}
				if res.ResyncRequired {
					errc <- fmt.Errorf("reader %+v: unexpected resync %s", r.q, res.Reason)
					return
				}
				for _, e := range res.Changes {
					r.v.Observe(journaltest.Item{Seq: e.Seq, Entity: e.Entity, EntitySeq: e.EntitySeq, ID: idOf(e)})
				}
				q.Cursor, q.FromOldest = res.Cursor, false
				p, _ := readerJ.CursorPosition(res.Cursor)
				r.pos.Store(p)
				if !res.More {
					select {
					case <-appDone:
						if p >= appended.Load() {
							return
						}
					default:
					}
					wctx, wcancel := context.WithTimeout(ctx, 50*time.Millisecond)
					_, _ = readerJ.Wait(wctx, p)
					wcancel()
				}
			}
		}()
	}
	wg.Wait()
	close(stopPrune)
	pwg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for i, r := range readers {
		if err := r.v.Check(); err != nil {
			t.Errorf("reader %d (%+v): %v", i, r.q, err)
		}
		if r.v.Observed() == 0 {
			t.Errorf("reader %d observed nothing", i)
		}
	}
	st, _ := j.State(testCtx(t))
	if st.Floor == 1 {
		t.Error("pruning never ran during the test")
	}
}

func TestWait(t *testing.T) {
	j, gen, url := newJournal(t)
	ctx := testCtx(t)
	waiter := openAt(t, url)
	var lsn decoder.LSN
	appendN(t, j, gen, &lsn, "public.a", 2)
	if h, err := waiter.Wait(ctx, 1); err != nil || h != 2 {
		t.Fatalf("wait below horizon: %d %v", h, err)
	}
	got := make(chan int64, 1)
	go func() {
		h, err := waiter.Wait(ctx, 2)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	time.Sleep(20 * time.Millisecond)
	appendN(t, j, gen, &lsn, "public.a", 3)
	select {
	case h := <-got:
		if h != 5 {
			t.Fatalf("woke at %d, want 5", h)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not wake on append")
	}
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := waiter.Wait(short, 5); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want deadline, got %v", err)
	}
	waiter.Close()
	if _, err := waiter.Wait(ctx, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

// TestFilteredReadScansABoundedWindow: a filtered read scans at most
// scanWindow entries past its cursor; with nothing matching it moves the
// cursor to the end of that window and says there is more.
func TestFilteredReadScansABoundedWindow(t *testing.T) {
	j, gen, _ := newJournal(t)
	var lsn decoder.LSN
	w := int(scanWindow(10))
	appendN(t, j, gen, &lsn, "public.b", w+5)
	appendN(t, j, gen, &lsn, "public.a", 1)
	q := Query{Entities: []string{"public.a"}, Limit: 10, FromOldest: true}
	res := mustRead(t, j, q)
	if len(res.Changes) != 0 || !res.More {
		t.Fatalf("first window: %d changes, more=%v", len(res.Changes), res.More)
	}
	if p, _ := j.CursorPosition(res.Cursor); p != int64(w) {
		t.Fatalf("cursor at %d, want the window's end %d", p, w)
	}
	res = mustRead(t, j, Query{Entities: q.Entities, Limit: 10, Cursor: res.Cursor})
	if len(res.Changes) != 1 || res.Changes[0].Seq != int64(w+6) || res.More {
		t.Fatalf("second window: %+v", res)
	}
}

// TestReadsBoundedByBytes: Changes and ReadAfterBytes stop before the entry
// whose predecessors reach the byte bound (the first is always returned),
// and continuing from the cursor misses nothing. Before, a read held up to
// Limit envelopes whatever their size.
func TestReadsBoundedByBytes(t *testing.T) {
	j, gen, _ := newJournal(t)
	lsn := decoder.LSN(0x1000)
	var txs []*decoder.Transaction
	for i := range 10 {
		lsn += 10
		c := ins("public.big", i)
		c.pad = 100 << 10
		if i%2 == 1 {
			c.entity = "public.other"
		}
		txs = append(txs, mkTx(uint32(lsn), lsn, testEpoch, c))
	}
	mustAppend(t, j, gen, txs...)

	// Unfiltered, 250 KB: three 100 KB entries (0, 100 and 200 KB before them).
	lg, err := j.ReadAfterBytes(testCtx(t), 0, 100, 250<<10)
	if err != nil {
		t.Fatal(err)
	}
	if got := seqs(lg.Entries); len(got) != 3 || got[0] != 1 {
		t.Fatalf("ReadAfterBytes returned seqs %v", got)
	}
	// A bound below one envelope still returns one.
	if lg, err = j.ReadAfterBytes(testCtx(t), 0, 100, 1); err != nil || len(lg.Entries) != 1 {
		t.Fatalf("tiny bound: %d entries, %v", len(lg.Entries), err)
	}

	// Filtered by entity: only public.big (seqs 1,3,5,7,9) counts.
	q := Query{Entities: []string{"public.big"}, FromOldest: true, MaxBytes: 250 << 10}
	var got []int64
	for range 10 {
		res := mustRead(t, j, q)
		if len(res.Changes) > 3 {
			t.Fatalf("read of %d changes past the byte bound", len(res.Changes))
		}
		got = append(got, seqs(res.Changes)...)
		q.Cursor, q.FromOldest = res.Cursor, false
		if !res.More {
			break
		}
	}
	if want := []int64{1, 3, 5, 7, 9}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("paged by bytes: %v, want %v", got, want)
	}
	first := mustRead(t, j, Query{Entities: []string{"public.big"}, FromOldest: true, MaxBytes: 250 << 10})
	if len(first.Changes) != 3 || !first.More {
		t.Fatalf("first page: %d changes, more %v", len(first.Changes), first.More)
	}
}

// TestEntryHasTenant: ” and NULL tenants stay apart when read.
func TestEntryHasTenant(t *testing.T) {
	j, gen, _ := newJournal(t)
	mustAppend(t, j, gen, mkTx(1, 0x2000, testEpoch,
		chg{entity: "public.t", op: decoder.OpInsert, key: `{"id":1}`, tenant: "", state: decoder.TenantKnown},
		chg{entity: "public.t", op: decoder.OpInsert, key: `{"id":2}`}))
	lg, err := j.ReadAfter(testCtx(t), 0, 10)
	if err != nil || len(lg.Entries) != 2 {
		t.Fatalf("%v %d", err, len(lg.Entries))
	}
	if e := lg.Entries[0]; !e.HasTenant || e.Tenant != "" {
		t.Fatalf("'' tenant read as %+v", e)
	}
	if e := lg.Entries[1]; e.HasTenant {
		t.Fatalf("NULL tenant read as %+v", e)
	}
	if e, err := j.EntryAt(testCtx(t), 1); err != nil || !e.HasTenant {
		t.Fatalf("EntryAt: %+v %v", e, err)
	}
	ents, err := j.Entities(testCtx(t), 0, 0)
	if err != nil || fmt.Sprint(ents) != "[public.t]" {
		t.Fatalf("Entities = %v, %v", ents, err)
	}
}
