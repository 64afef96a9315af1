package replication

import (
	"net"
	"syscall"
)

// setRecvLowat sets the socket's SO_RCVLOWAT: how many bytes must be
// waiting before a read blocked on it wakes (a read that finds any bytes
// still returns them). It reports false where the option cannot be set (not
// a socket of this process's, or a kernel that refuses it).
func setRecvLowat(c net.Conn, n int) bool {
	for {
		u, ok := c.(interface{ NetConn() net.Conn }) // TLS: the socket under it
		if !ok {
			break
		}
		c = u.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
	}); err != nil {
		return false
	}
	return serr == nil
}
