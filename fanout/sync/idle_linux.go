package sync

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// idlePoller watches idle sockets with an epoll instance of the node's own,
// so a socket waiting for its client's next frame holds no goroutine (a
// parked reader is a 2 KB stack and its g, most of what an idle socket
// costs). The epoll descriptor sits in Go's own poller: one goroutine
// waits on it like on any socket, and Close wakes it.
//
// A socket is armed one-shot and level-triggered: a frame already in the
// kernel fires at once, and each firing wakes the socket once until it is
// armed again. An event carries the socket's id, never its descriptor, so a
// descriptor number reused after a close cannot wake another socket. A
// closed descriptor leaves the epoll set by itself.
type idlePoller struct {
	epfd int
	file *os.File
	done chan struct{}
	// failed: epoll_wait failed (it cannot, short of a kernel bug); every
	// socket was woken and none parks any more.
	failed atomic.Bool

	mu      sync.Mutex // guards the following fields
	nextID  uint64
	sockets map[uint64]*socket
}

var errPollerFailed = errors.New("epoll_wait failed")

func newIdlePoller() (*idlePoller, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("epoll descriptor non-blocking: %w", err)
	}
	p := &idlePoller{epfd: fd, file: os.NewFile(uintptr(fd), "walcast-sync-epoll"),
		done: make(chan struct{}), sockets: map[uint64]*socket{}}
	rc, err := p.file.SyscallConn()
	if err != nil {
		_ = p.file.Close()
		return nil, err
	}
	go p.loop(rc)
	return p, nil
}

// add gives s an id for its events.
func (p *idlePoller) add(s *socket) {
	p.mu.Lock()
	p.nextID++
	s.pollID = p.nextID
	p.sockets[s.pollID] = s
	p.mu.Unlock()
}

// remove forgets s (it is gone: no event may wake it).
func (p *idlePoller) remove(s *socket) {
	p.mu.Lock()
	delete(p.sockets, s.pollID)
	p.mu.Unlock()
}

// arm asks for one wake-up of s when its connection has something to read
// (or has closed); add: s is not in the epoll set yet. It fails when the
// connection is closed. Only s's reading goroutine calls it, and nothing
// of s may be touched after it: the event may start the next reader
// before EpollCtl returns.
func (p *idlePoller) arm(s *socket, add bool) error {
	if p.failed.Load() {
		return errPollerFailed
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT,
		Fd: int32(uint32(s.pollID)), Pad: int32(uint32(s.pollID >> 32))}
	op := syscall.EPOLL_CTL_MOD
	if add {
		op = syscall.EPOLL_CTL_ADD
	}
	var cerr error
	if err := s.raw.Control(func(fd uintptr) { cerr = syscall.EpollCtl(p.epfd, op, int(fd), &ev) }); err != nil {
		return err
	}
	return cerr
}

func (p *idlePoller) loop(rc syscall.RawConn) {
	defer close(p.done)
	events := make([]syscall.EpollEvent, 256)
	var woken []*socket
	for {
		n := 0
		var werr error
		err := rc.Read(func(fd uintptr) bool {
			n, werr = syscall.EpollWait(int(fd), events, 0)
			if errors.Is(werr, syscall.EINTR) {
				werr = nil
				return false
			}
			return n > 0 || werr != nil
		})
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		clear(woken)
		woken = woken[:0]
		if werr != nil {
			p.failed.Store(true)
			for _, s := range p.sockets {
				woken = append(woken, s)
			}
		} else {
			for _, ev := range events[:n] {
				if s := p.sockets[uint64(uint32(ev.Fd))|uint64(uint32(ev.Pad))<<32]; s != nil {
					woken = append(woken, s)
				}
			}
		}
		p.mu.Unlock()
		for _, s := range woken {
			s.wake()
		}
		if werr != nil {
			return
		}
	}
}

// close stops the poller once every socket is gone.
func (p *idlePoller) close() {
	_ = p.file.Close()
	<-p.done
}
