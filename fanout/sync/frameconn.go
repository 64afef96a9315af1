package sync

import (
	"bufio"
	"encoding/binary"
	"net"
	"net/http"
)

// frameConn is the connection gorilla reads a socket through. It never
// returns bytes past the end of the WebSocket frame being read: the header's
// first two bytes, then the rest of the header, then the payload, each as
// its own read. So when a message has been read to its end, gorilla's
// buffer holds nothing of the next frame, and a socket with nothing more in
// the kernel can wait for its next frame without a goroutine (idlePoller).
//
// It only shortens reads; gorilla still parses and checks every byte, so a
// malformed header fails there as before. Writes do not go through it: the
// socket's writer writes to the TCP connection itself (net.Buffers needs it
// for writev). Only the socket's reading goroutine calls Read.
type frameConn struct {
	net.Conn
	hdr  [14]byte // the header read so far
	got  int      // header bytes in hdr
	want int      // header bytes needed: 2 until the second byte is known
	left uint64   // payload bytes of the current frame not yet read
}

func (c *frameConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return c.Conn.Read(p)
	}
	if c.left > 0 {
		if uint64(len(p)) > c.left {
			p = p[:c.left]
		}
		n, err := c.Conn.Read(p)
		c.left -= uint64(n)
		return n, err
	}
	if c.want == 0 {
		c.want = 2
	}
	p = p[:min(len(p), c.want-c.got)]
	n, err := c.Conn.Read(p)
	copy(c.hdr[c.got:], p[:n])
	c.got += n
	if c.got == 2 && c.want == 2 {
		c.want += headerRest(c.hdr[1])
	}
	if c.got == c.want {
		c.left = payloadLen(c.hdr[:c.got])
		c.got, c.want = 0, 0
	}
	return n, err
}

// atBoundary reports whether everything read so far ends a frame: no part
// of a header or payload is waiting to be read.
func (c *frameConn) atBoundary() bool { return c.left == 0 && c.got == 0 }

// headerRest is how many header bytes follow the first two, from the second
// (RFC 6455 §5.2): the extended length (0, 2 or 8) and the mask key (0 or 4).
func headerRest(b1 byte) int {
	n := 0
	switch b1 & 0x7f {
	case 126:
		n = 2
	case 127:
		n = 8
	}
	if b1&0x80 != 0 {
		n += 4
	}
	return n
}

// payloadLen is the payload length a complete header h gives.
func payloadLen(h []byte) uint64 {
	switch l := h[1] & 0x7f; l {
	case 126:
		return uint64(binary.BigEndian.Uint16(h[2:4]))
	case 127:
		return binary.BigEndian.Uint64(h[2:10])
	default:
		return uint64(l)
	}
}

// frameHijacker hands gorilla's Upgrade the hijacked connection wrapped in a
// frameConn when it is plain TCP (behind TLS, records hide frame boundaries:
// such a socket keeps its reading goroutine).
type frameHijacker struct {
	http.ResponseWriter
	tcp *net.TCPConn // the hijacked connection, when plain TCP
	fc  *frameConn
}

func (h *frameHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, brw, nil
	}
	h.tcp, h.fc = tc, &frameConn{Conn: tc}
	return h.fc, brw, nil
}
