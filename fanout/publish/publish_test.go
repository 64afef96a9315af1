package publish

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
	"github.com/walcast/walcast/internal/natstest"
	"github.com/walcast/walcast/internal/pgtest"
	"github.com/walcast/walcast/journal"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// pubFixture is a journal, a NATS server and helpers to append changes.
type pubFixture struct {
	t     *testing.T
	url   string
	j     *journal.Journal
	ns    *natstest.Server
	gen   int64
	lsn   decoder.LSN
	mu    sync.Mutex
	added []string // msg ids expected, in seq order
}

func newPubFixture(t *testing.T, configure ...func(*server.Options)) *pubFixture {
	t.Helper()
	url := pgtest.NewDatabase(t)
	j, err := journal.Open(context.Background(), journal.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Close)
	gen, err := j.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &pubFixture{t: t, url: url, j: j, ns: natstest.Start(t, configure...), gen: gen, lsn: 0x1000000}
}

// change builds a change body as the decoder would.
func change(lsn decoder.LSN, entity string, op decoder.Op, id int, tenant string, extra string) decoder.Change {
	ent, _ := json.Marshal(entity)
	body := fmt.Sprintf(`{"lsn":"%s","commitLsn":"%s","xid":1,"commitTime":"2026-11-29T00:00:00.000000Z","entity":%s,"op":"%s","key":{"id":%d},"after":{"id":%d%s}`,
		lsn, lsn, ent, op, id, id, extra)
	c := decoder.Change{LSN: lsn, Entity: entity, Op: op, Key: []byte(fmt.Sprintf(`{"id":%d}`, id))}
	if tenant != "" {
		c.Tenant, c.TenantState = tenant, decoder.TenantKnown
		tj, _ := json.Marshal(tenant)
		body += `,"tenant":` + string(tj)
	}
	c.Body = []byte(body + "}")
	return c
}

