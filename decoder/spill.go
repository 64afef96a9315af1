package decoder

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
)

// A spill file holds a transaction's changes in order, one record each:
//
//	lsn u64 | sub u32 | op u8 | tenant state u8 | entity len u16 |
//	tenant len u32 | key offset u32 | key len u32 | tail len u32 |
//	entity | tenant | tail
//
// all integers big-endian. The file is created in Config.SpillDir, deleted
// when the transaction aborts or, once committed, when it is Closed.
const spillHeader = 8 + 4 + 1 + 1 + 2 + 4 + 4 + 4 + 4

type spillWriter struct {
	f    *os.File
	w    *bufio.Writer
	size int64
	hdr  [spillHeader]byte
}

func newSpillWriter(dir string) (*spillWriter, error) {
	f, err := os.CreateTemp(dir, "walcast-spill-*")
	if err != nil {
		return nil, fmt.Errorf("decoder: create spill file (set the spill directory to a writable one with room for the largest transaction): %w", err)
	}
	return &spillWriter{f: f, w: bufio.NewWriterSize(f, 256<<10)}, nil
}

func (s *spillWriter) write(r *rec, tail []byte) error {
	h := s.hdr[:]
	binary.BigEndian.PutUint64(h[0:], uint64(r.lsn))
	binary.BigEndian.PutUint32(h[8:], r.sub)
	h[12] = r.op
	h[13] = byte(r.tstate)
	binary.BigEndian.PutUint16(h[14:], uint16(len(r.entity)))
	binary.BigEndian.PutUint32(h[16:], uint32(len(r.tenant)))
	binary.BigEndian.PutUint32(h[20:], r.keyOff)
	binary.BigEndian.PutUint32(h[24:], r.keyLen)
	binary.BigEndian.PutUint32(h[28:], uint32(len(tail)))
	s.w.Write(h)
	s.w.WriteString(r.entity)
	s.w.WriteString(r.tenant)
	if _, err := s.w.Write(tail); err != nil {
		return fmt.Errorf("decoder: write spill file %s: %w", s.f.Name(), err)
	}
	s.size += int64(spillHeader + len(r.entity) + len(r.tenant) + len(tail))
	return nil
}

// finish flushes the file and hands it to a committed transaction.
func (s *spillWriter) finish(head []byte, aborted map[uint32]struct{}) (*spillSource, error) {
	if err := s.w.Flush(); err != nil {
		_ = s.discard()
		return nil, fmt.Errorf("decoder: write spill file %s: %w", s.f.Name(), err)
	}
	return &spillSource{f: s.f, size: s.size, head: head, aborted: aborted}, nil
}

func (s *spillWriter) discard() error {
	name := s.f.Name()
	err := s.f.Close()
	if rerr := os.Remove(name); err == nil {
		err = rerr
	}
	return err
}

// spillSource is a committed transaction's spill file (changeSource).
type spillSource struct {
	f       *os.File
	size    int64
	head    []byte
	aborted map[uint32]struct{}
}

func (s *spillSource) open() (changeReader, error) {
	return &spillReader{
		src:      s,
		r:        bufio.NewReaderSize(io.NewSectionReader(s.f, 0, s.size), 256<<10),
		entities: make(map[string]string),
	}, nil
}

func (s *spillSource) close() error {
	name := s.f.Name()
	err := s.f.Close()
	if rerr := os.Remove(name); err == nil {
		err = rerr
	}
	return err
}

type spillReader struct {
	src      *spillSource
	r        *bufio.Reader
	hdr      [spillHeader]byte
	buf      []byte
	entities map[string]string // interned: a transaction touches few entities
	tenants  map[string]string
}

func (r *spillReader) next(c *Change) (bool, error) {
	for {
		if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
			if err == io.EOF {
				return false, nil
			}
			return false, fmt.Errorf("decoder: read spill file %s: %w", r.src.f.Name(), err)
		}
		h := r.hdr[:]
		lsn := LSN(binary.BigEndian.Uint64(h[0:]))
		sub := binary.BigEndian.Uint32(h[8:])
		op := h[12]
		ts := TenantState(h[13])
		entLen := int(binary.BigEndian.Uint16(h[14:]))
		tenLen := int(binary.BigEndian.Uint32(h[16:]))
		keyOff := int(binary.BigEndian.Uint32(h[20:]))
		keyLen := int(binary.BigEndian.Uint32(h[24:]))
		tailLen := int(binary.BigEndian.Uint32(h[28:]))
		n := entLen + tenLen + tailLen
		if cap(r.buf) < n {
			r.buf = make([]byte, n)
		}
		b := r.buf[:n]
		if _, err := io.ReadFull(r.r, b); err != nil {
			return false, fmt.Errorf("decoder: read spill file %s: %w", r.src.f.Name(), err)
		}
		if _, gone := r.src.aborted[sub]; gone {
			continue
		}
		if int(op) >= len(opNames) || keyOff+keyLen > tailLen {
			return false, fmt.Errorf("decoder: spill file %s is corrupt", r.src.f.Name())
		}
		ent := b[:entLen]
		entity, ok := r.entities[string(ent)]
		if !ok {
			entity = string(ent)
			r.entities[entity] = entity
		}
		tenant := ""
		if tenLen > 0 {
			tenant = r.intern(b[entLen : entLen+tenLen])
		}
		var off int
		c.Body, off = appendBody(c.Body[:0], lsn, r.src.head, b[entLen+tenLen:])
		c.LSN, c.Entity, c.Op, c.Tenant, c.TenantState = lsn, entity, opNames[op], tenant, ts
		c.Key = nil
		if keyLen > 0 {
			c.Key = c.Body[off+keyOff : off+keyOff+keyLen : off+keyOff+keyLen]
		}
		return true, nil
	}
}

// intern returns a string for b, shared while few distinct tenants appear.
func (r *spillReader) intern(b []byte) string {
	if s, ok := r.tenants[string(b)]; ok {
		return s
	}
	s := string(b)
	if r.tenants == nil {
		r.tenants = make(map[string]string)
	}
	if len(r.tenants) < 4096 {
		r.tenants[s] = s
	}
	return s
}

func (r *spillReader) close() error { return nil }
