package journal

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
)

// tenantRes is what is known of a key's tenant: found says a change of the
// key is known (journaled or earlier in the batch); tenant is nil when that
// change had no tenant.
type tenantRes struct {
	found  bool
	tenant *string
}

// priorKey is the key whose previous tenant c needs, or nil when it needs
// none: a change whose own tenant is unresolved (a key-only delete) needs
// its key's; an update whose old row did not carry the tenant column needs
// its old key's (OldKey, or Key when the key did not change), to tell
// whether the row changed tenant.
func priorKey(c *decoder.Change) []byte {
	if c.Op == decoder.OpUpdate && (c.TenantState == decoder.TenantUnresolved || c.OldTenantState == decoder.TenantUnresolved) {
		if c.OldKey != nil {
			return c.OldKey
		}
		return c.Key
	}
	if c.TenantState == decoder.TenantUnresolved {
		return c.Key
	}
	return nil
}

// lookupTenants finds, for every key whose previous tenant a change of the
// batch needs (priorKey), the tenant of the newest journaled change of that
// key, in one query for the whole batch. It returns nil when the batch has
// no such change (the common case without tenancy: one cheap pass over
// in-memory changes). Keys this process journaled recently are answered
// from cache (keyTenants); of the others, only those of entities that
// carried tenants before the batch (base) are looked up: only theirs have
// key_hash set. The map is entity →
// key → resolution and also covers keys resolved later in the batch itself
// (copySource updates it).
func (j *Journal) lookupTenants(ctx context.Context, conn *pgx.Conn, txs []*decoder.Transaction, base map[string]entityState, cache *keyTenants) (map[string]map[string]*tenantRes, error) {
	var ents, keys []string
	var hashes []int64
	var res []*tenantRes // of the keys looked up, in order
	var m map[string]map[string]*tenantRes
	for _, t := range txs {
		it := t.Changes()
		for it.Next() {
			c := it.Change()
			k := priorKey(c)
			if k == nil {
				continue
			}
			if m == nil {
				m = map[string]map[string]*tenantRes{}
			}
			km := m[c.Entity]
			if km == nil {
				km = map[string]*tenantRes{}
				m[c.Entity] = km
			}
			if _, ok := km[string(k)]; ok {
				continue
			}
			r := &tenantRes{}
			km[string(k)] = r
			if t, ok := cache.get(c.Entity, k); ok {
				r.found = true
				if t.has {
					r.tenant = &t.tenant
				}
				continue
			}
			if base[c.Entity].tenanted {
				ents = append(ents, c.Entity)
				keys = append(keys, string(k))
				hashes = append(hashes, keyHash(c.Entity, k))
				res = append(res, r)
			}
		}
		if err := it.Err(); err != nil {
			return nil, fmt.Errorf("read transaction %d: %w", t.Xid, err)
		}
	}
	if len(ents) == 0 {
		return m, nil
	}
	// Rows name their key by its ordinal: the keys are not sent back.
	//
	// The chunks that hold a key are found through the GIN index on their
	// key hashes, whatever the planner estimates: the alternatives it
	// costs lower (the primary key walked backwards, or every chunk) test
	// each chunk's key hash array, which means decompressing it, and for a
	// key whose newest change is old that is the whole journal. So the
	// query runs with sequential and plain index scans off, in a
	// transaction of its own or, inside the append's, set back after it.
	b := &pgx.Batch{}
	inTx := conn.PgConn().TxStatus() != 'I'
	if !inTx {
		b.Queue("BEGIN")
	}
	b.Queue("SET LOCAL enable_seqscan = off")
	b.Queue("SET LOCAL enable_indexscan = off")
	var i int64
	var tenant *string
	b.Queue(`SELECT u.i, l.tenant FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS u(entity, key, h, i)
		JOIN LATERAL (SELECT e.tenant FROM (SELECT * FROM `+j.sql.chunks+` c WHERE c.key_hash @> ARRAY[u.h] OFFSET 0) c
			CROSS JOIN LATERAL unnest(c.key_hash, c.entity, c.key, c.tenant, c.tenant_unknown) WITH ORDINALITY AS e(key_hash, entity, key, tenant, tenant_unknown, i)
			WHERE e.key_hash = u.h AND e.entity = u.entity AND e.key = u.key AND NOT e.tenant_unknown
				AND c.first_seq + e.i - 1 >= (SELECT floor FROM `+j.sql.retention+`)
			ORDER BY c.last_seq DESC, e.i DESC LIMIT 1) l ON true`, ents, keys, hashes).Query(func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&i, &tenant}, func() error {
			if i < 1 || i > int64(len(res)) {
				return fmt.Errorf("lookup returned key %d of %d", i, len(res))
			}
			*res[i-1] = tenantRes{found: true, tenant: tenant}
			return nil
		})
		return err
	})
	if inTx {
		b.Queue("SET LOCAL enable_seqscan TO DEFAULT")
		b.Queue("SET LOCAL enable_indexscan TO DEFAULT")
	} else {
		b.Queue("COMMIT")
	}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("resolve tenants: %w", err)
	}
	return m, nil
}

// keyHash is a stable 64-bit hash of entity and key, indexed to find the
// newest change of a key without indexing keys themselves (which can exceed a
// btree entry under REPLICA IDENTITY FULL).
func keyHash(entity string, key []byte) int64 {
	h := fnv.New64a()
	h.Write([]byte(entity))
	h.Write([]byte{0})
	h.Write(key)
	return int64(h.Sum64())
}
