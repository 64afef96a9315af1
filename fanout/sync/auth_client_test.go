package sync

import (
	"context"
	"errors"
	"io"
	"net"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/walcast/walcast/fanout/client"
)

// nextEvent returns c's next event of one of the given types, failing on an
// error event or a timeout.
func nextEvent(t *testing.T, c *client.Client, types ...string) client.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		ev, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		for _, ty := range types {
			if ev.Type == ty {
				return ev
			}
		}
		if ev.Type == client.EventError {
			t.Fatalf("error event %+v", ev)
		}
	}
}

// A token-expiry close (4100) is not the end: the client asks its
// TokenFunc for a new token, reconnects at once and resumes every topic
// from its cursor.
func TestClientTokenExpiryReconnects(t *testing.T) {
	clock := newFakeClock()
	e := newSyncEnv(t, func(c *Config) {
		c.Clock = clock
		c.IdleTimeout = 24 * time.Hour
	})
	var calls atomic.Int32
	c := e.client(token(t, []string{orders}, "", time.Hour), client.Options{
		TokenFunc: func(context.Context) (string, error) {
			calls.Add(1)
			return token(t, []string{orders}, "", 1000*time.Hour), nil
		}})
	if err := c.Subscribe(orders, ""); err != nil {
		t.Fatal(err)
	}
	e.topicLive(orders, 1)
	first := e.commit(ins(orders, 1))[0]
	if ev := nextEvent(t, c, client.EventChange); ev.Seq != first.Seq {
		t.Fatalf("got %+v", ev)
	}
	waitFor(t, "sweeper waiting", func() bool { return clock.sleepers() > 0 })
	clock.Advance(6 * time.Hour) // one sweep: the hour-long token has expired
	waitFor(t, "the expiry close", func() bool { return e.node.Stats().Closed["token-expired"] == 1 })
	second := e.commit(ins(orders, 2))[0]
	if ev := nextEvent(t, c, client.EventChange); ev.Seq != second.Seq {
		t.Fatalf("got %+v, want seq %d", ev, second.Seq)
	}
	if calls.Load() != 1 {
		t.Fatalf("TokenFunc called %d times", calls.Load())
	}
}

// With a TokenFunc the client refreshes its token on the live socket before
// exp: the socket is never closed for expiry.
func TestClientTokenRefreshBeforeExp(t *testing.T) {
	auth, err := NewAuthenticator(AuthConfig{Secret: syncJWTSecret, Leeway: -1})
	if err != nil {
		t.Fatal(err)
	}
	e := newSyncEnv(t, func(c *Config) { c.Auth = auth })
	exp := time.Now().Add(3 * time.Second).Unix()
	short := authSign(t, jwt.SigningMethodHS256, syncJWTSecret, "", authClaims(map[string]any{"exp": exp}))
	var calls atomic.Int32
	c := e.client(short, client.Options{PingInterval: 200 * time.Millisecond,
		TokenFunc: func(context.Context) (string, error) {
			calls.Add(1)
			return token(t, []string{orders}, "", time.Hour), nil
		}})
	if err := c.Subscribe(orders, ""); err != nil {
		t.Fatal(err)
	}
	e.topicLive(orders, 1)
	waitFor(t, "past the first token's exp", func() bool { return time.Now().Unix() > exp })
	time.Sleep(500 * time.Millisecond) // a few pings past exp: each would close an expired socket
	en := e.commit(ins(orders, 1))[0]
	if ev := nextEvent(t, c, client.EventChange); ev.Seq != en.Seq {
		t.Fatalf("got %+v", ev)
	}
	st := e.node.Stats()
	if st.Closed["token-expired"] != 0 || calls.Load() != 1 || st.SocketsOpen != 1 {
		t.Fatalf("refresh: %d TokenFunc calls, stats %+v", calls.Load(), st)
	}
}

// switchProxy forwards TCP connections to a target that can be switched;
// switching drops every open connection.
type switchProxy struct {
	ln     net.Listener
	mu     gosync.Mutex // guards the following fields
	target string
	conns  map[net.Conn]struct{}
	wg     gosync.WaitGroup
}

func newSwitchProxy(t *testing.T, target string) *switchProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			target := p.target
			p.mu.Unlock()
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns[in], p.conns[out] = struct{}{}, struct{}{}
			p.mu.Unlock()
			p.wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer p.wg.Done()
				_, _ = io.Copy(dst, src)
				dst.Close()
				src.Close()
			}
			go pipe(in, out)
			go pipe(out, in)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.switchTo("")
		p.wg.Wait()
	})
	return p
}

func (p *switchProxy) switchTo(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// After a resync the client's dedup starts over: a failover to another
// journal (its cursor resyncs, its seqs start lower) still delivers every
// change; a client that kept the old journal's seq would drop them all.
func TestClientAuthResyncResetsDedup(t *testing.T) {
	a, b := newSyncEnv(t), newSyncEnv(t)
	host := func(e *syncEnv) string { return e.srv.Listener.Addr().String() }
	p := newSwitchProxy(t, host(a))
	c, err := client.Dial(syncCtx(t), "ws://"+p.ln.Addr().String()+"/v1/socket",
		client.Options{Token: token(t, []string{orders}, "", time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Subscribe(orders, ""); err != nil {
		t.Fatal(err)
	}
	a.topicLive(orders, 1)
	var last int64
	for i := range 5 {
		en := a.commit(ins(orders, i))[0]
		if ev := nextEvent(t, c, client.EventChange); ev.Seq != en.Seq {
			t.Fatalf("got %+v", ev)
		}
		last = en.Seq
	}
	b.commit(ins(orders, 100)) // b's journal is behind a's
	p.switchTo(host(b))
	nextEvent(t, c, client.EventResync) // a's cursor on b's journal
	b.topicLive(orders, 1)
	en := b.commit(ins(orders, 101))[0]
	if en.Seq >= last {
		t.Fatalf("test setup: b's seq %d not below a's %d", en.Seq, last)
	}
	if ev := nextEvent(t, c, client.EventChange); ev.Seq != en.Seq {
		t.Fatalf("got %+v, want seq %d", ev, en.Seq)
	}
}

// The client reads frames up to Options.ReadLimit (DefaultReadLimit when
// unset); a larger frame ends it with ErrFrameTooLarge instead of an
// allocation as large as the node cares to send.
func TestClientCloseOnReadLimit(t *testing.T) {
	e := newSyncEnv(t)
	c := e.client(token(t, []string{orders}, "", time.Hour), client.Options{ReadLimit: 32 << 10})
	if err := c.Subscribe(orders, ""); err != nil {
		t.Fatal(err)
	}
	e.topicLive(orders, 1)
	small := e.commit(ins(orders, 1))[0]
	if ev := nextEvent(t, c, client.EventChange); ev.Seq != small.Seq {
		t.Fatalf("got %+v", ev)
	}
	e.commit(row{entity: orders, op: "insert", id: 2, pad: 64 << 10})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		_, err := c.Next(ctx)
		if err == nil {
			continue
		}
		if !errors.Is(err, client.ErrFrameTooLarge) {
			t.Fatalf("Next: %v, want ErrFrameTooLarge", err)
		}
		break
	}
}
