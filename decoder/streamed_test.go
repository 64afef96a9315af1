package decoder

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/walcast/walcast/internal/pgcapture"
)

// TestStreamedLarge streams a 100k-row transaction (logical_decoding_work_mem
// 64kB) interleaved with a second streamed transaction and small ordinary
// ones, decoding frames as they arrive under a 256 KiB budget: the big
// transactions spill, memory stays within the budget, and every change
// arrives once, in order, at its commit.
func TestStreamedLarge(t *testing.T) {
	const rows, chunks = 100_000, 10
	spillDir := t.TempDir()
	const budget = 256 << 10
	d := New(Config{MemoryBudget: budget, SpillDir: spillDir, Now: fixedNow})
	defer d.Close()
	var txs []*Transaction
	streamed := 0
	sc := scenario{
		params: map[string]string{"logical_decoding_work_mem": smallWorkMem},
		setup: `CREATE TABLE big (id int PRIMARY KEY, pad text);
CREATE TABLE mid (id int PRIMARY KEY);
CREATE TABLE small (id int PRIMARY KEY);
CREATE PUBLICATION p FOR ALL TABLES;`,
	}
	sc.steps = append(sc.steps, s0("BEGIN"), s2("BEGIN"))
	per := rows / chunks
	for i := 0; i < chunks; i++ {
		sc.steps = append(sc.steps,
			s0(fmt.Sprintf("INSERT INTO big SELECT i, 'padding-padding' FROM generate_series(%d, %d) i", i*per+1, (i+1)*per)),
			s1(fmt.Sprintf("INSERT INTO small VALUES (%d)", i)),
			s2(fmt.Sprintf("INSERT INTO mid SELECT i FROM generate_series(%d, %d) i", i*500+1, (i+1)*500)),
		)
	}
	sc.steps = append(sc.steps, s2("COMMIT"), s0("COMMIT"))
	runScenario(t, sc, func(f pgcapture.Frame) error {
		if f.Data[0] == 'S' {
			streamed++
		}
		if err := d.Decode(LSN(f.WALStart), f.Data); err != nil {
			return err
		}
		txs = d.Committed(txs)
		return nil
	})
	if streamed < 10 {
		t.Fatalf("only %d stream blocks: the transaction was not streamed", streamed)
	}
	st := d.Stats()
	if st.Spilled < 1 {
		t.Fatalf("nothing spilled: %+v", st)
	}
	if st.BufferedHigh > budget+4<<10 {
		t.Fatalf("buffered %d bytes in memory with a %d budget", st.BufferedHigh, budget)
	}
	var sizes []int
	for _, tx := range txs {
		sizes = append(sizes, tx.Len())
	}
	want := "[1 1 1 1 1 1 1 1 1 1 5000 100000]"
	if fmt.Sprint(sizes) != want {
		t.Fatalf("transaction sizes %v, want %s", sizes, want)
	}
	checkSeq(t, txs[10], "public.mid", 5000)
	checkSeq(t, txs[11], "public.big", rows)
	for _, tx := range txs {
		if err := tx.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(spillDir); len(ents) != 0 {
		t.Fatalf("spill files left: %v", ents)
	}
}

func s2(sql string) step { return step{2, sql} }

// checkSeq checks that tx holds inserts into entity with keys 1..n in order.
func checkSeq(t *testing.T, tx *Transaction, entity string, n int) {
	t.Helper()
	i := 0
	var last LSN
	for it := tx.Changes(); it.Next(); {
		c := it.Change()
		i++
		wantKey := `{"id":` + strconv.Itoa(i) + `}`
		if c.Entity != entity || string(c.Key) != wantKey || c.LSN < last || !bytes.HasPrefix(c.Body, []byte(`{"lsn":"`)) {
			t.Fatalf("change %d: %s key %s", i, c.Entity, c.Key)
		}
		last = c.LSN
		if i%997 == 0 && !json.Valid(c.Body) {
			t.Fatalf("change %d: invalid body %s", i, c.Body)
		}
	}
	if i != n {
		t.Fatalf("%s: %d changes, want %d", entity, i, n)
	}
}
