package publish

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/fanout/bus"
)

// TestPublishNamesNATSCannotTake: a tenant of 5 KB and a message prefix of
// 70 KB escape to subjects far past the server's 4 KB control-line limit.
// Before, the server closed the publisher's connection on each attempt and
// the publisher retried the same entry forever. Now both go out on hashed
// tokens, and the ordinary change behind them arrives.
func TestPublishNamesNATSCannotTake(t *testing.T) {
	f := newPubFixture(t)
	col := f.subscribe(f.connect())
	pubConn := f.connect()
	f.startPublisher(pubConn)

	tenant := strings.Repeat("t.", 2560) // 5 KB, escapes to 10 KB
	prefix := "walcast." + strings.Repeat("p*", 35<<10)
	msg := decoder.Change{Entity: prefix, Op: decoder.OpMessage,
		Body: []byte(`{"lsn":"0/1","commitLsn":"0/1","xid":1,"commitTime":"2026-11-29T00:00:00.000000Z","entity":` +
			string(must(json.Marshal(prefix))) + `,"op":"message","prefix":` + string(must(json.Marshal(prefix))) + `,"content":{"n":1},"transactional":true}`)}
	f.appendTx(change(0, "public.orders", decoder.OpInsert, 1, tenant, ""))
	f.appendTx(msg)
	f.appendTx(change(0, "public.orders", decoder.OpInsert, 2, "", ""))

	waitUntil(t, "all three published", 20*time.Second, func() bool { return len(col.snapshot()) >= 3 })
	msgs := col.snapshot()
	wantTenant := "walcast.change.public.orders." + bus.Token(tenant)
	if msgs[0].Subject != wantTenant || !bus.IsHashedToken(bus.Token(tenant)) {
		t.Fatalf("tenant subject %.200q, want %q", msgs[0].Subject, wantTenant)
	}
	if got, _ := bus.TenantOf(msgs[0].Subject); got != bus.TenantToken(tenant, true) {
		t.Fatalf("TenantOf = %q", got)
	}
	if msgs[1].Subject != "walcast.message."+bus.Token(prefix) {
		t.Fatalf("message subject %.200q", msgs[1].Subject)
	}
	for _, m := range msgs {
		if len(m.Subject) > bus.MaxSubjectBytes {
			t.Errorf("subject of %d bytes", len(m.Subject))
		}
	}
	if m := msgs[1].Header.Get(bus.HeaderEntity); m != "" {
		t.Fatalf("a 70 KB entity header was sent (%d bytes)", len(m))
	}
	var env decoder.Envelope
	if err := json.Unmarshal(msgs[2].Data, &env); err != nil || env.Seq != 3 || env.Entity != "public.orders" {
		t.Fatalf("ordinary change behind them: %.300s (%v)", msgs[2].Data, err)
	}
	if r := pubConn.Stats().Reconnects; r != 0 {
		t.Fatalf("the publisher's connection was dropped %d times", r)
	}
}

// TestMinimalReference: a reference envelope whose names alone exceed the
// max payload is cut down to positions and op.
func TestMinimalReference(t *testing.T) {
	env := []byte(`{"seq":7,"entitySeq":3,"lsn":"0/1","commitLsn":"0/2","xid":9,"commitTime":"2026-11-29T00:00:00Z","entity":"` +
		strings.Repeat("x", 1<<20) + `","op":"message","prefix":"p","content":"AAAA"}`)
	ref, err := referenceEnvelope(env, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(ref) > 256 || !strings.Contains(string(ref), `"oversize":true`) || !strings.Contains(string(ref), `"seq":7`) {
		t.Fatalf("minimal reference %s", ref)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
