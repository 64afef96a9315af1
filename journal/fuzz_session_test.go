package journal

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/walcast/walcast/decoder"
)

// session builds a pgoutput replication session from fuzz input: each input
// byte picks the next message (relations with odd names and types, ordinary
// and streamed transactions, changes, truncates, logical messages, aborts,
// commits), and the bytes after it supply names and values — not UTF-8, NUL,
// control characters, long, whatever the input holds.
type session struct {
	in  []byte
	lsn uint64
	xid uint32
}

func (s *session) byte() byte {
	if len(s.in) == 0 {
		return 0
	}
	b := s.in[0]
	s.in = s.in[1:]
	return b
}

// bytes takes up to n bytes, n chosen by the input (sometimes large).
func (s *session) bytes() []byte {
	n := int(s.byte())
	if n >= 250 {
		n = (n - 249) * 20000 // up to ~120 KB of repeated input, for limits
		b := bytes.Repeat([]byte{s.byte()}, n)
		return b
	}
	if n > len(s.in) {
		n = len(s.in)
	}
	b := s.in[:n]
	s.in = s.in[n:]
	return b
}

func cstr(m []byte, b []byte) []byte {
	return append(append(m, bytes.ReplaceAll(b, []byte{0}, []byte{'0'})...), 0)
}

var fuzzTypes = []uint32{23, 20, 25, 16, 3802, 114, 17, 1184, 1114, 1700, 1007, 1009, 701, 16385}

func (s *session) relation(stream bool, xid uint32) []byte {
	m := []byte{'R'}
	if stream {
		m = binary.BigEndian.AppendUint32(m, xid)
	}
	m = binary.BigEndian.AppendUint32(m, uint32(s.byte()%4+1))
	m = cstr(m, s.bytes())
	m = cstr(m, s.bytes())
	m = append(m, 'd')
	n := int(s.byte()%3) + 1
	m = binary.BigEndian.AppendUint16(m, uint16(n))
	for i := 0; i < n; i++ {
		m = append(m, s.byte()&1)
		if i == 1 {
			m = cstr(m, []byte("org")) // the tenant column
		} else {
			m = cstr(m, s.bytes())
		}
		m = binary.BigEndian.AppendUint32(m, fuzzTypes[int(s.byte())%len(fuzzTypes)])
		m = binary.BigEndian.AppendUint32(m, 0xffffffff)
	}
	return m
}

func (s *session) tuple(m []byte, n int) []byte {
	m = binary.BigEndian.AppendUint16(m, uint16(n))
	for i := 0; i < n; i++ {
		switch s.byte() % 5 {
		case 0:
			m = append(m, 'n')
		case 1:
			m = append(m, 'u')
		default:
			v := s.bytes()
			m = append(m, 't')
			m = binary.BigEndian.AppendUint32(m, uint32(len(v)))
			m = append(m, v...)
		}
	}
	return m
}

// next returns the next payload, or nil at the end of the input.
func (s *session) next(stream bool, xid uint32) []byte {
	if len(s.in) == 0 {
		return nil
	}
	s.lsn += 0x100
	op := s.byte() % 13
	var m []byte
	hdr := func(t byte) {
		m = []byte{t}
		if stream {
			m = binary.BigEndian.AppendUint32(m, xid+uint32(s.byte()%2)) // a subtransaction now and then
		}
	}
	switch op {
	case 0:
		return s.relation(stream, xid)
	case 1:
		s.xid++
		m = append([]byte{'B'}, make([]byte, 16)...)
		binary.BigEndian.PutUint64(m[1:], s.lsn)
		return binary.BigEndian.AppendUint32(m, s.xid)
	case 2:
		m = []byte{'C', 0}
		m = binary.BigEndian.AppendUint64(m, s.lsn)
		m = binary.BigEndian.AppendUint64(m, s.lsn+0x10)
		return binary.BigEndian.AppendUint64(m, 1)
	case 3, 4:
		hdr('I')
		m = binary.BigEndian.AppendUint32(m, uint32(s.byte()%4+1))
		m = append(m, 'N')
		return s.tuple(m, int(s.byte()%3)+1)
	case 5:
		hdr('U')
		m = binary.BigEndian.AppendUint32(m, uint32(s.byte()%4+1))
		if s.byte()&1 == 1 {
			m = append(m, 'O')
			m = s.tuple(m, int(s.byte()%3)+1)
		}
		m = append(m, 'N')
		return s.tuple(m, int(s.byte()%3)+1)
	case 6:
		hdr('D')
		m = binary.BigEndian.AppendUint32(m, uint32(s.byte()%4+1))
		m = append(m, "KO"[s.byte()&1])
		return s.tuple(m, int(s.byte()%3)+1)
	case 7:
		hdr('T')
		m = binary.BigEndian.AppendUint32(m, 1)
		m = append(m, s.byte()%4)
		return binary.BigEndian.AppendUint32(m, uint32(s.byte()%4+1))
	case 8:
		hdr('M')
		m = append(m, s.byte()&1)
		m = binary.BigEndian.AppendUint64(m, s.lsn)
		m = cstr(m, append([]byte("walcast."), s.bytes()...))
		v := s.bytes()
		m = binary.BigEndian.AppendUint32(m, uint32(len(v)))
		return append(m, v...)
	case 9:
		s.xid++
		m = []byte{'S'}
		m = binary.BigEndian.AppendUint32(m, s.xid)
		return append(m, 1)
	case 10:
		return []byte{'E'}
	case 11:
		m = []byte{'c'}
		m = binary.BigEndian.AppendUint32(m, s.xid)
		m = append(m, 0)
		m = binary.BigEndian.AppendUint64(m, s.lsn)
		m = binary.BigEndian.AppendUint64(m, s.lsn+0x10)
		return binary.BigEndian.AppendUint64(m, 1)
	default:
		m = []byte{'A'}
		m = binary.BigEndian.AppendUint32(m, s.xid)
		return binary.BigEndian.AppendUint32(m, s.xid+uint32(s.byte()%2))
	}
}

