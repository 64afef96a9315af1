package decoder

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestReadIsInsertShaped: a read envelope of a row is byte for byte the
// insert envelope pgoutput's tuple of the same row decodes to, but for the
// op — across types whose rules differ (int8 beyond 2^53, numeric, bool,
// jsonb, bytea, timestamptz, arrays, a domain over jsonb named by its base
// type), a composite key, NULLs and a tenant.
func TestReadIsInsertShaped(t *testing.T) {
	cols := []col{
		{"org", 25, true}, {"id", 20, true}, {"flag", 16, false}, {"amount", 1700, false}, {"doc", 3802, false},
		{"raw", 17, false}, {"at", 1184, false}, {"tags", 1007, false}, {"dom", 16500, false}, {"note", 25, false},
	}
	row := []any{"acme", "9007199254740993", "t", "12.50", `{"a": [1, null]}`, `\x00ff`, "2026-11-29 23:21:24.123456+00",
		"{1,2,NULL}", `{"x": 1}`, nil}
	f := newFeeder(t, Config{TenantColumn: "org"})
	f.feed(beginMsg(7, 0x2000), typeMsg(false, 0, 16500, "", "jsonb"),
		relationMsg(false, 0, 1, "public", "t", 'd', cols...), insertMsg(false, 0, 1, row...), commitMsg(0x2000, 0x2010))
	txs := f.d.Committed(nil)
	if len(txs) != 1 || txs[0].Len() != 1 {
		t.Fatalf("want one insert, got %d transactions", len(txs))
	}
	it := txs[0].Changes()
	it.Next()
	ins := *it.Change()
	tx := txs[0]

	var infos []ColumnInfo
	for _, c := range cols {
		ci := ColumnInfo{Name: c.name, TypeOID: c.oid, Key: c.key}
		if c.oid == 16500 {
			ci.BaseSchema, ci.BaseName = "pg_catalog", "jsonb"
		}
		infos = append(infos, ci)
	}
	enc := NewRowEncoder("public", "t", infos, "org")
	vals := make([][]byte, len(row))
	for i, v := range row {
		if v != nil {
			vals[i] = []byte(v.(string))
		}
	}
	b := NewTxBuilder(tx.Xid, tx.CommitLSN, tx.EndLSN, tx.CommitTime)
	b.Marker(ins.LSN, true, SnapshotMarker{ID: 3, Entity: "public.t"})
	b.Read(enc, ins.LSN, vals)
	b.Marker(ins.LSN, false, SnapshotMarker{ID: 3, Entity: "public.t", Rows: 1})
	out := b.Transaction()
	got := bodies(t, out)
	if len(got) != 3 {
		t.Fatalf("want 3 entries, got %d", len(got))
	}
	want := strings.Replace(string(ins.Body), `"op":"insert"`, `"op":"read"`, 1)
	if got[1] != want {
		t.Fatalf("read envelope differs from the insert's:\nread   %s\ninsert %s", got[1], want)
	}
	it = out.Changes()
	it.Next()
	it.Next()
	rd := it.Change()
	if rd.Op != OpRead || string(rd.Key) != string(ins.Key) || rd.Tenant != "acme" || rd.TenantState != TenantKnown || !rd.Tenanted || !ins.Tenanted {
		t.Fatalf("read change fields %+v, insert %+v", rd, ins)
	}
	wantEnd := `,"entity":"public.t","op":"snapshot-end","snapshot":{"id":3,"table":"public.t","rows":1}}`
	if !strings.HasSuffix(got[2], wantEnd) || !strings.Contains(got[0], `"op":"snapshot-begin","snapshot":{"id":3,"table":"public.t"}}`) {
		t.Fatalf("markers:\n%s\n%s", got[0], got[2])
	}
	if v := string(enc.Values(nil, vals, []int{0, 1})); v != `["acme","9007199254740993"]` {
		t.Fatalf("key values %s", v)
	}

	// Copy re-heads a decoded change unchanged.
	c := NewTxBuilder(tx.Xid, tx.CommitLSN, tx.EndLSN, tx.CommitTime)
	c.Copy(&ins)
	if cp := bodies(t, c.Transaction()); cp[0] != string(ins.Body) {
		t.Fatalf("copy %s, want %s", cp[0], ins.Body)
	}
}

