package decoder

import (
	"fmt"
	"testing"
)

// The domains scenario joins the captured scenarios of capture_test.go
// (TestCapture records it with -update, TestReplay replays the committed
// capture).
func init() { scenarios = append(scenarios, domainsScenario) }

// domainsScenario: what pgoutput really sends for domains (a Type message
// naming the base type), for the types initdb creates (OIDs 10000..16383,
// Type messages of their own), for arrays of domains (named "_posint", the
// element type unsaid), and JSON null next to SQL NULL in json and jsonb
// columns, under REPLICA IDENTITY DEFAULT and FULL.
var domainsScenario = scenario{
	name: "domains",
	setup: `
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN intarr AS int[];
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE DOMAIN posint2 AS posint;
CREATE DOMAIN flag AS bool;
CREATE DOMAIN doc AS jsonb;
CREATE DOMAIN blob AS bytea;
CREATE DOMAIN stamp AS timestamptz;
CREATE DOMAIN money2 AS numeric(12,2);
CREATE DOMAIN big AS int8;
CREATE DOMAIN dmood AS mood;
CREATE TYPE "_int4" AS ENUM ('x', 'y');
CREATE TABLE dom (
  id int PRIMARY KEY, ia intarr, pi posint, pi2 posint2, pia posint[], f flag, j doc, b blob, ts stamp,
  m money2, bg big, dm dmood, dma dmood[], fake public."_int4",
  sid information_schema.sql_identifier, sida information_schema.sql_identifier[],
  cn information_schema.cardinal_number, tsd information_schema.time_stamp);
CREATE TABLE jnull (id int PRIMARY KEY, jb jsonb, js json, dj doc, jba jsonb[]);
CREATE TABLE jkey (k jsonb PRIMARY KEY, v jsonb);
ALTER TABLE jkey REPLICA IDENTITY FULL;
CREATE PUBLICATION p FOR ALL TABLES;`,
	steps: []step{
		s0(`INSERT INTO dom VALUES (1, '{1,2,NULL}', 3, 4, '{5,6}', true, '{"a": null}', '\x0102',
  '2026-11-29 23:21:24.123456+05:30', 1234.5, 9007199254740993, 'ok', '{sad,happy}', 'x',
  'abc', '{x,"y z"}', 7, '2026-01-01 00:00:00+00')`),
		s0(`INSERT INTO dom (id, f, bg, tsd) VALUES (2, false, 42, NULL)`),
		s0(`INSERT INTO jnull VALUES (1, 'null', ' null ', 'null', ARRAY['null'::jsonb, NULL]),
  (2, NULL, NULL, NULL, NULL), (3, '{"a": null}', '[null]', '1', '{}')`),
		s0(`UPDATE jnull SET jb = NULL, js = 'null' WHERE id = 1`),
		s0(`INSERT INTO jkey VALUES ('null', 'null'), ('{"k": 1}', NULL)`),
		s0(`UPDATE jkey SET v = NULL WHERE k = 'null'`),
		s0(`DELETE FROM jkey WHERE k = 'null'`),
	},
	check: func(t *testing.T, txs []*Transaction) {
		envs := envelopes(t, txs)
		if len(envs) != 10 {
			t.Fatalf("%d envelopes, want 10", len(envs))
		}
		want := map[string]string{
			"ia": `[1,2,null]`, "pi": `3`, "pi2": `4`, "pia": `["5","6"]`, "f": `true`, "j": `{"a": null}`,
			"b": `"AQI="`, "ts": `"2026-11-29T17:51:24.123456Z"`, "m": `1234.50`, "bg": `"9007199254740993"`,
			"dm": `"ok"`, "dma": `["sad","happy"]`, "fake": `"x"`,
			"sid": `"abc"`, "sida": `["x","y z"]`, "cn": `7`, "tsd": `"2026-01-01T00:00:00.000000Z"`,
		}
		for k, v := range want {
			if got := string(envs[0].After[k]); got != v {
				t.Errorf("after.%s = %s, want %s", k, got, v)
			}
		}
		if got := string(envs[1].After["f"]) + " " + string(envs[1].After["bg"]); got != "false 42" {
			t.Errorf("second row: f bg = %s", got)
		}
		lists := func(e Envelope) string { return fmt.Sprintf("%q %q", e.BeforeJSONNull, e.AfterJSONNull) }
		wantLists := []string{
			`[] []`, `[] []`,
			`[] ["jb" "js" "dj"]`, `[] []`, `[] []`, // jnull inserts
			`[] ["js" "dj"]`,        // jnull update, no old row
			`[] ["k" "v"]`, `[] []`, // jkey inserts
			`["k" "v"] ["k"]`, // jkey update: v from JSON null to SQL NULL
			`["k"] []`,        // jkey delete
		}
		for i, w := range wantLists {
			if got := lists(envs[i]); got != w {
				t.Errorf("envelope %d (%s %s): lists %s, want %s", i, envs[i].Op, envs[i].Entity, got, w)
			}
		}
		if e := envs[2]; string(e.After["jb"]) != "null" || string(e.After["jba"]) != "[null,null]" || string(envs[3].After["jb"]) != "null" {
			t.Errorf("jnull rows: %s; %s", compact(e.After), compact(envs[3].After))
		}
	},
}
