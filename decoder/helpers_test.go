package decoder

import (
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// pg builds pgoutput payloads by hand.
type pg struct{ b []byte }

func msgOf(t byte) *pg         { return &pg{b: []byte{t}} }
func (m *pg) u8(v byte) *pg    { m.b = append(m.b, v); return m }
func (m *pg) u16(v uint16) *pg { m.b = binary.BigEndian.AppendUint16(m.b, v); return m }
func (m *pg) u32(v uint32) *pg { m.b = binary.BigEndian.AppendUint32(m.b, v); return m }
func (m *pg) u64(v uint64) *pg { m.b = binary.BigEndian.AppendUint64(m.b, v); return m }
func (m *pg) str(s string) *pg { m.b = append(append(m.b, s...), 0); return m }
func (m *pg) raw(b []byte) *pg { m.b = append(m.b, b...); return m }
func (m *pg) xidIf(s bool, x uint32) *pg {
	if s {
		m.u32(x)
	}
	return m
}

// col describes a Relation column: "name:oid" with a leading '*' for key.
type col struct {
	name string
	oid  uint32
	key  bool
}

var testTime = time.Date(2026, 11, 29, 23, 21, 24, 123456000, time.UTC)

func pgMicros(t time.Time) uint64 { return uint64(t.Sub(pgEpoch) / time.Microsecond) }

func beginMsg(xid uint32, final LSN) []byte {
	return msgOf('B').u64(uint64(final)).u64(pgMicros(testTime)).u32(xid).b
}

func commitMsg(commit, end LSN) []byte {
	return msgOf('C').u8(0).u64(uint64(commit)).u64(uint64(end)).u64(pgMicros(testTime)).b
}

func relationMsg(stream bool, xid, id uint32, ns, name string, ident byte, cols ...col) []byte {
	m := msgOf('R').xidIf(stream, xid).u32(id).str(ns).str(name).u8(ident).u16(uint16(len(cols)))
	for _, c := range cols {
		var f byte
		if c.key {
			f = 1
		}
		m.u8(f).str(c.name).u32(c.oid).u32(0xffffffff)
	}
	return m.b
}

// tuple encodes values: nil → 'n', "\x00u" → 'u', anything else → 't'.
const unchangedToast = "\x00u"

func tuple(vals ...any) []byte {
	m := &pg{}
	m.u16(uint16(len(vals)))
	for _, v := range vals {
		switch v := v.(type) {
		case nil:
			m.u8('n')
		case string:
			if v == unchangedToast {
				m.u8('u')
				continue
			}
			m.u8('t').u32(uint32(len(v))).raw([]byte(v))
		default:
			panic("tuple value must be string or nil")
		}
	}
	return m.b
}

func insertMsg(stream bool, xid, rel uint32, vals ...any) []byte {
	return msgOf('I').xidIf(stream, xid).u32(rel).u8('N').raw(tuple(vals...)).b
}

func updateMsg(stream bool, xid, rel uint32, oldKind byte, old []any, vals ...any) []byte {
	m := msgOf('U').xidIf(stream, xid).u32(rel)
	if oldKind != 0 {
		m.u8(oldKind).raw(tuple(old...))
	}
	return m.u8('N').raw(tuple(vals...)).b
}

func deleteMsg(stream bool, xid, rel uint32, oldKind byte, old ...any) []byte {
	return msgOf('D').xidIf(stream, xid).u32(rel).u8(oldKind).raw(tuple(old...)).b
}

func truncateMsg(stream bool, xid uint32, opts byte, rels ...uint32) []byte {
	m := msgOf('T').xidIf(stream, xid).u32(uint32(len(rels))).u8(opts)
	for _, r := range rels {
		m.u32(r)
	}
	return m.b
}

func messageMsg(stream bool, xid uint32, transactional bool, lsn LSN, prefix, content string) []byte {
	var f byte
	if transactional {
		f = 1
	}
	return msgOf('M').xidIf(stream, xid).u8(f).u64(uint64(lsn)).str(prefix).u32(uint32(len(content))).raw([]byte(content)).b
}

func typeMsg(stream bool, xid, oid uint32, ns, name string) []byte {
	return msgOf('Y').xidIf(stream, xid).u32(oid).str(ns).str(name).b
}

func originMsg(lsn LSN, name string) []byte { return msgOf('O').u64(uint64(lsn)).str(name).b }

func streamStartMsg(xid uint32, first bool) []byte {
	var f byte
	if first {
		f = 1
	}
	return msgOf('S').u32(xid).u8(f).b
}

func streamStopMsg() []byte { return msgOf('E').b }

func streamCommitMsg(xid uint32, commit, end LSN) []byte {
	return msgOf('c').u32(xid).u8(0).u64(uint64(commit)).u64(uint64(end)).u64(pgMicros(testTime)).b
}

func streamAbortMsg(xid, sub uint32) []byte { return msgOf('A').u32(xid).u32(sub).b }

// feed decodes payloads at increasing LSNs starting at 0/1000 (+0x10 each).
type feeder struct {
	t   testing.TB
	d   *Decoder
	lsn LSN
}

func newFeeder(t testing.TB, cfg Config) *feeder {
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return testTime }
	}
	if cfg.SpillDir == "" {
		cfg.SpillDir = t.TempDir()
	}
	d := New(cfg)
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &feeder{t: t, d: d, lsn: 0x1000}
}

func (f *feeder) feed(msgs ...[]byte) {
	f.t.Helper()
	for _, m := range msgs {
		if err := f.d.Decode(f.lsn, m); err != nil {
			f.t.Fatalf("Decode(%s, %q): %v", f.lsn, m, err)
		}
		f.lsn += 0x10
	}
}

// take returns every committed transaction's bodies, checking each body's
// framing and JSON validity and that Key is the body's "key".
func (f *feeder) take() [][]string {
	f.t.Helper()
	var out [][]string
	for _, tx := range f.d.Committed(nil) {
		out = append(out, bodies(f.t, tx))
		if err := tx.Close(); err != nil {
			f.t.Fatal(err)
		}
	}
	return out
}

func bodies(t testing.TB, tx *Transaction) []string {
	t.Helper()
	var out []string
	it := tx.Changes()
	for it.Next() {
		c := it.Change()
		checkChange(t, c)
		out = append(out, string(c.Body))
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) != tx.Len() {
		t.Fatalf("Len() = %d, iterated %d", tx.Len(), len(out))
	}
	return out
}

func checkChange(t testing.TB, c *Change) {
	t.Helper()
	b := string(c.Body)
	if !strings.HasPrefix(b, `{"lsn":`) || !strings.HasSuffix(b, "}") || !json.Valid(c.Body) {
		t.Fatalf("bad body %s", b)
	}
	var env Envelope
	if err := json.Unmarshal(c.Body, &env); err != nil {
		t.Fatalf("body %s: %v", b, err)
	}
	if env.LSN != c.LSN || env.Op != c.Op || (env.Entity != c.Entity) {
		t.Fatalf("Change fields %+v disagree with body %s", c, b)
	}
	var raw map[string]json.RawMessage
	_ = json.Unmarshal(c.Body, &raw)
	if string(raw["key"]) != string(c.Key) {
		t.Fatalf("Key %s, body key %s", c.Key, raw["key"])
	}
	switch c.TenantState {
	case TenantKnown:
		if env.Tenant != c.Tenant {
			t.Fatalf("tenant %q, body %s", c.Tenant, b)
		}
	default:
		if _, ok := raw["tenant"]; ok || c.Tenant != "" {
			t.Fatalf("tenant state %d with tenant in %s", c.TenantState, b)
		}
	}
}
