package sync

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestTopicCheckBeforeDatabase: under a "*" grant, GET /v1/snapshot and
// GET /v1/changes accept only entities the journal has changes of, as the
// socket does, and give one answer for a system catalog, an unpublished
// table and a missing one, before any database work: an exclusive lock
// held on the unpublished table does not delay the answer (the node takes
// no lock on it). Before, /v1/snapshot served pg_catalog.pg_proc and the
// unpublished table's rows (api keys included), and told a missing table
// from a present one; /v1/changes read the journal for any name.
func TestTopicCheckBeforeDatabase(t *testing.T) {
	env := newStateEnvWith(t, nil,
		`CREATE TABLE secrets (id int PRIMARY KEY, api_key text)`,
		`INSERT INTO secrets VALUES (1, 'sk_live_0123')`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, env.src)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE secrets IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}

	star := stateTokenTopics(t, "", "*")
	for _, path := range []string{"/v1/snapshot", "/v1/changes"} {
		var first string
		for _, topic := range []string{"pg_catalog.pg_proc", "public.secrets", "public.nope"} {
			resp, body := env.get(path+"?topic="+topic, star, nil)
			if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, `"unknown-topic"`) || strings.Contains(body, "sk_live") {
				t.Fatalf("%s?topic=%s: %d %.300s", path, topic, resp.StatusCode, body)
			}
			if first == "" {
				first = body
			} else if body != first {
				t.Fatalf("%s?topic=%s answered %q, another unknown topic %q: the answers must not differ", path, topic, body, first)
			}
		}
	}
	ws := env.mustDial(star)
	for _, topic := range []string{"pg_catalog.pg_proc", "public.secrets", "public.nope"} {
		ws.sub(topic, "")
		if f := ws.expect("error"); f.Code != "unknown-topic" {
			t.Fatalf("socket sub %s: %+v", topic, f)
		}
	}
	// A journaled entity is served as before.
	resp, body := env.get("/v1/snapshot?topic=public.docs", star, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"snapshot-end"`) {
		t.Fatalf("/v1/snapshot?topic=public.docs: %d %.300s", resp.StatusCode, body)
	}
}
