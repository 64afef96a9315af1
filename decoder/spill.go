package decoder

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
)

// A spill file holds a transaction's changes in order, one record each:
//
//	lsn u64 | sub u32 | op u8 | tenant state u8 | entity len u32 |
//	tenant len u32 | key offset u32 | key len u32 | tail len u32 |
//	old tenant state u8 | flags u8 (1: tenanted) | old tenant len u32 |
//	old key offset u32 | old key len u32 |
//	entity | tenant | old tenant | tail
//
// all integers big-endian; every length is 32-bit (a logical message's
// entity is its prefix, which Postgres does not bound). The reader checks
// each record against the file's size before it allocates for it, so a
// corrupt file is an error naming it, never a panic or a huge allocation.
//
// The file is created in Config.SpillDir and unlinked at once: the open
// *os.File keeps its data until the transaction aborts or, once committed,
// is Closed, and a process that is killed leaves no file behind (the kernel
// frees the space when the descriptor goes). Its space still counts in df,
// not in ls or du. Where the file system cannot unlink an open file, it is
// removed on close instead.
const spillHeader = 8 + 4 + 1 + 1 + 4 + 4 + 4 + 4 + 4 + 1 + 1 + 4 + 4 + 4

// spillFile is an open spill file.
type spillFile struct {
	f      *os.File
	linked bool // the unlink at creation failed: remove on close
}

func createSpillFile(dir string) (spillFile, error) {
	f, err := os.CreateTemp(dir, "walcast-spill-*")
	if err != nil {
		return spillFile{}, fmt.Errorf("decoder: create spill file (set the spill directory to a writable one with room for the largest transaction): %w", err)
	}
	return spillFile{f: f, linked: os.Remove(f.Name()) != nil}, nil
}

func (s spillFile) name() string { return s.f.Name() }

func (s spillFile) close() error {
	err := s.f.Close()
	if s.linked {
		if rerr := os.Remove(s.f.Name()); err == nil {
			err = rerr
		}
	}
	return err
}

type spillWriter struct {
	file spillFile
	w    *bufio.Writer
	size int64
	hdr  [spillHeader]byte
}

func newSpillWriter(dir string) (*spillWriter, error) {
	f, err := createSpillFile(dir)
	if err != nil {
		return nil, err
	}
	return &spillWriter{file: f, w: bufio.NewWriterSize(f.f, 256<<10)}, nil
}

func (s *spillWriter) write(r *rec, tail []byte) error {
	oldTenant := r.oldTenant
	if oldTenant == r.tenant {
		oldTenant = "" // the reader shares the tenant's (old tenant state known)
	}
	if err := checkSpillLens(len(r.entity), len(r.tenant)+len(oldTenant), len(tail)); err != nil {
		return fmt.Errorf("decoder: write spill file %s: %w at LSN %s", s.file.name(), err, r.lsn)
	}
	h := s.hdr[:]
	binary.BigEndian.PutUint64(h[0:], uint64(r.lsn))
	binary.BigEndian.PutUint32(h[8:], r.sub)
	h[12] = r.op
	h[13] = byte(r.tstate)
	binary.BigEndian.PutUint32(h[14:], uint32(len(r.entity)))
	binary.BigEndian.PutUint32(h[18:], uint32(len(r.tenant)))
	binary.BigEndian.PutUint32(h[22:], r.keyOff)
	binary.BigEndian.PutUint32(h[26:], r.keyLen)
	binary.BigEndian.PutUint32(h[30:], uint32(len(tail)))
	h[34] = byte(r.oldState)
	h[35] = 0
	if r.tenanted {
		h[35] = spillTenanted
	}
	if r.oldState == TenantKnown && r.oldTenant == r.tenant {
		h[35] |= spillSameTenant
	}
	binary.BigEndian.PutUint32(h[36:], uint32(len(oldTenant)))
	binary.BigEndian.PutUint32(h[40:], r.oldKeyOff)
	binary.BigEndian.PutUint32(h[44:], r.oldKeyLen)
	// bufio.Writer's error is sticky: the last write reports any.
	s.w.Write(h)
	s.w.WriteString(r.entity)
	s.w.WriteString(r.tenant)
	s.w.WriteString(oldTenant)
	if _, err := s.w.Write(tail); err != nil {
		return fmt.Errorf("decoder: write spill file %s: %w", s.file.name(), err)
	}
	s.size += int64(spillHeader + len(r.entity) + len(r.tenant) + len(oldTenant) + len(tail))
	return nil
}

// Spill record flags.
const (
	spillTenanted   = 1 << 0 // rec.tenanted
	spillSameTenant = 1 << 1 // the old tenant is the tenant (not written again)
)

// checkSpillLens refuses lengths a spill record cannot describe.
func checkSpillLens(entity, tenant, tail int) error {
	if uint64(entity) > math.MaxUint32 || uint64(tenant) > math.MaxUint32 || uint64(tail) > math.MaxUint32 {
		return fmt.Errorf("%w: entity %d, tenant %d, envelope %d bytes", ErrChangeTooLarge, entity, tenant, tail)
	}
	return nil
}

// flush writes out what the file's buffer holds, at commit.
func (s *spillWriter) flush() error {
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("decoder: write spill file %s: %w", s.file.name(), err)
	}
	return nil
}

// source hands the flushed file to a committed transaction.
func (s *spillWriter) source(head []byte, aborted map[uint32]struct{}) *spillSource {
	return &spillSource{file: s.file, size: s.size, head: head, aborted: aborted}
}

func (s *spillWriter) discard() error { return s.file.close() }

