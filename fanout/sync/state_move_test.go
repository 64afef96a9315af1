package sync

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcast/walcast/internal/pgtest"
)

// moveWriter runs random transactions on public.docs until stop, over ids
// 1..n, that move rows between tenants a, b, the empty tenant and none:
// inserts, updates of the value, updates of the tenant, key changes that
// also change the tenant, deletes, and a transaction that inserts a row and
// moves it before it commits.
// moves counts the updates that changed a row's tenant.
func moveWriter(t *testing.T, url string, seed uint64, n int, stop <-chan struct{}, moves *atomic.Int64, done func()) {
	defer done()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close(ctx)
	rng := rand.New(rand.NewPCG(seed, 11))
	tenants := []any{"a", "b", "", nil}
	tenant := func() any { return tenants[rng.IntN(len(tenants))] }
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		id := rng.IntN(n) + 1
		var err error
		switch rng.IntN(7) {
		case 0:
			_, err = conn.Exec(ctx, `INSERT INTO docs VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, id, tenant(), fmt.Sprint("v", i))
		case 1:
			_, err = conn.Exec(ctx, `UPDATE docs SET val = $2 WHERE id = $1`, id, fmt.Sprint("u", i))
		case 2, 3:
			var tag pgconn.CommandTag
			tag, err = conn.Exec(ctx, `UPDATE docs SET tenant = $2, val = $3 WHERE id = $1 AND tenant IS DISTINCT FROM $2`, id, tenant(), fmt.Sprint("m", i))
			moves.Add(tag.RowsAffected())
		case 4:
			to := rng.IntN(n) + 1
			_, err = conn.Exec(ctx, `UPDATE docs SET id = $2, tenant = $3 WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM docs WHERE id = $2)`, id, to, tenant())
		case 5:
			_, err = conn.Exec(ctx, `DELETE FROM docs WHERE id = $1`, id)
		case 6:
			err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `DELETE FROM docs WHERE id = $1`, id); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO docs VALUES ($1, $2, $3)`, id, tenant(), fmt.Sprint("i", i)); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE docs SET tenant = $2 WHERE id = $1`, id, tenant())
				return err
			})
		}
		if err != nil && !strings.Contains(err.Error(), "duplicate key") {
			t.Error(err)
			return
		}
	}
}

// TestStateTenantMoves: "snapshot":true clients of tenants a and b and
// unscoped ones subscribe at random moments while writers move rows between
// tenants (and to and from none, and the empty tenant); each client's rows
// and changes must rebuild exactly its scoped SELECT — a row that left a
// client's tenant is gone from its state, one that entered it is there.
func TestStateTenantMoves(t *testing.T) {
	env := newStateEnv(t)
	const n = 400
	pgtest.MustExec(t, env.src, fmt.Sprintf(`INSERT INTO docs SELECT g, (ARRAY['a','b','',NULL])[g %% 4 + 1], 'seed' FROM generate_series(1, %d) g ON CONFLICT DO NOTHING`, n))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var moves atomic.Int64
	for w := range 3 {
		wg.Add(1)
		go moveWriter(t, env.src, uint64(w+1), n, stop, &moves, wg.Done)
	}
	type sub struct {
		ws *stateConn
		c  *stateClient
	}
	var subs []sub
	tenants := []string{"a", "b", ""}
	for i := range 9 {
		time.Sleep(time.Duration(rand.IntN(150)) * time.Millisecond) // random moments during the writes
		tenant := tenants[i%3]
		ws := dialState(env, stateToken(t, tenant, true))
		ws.ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
		subs = append(subs, sub{ws, newStateClient(tenant)})
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	if moves.Load() == 0 {
		t.Fatal("the writers moved no row to another tenant (test bug)")
	}
	t.Logf("%d updates moved a row to another tenant", moves.Load())
	for _, s := range subs {
		follow(t, env, s.ws, s.c)
		if len(s.c.errs) > 0 {
			t.Errorf("client of tenant %q: %s", s.c.tenant, strings.Join(s.c.errs, "; "))
		}
	}
}

// moveFrame is a change frame's envelope as a client of a move reads it.
type moveFrame struct {
	Op     string          `json:"op"`
	Key    json.RawMessage `json:"key"`
	Tenant *string         `json:"tenant"`
	Moved  string          `json:"moved"`
	After  json.RawMessage `json:"after"`
}

// nextDoc is ws's next change of public.docs other than the environment's
// row 0, failing on any other frame.
func nextDoc(t *testing.T, ws *wsConn) moveFrame {
	t.Helper()
	for {
		f := ws.read()
		if f.T != "change" {
			t.Fatalf("frame %+v, want a change", f)
		}
		var m moveFrame
		if err := json.Unmarshal(f.Change, &m); err != nil {
			t.Fatal(err)
		}
		var k struct{ ID int }
		_ = json.Unmarshal(m.Key, &k)
		if k.ID != 0 {
			return m
		}
	}
}

// TestStateTenantMoveLive: a live socket of the tenant a row leaves gets a
// delete frame marked "moved":"tenant"; the new tenant's gets the update;
// an unscoped socket gets nothing of either until the row moves to no
// tenant — under REPLICA IDENTITY DEFAULT and FULL.
func TestStateTenantMoveLive(t *testing.T) {
	for _, identity := range []string{"DEFAULT", "FULL"} {
		t.Run(identity, func(t *testing.T) {
			env := newStateEnv(t, `ALTER TABLE docs REPLICA IDENTITY `+identity)
			socks := map[string]*wsConn{}
			for _, tenant := range []string{"a", "b", ""} {
				ws := env.mustDial(stateToken(t, tenant, false))
				ws.sub("public.docs", "")
				ws.expect("subscribed")
				socks[tenant] = ws
			}
			expect := func(tenant, op string, id int, rowTenant *string, moved bool) {
				t.Helper()
				m := nextDoc(t, socks[tenant])
				var k struct{ ID int }
				_ = json.Unmarshal(m.Key, &k)
				if m.Op != op || k.ID != id || (m.Tenant == nil) != (rowTenant == nil) || (m.Tenant != nil && *m.Tenant != *rowTenant) || (m.Moved == "tenant") != moved {
					t.Fatalf("socket of tenant %q got %+v (tenant %v), want %s of id %d in tenant %v, moved %v", tenant, m, deref(m.Tenant), op, id, deref(rowTenant), moved)
				}
				if moved && m.After != nil {
					t.Errorf("moved delete carries after: %s", m.After)
				}
			}
			a, b := strp("a"), strp("b")
			pgtest.MustExec(t, env.src, `INSERT INTO docs VALUES (100, 'a', 'x')`)
			expect("a", "insert", 100, a, false)
			pgtest.MustExec(t, env.src, `UPDATE docs SET tenant = 'b' WHERE id = 100`)
			expect("a", "delete", 100, a, true)
			expect("b", "update", 100, b, false)
			// A key change to no tenant: b loses the old key; everyone
			// sees the row under its new key.
			pgtest.MustExec(t, env.src, `UPDATE docs SET tenant = NULL, id = 101 WHERE id = 100`)
			expect("b", "delete", 100, b, true)
			expect("b", "update", 101, nil, false)
			expect("a", "update", 101, nil, false)
			expect("", "update", 101, nil, false)
			// From no tenant to a: it leaves b and the unscoped socket.
			pgtest.MustExec(t, env.src, `UPDATE docs SET tenant = 'a' WHERE id = 101`)
			expect("b", "delete", 101, nil, true)
			expect("", "delete", 101, nil, true)
			expect("a", "delete", 101, nil, true)
			expect("a", "update", 101, a, false)
		})
	}
}

func strp(s string) *string { return &s }

func deref(s *string) string {
	if s == nil {
		return "<none>"
	}
	return fmt.Sprintf("%q", *s)
}