// TestControlMessagesAreNotEnvelopes: a transactional message whose prefix
// is the control prefix rides on its transaction (Controls) and never
// becomes a message envelope, though it also matches MessagePrefix; a
// rolled-back one never appears.
func TestControlMessagesAreNotEnvelopes(t *testing.T) {
	f := newFeeder(t, Config{ControlPrefix: "walcast.snapshot"})
	f.feed(beginMsg(5, 0x2000), messageMsg(false, 0, true, 0x1f00, "walcast.snapshot", `{"token":"r:1:1","mark":"low"}`),
		messageMsg(false, 0, true, 0x1f10, "walcast.app", `{"x":1}`), commitMsg(0x2000, 0x2010),
		messageMsg(false, 0, false, 0x2020, "walcast.snapshot", `{"token":"r:1:2","mark":"nontx"}`))
	// A streamed transaction with a control message that aborts.
	f.feed(streamStartMsg(9, true), messageMsg(true, 9, true, 0x2100, "walcast.snapshot", `{"token":"r:1:3","mark":"aborted"}`), streamStopMsg(), streamAbortMsg(9, 9))
	txs := f.d.Committed(nil)
	if len(txs) != 1 {
		t.Fatalf("want 1 transaction, got %d", len(txs))
	}
	if cs := txs[0].Controls(); len(cs) != 1 || string(cs[0]) != `{"token":"r:1:1","mark":"low"}` {
		t.Fatalf("controls %q", cs)
	}
	got := bodies(t, txs[0])
	if len(got) != 1 || !strings.Contains(got[0], `"prefix":"walcast.app"`) {
		t.Fatalf("envelopes %q", got)
	}
}

// TestControlMessagesBounded: control messages are emitted by any role, so
// only what can be walcast's own watermark is kept — small, starting with
// the token, a few per transaction — and everything else is dropped
// without keeping its bytes, counted by reason, and never journaled.
func TestControlMessagesBounded(t *testing.T) {
	dropped := map[string]int{}
	f := newFeeder(t, Config{ControlPrefix: "walcast.snapshot", OnControlDropped: func(r string) { dropped[r]++ }})
	big := strings.Repeat("x", 2<<20)
	bigToken := ControlContentStart + strings.Repeat("x", MaxControlBytes) + `"}`
	msgs := [][]byte{beginMsg(5, 0x2000)}
	for i := 0; i < 10; i++ {
		msgs = append(msgs, messageMsg(false, 0, true, 0x1f00, "walcast.snapshot", big))
	}
	msgs = append(msgs, messageMsg(false, 0, true, 0x1f00, "walcast.snapshot", bigToken))
	for i := 0; i < 1000; i++ {
		msgs = append(msgs, messageMsg(false, 0, true, 0x1f00, "walcast.snapshot", "x"))
	}
	for i := 0; i < MaxControlsPerTransaction+3; i++ {
		msgs = append(msgs, messageMsg(false, 0, true, 0x1f00, "walcast.snapshot", `{"token":"t`+strings.Repeat("i", i)+`"}`))
	}
	msgs = append(msgs, insertMsg(false, 0, 1, "1"), commitMsg(0x2000, 0x2010),
		messageMsg(false, 0, false, 0x2020, "walcast.snapshot", `{"token":"nontx"}`))
	f.feed(relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 23, true}))
	f.feed(msgs...)
	txs := f.d.Committed(nil)
	if len(txs) != 1 {
		t.Fatalf("want 1 transaction, got %d", len(txs))
	}
	cs := txs[0].Controls()
	if len(cs) != MaxControlsPerTransaction {
		t.Fatalf("%d controls kept, want %d", len(cs), MaxControlsPerTransaction)
	}
	for i, c := range cs {
		if want := `{"token":"t` + strings.Repeat("i", i) + `"}`; string(c) != want {
			t.Fatalf("control %d = %.60q, want %q", i, c, want)
		}
	}
	if got := bodies(t, txs[0]); len(got) != 1 || !strings.Contains(got[0], `"op":"insert"`) {
		t.Fatalf("envelopes %.200q: only the insert may be journaled", got)
	}
	want := map[string]int{ControlDropTooLarge: 11, ControlDropNotWatermark: 1000, ControlDropTooMany: 3, ControlDropNonTransactional: 1}
	for r, n := range want {
		if dropped[r] != n {
			t.Errorf("dropped %s: %d, want %d (all: %v)", r, dropped[r], n, dropped)
		}
	}
	if s := f.d.Stats(); s.ControlsDropped != 1015 {
		t.Errorf("Stats.ControlsDropped = %d, want 1015", s.ControlsDropped)
	}
}

