package decoder

import (
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"
)

// longPrefix is a logical message prefix of about 70 KB: more than a 16-bit
// length can say.
var longPrefix = "walcast." + strings.Repeat("p", 70_000)

// TestSpillRecordLongEntity: a spill record whose entity is longer than
// 64 KiB (a logical message's entity is its prefix, unbounded by Postgres)
// reads back whole, followed by the next record.
func TestSpillRecordLongEntity(t *testing.T) {
	src := writeSpill(t,
		spillRec{rec{lsn: 0x10, op: opMessage, entity: longPrefix}, `,"entity":"x","op":"message"}`},
		spillRec{rec{lsn: 0x20, op: opInsert, entity: "public.t", keyOff: 27, keyLen: 8}, `,"entity":"public.t","key":{"id":1}}`},
	)
	defer src.close()
	got := readSpill(t, src)
	if len(got) != 2 || got[0].Entity != longPrefix || got[0].Op != OpMessage || got[1].Entity != "public.t" || string(got[1].Key) != `{"id":1}` {
		t.Fatalf("read back %d changes: %.200v…", len(got), got)
	}
}

// TestStreamedSpillLongPrefixMessage: a streamed transaction that spills,
// holding a logical message with a 70 KB prefix between inserts, decodes to
// exactly what the same stream decodes to in memory, with the whole prefix
// in the message's "prefix" field.
func TestStreamedSpillLongPrefixMessage(t *testing.T) {
	decode := func(budget int64) ([]string, []string, Stats) {
		f := newFeeder(t, Config{MemoryBudget: budget})
		f.feed(
			streamStartMsg(10, true),
			relationMsg(true, 10, 1, "public", "t", 'd', col{"id", 23, true}, col{"pad", 25, false}),
			insertMsg(true, 10, 1, "1", strings.Repeat("a", 500)),
			messageMsg(true, 10, true, 0x1020, longPrefix, `{"event":"big"}`),
			streamStopMsg(),
			streamStartMsg(10, false),
			insertMsg(true, 10, 1, "2", "b"),
			streamStopMsg(),
			streamCommitMsg(10, 0x4000, 0x4010),
		)
		txs := f.d.Committed(nil)
		if len(txs) != 1 {
			t.Fatalf("%d transactions", len(txs))
		}
		defer txs[0].Close()
		var ents []string
		for it := txs[0].Changes(); it.Next(); {
			ents = append(ents, it.Change().Entity)
		}
		return bodies(t, txs[0]), ents, f.d.Stats()
	}
	mem, memEnts, st := decode(1 << 30)
	if st.Spilled != 0 {
		t.Fatal("spilled under a 1 GiB budget")
	}
	spilled, spillEnts, st := decode(1)
	if st.Spilled != 1 {
		t.Fatalf("spilled %d transactions, want 1", st.Spilled)
	}
	if len(spilled) != 3 || strings.Join(spilled, "\n") != strings.Join(mem, "\n") || strings.Join(spillEnts, ",") != strings.Join(memEnts, ",") {
		t.Fatalf("spilled changes differ from in-memory ones:\n%.300q\n%.300q", spilled, mem)
	}
	if !strings.Contains(spilled[1], `"prefix":"`+longPrefix+`"`) || !strings.Contains(spilled[1], `"content":{"event":"big"}`) {
		t.Fatalf("message body %.200s…", spilled[1])
	}
}

