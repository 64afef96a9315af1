package sync

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// A state snapshot's catch-up decides, per journal entry, whether the
// entry's transaction is visible in the source snapshot S the rows were
// read in (docs/sync.md, "State, then changes"). It compares 64-bit
// transaction ids (xid8): S's, from pg_current_snapshot(), with the
// entry's, which walcast run journals beside the 32-bit xid of pgoutput.
// 32-bit xids cannot do it: the journal's look-back may hold a transaction
// 2^31 or more xids older than S — a database that burns xids on tables it
// does not publish — whose 32 bits then read as a future transaction's.

// A snapshot taken on a hot standby (--database-url naming one) is
// decided differently. There pg_current_snapshot() lists no transaction in
// progress: a standby keeps the primary's running xids apart from its own
// (KnownAssignedXids, which PostgreSQL puts in the snapshot's subxip
// array, not exported), so its xip is empty whatever runs on the primary,
// and xmin <= x < xmax says nothing. What a standby snapshot sees is
// instead fixed by replay order: the startup process replays commit
// records one at a time in WAL order, and a transaction becomes visible to
// new snapshots when its commit record is replayed. So the transactions a
// standby snapshot sees are exactly those whose commit records were
// replayed before it was taken: a prefix of commit order, which is the
// journal's seq order. With R the replay position read before the
// snapshot (pg_last_wal_replay_lsn) and U a position read after it that
// every replayed or half-replayed record ends at or before (the received
// position, or the replay position without a WAL receiver):
//
//   - an entry whose commit ends at or before R is visible (replayed
//     before the snapshot), and so is one whose xid8 is below xmin
//     (completed before it: xmin is the oldest xid the standby counted as
//     running);
//   - an entry whose xid8 is at or past xmax, or whose commit ends past
//     U, is invisible, and so is every later one (prefix);
//   - anything else (a commit replayed while the snapshot was taken) is
//     delivered: at worst the client gets a change its rows already hold,
//     which re-applies the same row image. readInto takes the snapshot
//     again until R equals the replay position read after it, which
//     leaves only a commit record whose replay straddled the snapshot.
//
// A change is never taken for one the rows hold unless they do.

// pgSnapshot is a pg_current_snapshot() value: xmin:xmax:xip, in 64-bit
// (epoch-qualified) transaction ids; on a standby, with the replay
// position read before it.
type pgSnapshot struct {
	xmin, xmax uint64
	xip        map[uint64]struct{}
	// standby: taken on a hot standby; replayed is R above.
	standby  bool
	replayed decoder.LSN
}

func parseSnapshot(s string) (pgSnapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return pgSnapshot{}, fmt.Errorf("snapshot %q is not xmin:xmax:xip", s)
	}
	var p pgSnapshot
	var err error
	if p.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return pgSnapshot{}, fmt.Errorf("snapshot %q: %w", s, err)
	}
	if p.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return pgSnapshot{}, fmt.Errorf("snapshot %q: %w", s, err)
	}
	p.xip = map[uint64]struct{}{}
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return pgSnapshot{}, fmt.Errorf("snapshot %q: %w", s, err)
			}
			p.xip[v] = struct{}{}
		}
	}
	return p, nil
}

// visible reports whether the committed transaction with 64-bit id x is
// visible in p, exactly as pg_visible_in_snapshot decides: before xmin, or
// before xmax and not in progress. An entry of no transaction (x 0, below
// every xmin) is visible.
func (p pgSnapshot) visible(x uint64) bool {
	switch {
	case x >= p.xmax:
		return false
	case x < p.xmin:
		return true
	}
	_, inProgress := p.xip[x]
	return !inProgress
}

// sees reports whether p sees the transaction of journal entry e, whose
// envelope carries the 32-bit xid x: by its 64-bit id when the journal has
// it (e.HasXid8), else — an entry journaled before the journal recorded
// full ids — by x widened with full.
func (p pgSnapshot) sees(e journal.Entry, x uint32) bool {
	if p.standby {
		return e.CommitLSN <= p.replayed || (e.HasXid8 && e.Xid8 != 0 && e.Xid8 < p.xmin)
	}
	if e.HasXid8 {
		return p.visible(e.Xid8)
	}
	return p.visible(p.full(x))
}

