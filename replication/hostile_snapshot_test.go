package replication

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

// heapPeak samples the heap in use until stop is called, and returns the
// highest sample: a bound on what a burst of input made the process hold.
func heapPeak() (stop func() uint64) {
	var mu sync.Mutex
	var peak uint64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			mu.Lock()
			peak = max(peak, ms.HeapInuse)
			mu.Unlock()
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-finished
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}

// TestControlMessageFlood: any role may emit messages with walcast's
// watermark prefix. Ten 10 MB ones in one transaction and 100k tiny ones
// (some shaped like watermarks) in another are dropped as they arrive —
// never held, never journaled — while the stream goes on and a snapshot
// started afterwards completes.
func TestControlMessageFlood(t *testing.T) {
	f := newFixture(t, `INSERT INTO items SELECT g, 'row' || g, g FROM generate_series(1, 500) g`)
	c := pgtest.Shared(t)
	role := "app_" + strings.ToLower(strings.ReplaceAll(dbName(t, f.url), "_", ""))
	role = role[:min(len(role), 40)]
	execSQL(t, f.url, `CREATE ROLE `+role+` LOGIN PASSWORD 'pw'`, `GRANT INSERT ON items TO `+role)
	t.Cleanup(func() {
		execSQL(t, f.url, `DROP OWNED BY `+role+` CASCADE`)
		execSQL(t, c.URL("postgres"), `DROP ROLE `+role)
	})
	appURL := c.UserURL(dbName(t, f.url), role, "pw")

	run := f.start(f.config())
	waitFor(t, "active role", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
	caughtUp(t, f, "before-flood")

	// Collect often while the flood streams, so that the peak is what is
	// held rather than garbage awaiting collection.
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	stop := heapPeak()
	execSQL(t, appURL,
		`BEGIN; SELECT pg_logical_emit_message(true, 'walcast.snapshot', repeat('x', 10000000)) FROM generate_series(1, 10); INSERT INTO items VALUES (100001, 'in-the-big-one', 0); COMMIT`,
		`SELECT pg_logical_emit_message(true, 'walcast.snapshot', CASE WHEN g % 2 = 0 THEN 'x' ELSE '{"token":"evil:' || g || '"}' END) FROM generate_series(1, 100000) g`,
		`INSERT INTO items VALUES (100002, 'after-the-flood', 0)`)
	es := caughtUp(t, f, "after-flood")
	peak := stop()
	growth := int64(peak) - int64(base)
	t.Logf("heap in use: %d MiB before the flood, peak %d MiB during it (growth %d MiB for 100 MB of control messages)",
		base>>20, peak>>20, growth>>20)
	if growth > 64<<20 {
		t.Fatalf("heap in use grew by %d MiB while 100 MB of foreign control messages streamed: they must not be held", growth>>20)
	}
	seen := map[string]bool{}
	for _, e := range es {
		if strings.HasPrefix(e.Entity, "walcast.") {
			t.Fatalf("a control message was journaled: %.200s", e.Envelope)
		}
		for _, tag := range []string{"in-the-big-one", "after-the-flood"} {
			if strings.Contains(string(e.Envelope), tag) {
				seen[tag] = true
			}
		}
	}
	if !seen["in-the-big-one"] || !seen["after-the-flood"] {
		t.Fatalf("changes around the flood missing from the journal: %v", seen)
	}

	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "items", ChunkSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	if s := waitSnapshot(t, f, id, 60*time.Second); s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	reads := 0
	for _, e := range caughtUp(t, f, "after-snapshot") {
		if e.Op == decoder.OpRead {
			reads++
		}
	}
	if reads != 502 {
		t.Fatalf("%d reads, want 502", reads)
	}
	if n := run.r.Stats().Reconnects.Load(); n != 0 {
		t.Fatalf("the session reconnected %d times: %s", n, run.r.State().LastError)
	}
}

// TestDeepJSON: json and jsonb nested deeper than
// decoder.MaxEmbeddedJSONDepth (Postgres accepts 10,001 levels) reach the
// journal as JSON strings of their text — in columns, jsonb[] elements,
// snapshot reads and message content (base64) — so every envelope parses
// with encoding/json; a document at the bound is embedded.
func TestDeepJSON(t *testing.T) {
	f := newFixture(t, `CREATE TABLE deep (id int PRIMARY KEY, j json, jb jsonb, ja jsonb[])`, `ALTER PUBLICATION pub ADD TABLE deep`)
	run := f.start(f.config())
	waitFor(t, "active role", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
	depths := []int{decoder.MaxEmbeddedJSONDepth, decoder.MaxEmbeddedJSONDepth + 1, 9999, 10001}
	doc := func(n int) string { return strings.Repeat("[", n) + "1" + strings.Repeat("]", n) }
	for _, n := range depths {
		d := fmt.Sprintf(`repeat('[', %d) || '1' || repeat(']', %d)`, n, n)
		execSQL(t, f.url, fmt.Sprintf(`INSERT INTO deep VALUES (%d, (%s)::json, (%s)::jsonb, ARRAY[(%s)::jsonb])`, n, d, d, d),
			fmt.Sprintf(`SELECT pg_logical_emit_message(true, 'walcast.deep%d', %s)`, n, d))
	}
	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "deep"})
	if err != nil {
		t.Fatal(err)
	}
	if s := waitSnapshot(t, f, id, 60*time.Second); s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	inserts, reads, messages := 0, 0, 0
	for _, e := range caughtUp(t, f, "after-deep") {
		if e.Entity != "public.deep" && !strings.HasPrefix(e.Entity, "walcast.deep") {
			continue
		}
		var env decoder.Envelope
		if err := json.Unmarshal(e.Envelope, &env); err != nil {
			t.Fatalf("entry %d (%s %s) does not parse: %v", e.Seq, e.Entity, e.Op, err)
		}
		switch env.Op {
		case decoder.OpInsert, decoder.OpRead:
			var n int
			if err := json.Unmarshal(env.Key["id"], &n); err != nil {
				t.Fatal(err)
			}
			want := doc(n)
			if n > decoder.MaxEmbeddedJSONDepth {
				q, _ := json.Marshal(want)
				want = string(q)
			}
			for _, c := range []string{"j", "jb"} {
				if string(env.After[c]) != want {
					t.Errorf("%s of depth %d: after.%s = %.30s…", env.Op, n, c, env.After[c])
				}
			}
			if string(env.After["ja"]) != "["+want+"]" {
				t.Errorf("%s of depth %d: after.ja = %.30s…", env.Op, n, env.After["ja"])
			}
			if env.Op == decoder.OpInsert {
				inserts++
			} else {
				reads++
			}
		case decoder.OpMessage:
			var n int
			fmt.Sscanf(env.Prefix, "walcast.deep%d", &n)
			want := doc(n)
			if n > decoder.MaxEmbeddedJSONDepth {
				want = `"` + base64.StdEncoding.EncodeToString([]byte(want)) + `"`
			}
			if string(env.Content) != want {
				t.Errorf("message of depth %d: content %.30s…", n, env.Content)
			}
			messages++
		}
	}
	if inserts != len(depths) || reads != len(depths) || messages != len(depths) {
		t.Fatalf("%d inserts, %d reads, %d messages; want %d of each", inserts, reads, messages, len(depths))
	}
}

