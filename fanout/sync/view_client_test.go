package sync

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/fanout/client"
	"github.com/walcast/walcast/internal/pgtest"
)

// TestClientFilteredStateSurvivesReconnect: the Go client's State follows
// public.items with a snapshot, a filter on status and a column list, as
// tenant "a". Rows move in and out of the filter, change key, are deleted,
// and rows of another tenant are written beside them; the state must equal
// SELECT id, status, amount FROM items WHERE <a's scope> AND status =
// 'paid'. Then the node drops every socket: the client resumes from its
// cursor with the same filter and columns (a cursor is bound to them, so
// anything else is bad-cursor), without a second snapshot, and stays exact
// under more writes.
func TestClientFilteredStateSurvivesReconnect(t *testing.T) {
	env := newStateEnvWith(t, nil, itemsSetup...)
	pgtest.MustExec(t, env.src, `INSERT INTO items SELECT g, (ARRAY['a','b',NULL])[g % 3 + 1], (ARRAY['new','paid','void'])[g % 3 + 1], g, 'seed' FROM generate_series(1, 30) g`)
	waitFor(t, "items to be journaled", func() bool { return env.node.known("public.items") })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := client.Dial(ctx, env.wsURL(""), client.Options{Token: itemsToken(t, "a")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st := client.NewState(c)
	const topic = "public.items"
	if err := st.SubscribeWith(topic, client.SubscribeOptions{
		Filter:  json.RawMessage(`{"col":"status","op":"=","value":"paid"}`),
		Columns: []string{"status", "amount"},
	}); err != nil {
		t.Fatal(err)
	}
	var (
		mu      gosync.Mutex
		begins  int
		errs    []string
		readers gosync.WaitGroup
	)
	readers.Add(1)
	go func() {
		defer readers.Done()
		for {
			ev, err := st.Next(ctx)
			mu.Lock()
			if err != nil && ctx.Err() == nil {
				errs = append(errs, err.Error())
			}
			switch ev.Type {
			case client.EventSnapshotBegin:
				begins++
			case client.EventError:
				errs = append(errs, ev.Code+": "+ev.Msg)
			}
			mu.Unlock()
			if err != nil && ev.Type == "" {
				return
			}
		}
	}()
	defer func() {
		cancel()
		readers.Wait()
	}()

	// exact waits until the state equals the filter's rows of tenant a's
	// scope, with only the listed columns and the key.
	exact := func(when string) {
		t.Helper()
		var diff string
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			e := strings.Join(errs, "; ")
			mu.Unlock()
			if e != "" {
				t.Fatalf("%s: errors: %s", when, e)
			}
			if ok, _ := st.Ready(topic); ok {
				if diff = diffStates(filteredState(t, st), filteredTable(t, env.src)); diff == "" {
					return
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("%s: state differs from the table after 30 s:\n%s", when, diff)
	}
	exact("after the snapshot")

	pgtest.MustExec(t, env.src,
		`UPDATE items SET status = 'paid' WHERE id IN (3, 6)`,          // into the filter (a's and no tenant's)
		`UPDATE items SET status = 'void' WHERE id IN (4, 7)`,          // out of it: removals
		`UPDATE items SET amount = amount + 100 WHERE status = 'paid'`, // within it
		`UPDATE items SET id = 101, status = 'paid' WHERE id = 1`,      // a key change into it
		`UPDATE items SET id = 110 WHERE id = 10`,                      // a key change within it
		`DELETE FROM items WHERE id IN (13, 16)`,                       // deletes within it
		`INSERT INTO items VALUES (40, 'a', 'paid', 1, 'x'), (41, 'b', 'paid', 2, 'x'), (42, NULL, 'new', 3, 'x')`,
		`BEGIN; UPDATE items SET status = 'new' WHERE id = 40; UPDATE items SET status = 'paid' WHERE id = 42; COMMIT`,
	)
	exact("after the first writes")
	if r := env.node.Stats().Filter.Removals; r == 0 {
		t.Fatal("no row left the filter: the test tests nothing")
	}
	if _, cur := st.Ready(topic); cur == "" || c.Cursor(topic) == "" {
		t.Fatal("no cursor to resume from")
	}

	// The node drops every socket; the client reconnects and resumes.
	env.node.mu.Lock()
	n := len(env.node.sockets)
	for s := range env.node.sockets {
		s.closeWith(websocket.CloseGoingAway, "test", "test")
	}
	env.node.mu.Unlock()
	if n == 0 {
		t.Fatal("no socket to drop")
	}
	waitFor(t, "the client to reconnect", func() bool {
		env.node.mu.Lock()
		defer env.node.mu.Unlock()
		return len(env.node.sockets) > 0
	})
	pgtest.MustExec(t, env.src,
		`UPDATE items SET status = 'void' WHERE id = 101`,
		`UPDATE items SET status = 'paid' WHERE id IN (9, 12, 18)`,
		`UPDATE items SET amount = -1 WHERE id = 110`,
		`INSERT INTO items VALUES (50, NULL, 'paid', 5, 'x'), (51, 'a', 'void', 6, 'x')`,
		`DELETE FROM items WHERE id = 19`,
	)
	exact("after the reconnect")
	mu.Lock()
	defer mu.Unlock()
	if len(errs) > 0 {
		t.Fatalf("errors: %s", strings.Join(errs, "; "))
	}
	if begins != 1 {
		t.Fatalf("%d snapshots, want 1: the client should resume from its cursor, not read the rows again", begins)
	}
}

// filteredState is the state's rows as id → "status amount", failing on a
// column outside the list.
func filteredState(t *testing.T, st *client.State) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, r := range st.Rows("public.items") {
		for col := range r {
			if col != "id" && col != "status" && col != "amount" {
				t.Fatalf("row %s holds column %s outside the list", r["id"], col)
			}
		}
		out[string(r["id"])] = fmt.Sprintf("%s %s", r["status"], r["amount"])
	}
	return out
}

// filteredTable is what filteredState must equal: the paid rows of tenant
// a's scope.
func filteredTable(t *testing.T, url string) map[string]string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT id::text, to_json(status)::text, to_json(amount)::text FROM items WHERE (tenant IS NULL OR tenant = 'a') AND status = 'paid'`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var id, status, amount string
		if err := rows.Scan(&id, &status, &amount); err != nil {
			t.Fatal(err)
		}
		out[id] = status + " " + amount
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
