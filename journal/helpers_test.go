package journal

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

var testSecret = []byte("test-secret-0123456789abcdef")

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// openAt opens a journal on url, closed when the test ends.
func openAt(t testing.TB, url string, mod ...func(*Config)) *Journal {
	t.Helper()
	cfg := Config{URL: url, CursorSecret: testSecret}
	for _, f := range mod {
		f(&cfg)
	}
	j, err := Open(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Close)
	return j
}

// newJournal opens a journal on a fresh database and acquires it.
func newJournal(t testing.TB, mod ...func(*Config)) (*Journal, int64, string) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	j := openAt(t, url, mod...)
	gen, err := j.Acquire(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return j, gen, url
}

// chg describes a change for a test transaction.
type chg struct {
	entity string
	op     decoder.Op
	key    string // JSON object, e.g. {"id":1}; "" for none
	tenant string
	state  decoder.TenantState
	pad    int // bytes of padding in "after"
	// For updates, what the decoder says of the old row (decoder.Change):
	// oldKey ("" : the key did not change; it is then also "before"),
	// oldTenant and oldState; tenanted marks an entity with a tenant column.
	oldKey    string
	oldTenant string
	oldState  decoder.TenantState
	tenanted  bool
}

var testEpoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// mkTx builds a committed transaction the way the decoder would: each body
// is the envelope without seq/entitySeq (and without tenant when
// unresolved). Change LSNs are end-len+i.
func mkTx(xid uint32, end decoder.LSN, commitTime time.Time, changes ...chg) *decoder.Transaction {
	out := make([]decoder.Change, len(changes))
	for i, c := range changes {
		lsn := end - decoder.LSN(len(changes)) + decoder.LSN(i)
		env := decoder.Envelope{LSN: lsn, CommitLSN: end, Xid: xid, CommitTime: commitTime, Entity: c.entity, Op: c.op}
		if c.op == "" {
			env.Op = decoder.OpInsert
		}
		if c.key != "" {
			if err := json.Unmarshal([]byte(c.key), &env.Key); err != nil {
				panic(err)
			}
			if env.Op != decoder.OpDelete {
				env.After = map[string]json.RawMessage{"pad": json.RawMessage(fmt.Sprintf("%q", strings.Repeat("x", c.pad)))}
				for k, v := range env.Key {
					env.After[k] = v
				}
			}
		}
		if c.state == decoder.TenantKnown {
			env.Tenant = c.tenant
		}
		if c.oldKey != "" {
			if err := json.Unmarshal([]byte(c.oldKey), &env.Before); err != nil {
				panic(err)
			}
		}
		body, err := json.Marshal(env)
		if err != nil {
			panic(err)
		}
		var key []byte
		if c.key != "" {
			key = []byte(c.key)
		}
		out[i] = decoder.Change{LSN: lsn, Entity: c.entity, Op: env.Op, Key: key, Tenant: c.tenant, TenantState: c.state, Body: body,
			Tenanted: c.tenanted, OldTenant: c.oldTenant, OldTenantState: c.oldState}
		if c.oldKey != "" {
			out[i].OldKey = []byte(c.oldKey)
		}
	}
	return decoder.NewTransaction(xid, end-decoder.LSN(len(changes))-1, end, commitTime, out)
}

// ins is an untenanted insert of key id into entity.
func ins(entity string, id int) chg {
	return chg{entity: entity, op: decoder.OpInsert, key: fmt.Sprintf(`{"id":%d}`, id)}
}

func mustAppend(t testing.TB, j *Journal, gen int64, txs ...*decoder.Transaction) AppendResult {
	t.Helper()
	res, err := j.Append(testCtx(t), gen, txs)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func mustRead(t testing.TB, j *Journal, q Query) Result {
	t.Helper()
	res, err := j.Changes(testCtx(t), q)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// readAll reads from q.Cursor (or the oldest entry when empty) until caught
// up, failing on a resync.
func readAll(t testing.TB, j *Journal, q Query) ([]Entry, string) {
	t.Helper()
	if q.Cursor == "" {
		q.FromOldest = true
	}
	var all []Entry
	for {
		res := mustRead(t, j, q)
		if res.ResyncRequired {
			t.Fatalf("unexpected resync (%s)", res.Reason)
		}
		all = append(all, res.Changes...)
		q.Cursor, q.FromOldest = res.Cursor, false
		if !res.More {
			return all, q.Cursor
		}
	}
}

func seqs(es []Entry) []int64 {
	out := make([]int64, len(es))
	for i, e := range es {
		out[i] = e.Seq
	}
	return out
}

// decodeEnv parses an entry's envelope and checks it against the entry.
func decodeEnv(t testing.TB, e Entry) decoder.Envelope {
	t.Helper()
	var env decoder.Envelope
	if err := json.Unmarshal(e.Envelope, &env); err != nil {
		t.Fatalf("seq %d: envelope is not JSON: %v\n%s", e.Seq, err, e.Envelope)
	}
	if env.Seq != e.Seq || env.EntitySeq != e.EntitySeq || env.Entity != e.Entity || env.Op != e.Op {
		t.Fatalf("envelope %s disagrees with entry %+v", e.Envelope, e)
	}
	if env.Tenant != e.Tenant || env.TenantUnknown != e.TenantUnknown {
		t.Fatalf("envelope tenant %q/%v disagrees with entry %q/%v", env.Tenant, env.TenantUnknown, e.Tenant, e.TenantUnknown)
	}
	return env
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// unchunkSQL turns a journal's chunks back into the entries table of
// migrations 1 to 8 (one row per entry, its primary key and key hash
// index), as a journal written before migration 9 has it, and forgets
// migration 9: the next Open migrates it again.
const unchunkSQL = `CREATE TABLE walcast.entries_v8 AS SELECT * FROM walcast.entries;
DROP VIEW walcast.entries;
DROP TABLE walcast.chunks;
ALTER TABLE walcast.entries_v8 RENAME TO entries;
ALTER TABLE walcast.entries ADD PRIMARY KEY (seq);
CREATE INDEX entries_key_hash ON walcast.entries (key_hash, seq) WHERE key_hash IS NOT NULL;
DELETE FROM walcast.migrations WHERE version >= 9`
