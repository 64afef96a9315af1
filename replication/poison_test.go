package replication

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

// poison is one awkward input of the poison catalog: what a database role
// can write (or an operator can set up) that must neither stop, loop nor
// flood the stream.
type poison struct {
	name string
	// sqlASCII puts the source in a SQL_ASCII database (text holds any
	// bytes there) with the journal in an ordinary UTF-8 database.
	sqlASCII bool
	setup    []string // on the source, before walcast starts
	cfg      func(*Config)
	journal  []string // on the journal database, after it is created
	write    []string // the poison, each string one transaction
	// check inspects the journal entries written for the poison (the
	// ordinary row behind it excluded) and the replicator.
	check func(t *testing.T, es []journal.Entry, r *Replicator)
}

func envelopeOf(t *testing.T, e journal.Entry) decoder.Envelope {
	t.Helper()
	var env decoder.Envelope
	if err := json.Unmarshal(e.Envelope, &env); err != nil {
		t.Fatalf("entry %d: %v\n%.300s", e.Seq, err, e.Envelope)
	}
	return env
}

func onlyEntry(t *testing.T, es []journal.Entry) (journal.Entry, decoder.Envelope) {
	t.Helper()
	if len(es) != 1 {
		t.Fatalf("%d entries for the poison, want 1", len(es))
	}
	return es[0], envelopeOf(t, es[0])
}

