package decoder

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/walcast/walcast/internal/pgcapture"
	"github.com/walcast/walcast/internal/pgtest"
)

var update = flag.Bool("update", false, "re-capture testdata/pgoutput from a live Postgres and rewrite the golden envelopes")

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const captureDir = "../testdata/pgoutput"

// step is SQL run on one of a scenario's two sessions, so transactions can
// interleave.
type step struct {
	conn int
	sql  string
}

func s0(sql string) step { return step{0, sql} }
func s1(sql string) step { return step{1, sql} }

// scenario is a workload captured from a real Postgres: setup runs before
// the slot exists, steps after, and check asserts what the golden file
// should show in case it is regenerated wrongly.
type scenario struct {
	name   string
	setup  string
	steps  []step
	params map[string]string // replication session settings
	cfg    Config
	check  func(t *testing.T, txs []*Transaction)
}

const smallWorkMem = "64kB"

var scenarios = []scenario{
	{
		name: "types",
		setup: `
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TYPE pair AS (a int, b text);
CREATE TABLE types (
  id serial PRIMARY KEY,
  b bool, i2 int2, i4 int4, i8 int8, f4 float4, f8 float8, n numeric, n3810 numeric(38,10),
  t text, vc varchar(10), c char(3), j json, jb jsonb, by bytea, u uuid, ip inet, cidr cidr,
  mac macaddr, d date, tm time, ttz timetz, ts timestamp, tstz timestamptz, iv interval,
  bt bit(4), vb varbit, r int4range, tr tstzrange, m money, x xml, o oid,
  ia int4[], ia2 int4[][], ta text[], ja jsonb[], ba bytea[], tsa timestamptz[], na numeric[], i8a int8[],
  e mood, ea mood[], dom posint, comp pair, compa pair[]);
CREATE PUBLICATION p FOR ALL TABLES;`,
		steps: []step{
			s0(`SET TIME ZONE 'Asia/Kolkata'; INSERT INTO types (b, i2, i4, i8, f4, f8, n, n3810, t, vc, c, j, jb, by, u, ip, cidr, mac,
  d, tm, ttz, ts, tstz, iv, bt, vb, r, tr, m, x, o, ia, ia2, ta, ja, ba, tsa, na, i8a, e, ea, dom, comp, compa) VALUES
 (true, -32768, 2147483647, 9007199254740993, 1.1, 0.1, 3.14159, 12345678901234567890123456.1234567891,
  E'tab\there "quoted" \\ back\nnew é ☃', 'short', 'ab', '{"b": [1, 2.5, "x"], "a": null}', '{"b": [1, 2.5, "x"], "a": null}',
  '\x00ff10', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03',
  '2026-11-29', '23:21:24.5', '23:21:24+05', '2026-11-29 23:21:24.123456', '2026-11-29 23:21:24.123456+05:30',
  '1 year 2 mons 3 days 04:05:06.7', B'1010', B'10111', '[1,10)', '[2026-01-01 00:00:00+00,2026-02-01 00:00:00+00)',
  1.5, '<a>x</a>', 42, '{1,2,3}', '{{1,2},{3,NULL}}', '{"a b","c,d","NULL",NULL,"q\"x"}', ARRAY['{"k": 1}'::jsonb, '[]'],
  ARRAY['\x0102'::bytea, ''], ARRAY['2026-01-01 00:00:00+00'::timestamptz, 'infinity'], '{1.5,NaN}', '{1,9223372036854775807}',
  'happy', '{sad,happy}', 7, ROW(1, 'x y'), ARRAY[ROW(1, 'a')::pair, ROW(2, NULL)::pair])`),
			s0(`INSERT INTO types (i8, f4, f8, n, n3810, ts, tstz, d, i2, i4) VALUES
 (-9223372036854775808, 'NaN', 'Infinity', 'NaN', -0.0000000001, 'infinity', '-infinity', 'infinity', 0, -1),
 (9007199254740992, '-Infinity', 1e300, '-Infinity', 1.5, '-infinity', 'infinity', '-infinity', 1, 1),
 (42, 3.4028235e38, 5e-324, 123456789012345, 99999999999999999999999999.9999999999, '0044-03-15 12:00:00 BC', '2026-01-01 00:00:00 America/New_York', '2026-01-01', 2, 2)`),
			s0(`INSERT INTO types DEFAULT VALUES`),
		},
		check: func(t *testing.T, txs []*Transaction) {
			envs := envelopes(t, txs)
			if len(envs) != 5 {
				t.Fatalf("%d envelopes, want 5", len(envs))
			}
			want := map[string]string{
				"i8": `"9007199254740993"`, "n3810": `"12345678901234567890123456.1234567891"`, "by": `"AP8Q"`,
				"tstz": `"2026-11-29T17:51:24.123456Z"`, "ts": `"2026-11-29T23:21:24.123456"`, "ea": `["sad","happy"]`,
				"e": `"happy"`, "dom": `7`, "jb": `{"a": null, "b": [1, 2.5, "x"]}`, "ia2": `[[1,2],[3,null]]`, "iv": `"P1Y2M3DT4H5M6.7S"`,
			}
			for k, v := range want {
				if got := string(envs[0].After[k]); got != v {
					t.Errorf("after.%s = %s, want %s", k, got, v)
				}
			}
			if got := string(envs[1].After["f8"]); got != `"Infinity"` {
				t.Errorf("f8 = %s", got)
			}
			if got := string(envs[1].After["tstz"]); got != `"-infinity"` {
				t.Errorf("tstz = %s", got)
			}
		},
	},
	{
		name: "toast",
		setup: `
CREATE TABLE toast_default (id int PRIMARY KEY, note int, big text);
ALTER TABLE toast_default ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE toast_full (id int PRIMARY KEY, note int, big text);
ALTER TABLE toast_full ALTER COLUMN big SET STORAGE EXTERNAL;
ALTER TABLE toast_full REPLICA IDENTITY FULL;
CREATE PUBLICATION p FOR ALL TABLES;`,
		steps: []step{
			s0(`INSERT INTO toast_default SELECT 1, 0, string_agg(md5(i::text), '') FROM generate_series(1, 3200) i`),
			s0(`UPDATE toast_default SET note = 1 WHERE id = 1`),
			s0(`INSERT INTO toast_full SELECT 1, 0, string_agg(md5((i + 7)::text), '') FROM generate_series(1, 3200) i`),
			s0(`UPDATE toast_full SET note = 1 WHERE id = 1`),
		},
		check: func(t *testing.T, txs []*Transaction) {
			envs := envelopes(t, txs)
			if len(envs) != 4 {
				t.Fatalf("%d envelopes", len(envs))
			}
			if u := envs[1]; len(u.Unchanged) != 1 || u.Unchanged[0] != "big" || u.After["big"] != nil {
				t.Errorf("DEFAULT update: unchanged %v, after.big %q", u.Unchanged, u.After["big"])
			}
			if u := envs[3]; len(u.Unchanged) != 0 || len(u.After["big"]) != 102402 || string(u.After["big"]) != string(u.Before["big"]) {
				t.Errorf("FULL update: unchanged %v, after.big %d bytes", u.Unchanged, len(u.After["big"]))
			}
		},
	},
	{
		name: "keys",
		setup: `
CREATE TABLE k_default (id int PRIMARY KEY, v text);
CREATE TABLE k_full (id int PRIMARY KEY, v text);
ALTER TABLE k_full REPLICA IDENTITY FULL;
CREATE TABLE k_index (id serial PRIMARY KEY, a int NOT NULL, b int NOT NULL, v text);
CREATE UNIQUE INDEX k_index_ab ON k_index (a, b);
ALTER TABLE k_index REPLICA IDENTITY USING INDEX k_index_ab;
CREATE PUBLICATION p FOR ALL TABLES;`,
		steps: []step{
			s0(`INSERT INTO k_default VALUES (1, 'a'), (2, 'b')`),
			s0(`UPDATE k_default SET id = 10 WHERE id = 1`),
			s0(`UPDATE k_default SET v = 'c' WHERE id = 2`),
			s0(`DELETE FROM k_default WHERE id = 10`),
			s0(`INSERT INTO k_full VALUES (1, 'a')`),
			s0(`UPDATE k_full SET id = 2`),
			s0(`DELETE FROM k_full`),
			s0(`INSERT INTO k_index (a, b, v) VALUES (1, 1, 'x')`),
			s0(`UPDATE k_index SET v = 'y'`),
			s0(`UPDATE k_index SET a = 2`),
			s0(`DELETE FROM k_index`),
		},
		check: func(t *testing.T, txs []*Transaction) {
			envs := envelopes(t, txs)
			wantBefore := []string{"", "", `{"id":1}`, "", `{"id":10}`, "", `{"id":1,"v":"a"}`, `{"id":2,"v":"a"}`, "", "", `{"a":1,"b":1}`, `{"a":2,"b":1}`}
			if len(envs) != len(wantBefore) {
				t.Fatalf("%d envelopes, want %d", len(envs), len(wantBefore))
			}
			for i, w := range wantBefore {
				if got := compact(envs[i].Before); got != w {
					t.Errorf("envelope %d (%s %s): before %s, want %s", i, envs[i].Op, envs[i].Entity, got, w)
				}
			}
		},
	},
	{
		name: "truncate",
		setup: `
CREATE TABLE ta (id serial PRIMARY KEY);
CREATE TABLE tb (id serial PRIMARY KEY);
CREATE TABLE tc (id serial PRIMARY KEY, a_id int REFERENCES ta (id));
INSERT INTO ta DEFAULT VALUES; INSERT INTO tb DEFAULT VALUES; INSERT INTO tc (a_id) VALUES (1);
CREATE PUBLICATION p FOR ALL TABLES;`,
		steps: []step{
			s0(`TRUNCATE ta, tb RESTART IDENTITY CASCADE`),
			s0(`TRUNCATE tb`),
		},
		check: func(t *testing.T, txs []*Transaction) {
			envs := envelopes(t, txs)
			if len(txs) != 2 || len(envs) != 4 || txs[0].Len() != 3 {
				t.Fatalf("%d transactions, %d envelopes", len(txs), len(envs))
			}
			for i, e := range envs[:3] {
				if e.Op != OpTruncate || e.Truncate == nil || !e.Truncate.Cascade || !e.Truncate.RestartIdentity || e.Xid != envs[0].Xid {
					t.Errorf("envelope %d: %+v", i, e)
				}
			}
			if e := envs[3]; e.Truncate == nil || e.Truncate.Cascade || e.Truncate.RestartIdentity {
				t.Errorf("plain truncate: %+v", e.Truncate)
			}
		},
	},
	{
		name: "ddl",
		setup: `
CREATE TABLE evo (id int PRIMARY KEY, a text, g int GENERATED ALWAYS AS (id * 2) STORED);
CREATE PUBLICATION p FOR ALL TABLES;`,
		steps: []step{
			s0(`INSERT INTO evo (id, a) VALUES (1, 'x')`),
			s0(`ALTER TABLE evo ADD COLUMN b int DEFAULT 7`),
			s0(`INSERT INTO evo (id, a, b) VALUES (2, 'y', 8)`),
			s0(`ALTER TABLE evo DROP COLUMN a`),
			s0(`INSERT INTO evo (id, b) VALUES (3, 9)`),
			s0(`ALTER TABLE evo RENAME COLUMN b TO c`),
			s0(`INSERT INTO evo (id, c) VALUES (4, 10)`),
			s0(`ALTER TABLE evo ALTER COLUMN c TYPE text`),
			s0(`INSERT INTO evo (id, c) VALUES (5, 'eleven')`),
			s0(`UPDATE evo SET c = 'twelve' WHERE id = 1`),
		},
		check: func(t *testing.T, txs []*Transaction) {
			envs := envelopes(t, txs)
			want := []string{`{"a":"x","id":1}`, `{"a":"y","b":8,"id":2}`, `{"b":9,"id":3}`, `{"c":10,"id":4}`, `{"c":"eleven","id":5}`, `{"c":"twelve","id":1}`}
			if len(envs) != len(want) {
				t.Fatalf("%d envelopes", len(envs))
			}
			for i, w := range want {
				if got := compact(envs[i].After); got != w {
					t.Errorf("envelope %d: after %s, want %s", i, got, w)
				}
			}
		},
	},
	{
		name: "column_list",
		setup: `
CREATE TABLE cl (id int PRIMARY KEY, a text, secret text, b int);
CREATE TABLE other (id int PRIMARY KEY);
CREATE PUBLICATION p FOR TABLE cl (id, a, b);`,
		steps: []step{
			s0(`INSERT INTO cl VALUES (1, 'x', 'hidden', 2)`),
			s0(`INSERT INTO other VALUES (1)`),
			s0(`UPDATE cl SET secret = 'still hidden', a = 'y' WHERE id = 1`),
			s0(`DELETE FROM cl`),
		},
		check: func(t *testing.T, txs []*Transaction) {
			envs := envelopes(t, txs)
			if len(envs) != 3 {
				t.Fatalf("%d envelopes, want 3", len(envs))
			}
			if got := compact(envs[0].After); got != `{"a":"x","b":2,"id":1}` {
				t.Errorf("insert after %s", got)
			}
			if got := compact(envs[1].After); got != `{"a":"y","b":2,"id":1}` {
				t.Errorf("update after %s", got)
			}
		},
	},
	partitionScenario("partition", false),
	partitionScenario("partition_root", true),
	{
		name: "messages",
		setup: `
CREATE TABLE m (id int PRIMARY KEY);
CREATE SCHEMA walcast;
CREATE TABLE walcast.journal (id int PRIMARY KEY);
CREATE PUBLICATION p FOR ALL TABLES;`,
		steps: []step{
			s0(`BEGIN`),
			s0(`SELECT pg_logical_emit_message(true, 'walcast.tx', '{"n": 1}')`),
			s0(`SELECT pg_logical_emit_message(false, 'walcast.nontx', 'hello')`),
			s0(`INSERT INTO m VALUES (1)`),
			s0(`ROLLBACK`),
			s0(`SELECT pg_logical_emit_message(true, 'walcast.committed', '{"ok": true}')`),
			s0(`SELECT pg_logical_emit_message(false, 'other.prefix', 'x')`),
			s0(`INSERT INTO walcast.journal VALUES (1)`),
			s0(`INSERT INTO m VALUES (2)`),
		},
		check: func(t *testing.T, txs []*Transaction) {
			// A table in a schema named walcast is data here: the decoder
			// skips journal tables by OID (Config.SkipRelations), never by
			// schema name.
			envs := envelopes(t, txs)
			if len(envs) != 4 {
				t.Fatalf("%d envelopes, want 4", len(envs))
			}
			if e := envs[0]; e.Op != OpMessage || e.Prefix != "walcast.nontx" || string(e.Content) != `"aGVsbG8="` || *e.Transactional {
				t.Errorf("non-transactional message: %+v", e)
			}
			if e := envs[1]; e.Prefix != "walcast.committed" || string(e.Content) != `{"ok": true}` || !*e.Transactional {
				t.Errorf("transactional message: %+v", e)
			}
			if e := envs[2]; e.Entity != "walcast.journal" || compact(e.Key) != `{"id":1}` {
				t.Errorf("insert into walcast.journal: %+v", e)
			}
			if e := envs[3]; e.Entity != "public.m" || compact(e.Key) != `{"id":2}` {
				t.Errorf("insert: %+v", e)
			}
		},
	},
	{
		name: "tenant",
		cfg:  Config{TenantColumn: "org"},
		setup: `
CREATE TABLE docs (id int PRIMARY KEY, org text, body text);
CREATE TABLE docs_full (id int PRIMARY KEY, org text);
ALTER TABLE docs_full REPLICA IDENTITY FULL;
CREATE PUBLICATION p FOR ALL TABLES;`,
		steps: []step{
			s0(`INSERT INTO docs VALUES (1, 'acme', 'x'), (2, NULL, 'y')`),
			s0(`DELETE FROM docs WHERE id = 1`),
			s0(`INSERT INTO docs_full VALUES (1, 'acme')`),
			s0(`DELETE FROM docs_full`),
		},
		check: func(t *testing.T, txs []*Transaction) {
			var states []TenantState
			for _, tx := range txs {
				for it := tx.Changes(); it.Next(); {
					states = append(states, it.Change().TenantState)
				}
			}
			want := []TenantState{TenantKnown, TenantNone, TenantUnresolved, TenantKnown, TenantKnown}
			if fmt.Sprint(states) != fmt.Sprint(want) {
				t.Fatalf("tenant states %v, want %v", states, want)
			}
		},
	},
	{
		name:   "streamed",
		params: map[string]string{"logical_decoding_work_mem": smallWorkMem},
		setup: `
CREATE TABLE s (id int PRIMARY KEY, pad text);
CREATE TABLE small (id int PRIMARY KEY);
CREATE PUBLICATION p FOR ALL TABLES;`,
		steps: []step{
			// A streamed transaction interleaved with small ones.
			s0(`BEGIN`),
			s0(`INSERT INTO s SELECT i, 'row' FROM generate_series(1, 1000) i`),
			s1(`INSERT INTO small VALUES (1)`),
			s0(`INSERT INTO s SELECT i, 'row' FROM generate_series(1001, 2000) i`),
			s1(`INSERT INTO small VALUES (2)`),
			s0(`COMMIT`),
			// A streamed transaction rolled back.
			s0(`BEGIN`),
			s0(`INSERT INTO s SELECT i, 'gone' FROM generate_series(10001, 12000) i`),
			s1(`INSERT INTO small VALUES (3)`),
			s0(`ROLLBACK`),
			// 500 + rolled-back 500 + 5 rows: exactly 505 envelopes.
			s0(`BEGIN`),
			s0(`INSERT INTO s SELECT i, 'kept' FROM generate_series(20001, 20500) i`),
			s0(`SAVEPOINT sp`),
			s0(`INSERT INTO s SELECT i, 'gone' FROM generate_series(20501, 21000) i`),
			s1(`INSERT INTO small VALUES (4)`),
			s0(`ROLLBACK TO SAVEPOINT sp`),
			s0(`INSERT INTO s SELECT i, 'kept' FROM generate_series(21001, 21005) i`),
			s0(`COMMIT`),
		},
		check: func(t *testing.T, txs []*Transaction) {
			var sizes []int
			for _, tx := range txs {
				sizes = append(sizes, tx.Len())
			}
			if fmt.Sprint(sizes) != "[1 1 2000 1 1 505]" {
				t.Fatalf("transaction sizes %v, want [1 1 2000 1 1 505]", sizes)
			}
			for _, e := range envelopes(t, txs[5:]) {
				if string(e.After["pad"]) != `"kept"` {
					t.Fatalf("rolled-back row delivered: %s", compact(e.After))
				}
			}
		},
	},
}

