package decoder

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

// openSpillFiles counts this process's open files in dir: a spill file is
// unlinked at creation, so only its descriptor shows that it still holds
// disk space.
func openSpillFiles(t *testing.T, dir string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(target, dir+string(filepath.Separator)) {
			n++
		}
	}
	return n
}

// recordBytes is what the bound counts for one change: its spill record.
func recordBytes(t *testing.T, c *Change) int64 {
	t.Helper()
	i := strings.Index(string(c.Body), entityField)
	if i < 0 {
		t.Fatalf("no entity in %s", c.Body)
	}
	return int64(spillHeader + len(c.Entity) + len(c.Tenant) + len(c.Body) - i)
}

// bigTx is an ordinary transaction of n rows of items and m of other.
func bigTx(xid uint32, n, m int) [][]byte {
	msgs := [][]byte{beginMsg(xid, 0x9000),
		relationMsg(false, 0, 1, "public", "items", 'd', col{"id", 23, true}, col{"pad", 25, false}),
		relationMsg(false, 0, 2, "public", "other", 'd', col{"id", 23, true})}
	for i := 1; i <= n; i++ {
		msgs = append(msgs, insertMsg(false, 0, 1, utoa(uint32(i)), strings.Repeat("x", 100)))
		if i <= m {
			msgs = append(msgs, insertMsg(false, 0, 2, utoa(uint32(i))))
		}
	}
	return append(msgs, commitMsg(0x9000, 0x9010))
}

// quarantined decodes a transaction's entries as envelopes.
func quarantined(t *testing.T, tx *Transaction) []Envelope {
	t.Helper()
	var out []Envelope
	for _, b := range bodies(t, tx) {
		var env Envelope
		if err := json.Unmarshal([]byte(b), &env); err != nil {
			t.Fatal(err)
		}
		if env.Op != OpQuarantine || env.Quarantine == nil || env.Quarantine.Op != QuarantinedTransaction {
			t.Fatalf("not a transaction's quarantine entry: %s", b)
		}
		out = append(out, env)
	}
	return out
}

// TestTransactionBound: a transaction whose changes take exactly
// MaxTransactionBytes is carried whole; one byte less and it becomes one
// quarantine entry per table it touched, saying what it was and that the
// tables must be refetched, with its memory and spill file released at
// once. In memory and spilled alike.
func TestTransactionBound(t *testing.T) {
	for _, budget := range []int64{1, 64 << 20} {
		dir := t.TempDir()
		// Its size, measured on a decoder without a bound worth the name.
		f := newFeeder(t, Config{MemoryBudget: budget, SpillDir: dir, MaxTransactionBytes: 1 << 40})
		f.feed(bigTx(7, 300, 5)...)
		txs := f.d.Committed(nil)
		var size int64
		var firstItems, firstOther LSN
		it := txs[0].Changes()
		for it.Next() {
			c := it.Change()
			size += recordBytes(t, c)
			if c.Entity == "public.items" && firstItems == 0 {
				firstItems = c.LSN
			}
			if c.Entity == "public.other" && firstOther == 0 {
				firstOther = c.LSN
			}
		}
		_ = txs[0].Close()

		f = newFeeder(t, Config{MemoryBudget: budget, SpillDir: dir, MaxTransactionBytes: size})
		f.feed(bigTx(7, 300, 5)...)
		if got := f.take(); len(got) != 1 || len(got[0]) != 305 {
			t.Fatalf("budget %d: at exactly the bound, %d transactions, want one of 305 changes", budget, len(got))
		}

		var seen []TransactionQuarantine
		var reasons []string
		f = newFeeder(t, Config{MemoryBudget: budget, SpillDir: dir, MaxTransactionBytes: size - 1,
			OnTransactionQuarantine: func(q TransactionQuarantine) { seen = append(seen, q) },
			OnQuarantine:            func(r string) { reasons = append(reasons, r) }})
		msgs := bigTx(7, 300, 5)
		f.feed(msgs[:len(msgs)-1]...)
		if f.d.held != 0 || f.d.mem != 0 || openSpillFiles(t, dir) != 0 {
			t.Fatalf("budget %d: past the bound the transaction still holds %d bytes (%d in memory, %d spill files)",
				budget, f.d.held, f.d.mem, openSpillFiles(t, dir))
		}
		f.feed(msgs[len(msgs)-1])
		txs = f.d.Committed(nil)
		if len(txs) != 1 || txs[0].Xid != 7 || txs[0].EndLSN != 0x9010 {
			t.Fatalf("budget %d: %d transactions", budget, len(txs))
		}
		envs := quarantined(t, txs[0])
		_ = txs[0].Close()
		if len(envs) != 2 || envs[0].Entity != "public.items" || envs[1].Entity != "public.other" ||
			envs[0].LSN != firstItems || envs[1].LSN != firstOther {
			t.Fatalf("budget %d: entries %+v", budget, envs)
		}
		for _, env := range envs {
			q := env.Quarantine
			if env.Xid != 7 || env.CommitLSN != 0x9010 || q.Reason != ReasonTransactionTooLarge || int64(q.Size) != size ||
				q.Changes != 305 || q.FirstLSN != firstItems || !reflect.DeepEqual(q.Tables, []string{"public.items", "public.other"}) ||
				!strings.Contains(q.Detail, "refetch") || env.Key != nil || env.Tenant != "" {
				t.Fatalf("budget %d: entry %+v, quarantine %+v; want size %d", budget, env, q, size)
			}
		}
		want := TransactionQuarantine{Xid: 7, FirstLSN: firstItems, CommitLSN: 0x9000, EndLSN: 0x9010, Reason: ReasonTransactionTooLarge,
			Bytes: size, Limit: size - 1, Changes: 305, Entities: []string{"public.items", "public.other"}, SpillDir: dir}
		if len(seen) != 1 || !reflect.DeepEqual(seen[0], want) || !reflect.DeepEqual(reasons, []string{ReasonTransactionTooLarge, ReasonTransactionTooLarge}) {
			t.Fatalf("budget %d: reported %+v and reasons %v, want %+v", budget, seen, reasons, want)
		}
		if f.d.held != 0 || openSpillFiles(t, dir) != 0 {
			t.Fatalf("budget %d: after commit %d bytes held, %d spill files open", budget, f.d.held, openSpillFiles(t, dir))
		}
	}
}