var poisonCatalog = []poison{
	{
		name:  "message JSON in LATIN1",
		write: []string{`SELECT pg_logical_emit_message(true, 'walcast.x', convert_to('{"n":"Müller"}', 'LATIN1'))`},
		check: func(t *testing.T, es []journal.Entry, _ *Replicator) {
			_, env := onlyEntry(t, es)
			want := `"` + base64.StdEncoding.EncodeToString([]byte("{\"n\":\"M\xfcller\"}")) + `"`
			if env.Op != decoder.OpMessage || string(env.Content) != want {
				t.Fatalf("content %s, want %s (base64 of the bytes as sent)", env.Content, want)
			}
		},
	},
	{
		name:  "message with NUL bytes",
		write: []string{`SELECT pg_logical_emit_message(true, 'walcast.nul', '\x00ff00'::bytea)`},
		check: func(t *testing.T, es []journal.Entry, _ *Replicator) {
			if _, env := onlyEntry(t, es); string(env.Content) != `"AP8A"` {
				t.Fatalf("content %s", env.Content)
			}
		},
	},
	{
		name:  "message JSON with an escaped NUL and control characters",
		write: []string{`SELECT pg_logical_emit_message(false, 'walcast.esc', '{"a":"\u0000\u001f"}')`},
		check: func(t *testing.T, es []journal.Entry, _ *Replicator) {
			if _, env := onlyEntry(t, es); string(env.Content) != `{"a":"\u0000\u001f"}` {
				t.Fatalf("content %s", env.Content)
			}
		},
	},
	{
		name:  "message prefix of 70 KB in a spilled transaction",
		cfg:   func(c *Config) { c.MemoryBudget = 256 << 10 },
		write: []string{`BEGIN; INSERT INTO items SELECT g, repeat('x', 200), g FROM generate_series(1, 3000) g; SELECT pg_logical_emit_message(true, 'walcast.' || repeat('p', 70000), '{"big":true}'); COMMIT`},
		check: func(t *testing.T, es []journal.Entry, _ *Replicator) {
			if len(es) != 3001 {
				t.Fatalf("%d entries, want 3001", len(es))
			}
			prefix := "walcast." + strings.Repeat("p", 70000)
			env := envelopeOf(t, es[3000])
			if env.Op != decoder.OpMessage || env.Prefix != prefix || es[3000].Entity != decoder.SafeEntity(prefix) || string(env.Content) != `{"big":true}` {
				t.Fatalf("message: op %s entity %.40q prefix of %d bytes", env.Op, es[3000].Entity, len(env.Prefix))
			}
		},
	},
	{
		name:  "10k distinct message prefixes",
		write: []string{`SELECT pg_logical_emit_message(true, 'walcast.p' || g, '{}') FROM generate_series(1, 10000) g`},
		check: func(t *testing.T, es []journal.Entry, r *Replicator) {
			if len(es) != 10000 {
				t.Fatalf("%d entries, want 10000", len(es))
			}
			_, journaled := r.ChangeCounts()
			n := 0
			journaled.Each(func(string, decoder.Op, uint64) { n++ })
			if n > decoder.MaxMessageEntities+4 {
				t.Fatalf("journaled counters hold %d series: message prefixes must not be unbounded metric labels", n)
			}
		},
	},
	{
		name:  "tenant value of 5 KB",
		setup: []string{`CREATE TABLE docs (id int PRIMARY KEY, org text, body text)`, `ALTER PUBLICATION pub ADD TABLE docs`},
		cfg:   func(c *Config) { c.TenantColumn = "org" },
		write: []string{`INSERT INTO docs VALUES (1, repeat('t', 5000), 'x')`},
		check: func(t *testing.T, es []journal.Entry, _ *Replicator) {
			e, env := onlyEntry(t, es)
			if !e.HasTenant || e.Tenant != strings.Repeat("t", 5000) || env.Tenant != e.Tenant {
				t.Fatalf("tenant of %d bytes (has %v)", len(e.Tenant), e.HasTenant)
			}
		},
	},
	{
		name:  "control characters, dots and wildcards in identifiers",
		setup: []string{"CREATE TABLE \"we.ird*>\x01 \x7f\" (\"k\ney\" int PRIMARY KEY, \"v\t\" text)", "ALTER PUBLICATION pub ADD TABLE \"we.ird*>\x01 \x7f\""},
		write: []string{"INSERT INTO \"we.ird*>\x01 \x7f\" VALUES (1, 'x')"},
		check: func(t *testing.T, es []journal.Entry, _ *Replicator) {
			e, env := onlyEntry(t, es)
			if e.Entity != decoder.EntityName("public", "we.ird*>\x01 \x7f") || env.Op != decoder.OpInsert || string(env.Key["k\ney"]) != "1" {
				t.Fatalf("entity %q: %s", e.Entity, e.Envelope)
			}
		},
	},
	{
		name:  "row over the envelope limit, and its update under REPLICA IDENTITY FULL",
		setup: []string{`ALTER TABLE items REPLICA IDENTITY FULL`},
		cfg:   func(c *Config) { c.MaxEnvelopeBytes = 1 << 20 },
		write: []string{`INSERT INTO items VALUES (77, repeat('y', 3 << 20), 1)`, `UPDATE items SET n = 2 WHERE id = 77`},
		check: func(t *testing.T, es []journal.Entry, r *Replicator) {
			if len(es) != 2 {
				t.Fatalf("%d entries, want 2", len(es))
			}
			for i, want := range []decoder.Op{decoder.OpInsert, decoder.OpUpdate} {
				env := envelopeOf(t, es[i])
				q := env.Quarantine
				if env.Op != decoder.OpQuarantine || q == nil || q.Op != want || q.Reason != decoder.ReasonTooLarge || q.Size < 3<<20 || q.Raw != nil {
					t.Fatalf("entry %d: %.400s", i, es[i].Envelope)
				}
				if len(es[i].Envelope) > 4096 || es[i].Entity != "public.items" {
					t.Fatalf("entry %d of %d bytes for %q", i, len(es[i].Envelope), es[i].Entity)
				}
			}
			if n := r.Quarantined(decoder.ReasonTooLarge); n != 2 {
				t.Fatalf("quarantined too-large: %d, want 2", n)
			}
		},
	},
	{
		name: "a change the journal keeps refusing",
		journal: []string{
			`CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
			 BEGIN IF array_to_string(NEW.envelope, ',') LIKE '%poison-pill%' THEN RAISE EXCEPTION 'refused for the test' USING ERRCODE = '22023'; END IF; RETURN NEW; END $$`,
			`CREATE TRIGGER refuse BEFORE INSERT ON walcast.chunks FOR EACH ROW EXECUTE FUNCTION public.refuse()`,
		},
		write: []string{`INSERT INTO items VALUES (55, 'poison-pill', 1)`},
		check: func(t *testing.T, es []journal.Entry, r *Replicator) {
			_, env := onlyEntry(t, es)
			q := env.Quarantine
			if env.Op != decoder.OpQuarantine || q.Reason != decoder.ReasonAppendFailed || q.Op != decoder.OpInsert ||
				!strings.Contains(string(q.Raw), "poison-pill") || !strings.Contains(q.Detail, "refused for the test") || string(env.Key["id"]) != "55" {
				t.Fatalf("%s", es[0].Envelope)
			}
			if n := r.Quarantined(decoder.ReasonAppendFailed); n != 1 {
				t.Fatalf("quarantined append-failed: %d, want 1", n)
			}
		},
	},
	{
		name:     "tenant value not UTF-8 (SQL_ASCII source)",
		sqlASCII: true,
		setup:    []string{`CREATE TABLE docs (id int PRIMARY KEY, org text, body text)`, `ALTER PUBLICATION pub ADD TABLE docs`},
		cfg:      func(c *Config) { c.TenantColumn = "org" },
		write:    []string{`INSERT INTO docs VALUES (1, E'acm\xe9', 'secret')`},
		check: func(t *testing.T, es []journal.Entry, _ *Replicator) {
			e, env := onlyEntry(t, es)
			q := env.Quarantine
			if env.Op != decoder.OpQuarantine || q.Reason != decoder.ReasonTenantNotUTF8 || string(q.Tenant) != "acm\xe9" {
				t.Fatalf("%s", e.Envelope)
			}
			if e.HasTenant || !e.TenantUnknown {
				t.Fatalf("a change whose tenant cannot be carried must reach no tenant: has %v unknown %v", e.HasTenant, e.TenantUnknown)
			}
		},
	},
	{
		name:     "message prefix not UTF-8 (SQL_ASCII source)",
		sqlASCII: true,
		write:    []string{`SELECT pg_logical_emit_message(true, E'walcast.\xfc', '{}')`},
		check: func(t *testing.T, es []journal.Entry, _ *Replicator) {
			e, env := onlyEntry(t, es)
			if env.Op != decoder.OpQuarantine || env.Quarantine.Reason != decoder.ReasonEntityNotUTF8 || string(env.Quarantine.Entity) != "walcast.\xfc" ||
				e.Entity != decoder.SafeEntity("walcast.\xfc") {
				t.Fatalf("entity %q: %s", e.Entity, e.Envelope)
			}
		},
	},
}