// TestQuarantinedKeyChangeKeepsOldKey: an update that changes the primary
// key of a row over --max-envelope-bytes is quarantined with both keys —
// "key" the new one, "before" the old one — so that a consumer drops or
// refetches the old row too, and the entry stays small.
func TestQuarantinedKeyChangeKeepsOldKey(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.MaxEnvelopeBytes = 1 << 20
	run := f.start(cfg)
	waitFor(t, "active role", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
	execSQL(t, f.url, `INSERT INTO items VALUES (77, repeat('y', 3 << 20), 1)`, `UPDATE items SET id = 78, val = val || 'z' WHERE id = 77`)
	var update journal.Entry
	for _, e := range caughtUp(t, f, "after-key-change") {
		if e.Entity == "public.items" && strings.Contains(string(e.Envelope), `"op":"update"`) {
			update = e
		}
	}
	env := envelopeOf(t, update)
	if env.Op != decoder.OpQuarantine || env.Quarantine.Reason != decoder.ReasonTooLarge || env.Quarantine.Op != decoder.OpUpdate {
		t.Fatalf("update entry: %.400s", update.Envelope)
	}
	if string(env.Key["id"]) != "78" || len(env.Before) != 1 || string(env.Before["id"]) != "77" {
		t.Fatalf("quarantined key change: key %v, before %v; want the new key and the old one", env.Key, env.Before)
	}
	if len(update.Envelope) > 4096 {
		t.Fatalf("quarantine entry of %d bytes", len(update.Envelope))
	}
}

// TestSnapshotOversizeRow: a snapshot reads rows through the same guard as
// the stream's changes: with --max-envelope-bytes 1 MiB, the 5 MB row of a
// table becomes a quarantine entry carrying its key (under REPLICA
// IDENTITY FULL too: its primary key), the other rows are reads, and the
// snapshot ends done.
func TestSnapshotOversizeRow(t *testing.T) {
	for _, full := range []bool{false, true} {
		t.Run(fmt.Sprintf("full=%v", full), func(t *testing.T) {
			setup := []string{`CREATE TABLE wide (id int PRIMARY KEY, body text)`,
				`INSERT INTO wide SELECT g, 'row' || g FROM generate_series(1, 50) g`,
				`INSERT INTO wide VALUES (1000, repeat('w', 5000000))`,
				`ALTER PUBLICATION pub ADD TABLE wide`}
			if full {
				setup = append(setup, `ALTER TABLE wide REPLICA IDENTITY FULL`)
			}
			f := newFixture(t, setup...)
			cfg := f.config()
			cfg.MaxEnvelopeBytes = 1 << 20
			run := f.start(cfg)
			waitFor(t, "active role", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
			id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "wide", ChunkSize: 20})
			if err != nil {
				t.Fatal(err)
			}
			if s := waitSnapshot(t, f, id, 60*time.Second); s.Status != journal.SnapshotDone {
				t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
			}
			reads, quarantined := 0, 0
			for _, e := range caughtUp(t, f, "after-wide") {
				if e.Entity != "public.wide" {
					continue
				}
				if len(e.Envelope) > 1<<20 {
					t.Fatalf("entry %d (%s) of %d bytes over the 1 MiB limit", e.Seq, e.Op, len(e.Envelope))
				}
				switch e.Op {
				case decoder.OpRead:
					reads++
				case decoder.OpQuarantine:
					quarantined++
					env := envelopeOf(t, e)
					q := env.Quarantine
					if q.Op != decoder.OpRead || q.Reason != decoder.ReasonTooLarge || q.Size < 5000000 || len(env.Key) != 1 || string(env.Key["id"]) != "1000" {
						t.Fatalf("quarantined read: %.400s", e.Envelope)
					}
					if len(e.Envelope) > 4096 {
						t.Fatalf("quarantine entry of %d bytes", len(e.Envelope))
					}
				}
			}
			if reads != 50 || quarantined != 1 {
				t.Fatalf("%d reads and %d quarantine entries, want 50 and 1", reads, quarantined)
			}
			if n := run.r.Quarantined(decoder.ReasonTooLarge); n != 1 {
				t.Fatalf("quarantined too-large counted %d, want 1", n)
			}
		})
	}
}