// TestSpillFileCorrupt: a spill file whose record claims more bytes than the
// file holds, a truncated one, or one with an unknown op fails iteration with
// an error naming the file — no panic, no allocation of the claimed size.
func TestSpillFileCorrupt(t *testing.T) {
	recs := []spillRec{
		{rec{lsn: 0x10, op: opInsert, entity: "public.t"}, `,"entity":"public.t","op":"insert"}`},
		{rec{lsn: 0x20, op: opInsert, entity: "public.t"}, `,"entity":"public.t","op":"insert"}`},
	}
	second := int64(spillHeader + len("public.t") + len(recs[0].tail))
	cases := map[string]func(f *os.File){
		"entity length":     func(f *os.File) { putU32(t, f, second+14, 0xffffffff) },
		"tail length":       func(f *os.File) { putU32(t, f, second+30, 1<<31) },
		"key range":         func(f *os.File) { putU32(t, f, second+22, 3); putU32(t, f, second+26, 1<<30) },
		"op":                func(f *os.File) { f.WriteAt([]byte{99}, second+12) },
		"tenant state":      func(f *os.File) { f.WriteAt([]byte{9}, second+13) },
		"old tenant":        func(f *os.File) { f.WriteAt([]byte{9}, second+34) },
		"flags":             func(f *os.File) { f.WriteAt([]byte{0x80}, second+35) },
		"old key range":     func(f *os.File) { putU32(t, f, second+40, 3); putU32(t, f, second+44, 1<<30) },
		"old tenant length": func(f *os.File) { putU32(t, f, second+36, 0xffffffff) },
	}
	for name, corrupt := range cases {
		t.Run(name, func(t *testing.T) {
			src := writeSpill(t, recs...)
			defer src.close()
			corrupt(src.file.f)
			it := (&Transaction{n: 2, spill: src}).Changes()
			n := 0
			for it.Next() {
				n++
			}
			err := it.Err()
			if n != 1 || err == nil || !strings.Contains(err.Error(), src.file.name()) || !strings.Contains(err.Error(), "corrupt") {
				t.Fatalf("read %d changes, err %v", n, err)
			}
		})
	}
	t.Run("truncated", func(t *testing.T) {
		src := writeSpill(t, recs...)
		defer src.close()
		src.size -= 5 // the file ends inside the second record
		it := (&Transaction{n: 2, spill: src}).Changes()
		n := 0
		for it.Next() {
			n++
		}
		if err := it.Err(); n != 1 || err == nil || !strings.Contains(err.Error(), src.file.name()) {
			t.Fatalf("read %d changes, err %v", n, err)
		}
	})
}

// TestSpillWriteTooLong: a length of 4 GiB or more cannot be described by
// a spill record and is refused, never written wrapped. (walcast builds for
// 64-bit platforms only: the lengths below do not fit a 32-bit int.)
func TestSpillWriteTooLong(t *testing.T) {
	for _, l := range [][3]int{{1 << 32, 0, 0}, {0, 1 << 32, 0}, {0, 0, 1 << 32}} {
		if err := checkSpillLens(l[0], l[1], l[2]); !errors.Is(err, ErrChangeTooLarge) {
			t.Fatalf("lengths %v: %v", l, err)
		}
	}
	if err := checkSpillLens(1<<32-1, 70_000, 1<<32-1); err != nil {
		t.Fatal(err)
	}
}

type spillRec struct {
	r    rec
	tail string
}

func writeSpill(t *testing.T, recs ...spillRec) *spillSource {
	t.Helper()
	sp, err := newSpillWriter(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for i := range recs {
		r := recs[i].r
		r.tailLen = uint32(len(recs[i].tail))
		if err := sp.write(&r, []byte(recs[i].tail)); err != nil {
			t.Fatal(err)
		}
	}
	if err := sp.flush(); err != nil {
		t.Fatal(err)
	}
	return sp.source(appendHead(nil, 7, 0x100, testTime), nil)
}

func readSpill(t *testing.T, src *spillSource) []Change {
	t.Helper()
	var out []Change
	it := (&Transaction{spill: src}).Changes()
	for it.Next() {
		c := *it.Change()
		c.Body = append([]byte(nil), c.Body...)
		c.Key = append([]byte(nil), c.Key...)
		if len(c.Key) == 0 {
			c.Key = nil
		}
		out = append(out, c)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func putU32(t *testing.T, f *os.File, off int64, v uint32) {
	t.Helper()
	if _, err := f.WriteAt(binary.BigEndian.AppendUint32(nil, v), off); err != nil {
		t.Fatal(err)
	}
}