// TestReadGuarded: a snapshot read goes through the same guard as a change:
// a row over the envelope limit, or with a tenant that is not UTF-8, becomes
// a quarantine entry standing for the read, carrying the key (the primary
// key under REPLICA IDENTITY FULL, when known) so a consumer can refetch
// the row; other reads are unchanged.
func TestReadGuarded(t *testing.T) {
	for _, full := range []bool{false, true} {
		cols := []ColumnInfo{{Name: "org", TypeOID: 25, Key: full}, {Name: "id", TypeOID: 23, Key: true, PrimaryKey: true},
			{Name: "body", TypeOID: 25, Key: full}}
		enc := NewRowEncoder("public", "t", cols, "org")
		var reasons []string
		enc.Guard(4096, func(r string) { reasons = append(reasons, r) })
		b := NewTxBuilder(7, 0x2000, 0x2010, testTime)
		b.Read(enc, 0x1000, [][]byte{[]byte("acme"), []byte("1"), []byte("small")})
		b.Read(enc, 0x1000, [][]byte{[]byte("acme"), []byte("2"), []byte(strings.Repeat("b", 5000))})
		b.Read(enc, 0x1000, [][]byte{[]byte("acm\xe9"), []byte("3"), []byte("small")})
		var got []Change
		it := b.Transaction().Changes()
		for it.Next() {
			c := *it.Change()
			checkChange(t, &c)
			got = append(got, c)
		}
		if len(got) != 3 || got[0].Op != OpRead || !strings.Contains(string(got[0].Body), `"body":"small"`) {
			t.Fatalf("full %v: %d entries, first %s", full, len(got), got[0].Body)
		}
		var big Envelope
		if err := json.Unmarshal(got[1].Body, &big); err != nil {
			t.Fatal(err)
		}
		if big.Op != OpQuarantine || big.Quarantine.Op != OpRead || big.Quarantine.Reason != ReasonTooLarge || len(got[1].Body) > 4096 {
			t.Fatalf("full %v: oversize read: %.300s", full, got[1].Body)
		}
		wantKey := `{"id":2}`
		if got[1].Key == nil || string(got[1].Key) != wantKey || got[1].Tenant != "acme" {
			t.Fatalf("full %v: oversize read key %s tenant %q", full, got[1].Key, got[1].Tenant)
		}
		if got[2].Op != OpQuarantine || !strings.Contains(string(got[2].Body), ReasonTenantNotUTF8) || got[2].TenantState != TenantUnresolved {
			t.Fatalf("full %v: read with a LATIN1 tenant: %s", full, got[2].Body)
		}
		if len(reasons) != 2 || reasons[0] != ReasonTooLarge || reasons[1] != ReasonTenantNotUTF8 {
			t.Fatalf("full %v: quarantine reasons %q", full, reasons)
		}
	}
}