// appendTx journals one transaction of changes.
func (f *pubFixture) appendTx(changes ...decoder.Change) {
	f.t.Helper()
	f.mu.Lock()
	f.lsn += 0x100
	end := f.lsn
	f.mu.Unlock()
	for i := range changes {
		changes[i].LSN = end - 1
	}
	tx := decoder.NewTransaction(1, end-1, end, time.Now(), changes)
	if _, err := f.j.Append(context.Background(), f.gen, []*decoder.Transaction{tx}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *pubFixture) startPublisher(nc *nats.Conn) (stop func()) {
	p := New(Config{}, f.j, nc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	f.t.Cleanup(stop)
	return stop
}

func (f *pubFixture) connect() *nats.Conn {
	f.t.Helper()
	nc, err := bus.ConnectNATS(bus.NATSConfig{URL: f.ns.URL(), Name: "test"})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(nc.Close)
	return nc
}

// collector records every message on walcast.> in arrival order; the
// publisher's position messages go to positions.
type collector struct {
	mu        sync.Mutex
	msgs      []*nats.Msg
	positions []*nats.Msg
}

func (f *pubFixture) subscribe(nc *nats.Conn) *collector {
	f.t.Helper()
	c := &collector{}
	if _, err := nc.Subscribe("walcast.>", func(m *nats.Msg) {
		c.mu.Lock()
		if m.Subject == bus.PositionSubject("walcast") {
			c.positions = append(c.positions, m)
		} else {
			c.msgs = append(c.msgs, m)
		}
		c.mu.Unlock()
	}); err != nil {
		f.t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		f.t.Fatal(err)
	}
	return c
}

func (c *collector) snapshot() []*nats.Msg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*nats.Msg(nil), c.msgs...)
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPublishExactlyOnceInOrderWithSubjectsAndHeaders(t *testing.T) {
	f := newPubFixture(t)
	sub := f.connect()
	col := f.subscribe(sub)
	hostile := decoder.EntityName("we.ird sch*ema", "tbl>.\x01ü")
	f.appendTx(change(0, "public.orders", decoder.OpInsert, 1, "", ""), change(0, "public.orders", decoder.OpUpdate, 1, "acme", ""))
	f.appendTx(change(0, hostile, decoder.OpInsert, 7, "t.e*n>ant x", ""))
	f.startPublisher(f.connect())
	for i := 2; i < 200; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	want := 201
	waitUntil(t, "all published", 20*time.Second, func() bool { return len(col.snapshot()) >= want })
	time.Sleep(100 * time.Millisecond) // anything extra would arrive now
	msgs := col.snapshot()
	if len(msgs) != want {
		t.Fatalf("%d messages for %d entries", len(msgs), want)
	}
	id := f.j.IDHex()
	for i, m := range msgs {
		seq := int64(i + 1)
		if m.Header.Get(bus.HeaderSeq) != strconv.FormatInt(seq, 10) || m.Header.Get(bus.HeaderMsgID) != id+":0000000000000000:"+strconv.FormatInt(seq, 10) {
			t.Fatalf("message %d: seq %q msg id %q", i, m.Header.Get(bus.HeaderSeq), m.Header.Get(bus.HeaderMsgID))
		}
		var env decoder.Envelope
		if err := json.Unmarshal(m.Data, &env); err != nil {
			t.Fatal(err)
		}
		if env.Seq != seq || strconv.FormatInt(env.EntitySeq, 10) != m.Header.Get(bus.HeaderEntitySeq) || env.Entity != m.Header.Get(bus.HeaderEntity) {
			t.Fatalf("message %d: envelope %+v does not match headers %v", i, env, m.Header)
		}
		if m.Header.Get(bus.HeaderCommitLSN) == "" {
			t.Fatalf("message %d: no commit LSN header", i)
		}
	}
	subjects := []string{msgs[0].Subject, msgs[1].Subject, msgs[2].Subject}
	wantSubjects := []string{"walcast.change.public.orders._", "walcast.change.public.orders.acme",
		"walcast.change.we%2Eird%20sch%2Aema.tbl%3E%2E%01%C3%BC.t%2Ee%2An%3Eant%20x"}
	if strings.Join(subjects, "|") != strings.Join(wantSubjects, "|") {
		t.Fatalf("subjects\n got %q\nwant %q", subjects, wantSubjects)
	}
	if msgs[1].Header.Get(bus.HeaderTenant) != "acme" || msgs[0].Header.Get(bus.HeaderTenant) != "" {
		t.Fatalf("tenant headers: %q, %q", msgs[0].Header.Get(bus.HeaderTenant), msgs[1].Header.Get(bus.HeaderTenant))
	}
	// The hostile subject is delivered to a subscriber of exactly that
	// entity and nothing else.
	if n := strings.Count(msgs[2].Subject, "."); n != 4 {
		t.Fatalf("hostile names changed the subject's shape: %q", msgs[2].Subject)
	}
	// The position is saved within RecordInterval of the publisher
	// catching up.
	waitUntil(t, "the published position saved", 20*time.Second, func() bool {
		pos, err := f.j.Published(context.Background())
		return err == nil && pos == int64(want)
	})
}

// TestPublishSurvivesNATSOutage stops NATS while changes are journaled; the
// journal keeps growing, and once NATS is back every change is published: a
// JetStream stream bound to the subjects ends with each exactly once.
func TestPublishSurvivesNATSOutage(t *testing.T) {
	f := newPubFixture(t)
	js := f.connect()
	jsc, err := js.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jsc.AddStream(&nats.StreamConfig{Name: "WALCAST", Subjects: []string{"walcast.change.>", "walcast.message.>", "walcast.resync"}, Duplicates: time.Hour}); err != nil {
		t.Fatal(err)
	}
	f.startPublisher(f.connect())
	for i := 0; i < 50; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	waitUntil(t, "first 50 in the stream", 20*time.Second, func() bool { return streamMsgs(t, jsc) == 50 })

	f.ns.Shutdown()
	for i := 50; i < 150; i++ { // appends do not wait for NATS
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	time.Sleep(300 * time.Millisecond)
	f.ns.Restart(t)
	for i := 150; i < 200; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	waitUntil(t, "all 200 in the stream", 30*time.Second, func() bool { return streamMsgs(t, jsc) == 200 })
	time.Sleep(200 * time.Millisecond)
	if n := streamMsgs(t, jsc); n != 200 {
		t.Fatalf("stream holds %d messages, want 200", n)
	}
}

func streamMsgs(t *testing.T, js nats.JetStreamContext) uint64 {
	info, err := js.StreamInfo("WALCAST")
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// TestPublisherRestartResumes: a publisher stopped mid-stream is replaced by
// a new one that publishes the rest, from the recorded position, with the
// same message ids (a JetStream stream deduplicates any overlap).
func TestPublisherRestartResumes(t *testing.T) {
	f := newPubFixture(t)
	col := f.subscribe(f.connect())
	for i := 0; i < 100; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	stop := f.startPublisher(f.connect())
	waitUntil(t, "some published", 20*time.Second, func() bool { return len(col.snapshot()) >= 1 })
	stop()
	for i := 100; i < 150; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	f.startPublisher(f.connect())
	waitUntil(t, "all published", 20*time.Second, func() bool {
		seen := map[string]bool{}
		for _, m := range col.snapshot() {
			seen[m.Header.Get(bus.HeaderMsgID)] = true
		}
		return len(seen) == 150
	})
	// Every seq arrives in order; any repeat carries the same id as before.
	last := int64(0)
	for _, m := range col.snapshot() {
		seq, _ := strconv.ParseInt(m.Header.Get(bus.HeaderSeq), 10, 64)
		if seq > last+1 {
			t.Fatalf("gap: seq %d after %d", seq, last)
		}
		if seq > last {
			last = seq
		}
	}
}

// TestOversizeEnvelope: a 5 MB row goes out as a reference envelope (the full
// row stays in the journal) and the next change still flows.
func TestOversizeEnvelope(t *testing.T) {
	f := newPubFixture(t)
	col := f.subscribe(f.connect())
	f.startPublisher(f.connect())
	big := `,"blob":"` + strings.Repeat("x", 5<<20) + `"`
	f.appendTx(change(0, "public.docs", decoder.OpInsert, 1, "", big))
	f.appendTx(change(0, "public.docs", decoder.OpInsert, 2, "", ""))
	waitUntil(t, "both published", 20*time.Second, func() bool { return len(col.snapshot()) >= 2 })
	msgs := col.snapshot()
	var ref map[string]json.RawMessage
	if err := json.Unmarshal(msgs[0].Data, &ref); err != nil {
		t.Fatal(err)
	}
	if string(ref["oversize"]) != "true" || ref["after"] != nil || string(ref["seq"]) != "1" || len(msgs[0].Data) > 4096 {
		t.Fatalf("reference envelope: %s", msgs[0].Data[:min(len(msgs[0].Data), 300)])
	}
	lg, err := f.j.ReadAfter(context.Background(), 0, 1)
	if err != nil || len(lg.Entries) != 1 || len(lg.Entries[0].Envelope) < 5<<20 {
		t.Fatalf("the journal lost the full row: %v", err)
	}
	var env decoder.Envelope
	if err := json.Unmarshal(msgs[1].Data, &env); err != nil || env.Seq != 2 || env.Oversize {
		t.Fatalf("next change: %s (%v)", msgs[1].Data, err)
	}
}

// TestPublishPosition: the publisher publishes its position after the
// entries it covers, on the same connection: a subscriber of walcast.> sees
// every entry up to a position's seq before the position. When it has
// caught up the last position equals the horizon.
func TestPublishPosition(t *testing.T) {
	f := newPubFixture(t)
	col := f.subscribe(f.connect())
	f.startPublisher(f.connect())
	for i := 1; i <= 300; i++ {
		f.appendTx(change(0, "public.orders", decoder.OpInsert, i, "", ""))
	}
	last := func() int64 {
		col.mu.Lock()
		defer col.mu.Unlock()
		if len(col.positions) == 0 {
			return 0
		}
		n, _ := strconv.ParseInt(col.positions[len(col.positions)-1].Header.Get(bus.HeaderSeq), 10, 64)
		return n
	}
	waitUntil(t, "the position at the horizon", 20*time.Second, func() bool { return last() == 300 })
	col.mu.Lock()
	defer col.mu.Unlock()
	// Order across subjects on one connection is the publish order: count
	// the entries that arrived before each position by replaying arrival.
	if len(col.positions) > 100 {
		t.Fatalf("%d position messages for 300 entries: not rate limited", len(col.positions))
	}
	for _, p := range col.positions {
		if p.Header.Get(bus.HeaderEpoch) != "0000000000000000" || len(p.Data) != 0 || p.Header.Get(bus.HeaderMsgID) != "" {
			t.Fatalf("position message %v %q", p.Header, p.Data)
		}
	}
}
