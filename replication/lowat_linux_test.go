package replication

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestRecvLowat: with the option raised, a read waits for that many bytes
// (a few bytes time out), and lowered to 1 it takes what is there; both
// the batched stream reads and their bounded wait rely on this.
func TestRecvLowat(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	w, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r := <-accepted
	if r == nil {
		t.Fatal("accept failed")
	}
	defer r.Close()

	if !setRecvLowat(r, 4096) {
		t.Fatal("SO_RCVLOWAT could not be set on a TCP socket")
	}
	// A read that finds bytes returns them; the option holds back the
	// wake-up of a read that is already waiting.
	buf := make([]byte, 8192)
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, _ = w.Write(make([]byte, 100))
	}()
	_ = r.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := r.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("waiting read woken with 100 of 4096 bytes: %d bytes, err %v; want a timeout", n, err)
	}
	if _, err := w.Write(make([]byte, 4000)); err != nil {
		t.Fatal(err)
	}
	_ = r.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := 0
	for got < 4100 {
		n, err := r.Read(buf)
		if err != nil {
			t.Fatalf("read with 4,100 bytes waiting: %v", err)
		}
		got += n
	}

	if _, err := w.Write(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if !setRecvLowat(r, 1) {
		t.Fatal("SO_RCVLOWAT could not be lowered")
	}
	if n, err := r.Read(buf); err != nil || n != 10 {
		t.Fatalf("read after lowering: %d bytes, err %v; want 10", n, err)
	}

	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if setRecvLowat(a, 4096) {
		t.Fatal("setRecvLowat reported success on a connection without a socket")
	}
}
