package journal

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
)

// TestAcquireFencesFrozenAppender: an old appender frozen in the middle of an
// append (its transaction holds the meta row; SIGSTOP, a hung host) cannot
// keep a new appender out. Acquire gives it acquireWait, then ends its
// session; its append rolls back and the new generation appends.
func TestAcquireFencesFrozenAppender(t *testing.T) {
	j, gen, url := newJournal(t)
	mustAppend(t, j, gen, mkTx(1, 0x100, time.Now(), ins("public.a", 1)))

	ctx := testCtx(t)
	frozen, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer frozen.Close(ctx)
	tx, err := frozen.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+j.sql.meta+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	gen2, err := j.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire with a frozen appender holding the meta row: %v", err)
	}
	t.Logf("acquired generation %d in %s", gen2, time.Since(start).Round(time.Millisecond))
	if gen2 != gen+1 {
		t.Fatalf("generation %d, want %d", gen2, gen+1)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("the frozen appender's session survived")
	}
	res := mustAppend(t, j, gen2, mkTx(2, 0x200, time.Now(), ins("public.a", 2)))
	if res.Entries != 1 || res.Watermark != decoder.LSN(0x200) {
		t.Fatalf("append after the takeover: %+v", res)
	}
	if _, err := j.Append(ctx, gen, []*decoder.Transaction{mkTx(3, 0x300, time.Now(), ins("public.a", 3))}); err == nil {
		t.Fatal("the old generation could still append")
	}
}
