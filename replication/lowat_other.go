//go:build !linux

package replication

import "net"

// setRecvLowat: batching reads by SO_RCVLOWAT is used on Linux only.
func setRecvLowat(net.Conn, int) bool { return false }
