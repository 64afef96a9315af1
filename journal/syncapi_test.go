package journal

import (
	"errors"
	"testing"
)

func TestSyncAPI(t *testing.T) {
	j, gen, _ := newJournal(t)
	res := mustAppend(t, j, gen, mkTx(1, 0x100, testEpoch, ins("public.a", 1), ins("public.b", 1), ins("public.a", 2)))
	q := Query{Entities: []string{"public.a"}}

	// CursorAt issues what Changes would: reading from it continues there.
	cur, err := j.CursorAt(q, 0, res.FirstSeq)
	if err != nil {
		t.Fatal(err)
	}
	q.Cursor = cur
	if got := mustRead(t, j, q); len(got.Changes) != 1 || got.Changes[0].Seq != res.LastSeq {
		t.Fatalf("read from CursorAt: %+v", got)
	}
	if pos, _, reason, err := j.CheckCursor(q); err != nil || reason != "" || pos != res.FirstSeq {
		t.Fatalf("CheckCursor = %d %q %v", pos, reason, err)
	}
	if _, _, _, err := j.CheckCursor(Query{Entities: []string{"public.b"}, Cursor: cur}); !errors.Is(err, ErrCursorScope) {
		t.Fatalf("other scope: %v", err)
	}
	// A cursor is bound to its View as to its entities: one issued without
	// a view is refused under one, one issued under a view under another.
	if _, _, _, err := j.CheckCursor(Query{Entities: []string{"public.a"}, View: "f{}", Cursor: cur}); !errors.Is(err, ErrCursorScope) {
		t.Fatalf("a view's scope took a cursor issued without one: %v", err)
	}
	vq := Query{Entities: []string{"public.a"}, View: "f{\"col\":\"id\"}"}
	vcur, err := j.CursorAt(vq, 0, res.FirstSeq)
	if err != nil {
		t.Fatal(err)
	}
	vq.Cursor = vcur
	if pos, _, _, err := j.CheckCursor(vq); err != nil || pos != res.FirstSeq {
		t.Fatalf("the view's own cursor: %d %v", pos, err)
	}
	for _, other := range []string{"", "f{\"col\":\"id2\"}"} {
		if _, _, _, err := j.CheckCursor(Query{Entities: []string{"public.a"}, View: other, Cursor: vcur}); !errors.Is(err, ErrCursorScope) {
			t.Fatalf("view %q took a cursor of another view: %v", other, err)
		}
	}
	if _, _, _, err := j.CheckCursor(Query{Entities: []string{"public.a"}, Cursor: cur[:10] + string(cur[10]^1) + cur[11:]}); !errors.Is(err, ErrCursorTampered) {
		t.Fatalf("tampered: %v", err)
	}
	rotated := openAt(t, j.connCfg.ConnString(), func(c *Config) {
		c.CursorSecret = []byte("another-secret-0123456789")
		c.PreviousCursorSecrets = [][]byte{testSecret}
	})
	if _, _, reason, err := rotated.CheckCursor(q); err != nil || reason != ResyncSecretRotated {
		t.Fatalf("rotated: %q %v", reason, err)
	}

	e, err := j.EntryAt(testCtx(t), res.FirstSeq+1)
	if err != nil || e.Entity != "public.b" {
		t.Fatalf("EntryAt = %+v %v", e, err)
	}
	decodeEnv(t, e)
	if _, err := j.EntryAt(testCtx(t), 999); !errors.Is(err, ErrNoEntry) {
		t.Fatalf("EntryAt(999): %v", err)
	}
	for ent, want := range map[string]int64{"public.a": 2, "public.b": 1, "public.none": 0} {
		if got, err := j.LastEntitySeq(testCtx(t), ent); err != nil || got != want {
			t.Fatalf("LastEntitySeq(%s) = %d %v, want %d", ent, got, err, want)
		}
	}
}