// FuzzSession runs generated replication sessions through the decoder and
// the journal's row encoder. Whatever the session holds, nothing panics, and
// every entry the encoder builds is one the journal, NATS and sockets can
// take: valid UTF-8 JSON with no NUL byte, an entity of valid UTF-8 within
// decoder.MaxEntityBytes, a tenant of valid UTF-8 text, and a size within
// the envelope limit (plus what a quarantine entry adds).
func FuzzSession(f *testing.F) {
	f.Add([]byte("\x00\x01\x01\x02\x04\x03\x01\x01\x02"))
	f.Add([]byte("\x01\x08\x00\x05\xfc\xfe\xff\x00\x7b\x04\x0b\x22\x61\x22\x3a\x22\xe9\x22\x7d\x02"))
	f.Add([]byte("\x09\x00\x01\x03a.b\x02\x00\x03\x01\x03\x04\x00\x05\x04\xfcxyz\x03\x02\x01\x0a\x0b"))
	f.Add([]byte("\x01\x08\x00\xfa\x70\x04\x02{}\x02"))
	f.Add([]byte("\x00\x01\x00\x03\x00\x01\x01\x03\x01\x01\x02\xfb\x79\x02\x03\x06\x01\x04\x02\x02\x04\x03\x02\x02\xe9\x41\x02"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, in []byte) { runSession(t, dir, in) })
}

const fuzzMaxEnvelope = 16 << 10

// runSession decodes the session in describes and checks every entry.
func runSession(t *testing.T, dir string, in []byte) {
	d := decoder.New(decoder.Config{MemoryBudget: 2048, SpillDir: dir, TenantColumn: "org", MaxEnvelopeBytes: fuzzMaxEnvelope})
	defer d.Close()
	s := &session{in: in, lsn: 0x1000}
	inStream := false
	for {
		p := s.next(inStream, s.xid)
		if p == nil {
			return
		}
		switch p[0] {
		case 'S':
			inStream = true
		case 'E':
			inStream = false
		}
		if err := d.Decode(decoder.LSN(s.lsn), p); err != nil {
			var pe *decoder.ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("decode: %v", err)
			}
			if err := d.Reset(); err != nil { // as after a reconnect
				t.Fatal(err)
			}
			inStream = false
		}
		for _, tx := range d.Committed(nil) {
			checkEncoded(t, tx, fuzzMaxEnvelope)
			if err := tx.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// checkEncoded encodes tx's changes as journal rows and checks each entry.
func checkEncoded(t *testing.T, tx *decoder.Transaction, maxEnvelope int) {
	t.Helper()
	src := &copySource{txs: []*decoder.Transaction{tx}, next: 1, base: map[string]entityState{}, dirty: map[string]entityState{}, cur: tx}
	it := tx.Changes()
	for it.Next() {
		c := it.Change()
		if err := src.encode(c); err != nil {
			t.Fatalf("the journal cannot encode a change: %v\n%.300q", err, c.Body)
		}
		env := src.env
		switch {
		case !utf8.Valid(env) || !json.Valid(env) || bytes.IndexByte(env, 0) >= 0:
			t.Fatalf("entry is not NUL-free UTF-8 JSON: %.300q", env)
		case !utf8.ValidString(c.Entity) || len(c.Entity) > decoder.MaxEntityBytes || c.Entity == "":
			t.Fatalf("entity of %d bytes: %.80q", len(c.Entity), c.Entity)
		case !utf8.ValidString(c.Tenant) || bytes.IndexByte([]byte(c.Tenant), 0) >= 0:
			t.Fatalf("tenant %.80q", c.Tenant)
		case len(env) > maxEnvelope+decoder.MaxQuarantineRawBytes/2+4096:
			t.Fatalf("entry of %d bytes", len(env))
		}
		var e decoder.Envelope
		if err := json.Unmarshal(env, &e); err != nil || e.Entity != c.Entity || e.Op != c.Op {
			t.Fatalf("entry %.300q disagrees with its change (%s %q): %v", env, c.Op, c.Entity, err)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
}
