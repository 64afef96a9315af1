package sync

import (
	"bytes"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"testing"
)

// wsRawFrame builds one frame as a client (masked) or server (not) sends it.
func wsRawFrame(op byte, fin, masked bool, payload []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	var m byte
	if masked {
		m = 0x80
	}
	out := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		out = append(out, m|byte(n))
	case n <= 0xffff:
		out = append(out, m|126)
		out = binary.BigEndian.AppendUint16(out, uint16(n))
	default:
		out = append(out, m|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	if masked {
		out = append(out, 1, 2, 3, 4)
	}
	return append(out, payload...)
}

// streamConn is a net.Conn whose reads return whatever of its stream the
// caller asks for, up to a random cap: like a socket with all of it queued.
type streamConn struct {
	net.Conn
	r   *bytes.Reader
	rnd *rand.Rand
}

func (c *streamConn) Read(p []byte) (int, error) {
	if n := 1 + c.rnd.IntN(len(p)); n < len(p) && c.rnd.IntN(2) == 0 {
		p = p[:n] // sometimes a short read, as TCP may give
	}
	return c.r.Read(p)
}

// TestFrameConnStopsAtFrameEnds: whatever the reader asks for, frameConn
// never returns bytes of two frames in one read, returns the stream
// unchanged, and is at a boundary exactly at each frame's end — for every
// header form (7-bit, 16-bit and 64-bit lengths, masked or not, empty
// payloads, fragments and control frames).
func TestFrameConnStopsAtFrameEnds(t *testing.T) {
	sizes := []int{0, 1, 2, 125, 126, 127, 1000, 0xffff, 0x10000, 70000}
	var stream []byte
	var ends []int // offset of each frame's end
	for i, n := range sizes {
		p := bytes.Repeat([]byte{byte('a' + i)}, n)
		stream = append(stream, wsRawFrame(0x1, true, i%2 == 0, p)...)
		ends = append(ends, len(stream))
		stream = append(stream, wsRawFrame(0x9, true, true, []byte("ping"))...) // control
		ends = append(ends, len(stream))
		stream = append(stream, wsRawFrame(0x1, false, true, []byte("frag"))...)
		ends = append(ends, len(stream))
		stream = append(stream, wsRawFrame(0x0, true, true, nil)...) // empty continuation
		ends = append(ends, len(stream))
	}
	for seed := range uint64(20) {
		rnd := rand.New(rand.NewPCG(seed, 7))
		fc := &frameConn{Conn: &streamConn{r: bytes.NewReader(stream), rnd: rnd}}
		var got []byte
		next := 0
		buf := make([]byte, 1+rnd.IntN(200000))
		for {
			n, err := fc.Read(buf[:1+rnd.IntN(len(buf))])
			if n > 0 {
				start := len(got)
				got = append(got, buf[:n]...)
				for next < len(ends) && ends[next] <= start {
					next++
				}
				if next < len(ends) && len(got) > ends[next] {
					t.Fatalf("seed %d: a read of %d bytes at %d crossed the frame end at %d", seed, n, start, ends[next])
				}
				atEnd := next < len(ends) && len(got) == ends[next]
				if fc.atBoundary() != atEnd {
					t.Fatalf("seed %d: at %d atBoundary %v, want %v", seed, len(got), fc.atBoundary(), atEnd)
				}
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(got, stream) {
			t.Fatalf("seed %d: the stream changed (%d bytes, want %d)", seed, len(got), len(stream))
		}
	}
}

// TestFrameConnHostileHeaders: a header giving an absurd length (2^63 and
// more, which gorilla refuses) leaves reads unshortened past the header,
// and a header cut short leaves the connection mid-frame: nothing crashes
// and nothing is lost.
func TestFrameConnHostileHeaders(t *testing.T) {
	h := []byte{0x81, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4}
	data := append(h, bytes.Repeat([]byte{'x'}, 5000)...)
	fc := &frameConn{Conn: &streamConn{r: bytes.NewReader(data), rnd: rand.New(rand.NewPCG(1, 1))}}
	all, err := io.ReadAll(fc)
	if err != nil || !bytes.Equal(all, data) {
		t.Fatalf("read %d bytes, %v", len(all), err)
	}
	if fc.atBoundary() {
		t.Fatal("at a boundary inside a frame")
	}
	fc = &frameConn{Conn: &streamConn{r: bytes.NewReader([]byte{0x81, 0xfe, 0x01}), rnd: rand.New(rand.NewPCG(1, 1))}}
	if all, _ := io.ReadAll(fc); len(all) != 3 || fc.atBoundary() {
		t.Fatalf("cut header: %d bytes, atBoundary %v", len(all), fc.atBoundary())
	}
}
