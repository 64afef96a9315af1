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

	"github.com/walcast/walcast/fanout/client"
	"github.com/walcast/walcast/internal/pgtest"
)

// stateRows is a client.State's rows of public.docs in tableState's form.
func stateRows(t *testing.T, st *client.State) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, r := range st.Rows("public.docs") {
		out[string(r["id"])] = normRow(r)
	}
	return out
}

// TestClientStateKeepsTheTable: the Go client's state helper, against the
// real pipeline, under a write storm with a TRUNCATE in the middle and every
// socket kicked while one client is half way through its snapshot: each
// State ends equal to its tenant's SELECT, and the client kicked mid-
// snapshot asked for a fresh one (a half-read snapshot has no cursor).
func TestClientStateKeepsTheTable(t *testing.T) {
	env := newStateEnv(t)
	pgtest.MustExec(t, env.src, `INSERT INTO docs SELECT g, (ARRAY['a','b',NULL])[g % 3 + 1], 'seed' FROM generate_series(1, 3000) g ON CONFLICT DO NOTHING`)
	stop := make(chan struct{})
	var writers gosync.WaitGroup
	for w := range 2 {
		writers.Add(1)
		go stormWriter(t, env.src, uint64(w+11), 3000, stop, writers.Done)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kick := func() {
		env.node.mu.Lock()
		for s := range env.node.sockets {
			s.closeWith(websocket.CloseGoingAway, "test", "test")
		}
		env.node.mu.Unlock()
	}
	type follower struct {
		tenant string
		st     *client.State
		mu     gosync.Mutex
		begins int
		errs   []string
	}
	var fs []*follower
	var readers gosync.WaitGroup
	kicked := make(chan struct{})
	for i, tenant := range []string{"a", "b", "", "a"} {
		c, err := client.Dial(ctx, env.wsURL(""), client.Options{Token: stateToken(t, tenant, true)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		f := &follower{tenant: tenant, st: client.NewState(c)}
		fs = append(fs, f)
		if err := f.st.Subscribe("public.docs"); err != nil {
			t.Fatal(err)
		}
		readers.Add(1)
		go func() {
			defer readers.Done()
			rows := 0
			for {
				ev, err := f.st.Next(ctx)
				if err != nil {
					if ctx.Err() == nil {
						f.mu.Lock()
						f.errs = append(f.errs, err.Error())
						f.mu.Unlock()
					}
					if ev.Type == "" {
						return
					}
				}
				f.mu.Lock()
				switch ev.Type {
				case client.EventSnapshotBegin:
					f.begins++
					rows = 0
				case client.EventRow:
					// The last client kicks every socket half way
					// through its first snapshot.
					if rows++; i == 3 && rows == 300 && f.begins == 1 {
						close(kicked)
						kick()
					}
				case client.EventError:
					f.errs = append(f.errs, ev.Code+": "+ev.Msg)
				}
				f.mu.Unlock()
			}
		}()
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case <-kicked:
	case <-time.After(60 * time.Second):
		t.Fatal("the last client's snapshot never reached 300 rows")
	}
	time.Sleep(200 * time.Millisecond)
	pgtest.MustExec(t, env.src, `TRUNCATE docs`, `INSERT INTO docs SELECT g, (ARRAY['a','b',NULL])[g % 3 + 1], 'again' FROM generate_series(1, 1000) g ON CONFLICT DO NOTHING`)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	writers.Wait()
	for _, f := range fs {
		var diff string
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			if ok, _ := f.st.Ready("public.docs"); ok {
				if diff = diffStates(stateRows(t, f.st), tableState(t, env.src, f.tenant)); diff == "" {
					break
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		f.mu.Lock()
		if diff != "" {
			t.Errorf("client of tenant %q: state differs from the table after 60 s:\n%s", f.tenant, diff)
		}
		if len(f.errs) > 0 {
			t.Errorf("client of tenant %q: %s", f.tenant, strings.Join(f.errs, "; "))
		}
		f.mu.Unlock()
	}
	last := fs[3]
	last.mu.Lock()
	defer last.mu.Unlock()
	// The first snapshot, then a fresh one after the reconnect (a plain
	// resubscribe would leave the state never ready); the truncate comes
	// as a change of that snapshot's catch-up or as a third snapshot.
	if last.begins < 2 {
		t.Fatalf("the client kicked mid-snapshot saw %d snapshot-begins, want a fresh snapshot after the reconnect", last.begins)
	}
	cancel()
	readers.Wait()
}

// The state helper's rows are the envelope's after objects: a value of every
// JSON kind survives as the node sent it.
func TestClientStateRowValues(t *testing.T) {
	env := newStateEnv(t)
	pgtest.MustExec(t, env.src, `INSERT INTO docs VALUES (7, NULL, 'línea "1"'||chr(10)||'\u2028')`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, env.wsURL(""), client.Options{Token: stateToken(t, "", true)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st := client.NewState(c)
	if err := st.Subscribe("public.docs"); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := st.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == client.EventSnapshotEnd {
			break
		}
	}
	rows := st.Rows("public.docs")
	r, ok := rows[`{"id":7}`]
	if !ok {
		t.Fatalf("row 7 missing: %v", rows)
	}
	var val string
	if err := json.Unmarshal(r["val"], &val); err != nil || val != "línea \"1\"\n\\u2028" {
		t.Fatalf("val %s (%v)", r["val"], err)
	}
	if got := fmt.Sprint(len(rows)); got != "2" { // row 0 of newStateEnv and row 7
		t.Fatalf("%s rows: %v", got, rows)
	}
}
