//go:build !linux

package sync

import "errors"

// idlePoller is Linux's epoll (idle_linux.go); elsewhere an idle socket
// keeps its reading goroutine.
type idlePoller struct{}

func newIdlePoller() (*idlePoller, error) {
	return nil, errors.New("idle sockets without a goroutine need Linux's epoll")
}

func (p *idlePoller) add(*socket)             {}
func (p *idlePoller) remove(*socket)          {}
func (p *idlePoller) arm(*socket, bool) error { return errors.ErrUnsupported }
func (p *idlePoller) close()                  {}
