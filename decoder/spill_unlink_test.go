package decoder

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// spillStream feeds a streamed transaction of n rows under a budget that
// spills it at its first change, leaving it open (no commit).
func spillStream(f *feeder, xid uint32, n int) {
	f.feed(streamStartMsg(xid, true), relationMsg(true, xid, 1, "public", "t", 'd', col{"id", 23, true}, col{"pad", 25, false}))
	for i := 1; i <= n; i++ {
		f.feed(insertMsg(true, xid, 1, utoa(uint32(i)), strings.Repeat("x", 100)))
	}
	f.feed(streamStopMsg())
}

// TestSpillFileUnlinked: a spill file is unlinked as soon as it is created,
// so the spill directory shows nothing while the transaction is open, after
// it commits and is read, and after it is closed.
func TestSpillFileUnlinked(t *testing.T) {
	dir := t.TempDir()
	f := newFeeder(t, Config{MemoryBudget: 1, SpillDir: dir})
	spillStream(f, 10, 1000)
	if f.d.Stats().Spilled != 1 {
		t.Fatalf("spilled %d transactions, want 1", f.d.Stats().Spilled)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("spill files visible while the transaction is open: %v", ents)
	}
	f.feed(streamCommitMsg(10, 0x9000, 0x9010))
	txs := f.d.Committed(nil)
	if len(txs) != 1 {
		t.Fatalf("%d transactions", len(txs))
	}
	if got := bodies(t, txs[0]); len(got) != 1000 || !strings.Contains(got[999], `"key":{"id":1000}`) {
		t.Fatalf("%d changes, last %.80s", len(got), got[len(got)-1])
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("spill files visible after commit: %v", ents)
	}
	if err := txs[0].Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSpillFileGoneAfterCrash: a process killed (SIGKILL) while it holds a
// spilled transaction leaves no spill file behind. The test binary runs
// itself as the process that dies.
func TestSpillFileGoneAfterCrash(t *testing.T) {
	if dir := os.Getenv("WALCAST_TEST_SPILL_CRASH_DIR"); dir != "" {
		f := newFeeder(t, Config{MemoryBudget: 1, SpillDir: dir})
		spillStream(f, 10, 1000)
		if f.d.Stats().Spilled != 1 {
			os.Exit(3)
		}
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSpillFileGoneAfterCrash$", "-test.count=1")
	cmd.Env = append(os.Environ(), "WALCAST_TEST_SPILL_CRASH_DIR="+dir)
	out, err := cmd.CombinedOutput()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die of SIGKILL: %v\n%s", err, out)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("killed process left spill files: %v", ents)
	}
}
