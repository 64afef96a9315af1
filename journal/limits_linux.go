package journal

import (
	"strings"
	"syscall"
	"time"
)

// tcpUserTimeout is TCP_USER_TIMEOUT from linux/tcp.h (the syscall package
// does not name it).
const tcpUserTimeout = 0x12

// tcpUserTimeoutControl sets TCP_USER_TIMEOUT on TCP sockets: data sent and
// not acknowledged for d fails the connection, where the kernel would
// otherwise retransmit for about 15 minutes. It also bounds keepalive
// probing.
func tcpUserTimeoutControl(d time.Duration) func(network, address string, c syscall.RawConn) error {
	return func(network, _ string, c syscall.RawConn) error {
		if !strings.HasPrefix(network, "tcp") {
			return nil
		}
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(d.Milliseconds()))
		})
		if err != nil {
			return err
		}
		return serr
	}
}