func partitionScenario(name string, viaRoot bool) scenario {
	pub := "CREATE PUBLICATION p FOR ALL TABLES"
	if viaRoot {
		pub += " WITH (publish_via_partition_root = true)"
	}
	return scenario{
		name: name,
		setup: `
CREATE TABLE part (id int, region text, v int, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE part_eu PARTITION OF part FOR VALUES IN ('eu');
CREATE TABLE part_us PARTITION OF part FOR VALUES IN ('us');
` + pub + ";",
		steps: []step{
			s0(`INSERT INTO part VALUES (1, 'eu', 1), (2, 'us', 2)`),
			s0(`UPDATE part SET v = 3 WHERE id = 1`),
			s0(`UPDATE part SET region = 'us' WHERE id = 1`),
			s0(`DELETE FROM part WHERE id = 2`),
		},
		check: func(t *testing.T, txs []*Transaction) {
			var ents []string
			for _, e := range envelopes(t, txs) {
				ents = append(ents, string(e.Op)+" "+e.Entity)
			}
			want := "[insert public.part_eu insert public.part_us update public.part_eu delete public.part_eu insert public.part_us delete public.part_us]"
			if viaRoot {
				want = strings.ReplaceAll(strings.ReplaceAll(want, "part_eu", "part"), "part_us", "part")
			}
			if fmt.Sprint(ents) != want {
				t.Fatalf("got %v\nwant %s", ents, want)
			}
		},
	}
}

