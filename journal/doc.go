// Package journal is walcast's durable, ordered change journal, stored in
// PostgreSQL (DESIGN §5). It owns the journal schema and its migrations, the
// group-committed append with its watermark and fencing generation, the
// HMAC-authenticated cursors, reads by cursor with entity and tenant filters,
// retention, the LISTEN/NOTIFY path that tells readers about new entries,
// and the catalog of published tables that scopes every reader (catalog.go).
//
// It imports decoder for the change and transaction types and nothing else of
// walcast; it never imports replication or fanout, and it never logs: errors
// are returned to the caller, who decides what an operator sees.
//
// # Ordering
//
// Every append locks the single meta row (SELECT … FOR UPDATE) before it
// writes an entry, checks under that lock that the next_seq its entries are
// numbered from is the meta row's, and releases the lock only by committing
// or rolling back. Appends are therefore serialized, and a later append can
// only take the lock once the earlier one has committed and become visible.
// next_seq advances in the same transaction that writes the entries, so a
// rolled-back append consumes no seq. Together this gives: seq is
// contiguous, and seq order equals commit (visibility) order — a reader whose
// snapshot sees entry N sees every entry below N. Reading "seq > cursor ORDER
// BY seq" in one snapshot therefore never skips an entry that becomes visible
// later. Fencing (Acquire) keeps a single legitimate appender; the row lock
// keeps the guarantee even when a fenced one races it.
//
// # Positions
//
// The horizon is the newest assigned seq (0 when nothing was ever appended);
// the floor is the oldest retained seq. A cursor holds the seq of the last
// entry its reader has been given; reading returns entries above it. See
// Changes for when a cursor requires a resync.
//
// # Tenancy
//
// A key-only change whose tenant the decoder could not know (a DELETE under
// REPLICA IDENTITY DEFAULT) takes the tenant of the newest journaled change
// of the same entity and key, found through the chunks' key_hash arrays (a GIN index); within one
// batch, earlier changes of the batch count. To keep that index off the
// append path of deployments without tenancy, key_hash is stored only once
// an entity is known to carry tenants (it has a tenant column, or one of its
// changes had a tenant or lacked one); a delete whose key has no such
// retained change is marked tenantUnknown and reaches no tenant-scoped or
// unscoped reader (fail closed), only AllTenants readers.
//
// An update that moves a row to another tenant (or to or from no tenant;
// the empty tenant is a tenant) is journaled as two entries: first a
// delete of the old key in the old tenant, marked "moved":"tenant", then
// the update in the new one. The old tenant is the old row's when the
// decoder had it (decoder.Change.OldTenantState: REPLICA IDENTITY FULL, or
// an identity holding the tenant column), else that of the newest journaled
// change of the old key (the key before a key change), found as a delete's
// is, in the same one query per batch, for entities that carry tenants
// only — unless the appender remembers the key: it keeps the tenants of
// keys it journaled recently (keyTenants), as long as no other appender
// may have written. Where no retained change names it, the update is
// journaled alone (the old tenant's readers keep the row until they next
// snapshot).
//
// A table whose tenant column the publication's column list leaves out
// (CatalogEntry.TenantUnscoped) has its changes journaled as quarantine
// entries that carry no tenant and no key: they are tenantUnknown, so they
// too reach only AllTenants readers.
//
// # Storage
//
// Entries are stored many to a row (chunks.go): each append writes its
// entries as chunks of up to 1,024 consecutive seqs, every column an array
// that PostgreSQL compresses, so the journal writes a fraction of the WAL
// the source's own changes did (docs/performance.md). The entries view
// shows them one to a row.
//
// # Files
//
//   - journal.go: Open, the meta row (watermark, source, published position);
//     migrate.go: the schema and its migrations.
//   - append.go: the append API and fencing (Acquire); write.go: the append
//     transaction; encode.go: changes to entries (envelopes, tenants, moves);
//     chunks.go: entries to chunk rows, and the SQL that reads them back.
//   - read.go, cursor.go, where.go: reads by cursor with entity and tenant
//     filters; publishapi.go: the publisher's read by seq; syncapi.go and
//     xids.go: what sync nodes read besides changes; recent.go: the
//     in-memory tail of this process's own appends; notify.go: LISTEN;
//     txn.go: where a transaction ends within a reader's scope
//     (Entry.TxnEnd, TxnRest).
//   - tenant.go, keycache.go: the tenant of a key's newest change.
//   - retention.go: pruning; snapshot.go, snapshot_tables.go: snapshot
//     requests and progress, and the publication's recorded tables (all
//     the snapshot worker uses of them is the snapshotBook interface in
//     replication/snapshot_book.go);
//     catalog.go: what readers may see of each table.
//   - pool.go, limits_*.go: connections and their time bounds; replica.go:
//     reads from a physical standby (Config.ReadURL), and what a lagging
//     one may and may not answer.
package journal
