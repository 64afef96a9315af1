//go:build unix

package sync

import (
	"net"
	"syscall"
)

// tryWrite makes one non-blocking write of b to c, without waiting for
// room and without a deadline (the caller must not be held by a slow
// client), and returns the bytes written: fewer than len(b) when the
// kernel's send buffer filled up or the write failed (the caller's writer
// then writes the rest the ordinary way, and meets the error there). Only
// a plain TCP connection can be written this way: any other gets 0.
func tryWrite(c net.Conn, b []byte) int {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return 0
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	// Returning true ends RawConn.Write after this attempt instead of
	// waiting for the socket to become writable. RawConn.Write holds the
	// connection's write lock, and fails without calling us once a write
	// deadline has passed.
	_ = rc.Write(func(fd uintptr) bool {
		for {
			k, err := syscall.Write(int(fd), b)
			if err == syscall.EINTR {
				continue
			}
			n = max(k, 0)
			return true
		}
	})
	return n
}
