package decoder

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"

	"github.com/walcast/walcast/internal/pgcapture"
)

// fuzzInput packs payloads as u16 length + bytes.
func fuzzInput(payloads ...[]byte) []byte {
	var b []byte
	for _, p := range payloads {
		if len(p) > 0xffff {
			p = p[:0xffff]
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(p)))
		b = append(b, p...)
	}
	return b
}

// FuzzDecode feeds sequences of payloads to a decoder with a tiny memory
// budget (so spilling is exercised). Whatever the input, the decoder never
// panics, fails only with a *ProtocolError, and every change it yields has a
// body that is valid JSON of the envelope's shape.
func FuzzDecode(f *testing.F) {
	rel := relationMsg(false, 0, 1, "public", "t", 'd', col{"id", 23, true}, col{"a", 1007, false}, col{"j", 3802, false}, col{"ts", 1184, false})
	f.Add(fuzzInput(rel, beginMsg(1, 2), insertMsg(false, 0, 1, "1", "{1,{2}}", `{"a":1}`, "2026-01-01 00:00:00+00"), commitMsg(2, 3)))
	f.Add(fuzzInput(streamStartMsg(5, true), relationMsg(true, 5, 1, "s", "t", 'f', col{"id", 20, true}),
		insertMsg(true, 6, 1, "9007199254740993"), streamStopMsg(), streamAbortMsg(5, 6), streamCommitMsg(5, 7, 8)))
	f.Add(fuzzInput(messageMsg(false, 0, false, 1, "walcast.x", "\xff"), truncateMsg(false, 0, 3, 1)))
	files, _ := filepath.Glob(filepath.Join(captureDir, "*.bin.gz"))
	for _, file := range files {
		frames, err := pgcapture.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		var payloads [][]byte
		size := 0
		for _, fr := range frames {
			if size+len(fr.Data) > 32<<10 {
				break
			}
			size += len(fr.Data)
			payloads = append(payloads, fr.Data)
		}
		f.Add(fuzzInput(payloads...))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, in []byte) {
		d := New(Config{MemoryBudget: 512, SpillDir: dir, TenantColumn: "id", MessagePrefix: "w"})
		defer func() {
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
		}()
		lsn := LSN(0x100)
		for len(in) >= 2 {
			n := int(binary.BigEndian.Uint16(in))
			in = in[2:]
			if n > len(in) {
				n = len(in)
			}
			err := d.Decode(lsn, in[:n])
			in = in[n:]
			lsn += 8
			if err != nil {
				var pe *ProtocolError
				if !errors.As(err, &pe) {
					t.Fatalf("non-protocol error: %v", err)
				}
				if err := d.Reset(); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, tx := range d.Committed(nil) {
			n := 0
			it := tx.Changes()
			for it.Next() {
				n++
				c := it.Change()
				var env Envelope
				if err := json.Unmarshal(c.Body, &env); err != nil {
					t.Fatalf("body %q: %v", c.Body, err)
				}
				if c.Key != nil && !json.Valid(c.Key) {
					t.Fatalf("key %q", c.Key)
				}
			}
			if it.Err() != nil || n != tx.Len() {
				t.Fatalf("iterated %d of %d: %v", n, tx.Len(), it.Err())
			}
			if err := tx.Close(); err != nil {
				t.Fatal(err)
			}
		}
	})
}
