package sync

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestBrowserReact drives Debian's Chromium through a React page
// (test/browser/react-page.tsx, bundled with the React of the package's
// devDependencies) whose components follow public.items with the
// package's useLive hook (@walcast/client/react), against the real
// pipeline: a throwaway PostgreSQL, the replicator, the publisher, NATS
// and a sync node. The table's rows appear in both components (one of
// them suspends until they are there); an insert, an update and a delete
// made in SQL reach the page (through memo() tables, so only a new rows
// array shows); after a reload, which resumes with a stored cursor, the
// rows are there again and changes keep coming; a component of a topic
// the token does not grant shows the node's refusal; a component on a
// client of its own follows the topic with a filter (n <= 3) and a column
// list (n), and shows exactly those rows, cut to id and n, at every step
// (rows enter and leave it as updates change n); a TRUNCATE with new
// rows in the same transaction leaves exactly the new rows (the node
// answers it with a snapshot); after the sync node restarts, the page is
// back in step with the table; tokens of 2 to 3 s are refreshed on the
// socket throughout; unmounting the components unsubscribes the topic.
func TestBrowserReact(t *testing.T) {
	needJS(t, true)
	if _, err := os.Stat(jsDir + "/node_modules/react-dom"); err != nil {
		t.Fatalf("react-dom is missing from fanout/client/js/node_modules: run `npm ci` there: %v", err)
	}
	bundle := t.TempDir()
	var p *browserPipeline
	mux := http.NewServeMux()
	mux.Handle("/control/react/", http.StripPrefix("/control/react/", http.FileServer(http.Dir(bundle))))
	mux.HandleFunc("GET /control/rows", func(w http.ResponseWriter, r *http.Request) {
		var rows []byte
		if err := reactQueryRow(r.Context(), p.src, `SELECT coalesce(jsonb_agg(to_jsonb(i) ORDER BY id), '[]') FROM items i`, &rows); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(rows)
	})
	mux.HandleFunc("POST /control/change", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.Atoi(r.URL.Query().Get("id"))
		if err != nil {
			http.Error(w, "id: "+err.Error(), http.StatusBadRequest)
			return
		}
		sql, ok := map[string]string{
			"insert":   `INSERT INTO items VALUES ($1, 'react', 1)`,
			"update":   `UPDATE items SET val = val || '+', n = n + 1 WHERE id = $1`,
			"delete":   `DELETE FROM items WHERE id = $1`,
			"truncate": `BEGIN; TRUNCATE items; INSERT INTO items SELECT g, 'after', g FROM generate_series(100, 105) g; COMMIT`,
		}[r.URL.Query().Get("op")]
		if !ok {
			http.Error(w, "op: insert, update, delete or truncate", http.StatusBadRequest)
			return
		}
		conn, err := pgx.Connect(r.Context(), p.src)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer conn.Close(context.WithoutCancel(r.Context()))
		if r.URL.Query().Get("op") == "truncate" {
			_, err = conn.Exec(r.Context(), sql) // no arguments: one query string, one transaction
		} else {
			var tag pgconn.CommandTag
			tag, err = conn.Exec(r.Context(), sql, id)
			if err == nil && tag.RowsAffected() != 1 {
				err = errReactNoRow
			}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("{}"))
	})
	restarted := make(chan error, 1)
	mux.HandleFunc("POST /control/restart", func(w http.ResponseWriter, r *http.Request) {
		// Answered first: the restart shuts down the server this request
		// came through.
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("{}"))
		go func() { restarted <- p.restart() }()
	})
	mux.HandleFunc("GET /control/restarts", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		n := p.restarts
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"restarts":` + strconv.Itoa(n) + `}`))
	})
	p = newBrowserPipeline(t, mux)
	p.seed(t, `INSERT INTO items SELECT g, 'seed', g FROM generate_series(1, 20) g`)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "test/browser/react.mjs")
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(), "WALCAST_BASE="+p.base, "WALCAST_TOPIC="+pipelineTopic, "WALCAST_REACT_DIR="+bundle,
		"CHROMIUM="+chromiumPath())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("browser driver: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	var out struct {
		Steps []struct {
			What string
			Rows int
		}
		Fallbacks  int
		Restarts   int
		Refreshes  int
		Refused    string
		Stored     string
		Sent       []string
		Errors     []string
		PageErrors []string
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &out); err != nil {
		t.Fatalf("driver output: %v\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	select {
	case err := <-restarted:
		if err != nil {
			t.Fatalf("restarting the sync node: %v", err)
		}
	default:
		t.Error("the sync node was never restarted")
	}
	if len(out.Steps) != 9 {
		t.Errorf("the driver passed %d of 9 steps: %+v", len(out.Steps), out.Steps)
	}
	// The seed (20 rows and the pipeline's row 0), one insert, one
	// delete, then one insert and one delete; the truncate's 6 rows, and
	// one more, one less.
	for i, want := range []int{21, 22, 22, 21, 21, 21, 6, 7, 6} {
		if i < len(out.Steps) && out.Steps[i].Rows != want {
			t.Errorf("%s: the page showed %d rows, want %d", out.Steps[i].What, out.Steps[i].Rows, want)
		}
	}
	if !strings.HasPrefix(out.Refused, "0 rows; forbidden: ") {
		t.Errorf("the component of a topic the token does not grant shows %q, want its forbidden error", out.Refused)
	}
	if out.Restarts != 1 {
		t.Errorf("the page saw %d sync node restarts, want 1", out.Restarts)
	}
	// Tokens live 2 to 3 s and the test runs longer than that: they are
	// replaced on the open socket.
	if out.Refreshes < 2 {
		t.Errorf("the page sent %d refresh frames, want at least 2 (frames sent: %v)", out.Refreshes, out.Sent)
	}
	if !slices.Contains(out.Sent, "unsub") {
		t.Errorf("no unsub frame after unmount; the page sent %v", out.Sent)
	}
	if len(out.Errors) > 0 || len(out.PageErrors) > 0 {
		t.Errorf("the client reported %v; the page threw %v", out.Errors, out.PageErrors)
	}
	t.Logf("React page: %+v, suspense fallbacks %d, frames sent %v", out.Steps, out.Fallbacks, out.Sent)
}

// errReactNoRow: a change the control handler made touched no row.
var errReactNoRow = errors.New("the statement changed no row")

// reactQueryRow runs a one-value query on a connection of its own.
func reactQueryRow(ctx context.Context, url, sql string, dst any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, sql).Scan(dst)
}
