package sync

import (
	"testing"

	"github.com/walcast/walcast/internal/pgtest"
)

// TestRefreshDropsSnapshotClaim: a refresh whose token lacks the snapshot
// claim takes it from the socket's existing subscriptions: a TRUNCATE
// afterwards reaches the subscription as a plain resync, not as a
// snapshot the node reads for a token without the claim. Before, the
// subscription kept answering resyncs with fresh snapshots.
func TestRefreshDropsSnapshotClaim(t *testing.T) {
	env := newStateEnv(t)
	pgtest.MustExec(t, env.src, `INSERT INTO docs VALUES (1, NULL, 'a')`)
	ws := env.mustDial(stateToken(t, "", true))
	ws.send(map[string]any{"t": "sub", "topic": "public.docs", "snapshot": true})
	ws.until("snapshot-end")
	ws.send(map[string]string{"t": "refresh", "token": stateToken(t, "", false)})
	ws.until("refreshed")
	pgtest.MustExec(t, env.src, `TRUNCATE docs`, `INSERT INTO docs VALUES (2, NULL, 'b')`)
	for {
		f := ws.read()
		switch f.T {
		case "snapshot-begin", "row", "snapshot-end":
			t.Fatalf("after a refresh without the snapshot claim the node sent %+v, want a plain resync", f)
		case "error":
			t.Fatalf("error frame %+v", f)
		case "resync":
			if f.Topic != "public.docs" || f.Cursor == "" {
				t.Fatalf("resync %+v", f)
			}
			return
		}
	}
}