// runScenario runs sc against a fresh database and returns the captured
// frames.
func runScenario(t *testing.T, sc scenario, fn func(pgcapture.Frame) error) []pgcapture.Frame {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := pgtest.NewDatabase(t)
	var conns [3]*pgconn.PgConn
	for i := range conns {
		c, err := pgconn.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		conns[i] = c
	}
	if _, err := conns[0].Exec(ctx, sc.setup).ReadAll(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	stream, err := pgcapture.Open(ctx, url, pgcapture.Options{Publication: "p", Params: sc.params})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close(context.Background())
	for _, st := range sc.steps {
		if _, err := conns[st.conn].Exec(ctx, st.sql).ReadAll(); err != nil {
			t.Fatalf("%s: %v", st.sql, err)
		}
	}
	const marker = "capture.end"
	if _, err := conns[0].Exec(ctx, pgcapture.MarkerSQL(marker)).ReadAll(); err != nil {
		t.Fatal(err)
	}
	frames, err := stream.Until(ctx, marker, fn)
	if err != nil {
		t.Fatal(err)
	}
	return frames
}

var fixedNow = func() time.Time { return time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC) }

// decodeFrames decodes a capture; budget 0 is the default.
func decodeFrames(t testing.TB, frames []pgcapture.Frame, cfg Config) []*Transaction {
	t.Helper()
	cfg.Now = fixedNow
	if cfg.SpillDir == "" {
		cfg.SpillDir = t.TempDir()
	}
	d := New(cfg)
	var txs []*Transaction
	for _, f := range frames {
		if err := d.Decode(LSN(f.WALStart), f.Data); err != nil {
			t.Fatalf("decode %q at %X: %v", f.Data[0], f.WALStart, err)
		}
		txs = d.Committed(txs)
	}
	if !d.Idle() {
		t.Fatal("decoder holds a partial transaction at the end of a capture")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, tx := range txs {
			tx.Close()
		}
	})
	return txs
}

