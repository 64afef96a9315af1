package journal

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Wait blocks until the journal's horizon is above after and returns it, or
// until ctx ends. It learns of appends through LISTEN/NOTIFY (every append
// that writes entries notifies in its own transaction, so the notification
// arrives only once the entries are visible) on one dedicated connection
// shared by all waiters of this Journal, opened by the first Wait and closed
// by Close. While that connection is down Wait keeps waiting; it reconnects
// with backoff and re-reads the horizon, so no append is missed.
//
// When the journal's epoch changes (a reset or restore: seqs start again
// below what readers saw) Wait returns the new epoch's horizon even if it
// is not above after: the caller's position belongs to the old history and
// must be looked at again.
func (j *Journal) Wait(ctx context.Context, after int64) (int64, error) {
	l, err := j.startListener()
	if err != nil {
		return 0, opErr("journal.Wait", err, "")
	}
	l.mu.Lock()
	resets := l.resets
	l.mu.Unlock()
	for {
		l.mu.Lock()
		h, ready, changed, reset := l.horizon, l.ready, l.changed, l.resets != resets
		l.mu.Unlock()
		if ready && (h > after || reset) {
			return h, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-l.done:
			return 0, opErr("journal.Wait", ErrClosed, "")
		}
	}
}

// wakeLocal tells this process's waiters that an append committed entries
// up to h (with epoch, when the append started one; else 0). The NOTIFY of
// the same append follows and changes nothing.
func (j *Journal) wakeLocal(h, epoch int64) {
	j.lmu.Lock()
	l := j.listener
	j.lmu.Unlock()
	if l == nil {
		return
	}
	l.mu.Lock()
	ready := l.ready
	l.mu.Unlock()
	if ready {
		// Before the listener's first read it cannot tell an epoch
		// change; its own read will.
		l.publish(h, epoch, epoch != 0)
	}
}

func (j *Journal) startListener() (*listener, error) {
	j.lmu.Lock()
	defer j.lmu.Unlock()
	if j.closed {
		return nil, ErrClosed
	}
	if j.listener == nil {
		ctx, cancel := context.WithCancel(context.Background())
		l := &listener{j: j, cancel: cancel, done: make(chan struct{}), changed: make(chan struct{})}
		go l.run(ctx)
		j.listener = l
	}
	return j.listener, nil
}

// listener owns the LISTEN connection; its goroutine is started by
// startListener and stopped by stop (from Journal.Close).
type listener struct {
	j      *Journal
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns

	mu      sync.Mutex    // guards the following fields
	horizon int64         // newest seq known
	epoch   int64         // the journal's epoch at horizon
	resets  int           // epoch changes seen
	ready   bool          // horizon has been read at least once
	changed chan struct{} // closed (and replaced) when horizon or ready changes
}

func (l *listener) stop() {
	l.cancel()
	<-l.done
}

// publish records horizon h of epoch e (hasEpoch false: a notification of
// an older walcast, which does not say). A new epoch replaces the horizon
// even when it is lower.
func (l *listener) publish(h, e int64, hasEpoch bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case hasEpoch && l.ready && e != l.epoch:
		l.epoch, l.horizon = e, h
		l.resets++
	case hasEpoch && !l.ready:
		l.epoch = e
		l.horizon = max(l.horizon, h)
	case l.ready && h <= l.horizon:
		return
	default:
		l.horizon = max(l.horizon, h)
	}
	l.ready = true
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	backoff := 100 * time.Millisecond
	for {
		start := time.Now()
		_ = l.session(ctx) // an error ends the session; we reconnect
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > time.Minute {
			backoff = 100 * time.Millisecond
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (l *listener) session(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, l.j.connCfg.Copy())
	if err != nil {
		return err
	}
	defer closeConn(conn)
	// LISTEN and the horizon read are calls with the call timeout; the wait
	// for notifications is not (it is silent by nature), and a connection
	// that died under it is found by the TCP keepalives (applyLimits).
	cctx, cancel := l.j.callCtx(ctx)
	defer cancel()
	if _, err := conn.Exec(cctx, "LISTEN "+pgx.Identifier{l.j.channel}.Sanitize()); err != nil {
		return err
	}
	// Read the horizon after LISTEN so that no append falls between.
	var h, e int64
	if err := conn.QueryRow(cctx, "SELECT next_seq - 1, epoch FROM "+l.j.sql.meta).Scan(&h, &e); err != nil {
		return err
	}
	cancel()
	l.publish(h, e, true)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		h, e, hasEpoch, ok := parseNotification(n.Payload)
		if !ok {
			return errors.New("journal: unexpected notification payload " + strconv.Quote(n.Payload))
		}
		l.publish(h, e, hasEpoch)
	}
}

// parseNotification reads an append's notification: "<horizon> <epoch>", or
// "<horizon>" from a walcast older than epochs.
func parseNotification(p string) (h, e int64, hasEpoch, ok bool) {
	hs, es, hasEpoch := strings.Cut(p, " ")
	h, err := strconv.ParseInt(hs, 10, 64)
	if err != nil {
		return 0, 0, false, false
	}
	if hasEpoch {
		if e, err = strconv.ParseInt(es, 10, 64); err != nil {
			return 0, 0, false, false
		}
	}
	return h, e, hasEpoch, true
}