// spillSource is a committed transaction's spill file (changeSource).
type spillSource struct {
	file    spillFile
	size    int64
	head    []byte
	aborted map[uint32]struct{}
}

func (s *spillSource) open() (changeReader, error) {
	return &spillReader{
		src:      s,
		r:        bufio.NewReaderSize(io.NewSectionReader(s.file.f, 0, s.size), 256<<10),
		entities: make(map[string]string),
	}, nil
}

func (s *spillSource) close() error { return s.file.close() }

type spillReader struct {
	src      *spillSource
	r        *bufio.Reader
	pos      int64 // file offset of the next record
	hdr      [spillHeader]byte
	buf      []byte
	entities map[string]string // interned: a transaction touches few entities
	tenants  map[string]string
}

func (r *spillReader) corrupt(what string) error {
	return fmt.Errorf("decoder: spill file %s is corrupt: record at offset %d: %s", r.src.file.name(), r.pos, what)
}

func (r *spillReader) next(c *Change) (bool, error) {
	for {
		if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
			if err == io.EOF {
				return false, nil
			}
			if err == io.ErrUnexpectedEOF {
				return false, r.corrupt("truncated header")
			}
			return false, fmt.Errorf("decoder: read spill file %s: %w", r.src.file.name(), err)
		}
		h := r.hdr[:]
		lsn := LSN(binary.BigEndian.Uint64(h[0:]))
		sub := binary.BigEndian.Uint32(h[8:])
		op := h[12]
		ts := TenantState(h[13])
		entLen := int64(binary.BigEndian.Uint32(h[14:]))
		tenLen := int64(binary.BigEndian.Uint32(h[18:]))
		keyOff := int64(binary.BigEndian.Uint32(h[22:]))
		keyLen := int64(binary.BigEndian.Uint32(h[26:]))
		tailLen := int64(binary.BigEndian.Uint32(h[30:]))
		oldTS := TenantState(h[34])
		flags := h[35]
		oldTenLen := int64(binary.BigEndian.Uint32(h[36:]))
		oldKeyOff := int64(binary.BigEndian.Uint32(h[40:]))
		oldKeyLen := int64(binary.BigEndian.Uint32(h[44:]))
		n := entLen + tenLen + oldTenLen + tailLen
		switch {
		case int(op) >= len(opNames):
			return false, r.corrupt(fmt.Sprintf("unknown op %d", op))
		case ts > TenantUnresolved || oldTS > TenantUnresolved:
			return false, r.corrupt(fmt.Sprintf("unknown tenant state %d or %d", ts, oldTS))
		case flags > spillTenanted|spillSameTenant:
			return false, r.corrupt(fmt.Sprintf("unknown flags %#x", flags))
		case oldKeyOff+oldKeyLen > tailLen:
			return false, r.corrupt(fmt.Sprintf("old key at %d+%d outside a tail of %d bytes", oldKeyOff, oldKeyLen, tailLen))
		case n > r.src.size-r.pos-spillHeader:
			return false, r.corrupt(fmt.Sprintf("%d bytes of entity, tenant and tail run past the file's %d bytes", n, r.src.size))
		case keyOff+keyLen > tailLen:
			return false, r.corrupt(fmt.Sprintf("key at %d+%d outside a tail of %d bytes", keyOff, keyLen, tailLen))
		}
		if int64(cap(r.buf)) < n {
			r.buf = make([]byte, n)
		}
		b := r.buf[:n]
		if _, err := io.ReadFull(r.r, b); err != nil {
			return false, fmt.Errorf("decoder: read spill file %s: %w", r.src.file.name(), err)
		}
		r.pos += spillHeader + n
		if _, gone := r.src.aborted[sub]; gone {
			continue
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
		oldTenant := ""
		switch {
		case flags&spillSameTenant != 0:
			oldTenant = tenant
		case oldTenLen > 0:
			oldTenant = r.intern(b[entLen+tenLen : entLen+tenLen+oldTenLen])
		}
		var off int
		c.Body, off = appendBody(c.Body[:0], lsn, r.src.head, b[entLen+tenLen+oldTenLen:])
		c.LSN, c.Entity, c.Op, c.Tenant, c.TenantState = lsn, entity, opNames[op], tenant, ts
		c.Tenanted, c.OldTenant, c.OldTenantState = flags&spillTenanted != 0, oldTenant, oldTS
		c.Key, c.OldKey = nil, nil
		if keyLen > 0 {
			k, e := off+int(keyOff), off+int(keyOff+keyLen)
			c.Key = c.Body[k:e:e]
		}
		if oldKeyLen > 0 {
			k, e := off+int(oldKeyOff), off+int(oldKeyOff+oldKeyLen)
			c.OldKey = c.Body[k:e:e]
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

// CheckSpillDir reports whether spill files can be created in dir (the
// default temporary directory when empty), for a check at start-up: a
// missing or unwritable directory is a configuration error to fix then,
// rather than a failure met by the first large transaction. It creates and
// removes one empty file.
func CheckSpillDir(dir string) error {
	if dir == "" {
		dir = os.TempDir()
	}
	f, err := os.CreateTemp(dir, "walcast-spill-check-*")
	if err != nil {
		return fmt.Errorf("decoder: spill directory %s cannot hold spill files (it must be an existing directory walcast can write): %w", dir, err)
	}
	err = f.Close()
	if rerr := os.Remove(f.Name()); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("decoder: spill directory %s cannot hold spill files (it must be an existing directory walcast can write): %w", dir, err)
	}
	return nil
}