// golden renders transactions as the golden file: per transaction a line
// {"transaction":{...}} and then one line per envelope body.
func golden(t testing.TB, txs []*Transaction) []byte {
	var b bytes.Buffer
	for _, tx := range txs {
		fmt.Fprintf(&b, `{"transaction":{"xid":%d,"commitLsn":"%s","endLsn":"%s","commitTime":"%s","changes":%d}}`+"\n",
			tx.Xid, appendLSN(nil, tx.CommitLSN), appendLSN(nil, tx.EndLSN), tx.CommitTime.UTC().Format(time.RFC3339Nano), tx.Len())
		for _, body := range bodies(t, tx) {
			b.WriteString(body)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// normalize drops what differs between two captures of the same workload
// (positions, xids, times) so a live run can be compared with the golden.
func normalize(t testing.TB, g []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(g))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("golden line %q: %v", sc.Text(), err)
		}
		if tx, ok := m["transaction"].(map[string]any); ok {
			m = map[string]any{"transaction": tx["changes"]}
		}
		for _, k := range []string{"lsn", "commitLsn", "xid", "commitTime"} {
			delete(m, k)
		}
		b, _ := json.Marshal(m)
		out = append(out, string(b))
	}
	return out
}

// TestCapture runs every scenario against the harness Postgres through a real
// replication session. With -update it rewrites the capture and golden
// files; otherwise it checks that the live stream decodes to the golden
// envelopes (up to positions, xids and times).
func TestCapture(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			frames := runScenario(t, sc, nil)
			txs := decodeFrames(t, frames, sc.cfg)
			sc.check(t, txs)
			got := golden(t, txs)
			capPath := filepath.Join(captureDir, sc.name+".bin.gz")
			goldPath := filepath.Join(captureDir, sc.name+".golden.jsonl")
			if *update {
				if err := os.MkdirAll(captureDir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := pgcapture.WriteFile(capPath, frames); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(goldPath, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(goldPath)
			if err != nil {
				t.Fatalf("%v (create it with go test ./decoder -run TestCapture -update)", err)
			}
			diffLines(t, normalize(t, got), normalize(t, want))
		})
	}
}

