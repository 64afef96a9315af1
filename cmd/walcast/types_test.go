package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
)

// typesSource publishes tables with a column of every kind the envelope
// rules tell apart (enum, domains, arrays, json, bytea, timestamps, int8
// and numeric beyond a float64), nullable and not, a composite key, a
// name that needs quoting and two tables of one name in two schemas; one
// table is left out of the publication.
var typesSource = []string{
	`CREATE TYPE mood AS ENUM ('ok', 'sad')`,
	`CREATE DOMAIN posnum AS numeric CHECK (VALUE > 0)`,
	`CREATE DOMAIN flag AS bool`,
	`CREATE TABLE orders (id bigint PRIMARY KEY, status mood NOT NULL, total numeric, price posnum, ratio float8, qty int4 NOT NULL,
		small int2, paid flag, doc jsonb, raw bytea, at timestamptz NOT NULL DEFAULT now(), local timestamp, tags text[], nums int4[],
		uid uuid, "weird name" text, d date, iv interval, prices posnum[])`,
	`CREATE TABLE "line-items" (order_id bigint, n int, note text NOT NULL, PRIMARY KEY (order_id, n))`,
	`CREATE SCHEMA shop`,
	`CREATE TABLE shop.orders (id int PRIMARY KEY, v text)`,
	`CREATE TABLE secret (id int PRIMARY KEY)`,
	`CREATE PUBLICATION pub FOR TABLE orders, "line-items", shop.orders`,
}

// typesRows are inserted once the catalog is written: values at the edges
// of each rule (an int8 and a numeric a float64 cannot hold, NaN, an array
// with explicit bounds, NULLs, JSON of every shape).
var typesRows = []string{
	`INSERT INTO orders VALUES (1, 'ok', 3.5, 2, 0.25, 7, 1, true, '{"a":[1,"x",null]}', '\x0102', now(), '2026-01-02 03:04:05',
		'{a,NULL,"b c"}', '{{1,2},{3,4}}', gen_random_uuid(), 'w', '2026-01-02', '1 day', '{4.5,NULL}')`,
	`INSERT INTO orders VALUES (9007199254740993, 'sad', 123456789012345678901234.5, 12345678901234567.1234, 'NaN', -1, NULL, NULL,
		'null', NULL, '-infinity', NULL, '[0:1]={x,y}', '{}', NULL, NULL, NULL, NULL, NULL)`,
	`INSERT INTO orders (id, status, qty, ratio, total, doc) VALUES (2, 'ok', 0, '-Infinity', 'NaN', '"s"')`,
	`INSERT INTO "line-items" VALUES (1, 1, 'first')`,
	`INSERT INTO shop.orders VALUES (1, NULL)`,
}

