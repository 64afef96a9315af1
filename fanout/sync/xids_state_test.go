package sync

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

// A state snapshot on a source whose xid counter stands 2^31 and more past
// the transactions of entries in the journal's look-back window: those
// entries (an insert of a row later updated, an insert of a row later
// deleted) are visible in the snapshot and must not follow the rows —
// their 32-bit xids, read near the snapshot's xmax, look like transactions
// of the future, and delivering them would leave the client with the
// row's old value and a deleted row. A transaction in progress when the
// snapshot is taken and committed while it is read is delivered once.
func TestStateSkipsEntries2To31XidsOld(t *testing.T) {
	const next = 3<<32 | 1<<31 + 5000 // the source's xid counter: epoch 3, past 2^31
	c := pgtest.Start(t, pgtest.Options{NextXid: next})
	url := c.NewDatabase(t)
	ctx := syncCtx(t)

	// The old history, journaled before this walcast run started (as by
	// an earlier one): two inserts whose transactions are 2^31+1000 xids
	// older than anything the source runs now.
	const aged = next - 1<<31 - 1000
	j, err := journal.Open(ctx, journal.Config{URL: url, CursorSecret: syncTestSecret})
	if err != nil {
		t.Fatal(err)
	}
	gen, err := j.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oldInsert := func(x8 uint64, lsn decoder.LSN, id, val string) *decoder.Transaction {
		ct := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
		env := decoder.Envelope{LSN: lsn, CommitLSN: lsn + 1, Xid: uint32(x8), CommitTime: ct, Entity: "public.docs", Op: decoder.OpInsert,
			Key:   map[string]json.RawMessage{"id": json.RawMessage(id)},
			After: map[string]json.RawMessage{"id": json.RawMessage(id), "tenant": json.RawMessage("null"), "val": json.RawMessage(`"` + val + `"`)}}
		body, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		tx := decoder.NewTransaction(uint32(x8), lsn, lsn+1, ct, []decoder.Change{{LSN: lsn, Entity: "public.docs", Op: decoder.OpInsert,
			Key: []byte(`{"id":` + id + `}`), TenantState: decoder.TenantNone, Tenanted: true, Body: body}})
		tx.Xid8 = x8
		return tx
	}
	if _, err := j.Append(ctx, gen, []*decoder.Transaction{oldInsert(aged, 0x100, "1", "old"), oldInsert(aged+1, 0x200, "2", "ghost")}); err != nil {
		t.Fatal(err)
	}
	j.Close()

	// The rows those inserts wrote, as the source holds them; walcast run
	// then journals an update of one and the delete of the other.
	env := newStateEnvAt(t, url, nil, `INSERT INTO docs VALUES (1, NULL, 'old'), (2, NULL, 'ghost')`)
	pgtest.MustExec(t, url, `UPDATE docs SET val = 'new' WHERE id = 1`, `DELETE FROM docs WHERE id = 2`)
	// The cluster is this test's own, just restarted past 2^31 xids: its
	// first session (catalog pass included) may take a while on a loaded
	// machine.
	waitForWithin(t, 90*time.Second, "the update and the delete journaled", func() bool {
		res, err := env.j.Changes(ctx, journal.Query{Entities: []string{"public.docs"}, FromOldest: true, Limit: journal.MaxLimit})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range res.Changes {
			if e.Op == decoder.OpUpdate || e.Op == decoder.OpDelete {
				if !e.HasXid8 || e.Xid8 < next {
					t.Fatalf("entry %d (%s) journaled with xid8 %d (known %v), want one at or past %d", e.Seq, e.Op, e.Xid8, e.HasXid8, uint64(next))
				}
				n++
			}
		}
		return n == 2
	})
	var xmax uint64
	pgtest.MustQueryRow(t, url, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8`, nil, &xmax)
	if xmax-aged < 1<<31 {
		t.Fatalf("the source's xmax %d is only %d xids past the old entries", xmax, xmax-aged)
	}

	// A transaction in progress when the snapshot is taken.
	during, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer during.Close(context.Background())
	for _, sql := range []string{"BEGIN", "INSERT INTO docs VALUES (3, NULL, 'during')"} {
		if _, err := during.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	sc := dialState(env, stateToken(t, "", true))
	cl := newStateClient("")
	sc.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	var changes []string // change frames before snapshot-end
	for cl.snaps == 0 {
		f := sc.next(t, cl)
		switch f.T {
		case "snapshot-begin":
			if _, err := during.Exec(ctx, "COMMIT"); err != nil {
				t.Fatal(err)
			}
		case "change":
			changes = append(changes, string(f.Change))
		}
	}
	for _, ch := range changes {
		if strings.Contains(ch, `"old"`) || strings.Contains(ch, `"ghost"`) {
			t.Errorf("a change 2^31+ xids older than the snapshot followed its rows: %s", ch)
		}
	}
	follow(t, env, sc, cl)
	if len(cl.errs) > 0 {
		t.Fatalf("client: %s", strings.Join(cl.errs, "; "))
	}
	if cl.rows["1"] != `null|"new"` || cl.rows["3"] != `null|"during"` {
		t.Fatalf("client state %v", cl.rows)
	}
	if _, ok := cl.rows["2"]; ok {
		t.Fatalf("client state %v holds the deleted row 2", cl.rows)
	}
}
