package journal

// keyTenants remembers, for keys of entities that carry tenants, the tenant
// of the newest change of the key this process journaled (tenant-unknown
// changes aside), so that an append's tenant lookups (lookupTenants) need
// not ask the journal for keys it wrote recently: under REPLICA IDENTITY
// DEFAULT every update of a tenanted table needs its key's previous tenant.
//
// It holds only what this process appended while no other appender wrote in
// between, which is what the journal's newest entries of those keys say:
// append resets it whenever that is not certain (a failed or ambiguous
// append, a journal whose next seq is not the one this process left). A
// remembered key whose entries retention has since pruned still counts;
// what it says was journaled.
//
// Memory is bounded: entries go to the current generation; once it holds
// keyCacheBytes, it becomes the previous one (the one before is dropped), so
// lookups see between keyCacheBytes and twice that of the newest keys. Keys
// longer than maxCachedKey (whole rows under REPLICA IDENTITY FULL, whose
// old tenant the old row carries anyway) are never cached. Guarded by
// Journal.appendMu.
type keyTenants struct {
	cur, prev map[keyRef]keyTenant
	bytes     int // held by cur
	max       int // bytes per generation; 0 disables the cache
}

type keyRef struct{ entity, key string }

// keyTenant is a key's tenant: has is false for none.
type keyTenant struct {
	tenant string
	has    bool
}

const (
	keyCacheBytes = 8 << 20
	maxCachedKey  = 256
	keyEntryBytes = 64 // map slot, string headers and the tenant pointer, roughly
)

// get returns what the cache knows of entity's key.
func (c *keyTenants) get(entity string, key []byte) (keyTenant, bool) {
	if c.cur == nil || len(key) > maxCachedKey {
		return keyTenant{}, false
	}
	if t, ok := c.cur[keyRef{entity, string(key)}]; ok {
		return t, true
	}
	t, ok := c.prev[keyRef{entity, string(key)}]
	return t, ok
}

// put records that the newest change of entity's key has tenant t.
func (c *keyTenants) put(entity string, key []byte, t keyTenant) {
	if c.max <= 0 || len(key) > maxCachedKey {
		return
	}
	if c.cur == nil {
		c.cur = map[keyRef]keyTenant{}
	}
	k := keyRef{entity, string(key)}
	if _, had := c.cur[k]; !had {
		c.bytes += len(key) + len(t.tenant) + keyEntryBytes
	}
	c.cur[k] = t
	if c.bytes >= c.max {
		c.prev, c.cur, c.bytes = c.cur, map[keyRef]keyTenant{}, 0
	}
}

// reset forgets everything.
func (c *keyTenants) reset() {
	c.cur, c.prev, c.bytes = nil, nil, 0
}
