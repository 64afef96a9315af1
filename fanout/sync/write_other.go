//go:build !unix

package sync

import "net"

// tryWrite writes nothing where non-blocking raw writes are not available:
// the socket's writer goroutine sends every frame.
func tryWrite(net.Conn, []byte) int { return 0 }
