package sync

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/walcast/walcast/journal"
)

// longEventsURL is an event stream request of 256 topics and 100 cursors
// (authentic, of another topic): about 19 KB, near the header cap.
func longEventsURL(t testing.TB, e *syncEnv) string {
	t.Helper()
	forged, err := e.j.CursorAt(journal.Query{Entities: []string{"public.zz"}}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	q := url.Values{}
	for i := range 256 {
		q.Add("topic", "public.t"+strings.Repeat("x", i%40)+string(rune('a'+i%26)))
	}
	for range 100 {
		q.Add("cursor", forged)
	}
	return "/v1/events?" + q.Encode()
}

// TestEventsTokenlessCostsNoCursorWork: a request without a valid token is
// refused before its topics and cursors are looked at. Before, every
// (cursor, topic) pair was checked (a MAC, base64 and a scope hash each)
// first: a 19 KB URL of 256 topics and 100 forged cursors cost about a
// thousand times a plain 401. Measured in allocations, not time.
func TestEventsTokenlessCostsNoCursorWork(t *testing.T) {
	e := newSyncEnv(t)
	target := longEventsURL(t, e)
	h := e.node.Handler()
	plain := testing.AllocsPerRun(20, func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/v1/events?topic="+orders, nil))
	})
	big := testing.AllocsPerRun(20, func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", target, nil))
		if w.Code != http.StatusUnauthorized {
			t.Fatalf("tokenless stream: %d", w.Code)
		}
	})
	t.Logf("allocations: plain 401 %.0f, 256 topics and 100 cursors %.0f", plain, big)
	// Reading the URL's query is all the large request may add: a few
	// allocations per parameter, against dozens per (cursor, topic) pair.
	if limit := plain + 10*356; big > limit {
		t.Fatalf("a tokenless request of 256 topics and 100 cursors made %.0f allocations (a plain one %.0f): more than reading its query (%.0f)", big, plain, limit)
	}
}

// TestEventsCursorMatchLinear: matching C cursors to T topics costs at
// most one MAC per cursor and per topic; a cursor of each topic finds its
// topic whatever the order, and the scope hash read from a cursor is the
// journal's (cursorScope follows journal/cursor.go's layout).
func TestEventsCursorMatchLinear(t *testing.T) {
	e := newSyncEnv(t)
	var topics []eventsTopic
	var cursors []string
	for i := range 256 {
		topic := "public.t" + strings.Repeat("x", i%40) + string(rune('a'+i%26))
		topics = append(topics, eventsTopic{topic: topic})
		c, err := e.j.CursorAt(journal.Query{Entities: []string{topic}, Tenant: "acme"}, 0, int64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		cursors = append([]string{c}, cursors...) // reversed: the last topic's first
	}
	other, _ := e.j.CursorAt(journal.Query{Entities: []string{topics[0].topic}, Tenant: "globex"}, 0, 1)
	cursors = append(cursors, other)
	unmatched := e.node.matchCursors(topics, cursors, "acme")
	if len(unmatched) != 1 || unmatched[0] != other {
		t.Fatalf("unmatched %d cursors, want only the other tenant's", len(unmatched))
	}
	for i, tp := range topics {
		if pos, err := e.j.CursorPosition(tp.cursor); err != nil || pos != int64(i+1) {
			t.Fatalf("topic %d got the cursor of position %d (%v)", i, pos, err)
		}
		if _, _, _, err := e.j.CheckCursor(journal.Query{Entities: []string{tp.topic}, Tenant: "acme", Cursor: tp.cursor}); err != nil {
			t.Fatalf("topic %d: the journal refuses the matched cursor: %v", i, err)
		}
	}
	// Linear: the allocations of matching 257 cursors to 256 topics stay
	// within a constant per cursor and per topic (a pairwise check costs
	// several per pair: over 65,000 pairs).
	allocs := testing.AllocsPerRun(5, func() {
		ts := append([]eventsTopic(nil), topics...)
		for i := range ts {
			ts[i].cursor = ""
		}
		e.node.matchCursors(ts, cursors, "acme")
	})
	t.Logf("allocations matching %d cursors to %d topics: %.0f", len(cursors), len(topics), allocs)
	if limit := float64(40 * (len(topics) + len(cursors))); allocs > limit {
		t.Fatalf("matching made %.0f allocations, more than %.0f", allocs, limit)
	}
}

// BenchmarkEventsRefusedLongURL: the cost of refusing a tokenless event
// stream of 256 topics and 100 cursors (compare with a plain 401: run with
// -bench EventsRefused -benchmem).
func BenchmarkEventsRefusedLongURL(b *testing.B) {
	e := newSyncEnv(b)
	target := longEventsURL(b, e)
	h := e.node.Handler()
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", target, nil))
		if w.Code != http.StatusUnauthorized {
			b.Fatalf("status %d", w.Code)
		}
	}
}
