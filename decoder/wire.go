package decoder

import "encoding/binary"

// wire reads big-endian pgoutput fields from a borrowed payload. The first
// failure is sticky: later reads return zero values, and err reports where
// decoding stopped, so message parsers read every field and check once.
type wire struct {
	b      []byte
	off    int
	failAt int
	cause  error
	detail string
}

func (w *wire) fail(cause error, detail string) {
	if w.cause == nil {
		w.cause, w.detail, w.failAt = cause, detail, w.off
	}
}

func (w *wire) ok() bool { return w.cause == nil }

func (w *wire) need(n int) bool {
	if w.cause != nil {
		return false
	}
	if n < 0 || len(w.b)-w.off < n {
		w.fail(ErrTruncated, "")
		return false
	}
	return true
}

func (w *wire) u8() byte {
	if !w.need(1) {
		return 0
	}
	v := w.b[w.off]
	w.off++
	return v
}

func (w *wire) u16() uint16 {
	if !w.need(2) {
		return 0
	}
	v := binary.BigEndian.Uint16(w.b[w.off:])
	w.off += 2
	return v
}

func (w *wire) u32() uint32 {
	if !w.need(4) {
		return 0
	}
	v := binary.BigEndian.Uint32(w.b[w.off:])
	w.off += 4
	return v
}

func (w *wire) u64() uint64 {
	if !w.need(8) {
		return 0
	}
	v := binary.BigEndian.Uint64(w.b[w.off:])
	w.off += 8
	return v
}

// bytes returns the next n bytes, borrowed from the payload.
func (w *wire) bytes(n int) []byte {
	if !w.need(n) {
		return nil
	}
	v := w.b[w.off : w.off+n : w.off+n]
	w.off += n
	return v
}

// cstring returns a NUL-terminated string, borrowed, without the NUL.
func (w *wire) cstring() []byte {
	if w.cause != nil {
		return nil
	}
	for i := w.off; i < len(w.b); i++ {
		if w.b[i] == 0 {
			v := w.b[w.off:i:i]
			w.off = i + 1
			return v
		}
	}
	w.fail(ErrTruncated, "unterminated string")
	return nil
}