// TestTypes: `walcast types --lang ts` prints, from the catalog `walcast
// run` journals, an interface per published table (and none for the
// unpublished one) with its key, nullability and the documented type of
// every column; the rows walcast journaled for those tables, written as
// TypeScript values of those interfaces, compile under tsc --strict (the
// package's own TypeScript), and values of the wrong type do not; with
// @walcast/client, live<Row>() of a generated type needs no cast.
func TestTypes(t *testing.T) {
	url := pgtest.NewDatabase(t)
	execSQL(t, url, typesSource...)
	ns := natstest.Start(t)
	run := startWalcast(t, runArgs(url, "--nats-url", ns.URL())...)
	waitUntil(t, "run active", 30*time.Second, func() bool { return strings.HasPrefix(run.readyz(), "active") })

	var out, errOut string
	waitUntil(t, "the catalog of the three published tables", 30*time.Second, func() bool {
		var code int
		code, out, errOut = walcast(t, map[string]string{"WALCAST_JOURNAL_URL": url}, "types", "--lang", "ts")
		return code == 0 && strings.Count(out, "export interface ") == 4 // three tables and Tables
	})
	for _, want := range []string{
		"export interface Orders {",
		"export interface ShopOrders {",
		"export interface LineItems {",
		"  /** int8, key, not null */\n  id: Int8;",
		"  /** public.mood, not null */\n  status: string;",
		"  total: Numeric | null;",
		"  /** numeric */\n  price: Numeric | null;", // a domain is its base type
		"  ratio: Float | null;",
		"  qty: number;",
		"  small: number | null;",
		"  /** bool */\n  paid: boolean | null;",
		"  doc: Json | null;",
		"  raw: string | null;",
		"  /** timestamptz, not null */\n  at: string;",
		"  tags: PgArray<string> | null;",
		"  nums: PgArray<number> | null;",
		`  "weird name": string | null;`,
		"  prices: PgArray<Numeric> | null;",
		`export type LineItemsKey = Pick<LineItems, "order_id" | "n">;`,
		`export type OrdersKey = Pick<Orders, "id">;`,
		`  "public.orders": Orders;`,
		`  "shop.orders": ShopOrders;`,
		`  "public.line-items": LineItems;`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("walcast types lacks %q", want)
		}
	}
	if strings.Contains(out, "Secret") || strings.Contains(out, "secret") {
		t.Errorf("walcast types printed the unpublished table")
	}
	if t.Failed() {
		t.Fatalf("walcast types:\n%s\nstderr: %s", out, errOut)
	}

	// --table narrows; a table the catalog lacks is exit 1; flags.
	if code, o, e := walcast(t, nil, "types", "--lang", "ts", "--journal-url", url, "--table", "shop.orders"); code != 0 ||
		!strings.Contains(o, "export interface ShopOrders") || strings.Contains(o, "export interface Orders ") {
		t.Errorf("--table shop.orders: exit %d\n%s%s", code, o, e)
	}
	if code, _, e := walcast(t, nil, "types", "--lang", "ts", "--journal-url", url, "--table", "secret"); code != exitFailed || !strings.Contains(e, "no published table") {
		t.Errorf("--table secret: exit %d, %q", code, e)
	}
	for _, args := range [][]string{{"types", "--journal-url", url}, {"types", "--lang", "go", "--journal-url", url}, {"types", "--lang", "ts"}, {"types", "--lang", "ts", "--journal-url", url, "--table", "a.b.c"}} {
		if code, _, e := walcast(t, map[string]string{}, args...); code != exitUsage || e == "" {
			t.Errorf("%v: exit %d, %q; want a usage error", args, code, e)
		}
	}

	// A database holding no journal is refused, and left without one:
	// types only reads, so it never creates or migrates a journal.
	empty := pgtest.NewDatabase(t)
	if code, _, e := walcast(t, nil, "types", "--lang", "ts", "--journal-url", empty); code != exitUsage || !strings.Contains(e, "holds no journal") || !strings.Contains(e, "walcast run creates the journal") {
		t.Errorf("types against a database without a journal: exit %d, %q; want exit %d naming the fix", code, e, exitUsage)
	}
	var created bool
	pgtest.MustQueryRow(t, empty, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'walcast')", nil, &created)
	if created {
		t.Errorf("walcast types created a journal schema in a database that had none")
	}

	// The journaled rows, as TypeScript values of the generated types.
	execSQL(t, url, typesRows...)
	var afters map[string][]json.RawMessage
	waitUntil(t, "the rows journaled", 30*time.Second, func() bool {
		afters = journaledAfters(t, url)
		return len(afters["public.orders"]) == 3 && len(afters["public.line-items"]) == 1 && len(afters["shop.orders"]) == 1
	})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "walcast-types.ts"), []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	var check strings.Builder
	check.WriteString("import type { Orders, OrdersKey, LineItems, ShopOrders, Tables } from './walcast-types.js';\n")
	check.WriteString("import { Client } from '@walcast/client';\n\n")
	for _, v := range []struct{ name, typ, entity string }{{"orders", "Orders", "public.orders"}, {"items", "LineItems", "public.line-items"}, {"shop", "ShopOrders", "shop.orders"}} {
		vals := make([]string, len(afters[v.entity]))
		for i, a := range afters[v.entity] {
			vals[i] = string(a)
		}
		fmt.Fprintf(&check, "export const %s: %s[] = [\n  %s,\n];\n", v.name, v.typ, strings.Join(vals, ",\n  "))
	}
	check.WriteString(`
export const key: OrdersKey = { id: orders[0].id };
export const byTopic: Tables['public.line-items'][] = items;
// Values of the wrong type are refused (tsc fails on an unused directive).
// @ts-expect-error qty is not null
export const nullQty: Orders = { ...orders[0], qty: null };
// @ts-expect-error ratio is a number or NaN/Infinity, not any string
export const badFloat: Orders = { ...orders[0], ratio: 'x' };
// @ts-expect-error tags is an array (or its text)
export const badTags: Orders = { ...orders[0], tags: [1] };
// @ts-expect-error a column the table does not have
export const extra: ShopOrders = { id: 1, v: null, w: 2 };

const client = new Client({ url: 'http://127.0.0.1:8080', token: 't' });
export const live = client.live<Orders>('public.orders', {
  onChange: (rows) => {
    for (const o of rows.values()) {
      const q: number = o.qty;
      const s: string = o.status;
      void q, s;
    }
  },
});
`)
	if err := os.WriteFile(filepath.Join(dir, "check.ts"), []byte(check.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	tsc(t, dir, "walcast-types.ts", "check.ts")
}

// journaledAfters reads the after object of every insert in the journal,
// by entity.
func journaledAfters(t *testing.T, url string) map[string][]json.RawMessage {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT envelope FROM walcast.entries ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	bodies, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]json.RawMessage{}
	for _, b := range bodies {
		var env struct {
			Op     string          `json:"op"`
			Entity string          `json:"entity"`
			After  json.RawMessage `json:"after"`
		}
		if err := json.Unmarshal([]byte(b), &env); err != nil {
			t.Fatal(err)
		}
		if env.Op == "insert" {
			out[env.Entity] = append(out[env.Entity], env.After)
		}
	}
	return out
}

// tsc compiles files of dir with the TypeScript of the client package
// (fanout/client/js, its node_modules from npm ci), strict, with
// @walcast/client resolved to the package's sources.
func tsc(t *testing.T, dir string, files ...string) {
	t.Helper()
	js, err := filepath.Abs("../../fanout/client/js")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(js, "node_modules", "typescript", "bin", "tsc")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("TypeScript not found: run `npm ci` in fanout/client/js (make js-test does): %v", err)
	}
	cfg, err := json.Marshal(map[string]any{
		"compilerOptions": map[string]any{
			"target": "ES2020", "module": "ES2020", "moduleResolution": "bundler", "lib": []string{"ES2020", "DOM"},
			"strict": true, "noEmit": true, "skipLibCheck": true,
			"paths": map[string][]string{"@walcast/client": {filepath.Join(js, "src", "index.ts")}},
		},
		"files": files,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tsconfig.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", bin, "-p", filepath.Join(dir, "tsconfig.json"))
	if b, err := cmd.CombinedOutput(); err != nil {
		src, _ := os.ReadFile(filepath.Join(dir, files[len(files)-1]))
		t.Fatalf("tsc: %v\n%s\n--- %s ---\n%s", err, b, files[len(files)-1], src)
	}
}