// past reports whether e's transaction, and every one journaled after it,
// is invisible in p: its commit ends past walAt (the WAL insert position
// read after p on a primary, U above on a standby) or, on a standby, its
// xid8 is at or past xmax.
func (p pgSnapshot) past(e journal.Entry, walAt decoder.LSN) bool {
	if e.CommitLSN > walAt {
		return true
	}
	return p.standby && e.HasXid8 && e.Xid8 != 0 && e.Xid8 >= p.xmax
}

// full widens a 32-bit xid to the 64-bit id nearest p's xmax, at most 2^31
// before it or less than 2^31 after it. It is right only for a
// transaction less than 2^31 xids older than the snapshot, which is why it
// serves solely entries journaled without their full id (HasXid8 false).
func (p pgSnapshot) full(x uint32) uint64 {
	behind := uint32(p.xmax) - x // how far x precedes xmax, modulo 2^32
	if behind <= 1<<31 && uint64(behind) <= p.xmax {
		return p.xmax - uint64(behind)
	}
	return p.xmax + uint64(x-uint32(p.xmax))
}

// catchUpStart is the journal position a snapshot's catch-up reads after:
// every entry at or before it belongs to a transaction visible in snap. An
// entry journaled by H0 (read before snap was taken) committed before snap
// was taken, yet it is invisible when its backend had not left the proc
// array: its xid is then in snap's xip list, or at or past snap's xmax
// (xmax is one past the newest completed transaction, not the next xid to
// be assigned, so such a transaction need not be listed). The start is
// snapshotLookback before H0, or before the first such entry within
// snapshotXidLookback, whichever is earlier, but never before the newest
// resync entry or the retained floor.
//
// The search compares full xids, so an entry of a transaction visible in
// snap — however many xids older — never moves the start back: only a
// transaction snap did not see does, and then exactly to it.
func catchUpStart(ctx context.Context, j *journal.Journal, h0 int64, snap pgSnapshot) (int64, error) {
	if snap.standby {
		return standbyCatchUpStart(ctx, j, h0, snap)
	}
	pos := max(0, h0-snapshotLookback)
	xip := make([]uint64, 0, len(snap.xip))
	for x := range snap.xip {
		xip = append(xip, x)
	}
	first, ok, readFrom, err := j.FirstSeqInvisible(ctx, max(0, h0-snapshotXidLookback), h0, xip, snap.xmax)
	if err != nil {
		return 0, fmt.Errorf("journal read: %w", err)
	}
	if ok {
		pos = min(pos, first-1)
	}
	// Never before the retained floor or the newest resync entry (a slot
	// recreated, a new epoch): what lies before it is another history,
	// which the rows replace.
	return min(max(pos, readFrom), h0), nil
}

// standbyCatchUpStart is catchUpStart for a snapshot taken on a hot
// standby: just before the first entry whose commit ends past the
// standby's replay position (every entry before it is visible, see
// above), searched within snapshotXidLookback before h0 and, when the
// standby lags more than that, in all the journal retains. A standby that
// lags behind everything the journal retains (or behind its newest resync
// entry) cannot be joined to the journal: the snapshot is refused.
func standbyCatchUpStart(ctx context.Context, j *journal.Journal, h0 int64, snap pgSnapshot) (int64, error) {
	lo := max(0, h0-snapshotXidLookback)
	first, ok, readFrom, err := j.FirstSeqAfterLSN(ctx, lo, h0, snap.replayed)
	if err == nil && ok && first <= max(lo, readFrom)+1 && lo > readFrom {
		first, ok, readFrom, err = j.FirstSeqAfterLSN(ctx, readFrom, h0, snap.replayed)
	}
	if err != nil {
		return 0, fmt.Errorf("journal read: %w", err)
	}
	if !ok {
		return h0, nil
	}
	if first <= readFrom+1 && readFrom > 0 {
		return 0, refused("the snapshot source (--database-url, a hot standby) has replayed only up to %s, older than every change the journal retains; "+
			"the operator should check the standby's replay lag or point --database-url at a standby that keeps up; subscribe again later", snap.replayed)
	}
	return max(first-1, readFrom), nil
}