// streamRows feeds one stream block of n rows of relation 1 by (sub)xid sub.
func streamRows(f *feeder, xid, sub uint32, from, n int) {
	f.feed(streamStartMsg(xid, from == 1), relationMsg(true, xid, 1, "public", "t", 'd', col{"id", 23, true}, col{"pad", 25, false}))
	for i := from; i < from+n; i++ {
		f.feed(insertMsg(true, sub, 1, utoa(uint32(1000+i)), strings.Repeat("x", 100))) // every record the same size
	}
	f.feed(streamStopMsg())
}

// TestTransactionBoundStreamed: streamed transactions share the bound —
// when open transactions together pass it, the largest is cut and the
// others are carried whole; a subtransaction rolled back after the cut
// leaves its changes out of the count; a transaction cut and then
// aborted leaves nothing behind.
func TestTransactionBoundStreamed(t *testing.T) {
	dir := t.TempDir()
	f := newFeeder(t, Config{MemoryBudget: 1, SpillDir: dir, MaxTransactionBytes: 1 << 40})
	streamRows(f, 9, 9, 1, 1)
	one := f.d.held // one row's record
	f.feed(streamAbortMsg(9, 9))

	var seen []TransactionQuarantine
	f = newFeeder(t, Config{MemoryBudget: 1, SpillDir: dir, MaxTransactionBytes: 150 * one,
		OnTransactionQuarantine: func(q TransactionQuarantine) { seen = append(seen, q) }})
	streamRows(f, 10, 10, 1, 60)
	streamRows(f, 11, 11, 1, 50)
	if f.d.Stats().Spilled != 2 || f.d.held != 110*one {
		t.Fatalf("spilled %d, held %d, want 2 and %d", f.d.Stats().Spilled, f.d.held, 110*one)
	}
	streamRows(f, 10, 12, 61, 50) // a subtransaction of 10: 110 rows, 160 with the other
	if f.d.held != 50*one || openSpillFiles(t, dir) != 1 {
		t.Fatalf("after the bound: held %d (want the other transaction's %d), %d spill files open", f.d.held, 50*one, openSpillFiles(t, dir))
	}
	f.feed(streamAbortMsg(10, 12))
	streamRows(f, 10, 10, 200, 5)
	f.feed(streamCommitMsg(11, 0xa000, 0xa010), streamCommitMsg(10, 0xb000, 0xb010))
	txs := f.d.Committed(nil)
	if len(txs) != 2 || txs[0].Xid != 11 || txs[1].Xid != 10 {
		t.Fatalf("%d transactions", len(txs))
	}
	if got := bodies(t, txs[0]); len(got) != 50 {
		t.Fatalf("the smaller transaction has %d changes, want all 50", len(got))
	}
	envs := quarantined(t, txs[1])
	if len(envs) != 1 || envs[0].Quarantine.Changes != 65 || int64(envs[0].Quarantine.Size) != 115*one ||
		envs[0].Entity != "public.t" || envs[0].Xid != 10 {
		t.Fatalf("entries %+v (%+v): want one for public.t of 65 changes and %d bytes", envs, envs[0].Quarantine, 115*one)
	}
	if len(seen) != 1 || seen[0].Changes != 65 || seen[0].Xid != 10 {
		t.Fatalf("reported %+v", seen)
	}
	for _, tx := range txs {
		_ = tx.Close()
	}

	// Cut, then aborted: nothing is committed, nothing held, no file open.
	streamRows(f, 20, 20, 1, 200)
	if openSpillFiles(t, dir) != 0 || f.d.held != 0 {
		t.Fatalf("cut transaction holds %d bytes, %d spill files", f.d.held, openSpillFiles(t, dir))
	}
	f.feed(streamAbortMsg(20, 20))
	if txs := f.d.Committed(nil); len(txs) != 0 || len(seen) != 1 || !f.d.Idle() {
		t.Fatalf("an aborted transaction left %d transactions, %d reports", len(txs), len(seen))
	}
}

