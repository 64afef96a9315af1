package decoder

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// guardCase feeds one awkward change followed by an ordinary insert, in one
// transaction (ordinary or streamed and spilled), and checks what came out.
type guardCase struct {
	name  string
	cfg   Config
	setup bool // send the docs relation first
	msg   func(stream bool) []byte
	check func(t *testing.T, c *Change, env *Envelope)
}

// takeChanges returns copies of every committed change, checking each body
// is valid UTF-8 JSON agreeing with the Change's fields.
func takeChanges(t *testing.T, f *feeder) []Change {
	t.Helper()
	var out []Change
	for _, tx := range f.d.Committed(nil) {
		it := tx.Changes()
		for it.Next() {
			c := *it.Change()
			if !utf8.Valid(c.Body) || !utf8.ValidString(c.Entity) || !utf8.ValidString(c.Tenant) {
				t.Fatalf("not valid UTF-8: entity %q tenant %q body %q", c.Entity, c.Tenant, c.Body)
			}
			if len(c.Entity) > MaxEntityBytes {
				t.Fatalf("entity of %d bytes", len(c.Entity))
			}
			checkChange(t, &c)
			c.Body = append([]byte(nil), c.Body...)
			c.Key = append([]byte(nil), c.Key...)
			out = append(out, c)
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		if err := tx.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestGuard(t *testing.T) {
	latin1JSON := "{\"n\":\"M\xfcller\"}" // parses as JSON, is not UTF-8
	longPrefix := "walcast." + strings.Repeat("p", 70<<10)
	rel := func(s bool) []byte {
		return relationMsg(s, 9, 1, "public", "docs", 'd', col{"id", 23, true}, col{"org", 25, false}, col{"body", 25, false})
	}
	cases := []guardCase{
		{
			name: "message content JSON in LATIN1 is base64",
			msg:  func(s bool) []byte { return messageMsg(s, 9, true, 0x1500, "walcast.x", latin1JSON) },
			check: func(t *testing.T, c *Change, env *Envelope) {
				if env.Op != OpMessage || string(env.Content) != `"`+base64.StdEncoding.EncodeToString([]byte(latin1JSON))+`"` {
					t.Fatalf("content %s", env.Content)
				}
			},
		},
		{
			name: "message prefix not UTF-8 is quarantined with its bytes",
			msg:  func(s bool) []byte { return messageMsg(s, 9, true, 0x1500, "walcast.\xfc", "{}") },
			check: func(t *testing.T, c *Change, env *Envelope) {
				q := env.Quarantine
				if env.Op != OpQuarantine || c.Op != OpQuarantine || q == nil || q.Reason != ReasonEntityNotUTF8 || q.Op != OpMessage {
					t.Fatalf("envelope %s", c.Body)
				}
				if string(q.Entity) != "walcast.\xfc" || !strings.Contains(string(q.Raw), `"op":"message"`) || q.Size == 0 || len(q.SHA256) != 64 {
					t.Fatalf("quarantine %+v", q)
				}
				if c.Entity != SafeEntity("walcast.\xfc") {
					t.Fatalf("entity %q", c.Entity)
				}
			},
		},
		{
			name: "message prefix of 70 KB keeps the prefix, cuts the entity",
			msg:  func(s bool) []byte { return messageMsg(s, 9, true, 0x1500, longPrefix, `{"a":1}`) },
			check: func(t *testing.T, c *Change, env *Envelope) {
				if env.Op != OpMessage || env.Prefix != longPrefix || string(env.Content) != `{"a":1}` {
					t.Fatalf("op %s, prefix of %d bytes", env.Op, len(env.Prefix))
				}
				if c.Entity != SafeEntity(longPrefix) || len(c.Entity) > MaxEntityBytes || !strings.HasPrefix(c.Entity, "walcast.ppp") {
					t.Fatalf("entity %q", c.Entity)
				}
			},
		},
		{
			name:  "tenant value not UTF-8 is quarantined and routed to no tenant",
			cfg:   Config{TenantColumn: "org"},
			setup: true,
			msg:   func(s bool) []byte { return insertMsg(s, 9, 1, "7", "acm\xe9", "x") },
			check: func(t *testing.T, c *Change, env *Envelope) {
				q := env.Quarantine
				if c.Op != OpQuarantine || q.Reason != ReasonTenantNotUTF8 || string(q.Tenant) != "acm\xe9" || q.Op != OpInsert {
					t.Fatalf("envelope %s", c.Body)
				}
				if c.TenantState != TenantUnresolved || c.Key != nil || env.Tenant != "" {
					t.Fatalf("tenant state %d key %s in %s", c.TenantState, c.Key, c.Body)
				}
			},
		},
		{
			name:  "row over the envelope limit keeps key and tenant",
			cfg:   Config{TenantColumn: "org", MaxEnvelopeBytes: 4096},
			setup: true,
			msg:   func(s bool) []byte { return insertMsg(s, 9, 1, "7", "acme", strings.Repeat("b", 5000)) },
			check: func(t *testing.T, c *Change, env *Envelope) {
				q := env.Quarantine
				if c.Op != OpQuarantine || q.Reason != ReasonTooLarge || q.Size <= 5000 || q.Raw != nil || len(c.Body) > 4096 {
					t.Fatalf("envelope %.300s", c.Body)
				}
				if c.Entity != "public.docs" || string(c.Key) != `{"id":7}` || c.TenantState != TenantKnown || c.Tenant != "acme" || env.Tenant != "acme" {
					t.Fatalf("entity %q key %s tenant %d %q", c.Entity, c.Key, c.TenantState, c.Tenant)
				}
			},
		},
		{
			name:  "update changing the key over the envelope limit keeps both keys",
			cfg:   Config{TenantColumn: "org", MaxEnvelopeBytes: 4096},
			setup: true,
			msg: func(s bool) []byte {
				return updateMsg(s, 9, 1, 'K', []any{"6", nil, nil}, "7", "acme", strings.Repeat("b", 5000))
			},
			check: func(t *testing.T, c *Change, env *Envelope) {
				q := env.Quarantine
				if c.Op != OpQuarantine || q.Reason != ReasonTooLarge || q.Op != OpUpdate || len(c.Body) > 4096 {
					t.Fatalf("envelope %.300s", c.Body)
				}
				if string(c.Key) != `{"id":7}` || string(env.Before["id"]) != "6" || len(env.Before) != 1 || c.OldKey != nil {
					t.Fatalf("key %s, before %v (old key %s) in %s", c.Key, env.Before, c.OldKey, c.Body)
				}
			},
		},
		{
			name:  "row over the raw limit keeps only size and hash",
			cfg:   Config{MaxEnvelopeBytes: 4 << 20},
			setup: true,
			msg: func(s bool) []byte {
				return insertMsg(s, 9, 1, "8", nil, strings.Repeat("b", 5<<20))
			},
			check: func(t *testing.T, c *Change, env *Envelope) {
				q := env.Quarantine
				if c.Op != OpQuarantine || q.Reason != ReasonTooLarge || q.Raw != nil || q.Size <= MaxQuarantineRawBytes || len(c.Body) > 4096 {
					t.Fatalf("envelope of %d bytes: %.300s", len(c.Body), c.Body)
				}
			},
		},
	}
	for _, tc := range cases {
		for _, mode := range []string{"memory", "spilled"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				cfg := tc.cfg
				stream := mode == "spilled"
				if stream {
					cfg.MemoryBudget = 1 // every change goes to the spill file
				}
				f := newFeeder(t, cfg)
				ordinary := relationMsg(stream, 9, 2, "public", "plain", 'd', col{"id", 23, true})
				if stream {
					f.feed(streamStartMsg(9, true))
					if tc.setup {
						f.feed(rel(true))
					}
					f.feed(ordinary, tc.msg(true), insertMsg(true, 9, 2, "1"), streamStopMsg(), streamCommitMsg(9, 0x1F00, 0x2000))
				} else {
					if tc.setup {
						f.feed(rel(false))
					}
					f.feed(ordinary, beginMsg(9, 0x1F00), tc.msg(false), insertMsg(false, 9, 2, "1"), commitMsg(0x1F00, 0x2000))
				}
				if stream && f.d.Stats().Spilled == 0 {
					t.Fatal("the transaction did not spill")
				}
				got := takeChanges(t, f)
				if len(got) != 2 {
					t.Fatalf("%d changes, want 2", len(got))
				}
				var env Envelope
				if err := json.Unmarshal(got[0].Body, &env); err != nil {
					t.Fatal(err)
				}
				tc.check(t, &got[0], &env)
				if got[1].Entity != "public.plain" || string(got[1].Key) != `{"id":1}` {
					t.Fatalf("the ordinary row behind it: %s", got[1].Body)
				}
			})
		}
	}
}

func TestSafeEntity(t *testing.T) {
	for _, s := range []string{"public.t", "", strings.Repeat("é", 200), "a\xffb", strings.Repeat("x", 1<<16)} {
		got := SafeEntity(s)
		if !utf8.ValidString(got) || len(got) > MaxEntityBytes {
			t.Fatalf("SafeEntity(%.40q) = %.40q (%d bytes)", s, got, len(got))
		}
		if (len(s) <= MaxEntityBytes && utf8.ValidString(s)) != (got == s) {
			t.Fatalf("SafeEntity(%.40q) = %.40q", s, got)
		}
		if SafeEntity(s) != got {
			t.Fatal("not stable")
		}
	}
	a, b := SafeEntity(strings.Repeat("x", 300)+"1"), SafeEntity(strings.Repeat("x", 300)+"2")
	if a == b {
		t.Fatalf("distinct names share %q", a)
	}
}

// TestQuarantineKeyUnderFull: under REPLICA IDENTITY FULL every column is a
// key column, so the key and old row of a row too large to carry are too
// large for its quarantine entry too; with Config.KeyColumns naming the
// table's primary key, the entry carries that key, new and old, and stays
// small.
func TestQuarantineKeyUnderFull(t *testing.T) {
	big := strings.Repeat("b", 5000)
	run := func(keyCols func(uint32, string, string) []string) (Change, Envelope) {
		f := newFeeder(t, Config{MaxEnvelopeBytes: 4096, KeyColumns: keyCols})
		f.feed(relationMsg(false, 0, 1, "public", "full", 'f', col{"org", 25, true}, col{"id", 23, true}, col{"body", 25, true}),
			beginMsg(9, 0x1F00), updateMsg(false, 0, 1, 'O', []any{"acme", "6", big}, "acme", "7", big+"!"), commitMsg(0x1F00, 0x2000))
		got := takeChanges(t, f)
		if len(got) != 1 {
			t.Fatalf("%d changes", len(got))
		}
		var env Envelope
		if err := json.Unmarshal(got[0].Body, &env); err != nil {
			t.Fatal(err)
		}
		if got[0].Op != OpQuarantine || env.Quarantine.Reason != ReasonTooLarge || len(got[0].Body) > 4096 {
			t.Fatalf("entry of %d bytes: %.300s", len(got[0].Body), got[0].Body)
		}
		return got[0], env
	}
	var asked []string
	c, env := run(func(rel uint32, schema, table string) []string {
		asked = append(asked, schema+"."+table)
		return []string{"id", "org"}
	})
	if string(c.Key) != `{"org":"acme","id":7}` || len(env.Before) != 2 || string(env.Before["id"]) != "6" {
		t.Fatalf("with the primary key known: key %s, before %v", c.Key, env.Before)
	}
	if len(asked) != 1 || asked[0] != "public.full" {
		t.Fatalf("KeyColumns asked for %q", asked)
	}
	// Without it the whole row is the key: too large to carry.
	if c, env := run(nil); c.Key != nil || env.Before != nil {
		t.Fatalf("without KeyColumns: key %.60s, before %v", c.Key, env.Before)
	}
}
