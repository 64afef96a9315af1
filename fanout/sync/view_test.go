package sync

import (
	"bufio"
	"cmp"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/filter"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
	"github.com/walcast/walcast/replication"
)

// The filtered-subscription tests use public.items: a key, a tenant, two
// columns filters test (status, amount) and big, a TOASTed text that
// updates of the others leave unchanged. REPLICA IDENTITY DEFAULT: a delete
// carries only the key, an update no old row.
var itemsSetup = []string{
	`CREATE TABLE items (id int PRIMARY KEY, tenant text, status text, amount int, big text)`,
	`ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL`,
	`ALTER PUBLICATION pub ADD TABLE items`,
}

var itemCols = []string{"status", "amount", "big"}

func itemsToken(t testing.TB, tenant string) string {
	t.Helper()
	c := Claims{Topics: []string{"public.items"}, Tenant: tenant, Snapshot: true, RegisteredClaims: jwt.RegisteredClaims{
		Subject: "test", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(syncJWTSecret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// randFilter is a random filter over items, as the JSON a client sends and
// the SQL it stands for.
func randFilter(rng *rand.Rand, depth int) (js, sql string) {
	if depth > 0 && rng.IntN(3) == 0 {
		switch rng.IntN(3) {
		case 0, 1:
			op := []string{"and", "or"}[rng.IntN(2)]
			n := rng.IntN(3) + 1
			var jp, sp []string
			for range n {
				j, s := randFilter(rng, depth-1)
				jp, sp = append(jp, j), append(sp, "("+s+")")
			}
			return fmt.Sprintf(`{%q:[%s]}`, op, strings.Join(jp, ",")), strings.Join(sp, " "+strings.ToUpper(op)+" ")
		default:
			j, s := randFilter(rng, depth-1)
			return `{"not":` + j + `}`, "NOT (" + s + ")"
		}
	}
	switch rng.IntN(5) {
	case 0:
		v := itemStatuses[rng.IntN(len(itemStatuses))]
		return fmt.Sprintf(`{"col":"status","op":"=","value":%q}`, v), fmt.Sprintf("status = '%s'", v)
	case 1:
		a, b := itemStatuses[rng.IntN(3)], itemStatuses[rng.IntN(3)]
		return fmt.Sprintf(`{"col":"status","op":"in","values":[%q,%q]}`, a, b), fmt.Sprintf("status IN ('%s','%s')", a, b)
	case 2:
		op := []string{"=", "<>", "<", "<=", ">", ">="}[rng.IntN(6)]
		v := rng.IntN(100)
		return fmt.Sprintf(`{"col":"amount","op":%q,"value":%d}`, op, v), fmt.Sprintf("amount %s %d", op, v)
	case 3:
		col := []string{"status", "amount"}[rng.IntN(2)]
		if rng.IntN(2) == 0 {
			return fmt.Sprintf(`{"col":%q,"op":"is null"}`, col), col + " IS NULL"
		}
		return fmt.Sprintf(`{"col":%q,"op":"is not null"}`, col), col + " IS NOT NULL"
	default:
		v := rng.IntN(60)
		return fmt.Sprintf(`{"col":"id","op":"<","value":%d}`, v), fmt.Sprintf("id < %d", v)
	}
}

var itemStatuses = []string{"new", "paid", "void"}

// itemWriter runs random transactions of 1 to 4 statements on items: inserts
// (a third with a big value), updates of status and amount that move rows
// in and out of filters and leave big unchanged, updates of big, key
// changes, deletes, and now and then a truncate. A row keeps its tenant.
func itemWriter(t *testing.T, url string, seed uint64, n int, stop <-chan struct{}, done func()) {
	defer done()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close(ctx)
	rng := rand.New(rand.NewPCG(seed, 11))
	tenants := []any{"a", "b", nil}
	status := func() any {
		if rng.IntN(5) == 0 {
			return nil
		}
		return itemStatuses[rng.IntN(3)]
	}
	amount := func() any {
		if rng.IntN(6) == 0 {
			return nil
		}
		return rng.IntN(100)
	}
	const bigSQL = `(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 100))`
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		for range rng.IntN(4) + 1 {
			id := rng.IntN(n) + 1
			var sql string
			var args []any
			switch k := rng.IntN(40); {
			case k < 10:
				big := "'small'"
				if rng.IntN(3) == 0 {
					big = bigSQL
				}
				sql, args = `INSERT INTO items VALUES ($1, $2, $3, $4, `+big+`) ON CONFLICT DO NOTHING`, []any{id, tenants[id%3], status(), amount()}
			case k < 24:
				sql, args = `UPDATE items SET status = $2, amount = $3 WHERE id = $1`, []any{id, status(), amount()}
			case k < 28:
				sql, args = `UPDATE items SET big = `+bigSQL+` WHERE id = $1`, []any{id}
			case k < 32:
				to := id + 3*(rng.IntN(5)+1)
				if to > n {
					to = id - 3
				}
				sql, args = `UPDATE items SET id = $2, amount = $3 WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM items WHERE id = $2)`, []any{id, to, amount()}
			case k < 39:
				sql, args = `DELETE FROM items WHERE id = $1`, []any{id}
			default:
				if rng.IntN(20) == 0 {
					sql = `TRUNCATE items`
				} else {
					sql, args = `DELETE FROM items WHERE id = $1`, []any{id}
				}
			}
			if _, err := tx.Exec(ctx, sql, args...); err != nil {
				_ = tx.Rollback(ctx)
				if strings.Contains(err.Error(), "duplicate key") || strings.Contains(err.Error(), "deadlock") {
					goto next
				}
				t.Error(err)
				return
			}
		}
		if err := tx.Commit(ctx); err != nil && !strings.Contains(err.Error(), "deadlock") {
			t.Error(err)
			return
		}
	next:
		time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
	}
}

// viewClient keeps a filtered subscription's rows as a client would: row
// and change frames applied by key, an update keeping its unchanged
// columns, the changes of a transaction applied at its end mark. It
// records what no correct stream can cause.
type viewClient struct {
	name    string
	tenant  string
	filter  string                       // JSON
	where   string                       // the filter as SQL
	cols    []string                     // the columns its rows have
	asked   []string                     // the column list it subscribes with (cols when nil)
	rows    map[string]map[string]string // id → column → normalized value
	pending []viewEnv                    // the transaction being received
	snap    map[string]map[string]string // the snapshot being received
	cursor  string
	snaps   int
	ends    int
	errs    []string
	// match judges a held row at each transaction boundary when the
	// column list keeps every column the filter reads (nil otherwise).
	match *filter.Filter
	// full compiles the filter against the table for the replay check;
	// bounds are the rows held at each boundary, with its cursor.
	full   *filter.Filter
	bounds []viewBound
}

// viewBound is a client's rows at a transaction boundary.
type viewBound struct {
	cursor string
	rows   map[string]map[string]string
}

type viewEnv struct {
	CommitLSN string                     `json:"commitLsn"`
	Op        string                     `json:"op"`
	Key       map[string]json.RawMessage `json:"key"`
	Before    map[string]json.RawMessage `json:"before"`
	After     map[string]json.RawMessage `json:"after"`
	Unchanged []string                   `json:"unchanged"`
	Left      string                     `json:"left"`
}

type viewFrame struct {
	T      string          `json:"t"`
	Cursor string          `json:"cursor"`
	End    bool            `json:"end"`
	Code   string          `json:"code"`
	Msg    string          `json:"message"`
	Row    json.RawMessage `json:"row"`
	Change json.RawMessage `json:"change"`
}

// normValue is a column's value as the client compares it with SQL's: big
// as the md5 of its text, the rest as their JSON.
func normValue(col string, v json.RawMessage) string {
	if col == "big" && string(v) != "null" {
		var s string
		_ = json.Unmarshal(v, &s)
		sum := md5.Sum([]byte(s))
		return `"` + hex.EncodeToString(sum[:]) + `"`
	}
	return string(v)
}

func (c *viewClient) errorf(format string, args ...any) {
	if len(c.errs) < 20 {
		c.errs = append(c.errs, fmt.Sprintf(format, args...))
	}
}

func (c *viewClient) applyEnv(rows map[string]map[string]string, e viewEnv) {
	id := string(e.Key["id"])
	for col := range e.After {
		if col != "id" && !slices.Contains(c.cols, col) {
			c.errorf("seq of %s: column %s outside the projection", id, col)
		}
	}
	switch e.Op {
	case "insert", "read":
		if _, ok := rows[id]; ok && e.Op == "insert" {
			c.errorf("insert of %s already held", id)
		}
		rows[id] = c.image(e.After)
	case "update":
		old := string(e.Key["id"])
		if e.Before != nil {
			old = string(e.Before["id"])
		}
		prev, held := rows[old]
		delete(rows, old)
		r := c.image(e.After)
		for _, u := range e.Unchanged {
			if !held {
				c.errorf("update of %s (was %s) leaves %s unchanged and the client does not hold the row: a hole", id, old, u)
				continue
			}
			r[u] = prev[u]
		}
		rows[id] = r
	case "delete":
		delete(rows, id)
	case "truncate":
		clear(rows)
	default:
		c.errorf("op %s", e.Op)
	}
}

func (c *viewClient) image(after map[string]json.RawMessage) map[string]string {
	r := map[string]string{}
	for _, col := range c.cols {
		if v, ok := after[col]; ok {
			r[col] = normValue(col, v)
		}
	}
	return r
}

func (c *viewClient) apply(b []byte) viewFrame {
	var f viewFrame
	if err := json.Unmarshal(b, &f); err != nil {
		c.errorf("frame %s: %v", b, err)
		return f
	}
	switch f.T {
	case "snapshot-begin":
		c.snap, c.pending = map[string]map[string]string{}, nil
	case "row":
		var e viewEnv
		_ = json.Unmarshal(f.Row, &e)
		c.applyEnv(c.snap, e)
	case "change":
		var e viewEnv
		if err := json.Unmarshal(f.Change, &e); err != nil {
			c.errorf("change: %v", err)
			return f
		}
		if c.snap != nil {
			c.applyEnv(c.snap, e)
			return f
		}
		if len(c.pending) > 0 && c.pending[0].CommitLSN != e.CommitLSN {
			c.errorf("a change of transaction %s inside transaction %s: a transaction without its end mark", e.CommitLSN, c.pending[0].CommitLSN)
		}
		c.pending = append(c.pending, e)
		if f.End {
			for _, e := range c.pending {
				c.applyEnv(c.rows, e)
			}
			c.pending, c.cursor = nil, f.Cursor
			c.ends++
			c.checkBoundary()
			c.record()
		} else if f.Cursor != "" {
			c.errorf("a cursor without an end mark")
		}
	case "snapshot-end":
		c.rows, c.snap, c.cursor = c.snap, nil, f.Cursor
		c.snaps++
		c.checkBoundary()
		c.record()
	case "resync":
		c.pending = nil // a fresh snapshot follows (snapshot:true)
	case "error":
		c.errorf("error frame %s: %s", f.Code, f.Msg)
	}
	return f
}

// checkBoundary checks, at a transaction boundary, that every row the
// client holds is one its filter matches (when its columns let it tell):
// the part of "the rows equal the query at every boundary" that needs no
// copy of the table as of that boundary.
func (c *viewClient) checkBoundary() {
	if c.match == nil {
		return
	}
	for id, r := range c.rows {
		vals := map[string]json.RawMessage{"id": json.RawMessage(id)}
		for col, v := range r {
			if col != "big" {
				vals[col] = json.RawMessage(v)
			}
		}
		if c.match.Match(filter.Row{Values: vals}) != filter.Matches {
			c.errorf("at the boundary of cursor %.12s… the client holds row %s %v, which its filter does not match", c.cursor, id, r)
		}
	}
}

// record keeps a copy of the rows at this boundary, for checkReplay.
func (c *viewClient) record() {
	rows := make(map[string]map[string]string, len(c.rows))
	for k, r := range c.rows {
		rows[k] = maps.Clone(r)
	}
	c.bounds = append(c.bounds, viewBound{cursor: c.cursor, rows: rows})
}

// checkReplay checks every recorded boundary against the table as of that
// boundary: the journal's changes of items (every tenant), applied in
// order from the empty table up to the boundary's position, scoped to the
// client's tenant, judged by its filter and cut to its columns. So "the
// rows equal the query at every transaction boundary" is checked at each
// of them, not only at the end.
func checkReplay(t *testing.T, env *stateEnv, clients []*viewClient) {
	t.Helper()
	ctx := context.Background()
	type at struct {
		pos int64
		c   *viewClient
		i   int
	}
	var all []at
	for _, c := range clients {
		for i, b := range c.bounds {
			pos, err := env.j.CursorPosition(b.cursor)
			if err != nil {
				t.Fatalf("%s: cursor of boundary %d: %v", c.name, i, err)
			}
			all = append(all, at{pos, c, i})
		}
	}
	slices.SortFunc(all, func(a, b at) int { return cmp.Compare(a.pos, b.pos) })
	// The table, replayed: id → tenant ("" for none, as *string) and the
	// row's values as the envelope carries them (big's value kept whole).
	type trow struct {
		tenant *string
		vals   map[string]json.RawMessage
	}
	table := map[string]*trow{}
	q := journal.Query{Entities: []string{"public.items"}, AllTenants: true, FromOldest: true, Limit: journal.MaxLimit}
	pos := int64(0)
	next := 0
	check := func(upTo int64) {
		for ; next < len(all) && all[next].pos <= upTo; next++ {
			a := all[next]
			want := map[string]map[string]string{}
			for id, r := range table {
				if r.tenant != nil && *r.tenant != a.c.tenant {
					continue
				}
				if a.c.full.Match(filter.Row{Values: r.vals}) != filter.Matches {
					continue
				}
				img := map[string]string{}
				for _, col := range a.c.cols {
					img[col] = normValue(col, r.vals[col])
				}
				want[id] = img
			}
			if d := diffViews(a.c.bounds[a.i].rows, want); d != "" && len(a.c.errs) < 20 {
				a.c.errorf("at boundary %d (position %d) the rows differ from the table as of then:\n%s", a.i, a.pos, d)
			}
		}
	}
	for {
		res, err := env.j.Changes(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range res.Changes {
			check(e.Seq - 1)
			var env viewEnv
			var tenant struct {
				Tenant *string `json:"tenant"`
			}
			if err := json.Unmarshal(e.Envelope, &env); err != nil {
				t.Fatal(err)
			}
			_ = json.Unmarshal(e.Envelope, &tenant)
			id := string(env.Key["id"])
			switch env.Op {
			case "insert":
				table[id] = &trow{tenant.Tenant, env.After}
			case "update":
				old := id
				if env.Before != nil {
					old = string(env.Before["id"])
				}
				prev := table[old]
				delete(table, old)
				vals := maps.Clone(env.After)
				for _, u := range env.Unchanged {
					if prev != nil {
						vals[u] = prev.vals[u]
					}
				}
				table[id] = &trow{tenant.Tenant, vals}
			case "delete":
				delete(table, id)
			case "truncate":
				clear(table)
			}
			pos = e.Seq
		}
		if !res.More {
			break
		}
		q.Cursor, q.FromOldest = res.Cursor, false
	}
	check(pos + 1<<40)
}

// itemsFilter compiles js against items' columns, for checkBoundary.
func itemsFilter(t *testing.T, js string, cols []string) *filter.Filter {
	t.Helper()
	info := []decoder.ColumnInfo{{Name: "id", TypeOID: 23, Key: true}, {Name: "tenant", TypeOID: 25}, {Name: "status", TypeOID: 25},
		{Name: "amount", TypeOID: 23}, {Name: "big", TypeOID: 25}}
	f, err := filter.Compile([]byte(js), info, filter.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, col := range f.Columns() {
		if col != "id" && !slices.Contains(cols, col) {
			return nil
		}
	}
	return f
}

// itemsFilterAll compiles js against items' columns, for checkReplay.
func itemsFilterAll(t *testing.T, js string) *filter.Filter {
	t.Helper()
	info := []decoder.ColumnInfo{{Name: "id", TypeOID: 23, Key: true}, {Name: "tenant", TypeOID: 25}, {Name: "status", TypeOID: 25},
		{Name: "amount", TypeOID: 23}, {Name: "big", TypeOID: 25}}
	f, err := filter.Compile([]byte(js), info, filter.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// want is the SQL the client's rows must equal.
func (c *viewClient) want(t *testing.T, url string) map[string]map[string]string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	scope := "tenant IS NULL"
	if c.tenant != "" {
		scope += " OR tenant = '" + c.tenant + "'"
	}
	var sel []string
	for _, col := range c.cols {
		v := col
		if col == "big" {
			v = "md5(big)"
		}
		sel = append(sel, fmt.Sprintf("'%s', %s", col, v))
	}
	q := fmt.Sprintf(`SELECT id, json_build_object(%s)::text FROM items WHERE (%s) AND (%s)`, strings.Join(sel, ", "), scope, c.where)
	if len(sel) == 0 {
		q = fmt.Sprintf(`SELECT id, '{}' FROM items WHERE (%s) AND (%s)`, scope, c.where)
	}
	rows, err := conn.Query(ctx, q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	out := map[string]map[string]string{}
	for rows.Next() {
		var id int
		var obj string
		if err := rows.Scan(&id, &obj); err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(obj), &m); err != nil {
			t.Fatal(err)
		}
		r := map[string]string{}
		for k, v := range m {
			r[k] = string(v)
		}
		out[strconv.Itoa(id)] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func diffViews(got, want map[string]map[string]string) string {
	var d []string
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			d = append(d, fmt.Sprintf("%s: missing, table has %v", k, w))
			continue
		}
		for col, v := range w {
			if g[col] != v {
				d = append(d, fmt.Sprintf("%s.%s: client %s table %s", k, col, g[col], v))
			}
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			d = append(d, fmt.Sprintf("%s: client holds %v, not in the filter's rows", k, g))
		}
	}
	slices.Sort(d)
	if len(d) > 10 {
		d = append(d[:10], fmt.Sprintf("… %d more", len(d)-10))
	}
	return strings.Join(d, "\n")
}

type viewSub struct {
	ws *stateConn
	c  *viewClient
}

func (s *viewSub) subscribe(resume bool) {
	asked := s.c.asked
	if asked == nil {
		asked = s.c.cols
	}
	f := map[string]any{"t": "sub", "topic": "public.items", "snapshot": true, "filter": json.RawMessage(s.c.filter), "columns": asked}
	if resume && s.c.cursor != "" {
		f["cursor"] = s.c.cursor
	}
	s.ws.ws.send(f)
}

// drain applies what the socket has until it has been quiet for a moment.
func (s *viewSub) drain(t *testing.T, quiet time.Duration) {
	t.Helper()
	for {
		select {
		case b := <-s.ws.frames:
			s.c.apply(b)
		case err := <-s.ws.err:
			t.Fatalf("%s: read: %v", s.c.name, err)
		case <-time.After(quiet):
			return
		}
	}
}

// TestFilteredSubscriptionsRandomized: clients with random filters and
// column lists follow items with "snapshot":true while writers run random
// transactions (rows moving in and out of filters, key changes, TOASTed
// values left unchanged, deletes under REPLICA IDENTITY DEFAULT, truncates),
// some clients reconnecting from their cursor in the middle. Each client
// must end with exactly SELECT <its columns> FROM items WHERE <its tenant
// scope> AND <its filter>, having never held a row with a hole or applied
// part of a transaction.
func TestFilteredSubscriptionsRandomized(t *testing.T) {
	t.Run("replica identity default", func(t *testing.T) { filteredRandomized(t, false) })
	// Under FULL an update's and a delete's before is the whole old row:
	// the node judges what a client that resumed may hold by it. Every
	// column is then a key column, so a column list keeps them all.
	t.Run("replica identity full", func(t *testing.T) { filteredRandomized(t, true) })
}

func filteredRandomized(t *testing.T, full bool) {
	var setup []string
	if full {
		setup = append(setup, `ALTER TABLE items REPLICA IDENTITY FULL`)
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("WALCAST_FILTER_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (WALCAST_FILTER_SEED=%d replays it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	// The test's clients never ping: no idle timeout while they wait.
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) { c.IdleTimeout = time.Hour }, append(slices.Clone(itemsSetup), setup...)...)
	pgtest.MustExec(t, env.src, `INSERT INTO items SELECT g, (ARRAY['a','b',NULL])[g % 3 + 1], (ARRAY['new','paid','void',NULL])[g % 4 + 1], g % 100, 'seed' FROM generate_series(1, 60) g`)
	waitFor(t, "items to be journaled", func() bool { return env.node.known("public.items") })

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go itemWriter(t, env.src, seed+uint64(w), 60, stop, wg.Done)
	}
	var subs []*viewSub
	tenants := []string{"a", ""}
	for i := range 6 {
		js, sql := randFilter(rng, 3)
		cols := []string{}
		for _, c := range itemCols {
			if rng.IntN(2) == 0 {
				cols = append(cols, c)
			}
		}
		c := &viewClient{name: fmt.Sprintf("client %d (tenant %q, filter %s, columns %v)", i, tenants[i%2], js, cols),
			tenant: tenants[i%2], filter: js, where: sql, cols: cols, match: itemsFilter(t, js, cols), full: itemsFilterAll(t, js)}
		if full {
			c.asked, c.cols = cols, []string{"tenant", "status", "amount", "big"}
		}
		s := &viewSub{ws: dialState(env, itemsToken(t, c.tenant)), c: c}
		s.subscribe(false)
		subs = append(subs, s)
	}
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range subs {
			s.drain(t, 5*time.Millisecond)
		}
		// A reconnect in the middle: from the last cursor, on a new
		// socket, the transaction in flight (if any) dropped.
		if s := subs[rng.IntN(len(subs))]; rng.IntN(8) == 0 && s.c.snaps > 0 && s.c.snap == nil {
			s.ws.ws.c.Close()
			s.c.pending = nil
			s.ws = dialState(env, itemsToken(t, s.c.tenant))
			s.subscribe(true)
		}
	}
	close(stop)
	wg.Wait()
	for _, s := range subs {
		end := time.Now().Add(60 * time.Second)
		for {
			s.drain(t, 300*time.Millisecond)
			d := diffViews(s.c.rows, s.c.want(t, env.src))
			if d == "" && s.c.snap == nil && len(s.c.pending) == 0 {
				break
			}
			if time.Now().After(end) {
				t.Errorf("%s: rows differ from SQL after 60 s:\n%s", s.c.name, d)
				break
			}
		}
		if len(s.c.errs) > 0 {
			t.Errorf("%s: %s", s.c.name, strings.Join(s.c.errs, "\n"))
		}
		t.Logf("%s: %d rows, %d snapshots, %d transactions", s.c.name, len(s.c.rows), s.c.snaps, s.c.ends)
	}
	var clients []*viewClient
	before := map[*viewClient]int{}
	for _, s := range subs {
		clients = append(clients, s.c)
		before[s.c] = len(s.c.errs)
	}
	checkReplay(t, env, clients)
	bounds := 0
	for _, c := range clients {
		bounds += len(c.bounds)
		if len(c.errs) > before[c] {
			t.Errorf("%s, against the table as of each boundary: %s", c.name, strings.Join(c.errs[before[c]:], "\n"))
		}
	}
	t.Logf("%d boundaries checked against the table as of each", bounds)
	st := env.node.Stats().Filter
	t.Logf("filter stats: %+v", st)
	if st.Skipped == 0 || st.Removals == 0 {
		t.Errorf("the workload never made a filter skip a change or remove a row (%+v): the test tests nothing", st)
	}
}

// TestFilterRefusedOnSub: hostile and mistaken filters and column lists on
// a sub get an error frame naming the problem (bad-filter) and cost the
// node nothing lasting; a pattern-like string is a plain value; a client
// following the table meanwhile loses nothing. The inbound frame limit is
// raised so that every input reaches the filter's own bounds.
func TestFilterRefusedOnSub(t *testing.T) {
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) {
		c.MaxFrameBytes = 16 << 20
		c.InboundBurst, c.InboundRate = 1000, 1000
	}, itemsSetup...)
	pgtest.MustExec(t, env.src, `INSERT INTO items VALUES (1, NULL, 'paid', 5, 'x')`)
	waitFor(t, "items to be journaled", func() bool { return env.node.known("public.items") })
	good := env.mustDial(itemsToken(t, ""))
	good.send(map[string]any{"t": "sub", "topic": "public.items", "filter": json.RawMessage(`{"col":"status","op":"=","value":"paid"}`)})
	good.expect("subscribed")

	deep := strings.Repeat(`{"not":`, 10000) + `{"col":"status","op":"is null"}` + strings.Repeat("}", 10000)
	var ors strings.Builder
	ors.WriteString(`{"or":[`)
	for i := range 10000 {
		if i > 0 {
			ors.WriteByte(',')
		}
		fmt.Fprintf(&ors, `{"col":"amount","op":"=","value":%d}`, i)
	}
	ors.WriteString("]}")
	for _, tc := range []struct {
		name    string
		filter  string
		columns any
		want    string
	}{
		{"10 MB", `{"col":"status","op":"=","value":"` + strings.Repeat("x", 10<<20) + `"}`, nil, "more than the limit of 16384"},
		// Deeper than encoding/json reads anything (10,000 levels): not
		// JSON to the node, so the socket closes as for any such frame.
		{"10,000 deep", deep, nil, "invalid JSON"},
		{"10,000 or terms", ors.String(), nil, "more than the limit"},
		{"unknown column", `{"col":"amout","op":">","value":1}`, nil, `column "amout" is not a published column`},
		{"wrong type", `{"col":"amount","op":">","value":"many"}`, nil, `filter.value: column "amount" is int4`},
		{"NaN for an integer", `{"col":"amount","op":">","value":"NaN"}`, nil, "filter.value"},
		{"null value", `{"col":"status","op":"=","value":null}`, nil, `"op":"is null"`},
		{"not an object", `5`, nil, "filter"},
		{"raw control characters", "{\"col\":\"status\x01\",\"op\":\"=\",\"value\":1}", nil, "invalid JSON"},
		{"escaped control characters", `{"col":"status\u0001\n","op":"=","value":"\u0007"}`, nil, "is not a published column"},
		{"not UTF-8", "{\"col\":\"st\xffatus\",\"op\":\"=\",\"value\":1}", nil, "filter"},
		{"unknown column in the list", "", []string{"status", "nope"}, `columns[1]: column "nope" is not a published column`},
		{"column listed twice", "", []string{"status", "status"}, "listed twice"},
		{"column list not a list", "", "status", "invalid JSON"},
	} {
		func() {
			c := env.mustDial(itemsToken(t, ""))
			f := map[string]any{"t": "sub", "topic": "public.items"}
			if tc.filter != "" {
				f["filter"] = json.RawMessage(tc.filter)
			}
			if tc.columns != nil {
				f["columns"] = tc.columns
			}
			b, _ := json.Marshal(f)
			if !json.Valid(b) || tc.name == "not UTF-8" || tc.name == "raw control characters" {
				// Sent as written: the client's bytes, not Go's cleaned-up JSON.
				b = []byte(`{"t":"sub","topic":"public.items","filter":` + tc.filter + `}`)
			}
			if err := c.c.WriteMessage(1, b); err != nil {
				t.Fatal(err)
			}
			if tc.want == "invalid JSON" {
				code, reason := c.expectClose()
				if code != CloseBadFrame || !strings.Contains(reason, "invalid JSON") {
					t.Errorf("%s: close %d %q, want %d invalid JSON frame", tc.name, code, reason, CloseBadFrame)
				}
				return
			}
			got := c.read()
			if got.T != "error" || got.Code != "bad-filter" || !strings.Contains(got.Message, tc.want) {
				t.Errorf("%s: got %+v, want a bad-filter error saying …%s…", tc.name, got, tc.want)
			}
			if len(got.Message) > 1024 {
				t.Errorf("%s: the error message is %d bytes: an echo of the input?", tc.name, len(got.Message))
			}
		}()
	}

	// A flood of filtered subs, valid and not, on one socket: each is
	// answered (the catalog is read once a second, not once a sub) and
	// the node keeps serving.
	flood := env.mustDial(itemsToken(t, ""))
	const subs = 900
	for i := range subs {
		f := json.RawMessage(fmt.Sprintf(`{"col":"amount","op":">","value":%d}`, i))
		if i%3 == 0 {
			f = json.RawMessage(`{"col":"nope","op":"is null"}`)
		}
		flood.send(map[string]any{"t": "sub", "topic": "public.items", "filter": f})
	}
	answered := map[string]int{}
	for range subs {
		f := flood.read()
		answered[f.T+"/"+f.Code]++
	}
	if answered["subscribed/"] != subs*2/3 || answered["error/bad-filter"] != subs/3 {
		t.Fatalf("a flood of %d subs was answered %v", subs, answered)
	}

	// Characters that mean something in patterns are plain characters.
	c := env.mustDial(itemsToken(t, ""))
	c.send(map[string]any{"t": "sub", "topic": "public.items", "filter": json.RawMessage(`{"col":"status","op":"in","values":[".*","%","p_id"]}`)})
	c.expect("subscribed")
	pgtest.MustExec(t, env.src, `INSERT INTO items VALUES (2, NULL, 'paid', 6, 'y')`, `INSERT INTO items VALUES (3, NULL, '.*', 7, 'z')`)
	if f := good.expect("change"); string(f.env.Key["id"]) != "2" {
		t.Fatalf("the client that followed meanwhile got %s, want row 2", f.Change)
	}
	if f := c.expect("change"); string(f.env.Key["id"]) != "3" {
		t.Fatalf("the pattern-like filter matched %s, want only row 3", f.Change)
	}
}

// TestFilterCursorBoundToTheFilter: a cursor issued under one filter and
// column list resumes under the same ones only; under another (or none) it
// is refused, so a client never resumes a position counted under a filter
// it no longer has.
func TestFilterCursorBoundToTheFilter(t *testing.T) {
	env := newStateEnv(t, itemsSetup...)
	pgtest.MustExec(t, env.src, `INSERT INTO items VALUES (1, NULL, 'paid', 5, 'x')`)
	waitFor(t, "items to be journaled", func() bool { return env.node.known("public.items") })
	paid := json.RawMessage(`{"col":"status","op":"=","value":"paid"}`)
	c := env.mustDial(itemsToken(t, ""))
	c.send(map[string]any{"t": "sub", "topic": "public.items", "filter": paid, "columns": []string{"status"}})
	cur := c.expect("subscribed").Cursor
	for _, tc := range []struct {
		name string
		sub  map[string]any
		want string
	}{
		{"same filter and columns", map[string]any{"filter": paid, "columns": []string{"status"}}, "subscribed"},
		{"same, written with other spacing", map[string]any{"filter": json.RawMessage(`{ "col": "status", "op": "=", "value": "paid" }`), "columns": []string{"status"}}, "subscribed"},
		{"same, keys in another order", map[string]any{"filter": json.RawMessage(`{"value":"paid","op":"=","col":"status"}`), "columns": []string{"status"}}, "subscribed"},
		{"another filter", map[string]any{"filter": json.RawMessage(`{"col":"status","op":"=","value":"void"}`), "columns": []string{"status"}}, "bad-cursor"},
		{"other columns", map[string]any{"filter": paid}, "bad-cursor"},
		{"no filter", map[string]any{}, "bad-cursor"},
		{"a null filter, which is none", map[string]any{"filter": json.RawMessage(`null`)}, "bad-cursor"},
	} {
		f := map[string]any{"t": "sub", "topic": "public.items", "cursor": cur}
		for k, v := range tc.sub {
			f[k] = v
		}
		d := env.mustDial(itemsToken(t, ""))
		d.send(f)
		got := d.read()
		if got.T != tc.want && got.Code != tc.want {
			t.Errorf("%s: got %+v, want %s", tc.name, got, tc.want)
		}
	}
}

// TestFilterHTTPAndEvents: GET /v1/snapshot and GET /v1/changes with a
// filter and a column list rebuild exactly the filter's rows, removals
// included; an event stream with filter.<topic> and columns.<topic> gets
// the same; a bad filter is a 400 naming the problem; a cursor of one
// filter is refused under another.
func TestFilterHTTPAndEvents(t *testing.T) {
	env := newStateEnv(t, itemsSetup...)
	pgtest.MustExec(t, env.src, `INSERT INTO items SELECT g, (ARRAY['a',NULL])[g % 2 + 1], (ARRAY['new','paid'])[g % 2 + 1], g, 'x' FROM generate_series(1, 40) g`)
	waitFor(t, "items to be journaled", func() bool { return env.node.known("public.items") })
	filterJS := `{"and":[{"col":"status","op":"=","value":"paid"},{"col":"amount","op":"<","value":30}]}`
	c := &viewClient{name: "http", tenant: "a", filter: filterJS, where: "status = 'paid' AND amount < 30", cols: []string{"amount"}}
	tok := itemsToken(t, "a")
	params := "topic=public.items&filter=" + url.QueryEscape(filterJS) + "&columns=amount"
	get := func(path string) *http.Response {
		req, _ := http.NewRequest("GET", env.srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := get("/v1/snapshot?" + params)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		c.apply(sc.Bytes())
	}
	resp.Body.Close()
	if d := diffViews(c.rows, c.want(t, env.src)); d != "" || c.snaps != 1 || len(c.errs) > 0 {
		t.Fatalf("snapshot (%d ends, %v):\n%s", c.snaps, c.errs, d)
	}
	if len(c.rows) == 0 {
		t.Fatal("the filter's snapshot is empty: the test tests nothing")
	}

	// An event stream with the same filter, from the snapshot's cursor.
	ev, r := env.openEvents(tok, "topic=public.items&cursor="+url.QueryEscape(c.cursor)+"&filter.public.items="+url.QueryEscape(filterJS)+"&columns.public.items=amount", nil)
	if ev == nil {
		t.Fatalf("event stream: %d", r.StatusCode)
	}
	ev.expect("subscribed")
	sseRows := maps.Clone(c.rows)

	// Rows leave (status, amount), enter, change key, are deleted.
	pgtest.MustExec(t, env.src,
		`UPDATE items SET status = 'new' WHERE id = 2`,
		`UPDATE items SET amount = 99 WHERE id = 4`,
		`UPDATE items SET status = 'paid' WHERE id = 3`,
		`UPDATE items SET id = 104 WHERE id = 6`,
		`DELETE FROM items WHERE id = 8`,
		`UPDATE items SET big = 'y' WHERE id = 31`)
	want := c.want(t, env.src)
	waitFor(t, "the changes read with the filter", func() bool {
		resp := get("/v1/changes?" + params + "&cursor=" + url.QueryEscape(c.cursor))
		defer resp.Body.Close()
		var out changesResponse
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		if out.ResyncRequired {
			t.Fatalf("resync: %+v", out)
		}
		for _, ch := range out.Changes {
			c.apply([]byte(`{"t":"change","end":true,"change":` + string(ch) + `}`))
		}
		if out.Cursor != "" {
			c.cursor = out.Cursor
		}
		return diffViews(c.rows, want) == ""
	})
	if len(c.errs) > 0 {
		t.Fatal(c.errs)
	}
	// The stream gets the same.
	sc2 := &viewClient{name: "events", tenant: "a", cols: c.cols, rows: sseRows}
	waitFor(t, "the event stream's rows", func() bool {
		select {
		case e := <-ev.events:
			if e.name == "change" {
				sc2.apply([]byte(e.raw))
			}
		case <-time.After(100 * time.Millisecond):
		}
		return diffViews(sc2.rows, want) == ""
	})
	if len(sc2.errs) > 0 {
		t.Fatal(sc2.errs)
	}
	// Row 31 changed a column the list leaves out, and row 1 never
	// matched: neither reached the stream; the removals did, marked.
	if st := env.node.Stats().Filter; st.Removals == 0 || st.Skipped == 0 {
		t.Fatalf("filter stats %+v", st)
	}

	// columns= alone: the key columns only.
	resp = get("/v1/snapshot?topic=public.items&columns=")
	sc = bufio.NewScanner(resp.Body)
	keysOnly := 0
	for sc.Scan() {
		var f viewFrame
		var e viewEnv
		if json.Unmarshal(sc.Bytes(), &f) == nil && f.T == "row" && json.Unmarshal(f.Row, &e) == nil {
			if len(e.After) != 1 || e.After["id"] == nil {
				t.Fatalf("columns= (the key columns only) sent %s", f.Row)
			}
			keysOnly++
		}
	}
	resp.Body.Close()
	if keysOnly == 0 {
		t.Fatal("columns=: no rows")
	}

	for _, tc := range []struct{ query, code string }{
		{"topic=public.items&filter=" + url.QueryEscape(`{"col":"nope","op":"is null"}`), "bad-filter"},
		{"topic=public.items&filter=%7Bnot-json", "bad-filter"},
		{"topic=public.items&columns=nope", "bad-filter"},
		{"topic=public.items&filter=", "bad-filter"},
		{"topic=public.items&filter=" + url.QueryEscape(`{"col":"status","op":"=","value":"`+strings.Repeat("x", 100<<10)+`"}`), "bad-filter"},
		{"topic=public.items&filter=" + url.QueryEscape("{\"col\":\"st\xffatus\",\"op\":\"is null\"}"), "bad-filter"},
		{"topic=public.items&filter=" + url.QueryEscape(`{"col":"status","op":"is null"}`) + "&filter=" + url.QueryEscape(`{"col":"amount","op":"is null"}`), "bad-filter"},
		{"topic=public.items&filter=" + url.QueryEscape(`{"col":"status","op":"=","value":"new"}`) + "&cursor=" + url.QueryEscape(c.cursor), "bad-cursor"},
	} {
		for _, path := range []string{"/v1/changes?", "/v1/snapshot?"} {
			if path == "/v1/snapshot?" && tc.code == "bad-cursor" {
				continue
			}
			resp := get(path + tc.query)
			var out struct{ Error, Message string }
			_ = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || out.Error != tc.code {
				t.Errorf("%s%s: %d %+v, want 400 %s", path, tc.query, resp.StatusCode, out, tc.code)
			}
		}
	}
}

// TestFilterSchemaChange: a column the publication stops publishing
// reaches the filtered subscriptions that read it — their next change
// cannot be judged, and the fresh snapshot that answers it is refused
// naming the column — and no other: a subscription whose filter and
// columns do not read it goes on receiving changes, with no resync. A new
// subscription with the old filter is refused naming the column.
func TestFilterSchemaChange(t *testing.T) {
	env := newStateEnv(t, itemsSetup...)
	pgtest.MustExec(t, env.src, `INSERT INTO items SELECT g, NULL, 'paid', g, 'x' FROM generate_series(1, 5) g`)
	waitFor(t, "items to be journaled", func() bool { return env.node.known("public.items") })
	tok := itemsToken(t, "")
	onStatus := dialState(env, tok)
	onStatus.ws.send(map[string]any{"t": "sub", "topic": "public.items", "snapshot": true,
		"filter": json.RawMessage(`{"col":"status","op":"=","value":"paid"}`), "columns": []string{"status"}})
	onAmount := dialState(env, tok)
	onAmount.ws.send(map[string]any{"t": "sub", "topic": "public.items", "snapshot": true,
		"filter": json.RawMessage(`{"col":"amount","op":">","value":2}`), "columns": []string{"amount"}})
	a := &viewClient{name: "status", cols: []string{"status"}}
	b := &viewClient{name: "amount", cols: []string{"amount"}, where: "amount > 2"}
	for _, c := range []struct {
		sc *stateConn
		vc *viewClient
	}{{onStatus, a}, {onAmount, b}} {
		for c.vc.snaps == 0 {
			c.vc.apply(<-c.sc.frames)
		}
	}

	pgtest.MustExec(t, env.src, `ALTER PUBLICATION pub SET TABLE docs, beat, items (id, tenant, amount, big)`,
		`UPDATE items SET amount = amount + 10 WHERE id = 1`)
	deadline := time.After(60 * time.Second)
	var refusal string
	for refusal == "" {
		select {
		case f := <-onStatus.frames:
			if got := a.apply(f); got.T == "error" {
				refusal = got.Code + ": " + got.Msg
			}
		case err := <-onStatus.err:
			t.Fatal(err)
		case <-deadline:
			t.Fatal("the subscription whose filter reads status was not told within 60 s")
		}
	}
	if !strings.Contains(refusal, "snapshot-failed") || !strings.Contains(refusal, `column "status"`) {
		t.Fatalf("the subscription on status ended with %q, want snapshot-failed naming the column", refusal)
	}
	// The subscription on amount saw the update as a plain change.
	want := b.want(t, env.src)
	for diffViews(b.rows, want) != "" {
		select {
		case f := <-onAmount.frames:
			if got := b.apply(f); got.T == "resync" || got.T == "snapshot-begin" || got.T == "error" {
				t.Fatalf("the subscription on amount got %s %s: the change of status reached it", got.T, got.Msg)
			}
		case <-deadline:
			t.Fatalf("the subscription on amount:\n%s", diffViews(b.rows, want))
		}
	}
	if len(b.errs) > 0 {
		t.Fatal(b.errs)
	}
	// Once walcast run has recorded the table's new shape, the old filter
	// is refused at once.
	waitFor(t, "the old filter refused naming the column", func() bool {
		c := env.mustDial(tok)
		c.send(map[string]any{"t": "sub", "topic": "public.items", "filter": json.RawMessage(`{"col":"status","op":"=","value":"paid"}`)})
		f := c.read()
		return f.T == "error" && f.Code == "bad-filter" && strings.Contains(f.Message, `column "status" is not a published column`)
	})
}

// TestFilterRowSetBudget: the keys the node keeps of filtered
// subscriptions' rows are bounded node-wide (MaxFilterMemoryBytes); a
// subscription that would pass the bound keeps none and is sent a removal
// for every row that may have left its filter, so its rows stay exact;
// the memory is given back when the subscriptions end.
func TestFilterRowSetBudget(t *testing.T) {
	const budget = 4 << 10
	env := newStateEnvWith(t, func(_ *replication.Config, c *Config) { c.MaxFilterMemoryBytes = budget }, itemsSetup...)
	pgtest.MustExec(t, env.src, `INSERT INTO items SELECT g, NULL, 'paid', g, 'x' FROM generate_series(1, 200) g`)
	waitFor(t, "items to be journaled", func() bool { return env.node.known("public.items") })
	var subs []*viewSub
	for i := range 3 {
		c := &viewClient{name: fmt.Sprint("client ", i), filter: `{"col":"status","op":"=","value":"paid"}`, where: "status = 'paid'", cols: []string{"status"}}
		s := &viewSub{ws: dialState(env, itemsToken(t, "")), c: c}
		s.subscribe(false)
		subs = append(subs, s)
	}
	for _, s := range subs {
		for s.c.snaps == 0 {
			s.drain(t, 50*time.Millisecond)
		}
	}
	st := env.node.Stats().Filter
	if st.RowSetsOverflowed == 0 || st.RowSetBytes > budget {
		t.Fatalf("200 rows for 3 subscriptions under a budget of %d bytes: %+v", budget, st)
	}
	pgtest.MustExec(t, env.src, `UPDATE items SET status = 'void' WHERE id % 3 = 0`, `DELETE FROM items WHERE id % 5 = 0`)
	for _, s := range subs {
		want := s.c.want(t, env.src)
		waitFor(t, s.c.name+" exact", func() bool {
			s.drain(t, 50*time.Millisecond)
			return diffViews(s.c.rows, want) == ""
		})
		if len(s.c.errs) > 0 {
			t.Fatal(s.c.errs)
		}
		s.ws.ws.c.Close()
	}
	waitFor(t, "the row sets' memory given back", func() bool { return env.node.Stats().Filter.RowSetBytes == 0 })
}