// TestSpillFailureQuarantines: when a spill file cannot be created (its
// directory is gone) or written (the disk is full: here the file size
// limit), the transaction is journaled as quarantine entries that say so,
// and the report names the directory and the error, instead of failing
// Decode, which would fail again on every reconnect.
func TestSpillFailureQuarantines(t *testing.T) {
	t.Run("directory gone", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "spill")
		var seen []TransactionQuarantine
		f := newFeeder(t, Config{MemoryBudget: 1, SpillDir: dir,
			OnTransactionQuarantine: func(q TransactionQuarantine) { seen = append(seen, q) }})
		f.feed(bigTx(7, 10, 0)...)
		txs := f.d.Committed(nil)
		envs := quarantined(t, txs[0])
		_ = txs[0].Close()
		if len(envs) != 1 || envs[0].Quarantine.Reason != ReasonSpillFailed || envs[0].Quarantine.Changes != 10 ||
			!strings.Contains(envs[0].Quarantine.Detail, dir) {
			t.Fatalf("entries %+v", envs)
		}
		if len(seen) != 1 || !errors.Is(seen[0].Cause, fs.ErrNotExist) || seen[0].SpillDir != dir || !strings.Contains(seen[0].Cause.Error(), dir) {
			t.Fatalf("reported %+v", seen)
		}
	})
	t.Run("disk full", func(t *testing.T) {
		dir := t.TempDir()
		var old syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
			t.Fatal(err)
		}
		lim := old
		lim.Cur = 64 << 10
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
				t.Fatal(err)
			}
		}()
		var seen []TransactionQuarantine
		f := newFeeder(t, Config{MemoryBudget: 1, SpillDir: dir,
			OnTransactionQuarantine: func(q TransactionQuarantine) { seen = append(seen, q) }})
		streamRows(f, 10, 10, 1, 5000) // about 700 KB
		if openSpillFiles(t, dir) != 0 || f.d.held != 0 {
			t.Fatalf("a failed spill still holds %d bytes, %d files", f.d.held, openSpillFiles(t, dir))
		}
		f.feed(streamCommitMsg(10, 0xa000, 0xa010))
		txs := f.d.Committed(nil)
		envs := quarantined(t, txs[0])
		_ = txs[0].Close()
		if len(envs) != 1 || envs[0].Quarantine.Reason != ReasonSpillFailed || envs[0].Quarantine.Changes != 5000 {
			t.Fatalf("entries %+v", envs)
		}
		if len(seen) != 1 || !errors.Is(seen[0].Cause, syscall.EFBIG) {
			t.Fatalf("reported %+v", seen)
		}
	})
}

// TestCheckSpillDir: a spill directory that cannot take files is refused
// at start with its path and the fix; a good one passes and keeps nothing.
func TestCheckSpillDir(t *testing.T) {
	dir := t.TempDir()
	if err := CheckSpillDir(dir); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the check left %v", ents)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{filepath.Join(dir, "missing"), file} {
		err := CheckSpillDir(bad)
		if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "an existing directory walcast can write") {
			t.Fatalf("CheckSpillDir(%s) = %v, want an error naming it and the fix", bad, err)
		}
	}
}