// TestReplay decodes the committed captures and compares with the golden
// envelopes byte for byte, under the default memory budget and under one
// small enough that every transaction spills.
func TestReplay(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			frames, err := pgcapture.ReadFile(filepath.Join(captureDir, sc.name+".bin.gz"))
			if err != nil {
				t.Fatalf("%v (create it with go test ./decoder -run TestCapture -update)", err)
			}
			want, err := os.ReadFile(filepath.Join(captureDir, sc.name+".golden.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			for _, budget := range []int64{0, 1024} {
				cfg := sc.cfg
				cfg.MemoryBudget = budget
				txs := decodeFrames(t, frames, cfg)
				sc.check(t, txs)
				diffLines(t, strings.Split(string(golden(t, txs)), "\n"), strings.Split(string(want), "\n"))
			}
		})
	}
}

func diffLines(t *testing.T, got, want []string) {
	t.Helper()
	for i := 0; i < len(got) || i < len(want); i++ {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Fatalf("line %d differs (%d lines, golden %d):\n got: %.600s\nwant: %.600s", i+1, len(got), len(want), g, w)
		}
	}
}

func envelopes(t *testing.T, txs []*Transaction) []Envelope {
	t.Helper()
	var out []Envelope
	for _, tx := range txs {
		for _, b := range bodies(t, tx) {
			var e Envelope
			if err := json.Unmarshal([]byte(b), &e); err != nil {
				t.Fatal(err)
			}
			out = append(out, e)
		}
	}
	return out
}

// compact renders a decoded object with sorted keys, "" for none.
func compact(m any) string {
	switch v := m.(type) {
	case map[string]json.RawMessage:
		if v == nil {
			return ""
		}
	case []byte:
		if v == nil {
			return ""
		}
		var x map[string]json.RawMessage
		json.Unmarshal(v, &x)
		m = x
	}
	b, _ := json.Marshal(m)
	var buf bytes.Buffer
	json.Compact(&buf, b)
	return buf.String()
}
