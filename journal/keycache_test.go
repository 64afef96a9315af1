package journal

import (
	"fmt"
	"strings"
	"testing"
)

// TestKeyCacheBounded: the key cache holds at most two generations of
// max bytes, answers from the newer one first, never caches long keys, and
// forgets everything on reset; with max 0 it holds nothing.
func TestKeyCacheBounded(t *testing.T) {
	c := keyTenants{max: 10 * (8 + keyEntryBytes)}
	key := func(i int) []byte { return []byte(fmt.Sprintf(`{"id":%d}`, i)) }
	for i := range 10 {
		c.put("e", key(i), keyTenant{tenant: "a", has: true})
	}
	if len(c.prev) == 0 || len(c.cur) != 0 {
		t.Fatalf("no new generation after max bytes: cur %d prev %d", len(c.cur), len(c.prev))
	}
	c.put("e", key(3), keyTenant{}) // newer, in cur: no tenant
	if got, ok := c.get("e", key(3)); !ok || got.has {
		t.Fatalf("key 3: %+v %v, want the newer (no tenant)", got, ok)
	}
	if got, ok := c.get("e", key(4)); !ok || got.tenant != "a" {
		t.Fatalf("key 4: %+v %v, want a from the older generation", got, ok)
	}
	for i := 100; i < 130; i++ {
		c.put("e", key(i), keyTenant{tenant: "b", has: true})
	}
	if _, ok := c.get("e", key(4)); ok {
		t.Fatal("key 4 outlived two generations")
	}
	if n := len(c.cur) + len(c.prev); n > 20 {
		t.Fatalf("%d keys held, bound 20", n)
	}
	long := []byte(`{"id":"` + strings.Repeat("x", maxCachedKey) + `"}`)
	c.put("e", long, keyTenant{tenant: "a", has: true})
	if _, ok := c.get("e", long); ok {
		t.Fatal("a key longer than maxCachedKey was cached")
	}
	if _, ok := c.get("other", key(129)); ok {
		t.Fatal("a key of another entity matched")
	}
	c.reset()
	if _, ok := c.get("e", key(129)); ok {
		t.Fatal("a key survived reset")
	}
	off := keyTenants{}
	off.put("e", key(1), keyTenant{})
	if _, ok := off.get("e", key(1)); ok {
		t.Fatal("a disabled cache held a key")
	}
}