// TestArrayOfDomainValues: the elements of an array of a domain are
// encoded exactly as the domain's base type, in inserts and snapshot reads:
// posnum[], posnum a domain over numeric, is [42.5], as a posnum column is
// 42.5; an array of a domain over an enum stays strings, and a domain over
// box keeps box's ';' delimiter.
func TestArrayOfDomainValues(t *testing.T) {
	f := newFixture(t,
		`CREATE DOMAIN posnum AS numeric CHECK (VALUE > 0)`,
		`CREATE DOMAIN posnum2 AS posnum`,
		`CREATE DOMAIN posbox AS box`,
		`CREATE TYPE mood AS ENUM ('sad', 'ok')`,
		`CREATE DOMAIN dmood AS mood`,
		`CREATE DOMAIN numarr AS posnum[]`,
		`CREATE TABLE doms (id int PRIMARY KEY, p posnum, pa posnum[], p2a posnum2[], na numarr, ba posbox[], ma dmood[])`,
		`INSERT INTO doms VALUES (1, 42.5, '{42.5,NULL}', '{7}', '{1.5}', ARRAY['(1,1),(0,0)'::posbox, '(2,2),(1,1)'], '{sad,ok}')`,
		`ALTER PUBLICATION pub ADD TABLE doms`)
	run := f.start(f.config())
	waitFor(t, "active role", 20*time.Second, func() bool { return run.r.State().Role == RoleActive })
	execSQL(t, f.url, `INSERT INTO doms VALUES (2, 42.5, '{42.5,NULL}', '{7}', '{1.5}', ARRAY['(1,1),(0,0)'::posbox, '(2,2),(1,1)'], '{sad,ok}')`)
	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "doms"})
	if err != nil {
		t.Fatal(err)
	}
	if s := waitSnapshot(t, f, id, 60*time.Second); s.Status != journal.SnapshotDone {
		t.Fatalf("snapshot ended %s: %s", s.Status, s.Error)
	}
	want := map[string]string{"p": `42.5`, "pa": `[42.5,null]`, "p2a": `[7]`, "na": `[1.5]`, "ba": `["(1,1),(0,0)","(2,2),(1,1)"]`, "ma": `["sad","ok"]`}
	seen := map[decoder.Op]int{}
	for _, e := range caughtUp(t, f, "after-doms") {
		if e.Entity != "public.doms" || (e.Op != decoder.OpInsert && e.Op != decoder.OpRead) {
			continue
		}
		seen[e.Op]++
		env := envelopeOf(t, e)
		for c, v := range want {
			if got := string(env.After[c]); got != v {
				t.Errorf("%s of id %s: after.%s = %s, want %s", e.Op, env.Key["id"], c, got, v)
			}
		}
	}
	if seen[decoder.OpInsert] != 1 || seen[decoder.OpRead] != 2 {
		t.Fatalf("entries %v, want 1 insert and 2 reads", seen)
	}
}