// TestPoisonCatalog writes each awkward input and checks that it is carried
// in its documented form, that an ordinary row written behind it arrives,
// that the slot keeps advancing past both and that the session never had
// to reconnect.
func TestPoisonCatalog(t *testing.T) {
	for _, p := range poisonCatalog {
		t.Run(p.name, func(t *testing.T) {
			srcURL, jURL := pgtest.NewDatabase(t), ""
			if p.sqlASCII {
				srcURL, jURL = sqlASCIIDatabase(t), srcURL
			}
			if jURL == "" {
				jURL = srcURL
			}
			execSQL(t, srcURL, append([]string{
				`CREATE TABLE items (id int PRIMARY KEY, val text, n int)`,
				`CREATE PUBLICATION pub FOR TABLE items`,
			}, p.setup...)...)
			j, err := journal.Open(context.Background(), journal.Config{URL: jURL, CursorSecret: testSecret})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(j.Close)
			execSQL(t, jURL, p.journal...)
			f := &fixture{t: t, url: jURL, j: j}
			cfg := (&fixture{t: t, url: srcURL}).config()
			if p.cfg != nil {
				p.cfg(&cfg)
			}
			run := f.start(cfg)
			waitFor(t, "active", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
			before := len(f.entries())

			execSQL(t, srcURL, p.write...)
			execSQL(t, srcURL, `INSERT INTO items VALUES (1000000, 'behind', 0)`)

			var es []journal.Entry
			waitFor(t, "the ordinary row behind the poison", 60*time.Second, func() bool {
				es = f.entries()[before:]
				return len(es) > 0 && strings.Contains(string(es[len(es)-1].Envelope), `"behind"`)
			})
			p.check(t, es[:len(es)-1], run.r)
			endLSN := es[len(es)-1].CommitLSN
			waitFor(t, "the slot to confirm past the ordinary row", 30*time.Second, func() bool {
				var confirmed string
				pgtest.MustQueryRow(t, srcURL, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'walcast'`, nil, &confirmed)
				c, _ := decoder.ParseLSN(confirmed)
				return c >= endLSN
			})
			if n := run.r.Stats().Reconnects.Load(); n != 0 {
				t.Fatalf("the session reconnected %d times: %s", n, run.r.State().LastError)
			}
		})
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("after the catalog: heap in use %d MiB, VmHWM %d KiB", ms.HeapInuse>>20, procKiB("VmHWM"))
	if ms.HeapInuse > 512<<20 {
		t.Fatalf("heap in use after the catalog: %d MiB", ms.HeapInuse>>20)
	}
}

// sqlASCIIDatabase creates a SQL_ASCII database, where text values hold any
// bytes, on the shared cluster.
func sqlASCIIDatabase(t *testing.T) string {
	t.Helper()
	c := pgtest.Shared(t)
	name := fmt.Sprintf("ascii_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	ctx := context.Background()
	if err := c.Exec(ctx, "postgres", "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+
		" ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.DropDatabase(context.Background(), name); err != nil {
			t.Error(err)
		}
	})
	return c.URL(name)
}

// TestIdleSourceStaysIdle: with a FOR ALL TABLES publication and the journal
// in the source database, every journal write is decoded back as a
// transaction of journal tables only. Such empty transactions are never
// journaled, and the idle advance ignores walcast's own WAL, so an idle
// source stays idle: no journal batches, almost no WAL.
func TestIdleSourceStaysIdle(t *testing.T) {
	f := newFixture(t, `CREATE PUBLICATION allpub FOR ALL TABLES`)
	cfg := f.config()
	cfg.Publication = "allpub"
	run := f.start(cfg)
	waitFor(t, "active", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
	execSQL(t, f.url, `INSERT INTO items VALUES (1, 'a', 1)`, `INSERT INTO unpublished (pad) SELECT repeat('x', 1000) FROM generate_series(1, 2000)`)
	// FOR ALL TABLES: the unpublished table is published here too.
	waitFor(t, "the writes", 30*time.Second, func() bool { return len(f.entries()) == 2001 })
	// Autovacuum would vacuum and analyze what the burst and the set-up
	// changed (the tables, the journal's, and the system catalogs the
	// migrations wrote) at a moment of its choosing, and its WAL is not
	// walcast's: done now, before the measurement, so nothing is left
	// for it to do.
	execSQL(t, f.url, `VACUUM (ANALYZE)`)
	time.Sleep(3 * time.Second) // let the advance past the burst and the vacuum settle

	wal := func() decoder.LSN {
		var s string
		pgtest.MustQueryRow(t, f.url, `SELECT pg_current_wal_lsn()::text`, nil, &s)
		l, _ := decoder.ParseLSN(s)
		return l
	}
	w0, b0 := wal(), run.r.Stats().Batches.Load()
	time.Sleep(6 * time.Second) // six status intervals: each could have brought an advance
	w1, b1 := wal(), run.r.Stats().Batches.Load()
	t.Logf("idle for 6s: %d bytes of WAL, %d journal batches", w1-w0, b1-b0)
	if b1-b0 > 1 || w1-w0 > 64<<10 {
		// Whatever autovacuum did meanwhile, to tell its WAL from walcast's.
		var av string
		pgtest.MustQueryRow(t, f.url, `SELECT coalesce(string_agg(schemaname || '.' || relname, ', '), 'none')
			FROM pg_stat_all_tables WHERE greatest(last_autovacuum, last_autoanalyze) > now() - interval '10 seconds'`, nil, &av)
		t.Fatalf("an idle source wrote %d bytes of WAL and %d journal batches in 6s (autovacuum in the last 10 s: %s)", w1-w0, b1-b0, av)
	}
	if n := len(f.entries()); n != 2001 {
		t.Fatalf("%d journal entries, want 2001", n)
	}
}

// TestJournalSchemaNameInAnotherDatabase: with the journal in another
// database under the schema "public", the source's public tables are data.
// The decoder used to drop (and acknowledge) every change of a schema named
// like the journal's.
func TestJournalSchemaNameInAnotherDatabase(t *testing.T) {
	src := pgtest.NewDatabase(t)
	execSQL(t, src, `CREATE TABLE items (id int PRIMARY KEY, val text, n int)`, `CREATE PUBLICATION pub FOR TABLE items`)
	j, err := journal.Open(context.Background(), journal.Config{URL: pgtest.NewDatabase(t), Schema: "public", CursorSecret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Close)
	f := &fixture{t: t, url: src, j: j}
	run := f.start(f.config())
	waitFor(t, "active", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
	execSQL(t, src, `INSERT INTO items VALUES (1, 'kept', 1)`)
	waitFor(t, "public.items journaled", 20*time.Second, func() bool {
		es := f.entries()
		return len(es) == 1 && es[0].Entity == "public.items"
	})
}
