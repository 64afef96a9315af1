package publish

import (
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/journal"
)

// deepDoc is an "after" column value nested depth-2 arrays deep around a
// string of pad bytes: inside an envelope (object, after) it is nested
// depth levels, and larger than pad.
func deepDoc(depth, pad int) string {
	n := depth - 2
	return `,"doc":` + strings.Repeat("[", n) + `"` + strings.Repeat("x", pad) + `"` + strings.Repeat("]", n)
}

// TestOversizeEnvelopeTooDeepToParse: a journaled envelope larger than the
// server's max payload that encoding/json cannot parse (a jsonb value
// nested past its depth limit of 10,000) goes out as a reference built
// from the journal row's own fields, and the next entry follows it: no
// journal entry can stall the publisher.
func TestOversizeEnvelopeTooDeepToParse(t *testing.T) {
	f := newPubFixture(t)
	col := f.subscribe(f.connect())
	f.appendTx(change(0, "public.docs", decoder.OpInsert, 1, "acme", deepDoc(10_001, 1_100_000)))
	f.appendTx(change(0, "public.docs", decoder.OpInsert, 2, "", ""))
	p := New(Config{}, f.j, f.connect())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	waitUntil(t, "both entries published", 20*time.Second, func() bool { return len(col.snapshot()) >= 2 })
	msgs := col.snapshot()
	var ref map[string]json.RawMessage
	if err := json.Unmarshal(msgs[0].Data, &ref); err != nil {
		t.Fatalf("the reference is not JSON: %v: %.300s", err, msgs[0].Data)
	}
	for k, want := range map[string]string{"seq": "1", "entitySeq": "1", "entity": `"public.docs"`, "op": `"insert"`, "tenant": `"acme"`, "oversize": "true"} {
		if string(ref[k]) != want {
			t.Errorf("reference %s = %s, want %s (%s)", k, ref[k], want, msgs[0].Data)
		}
	}
	if ref["lsn"] == nil || ref["commitLsn"] == nil || ref["commitTime"] == nil || ref["after"] != nil || len(msgs[0].Data) > 1024 {
		t.Errorf("reference envelope: %.300s", msgs[0].Data)
	}
	if msgs[0].Subject != "walcast.change.public.docs.acme" || msgs[0].Header.Get(bus.HeaderSeq) != "1" {
		t.Errorf("reference subject %s, headers %v", msgs[0].Subject, msgs[0].Header)
	}
	var env decoder.Envelope
	if err := json.Unmarshal(msgs[1].Data, &env); err != nil || env.Seq != 2 || env.Oversize {
		t.Fatalf("next entry: %.300s (%v)", msgs[1].Data, err)
	}
	if s := p.Stats(); s.Oversize != 1 || s.Unparsed != 1 {
		t.Errorf("stats %+v: want one oversize entry, published from its journal row", s)
	}
}

// TestJetStreamStreamMaxMsgSize: an existing stream whose max message size
// is below the server's max payload gets a reference for an envelope it
// would refuse, and the next entry follows it, instead of the stream
// refusing the same message forever.
func TestJetStreamStreamMaxMsgSize(t *testing.T) {
	f := newPubFixture(t)
	js, err := jetstream.New(f.connect())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "WALCAST", Subjects: streamSubjects("walcast"),
		Duplicates: 2 * time.Minute, MaxMsgSize: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	big := `,"blob":"` + strings.Repeat("x", 100<<10) + `"`
	f.appendTx(change(0, "public.docs", decoder.OpInsert, 1, "", big))
	f.appendTx(change(0, "public.docs", decoder.OpInsert, 2, "", ""))
	p, _ := f.startJS(JetStreamConfig{Stream: "WALCAST"})
	waitUntil(t, "both entries stored", 20*time.Second, func() bool { return p.Stats().Published == 2 })
	checkExactlyOnce(t, streamSeqs(t, f.ns.URL(), "WALCAST"), 2)
	s, err := js.Stream(context.Background(), "WALCAST")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	var ref map[string]json.RawMessage
	if err := json.Unmarshal(m.Data, &ref); err != nil || string(ref["oversize"]) != "true" || string(ref["seq"]) != "1" {
		t.Fatalf("stored message 1: %.300s (%v)", m.Data, err)
	}
}

// TestRowReferenceFitsMinPayload: the smallest form of an entry — its row
// reference without names, on the longest subject walcast builds, with
// every header it keeps and the JetStream expectation — fits minPayload, so
// a server at that limit takes every entry, and the reference is JSON
// whatever the row's names hold.
func TestRowReferenceFitsMinPayload(t *testing.T) {
	prefix := strings.Repeat("p", bus.MaxPrefixBytes)
	p := &Publisher{cfg: Config{Prefix: prefix}, id: "0123456789abcdef0123456789abcdef", log: slog.New(slog.DiscardHandler)}
	long := strings.Repeat("\x01.\"\\\xff", 2000)
	e := journal.Entry{Seq: math.MaxInt64, EntitySeq: math.MaxInt64, Entity: long + "." + long, Tenant: long, HasTenant: true,
		TenantUnknown: true, Op: decoder.OpSnapshotBegin, LSN: math.MaxUint64, CommitLSN: math.MaxUint64,
		CommitTime: time.Now(), Epoch: math.MaxInt64, Envelope: []byte("{" + strings.Repeat("[", 20000))}
	m, over := p.message(&e, minPayload, "")
	if !over {
		t.Fatal("an unparsable envelope larger than the limit went out as is")
	}
	if size := m.Size() + p.jsExpectRoom(); size > minPayload {
		t.Fatalf("the smallest form takes %d bytes with the JetStream expectation, over minPayload %d", size, minPayload)
	}
	var ref map[string]any
	if err := json.Unmarshal(m.Data, &ref); err != nil || ref["oversize"] != true || ref["op"] != string(decoder.OpSnapshotBegin) {
		t.Fatalf("reference %s (%v)", m.Data, err)
	}
	// With names that fit, the row reference carries them, escaped.
	e.Entity, e.Tenant = "public.we\"ird\x01", "t\\\xff"
	m, _ = p.message(&e, minPayload, "")
	if err := json.Unmarshal(m.Data, &ref); err != nil || ref["entity"] != e.Entity || ref["tenant"] != "t\\\ufffd" {
		t.Fatalf("reference %s (%v)", m.Data, err)
	}
}
