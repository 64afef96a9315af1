package journal

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
)

func TestRetentionByRows(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	var lsn decoder.LSN
	appendN(t, j, gen, &lsn, "public.a", 30)
	res, err := j.Prune(ctx, Retention{MaxRows: 12, BatchSize: 5})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != 18 || res.Floor != 19 || res.Batches != 4 {
		t.Fatalf("%+v", res)
	}
	st, _ := j.State(ctx)
	if st.Rows != 12 || st.Floor != 19 || st.Horizon != 30 {
		t.Fatalf("%+v", st)
	}
	assertRetained(t, j, 19, 30)
	// Within bounds: nothing to do.
	if res, err := j.Prune(ctx, Retention{MaxRows: 12}); err != nil || res.Rows != 0 || res.Floor != 19 {
		t.Fatalf("%+v %v", res, err)
	}
	// The newest entry is always kept.
	if res, err := j.Prune(ctx, Retention{MaxRows: 1}); err != nil || res.Floor != 30 {
		t.Fatalf("%+v %v", res, err)
	}
	assertRetained(t, j, 30, 30)
}

func TestRetentionByBytes(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	var lsn decoder.LSN
	appendN(t, j, gen, &lsn, "public.a", 20)
	all, _ := readAll(t, j, Query{AllTenants: true})
	var total int64
	for _, e := range all {
		total += int64(len(e.Envelope))
	}
	st, _ := j.State(ctx)
	if st.Bytes != total {
		t.Fatalf("state bytes %d, envelopes total %d", st.Bytes, total)
	}
	// Keep the newest entries whose sizes sum to at most limit.
	limit := total / 3
	var keep int64
	var from int64
	for i := len(all) - 1; i >= 0 && keep+int64(len(all[i].Envelope)) <= limit; i-- {
		keep += int64(len(all[i].Envelope))
		from = all[i].Seq
	}
	res, err := j.Prune(ctx, Retention{MaxBytes: limit, BatchSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Floor != from || res.Bytes != total-keep {
		t.Fatalf("prune %+v; want floor %d and %d bytes", res, from, total-keep)
	}
	st, _ = j.State(ctx)
	if st.Bytes != keep || st.Bytes > limit {
		t.Fatalf("retained %d bytes, want %d (<= %d)", st.Bytes, keep, limit)
	}
	assertRetained(t, j, from, 20)
	if res, err := j.Prune(ctx, Retention{MaxBytes: 1}); err != nil || res.Floor != 20 {
		t.Fatalf("tiny byte bound must keep the newest: %+v %v", res, err)
	}
}

func TestRetentionByAge(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	now := time.Now()
	var txs []*decoder.Transaction
	for i := 0; i < 10; i++ {
		age := time.Duration(10-i) * time.Hour // 10h … 1h old
		txs = append(txs, mkTx(uint32(i), decoder.LSN(100*(i+1)), now.Add(-age), ins("public.a", i)))
	}
	mustAppend(t, j, gen, txs...)
	res, err := j.Prune(ctx, Retention{MaxAge: 4*time.Hour + 30*time.Minute, BatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != 6 || res.Floor != 7 {
		t.Fatalf("%+v", res)
	}
	assertRetained(t, j, 7, 10)
	if res, err := j.Prune(ctx, Retention{MaxAge: time.Minute}); err != nil || res.Floor != 10 {
		t.Fatalf("everything old must keep the newest: %+v %v", res, err)
	}
	assertRetained(t, j, 10, 10)
}

// TestRetentionRunner runs the background pruner and stops it.
func TestRetentionRunner(t *testing.T) {
	j, gen, _ := newJournal(t)
	var lsn decoder.LSN
	appendN(t, j, gen, &lsn, "public.a", 20)
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() {
		done <- j.RunRetention(ctx, Retention{MaxRows: 5}, 10*time.Millisecond, func(err error) { t.Error(err) })
	}()
	waitFor(t, "background pruning", func() bool {
		st, err := j.State(testCtx(t))
		return err == nil && st.Rows == 5
	})
	appendN(t, j, gen, &lsn, "public.a", 10)
	waitFor(t, "background pruning of new entries", func() bool {
		st, err := j.State(testCtx(t))
		return err == nil && st.Rows == 5 && st.Floor == 26
	})
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("RunRetention returned %v", err)
	}
}

// TestPruneDoesNotBlockAppends holds a prune batch's transaction open and
// appends meanwhile.
func TestPruneDoesNotBlockAppends(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	var lsn decoder.LSN
	appendN(t, j, gen, &lsn, "public.a", 10)
	c, err := j.pool.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer j.pool.release(c)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// What a prune batch locks and deletes.
	if _, err := tx.Exec(ctx, "SELECT floor FROM "+j.sql.retention+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "DELETE FROM "+j.sql.chunks+" WHERE first_seq <= 5"); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lsn += 10
	if _, err := j.Append(actx, gen, []*decoder.Transaction{mkTx(1, lsn, testEpoch, ins("public.a", 1))}); err != nil {
		t.Fatalf("append blocked behind pruning: %v", err)
	}
}

func assertRetained(t testing.TB, j *Journal, from, to int64) {
	t.Helper()
	var lo, hi, n int64
	if err := j.queryRow(testCtx(t), "SELECT coalesce(min(seq), 0), coalesce(max(seq), 0), count(*) FROM "+j.sql.entries, nil, &lo, &hi, &n); err != nil {
		t.Fatal(err)
	}
	if lo != from || hi != to || n != to-from+1 {
		t.Fatalf("retained seqs %d..%d (%d rows), want %d..%d", lo, hi, n, from, to)
	}
}

// TestHostileNames runs the journal in a schema and with entity names built
// to break unquoted SQL.
func TestHostileNames(t *testing.T) {
	for _, schema := range []string{`we"ird; DROP SCHEMA public CASCADE; --`, `Upper Case`, `ünïcode.dot`, `'quote'`} {
		t.Run(schema, func(t *testing.T) {
			j, gen, url := newJournal(t, func(c *Config) { c.Schema = schema })
			ctx := testCtx(t)
			ents := []string{`public."x; DROP TABLE y; --"`, "public.new\nline", `public.'q'`, "public.ü", ""}
			var txs []*decoder.Transaction
			for i, e := range ents {
				c := ins(e, i)
				c.tenant, c.state = `t"1\`, decoder.TenantKnown
				txs = append(txs, mkTx(uint32(i), decoder.LSN(100*(i+1)), testEpoch, c))
			}
			mustAppend(t, j, gen, txs...)
			waiter := openAt(t, url, func(c *Config) { c.Schema = schema })
			if h, err := waiter.Wait(ctx, 0); err != nil || h != int64(len(ents)) {
				t.Fatalf("wait: %d %v", h, err)
			}
			for _, e := range ents {
				got, _ := readAll(t, j, Query{Entities: []string{e}, Tenant: `t"1\`})
				if len(got) != 1 || got[0].Entity != e || got[0].EntitySeq != 1 {
					t.Fatalf("entity %q: %+v", e, got)
				}
				decodeEnv(t, got[0])
			}
			if _, err := j.Prune(ctx, Retention{MaxRows: 2}); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := j.queryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = $1", []any{schema}, &n); err != nil || n != 1 {
				t.Fatalf("schema %q not created as named: %d %v", schema, n, err)
			}
			if err := j.queryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = 'public'", nil, &n); err != nil || n != 1 {
				t.Fatal("the public schema went missing")
			}
		})
	}
}

// TestImports guards the layering of DESIGN §1: journal depends on decoder
// and on nothing above it.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/walcast/walcast/journal").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		own := strings.HasPrefix(dep, "github.com/walcast/walcast/")
		allowed := dep == "github.com/walcast/walcast/journal" || dep == "github.com/walcast/walcast/decoder"
		if own && !allowed || strings.Contains(dep, "nats-io") {
			t.Errorf("journal must not depend on %s", dep)
		}
	}
}

// TestRetentionByAgeStopsAtTheFirstYoungEntry: the floor describes a prefix,
// so an old entry behind a young one (a source clock step) waits.
func TestRetentionByAgeStopsAtTheFirstYoungEntry(t *testing.T) {
	j, gen, _ := newJournal(t)
	now := time.Now()
	ages := []time.Duration{5 * time.Hour, 4 * time.Hour, time.Minute, 3 * time.Hour, time.Minute}
	var txs []*decoder.Transaction
	for i, age := range ages {
		txs = append(txs, mkTx(uint32(i), decoder.LSN(100*(i+1)), now.Add(-age), ins("public.a", i)))
	}
	mustAppend(t, j, gen, txs...)
	res, err := j.Prune(testCtx(t), Retention{MaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != 2 || res.Floor != 3 {
		t.Fatalf("%+v", res)
	}
	assertRetained(t, j, 3, 5)
}
