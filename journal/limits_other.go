//go:build !linux

package journal

import (
	"syscall"
	"time"
)

// tcpUserTimeoutControl is a no-op where TCP_USER_TIMEOUT is not available;
// keepalives and the progress watchdog still bound every call.
func tcpUserTimeoutControl(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
