package journal

import (
	"context"
	"encoding/binary"
	"math"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The journal's storage form (DESIGN §5). Entries are stored in chunks: one
// row of the chunks table holds up to chunkMaxEntries consecutive entries,
// column by column, each column an array with one element per entry (seq
// first_seq+i-1 is element i). PostgreSQL compresses the arrays (lz4 where
// the server has it, see migration 9) and moves the large ones out of
// line, so a chunk of similar envelopes costs a fraction of its size in WAL
// and the table and its primary key grow by one row per chunk, not per
// change. Readers see entries through entriesIn (and operators through the
// entries view), never through the arrays directly.
//
// A chunk never spans appends, so chunks are written, committed and pruned
// whole; retention moves the floor entry by entry and deletes a chunk once
// every entry in it is below the floor. Every read bounds its seqs by the
// floor (which it already did), so entries of a partly pruned chunk are
// never served.

// chunkColumns is the COPY column order; chunkBuilder.row follows it.
var chunkColumns = []string{"first_seq", "last_seq", "entity", "entity_seq", "tenant", "tenant_unknown", "op",
	"key_hash", "key", "lsn", "commit_lsn", "xid", "commit_time", "size", "envelope", "xid8"}

// entryFields are the per-entry arrays of a chunk, in chunkColumns order,
// and their element types.
var entryFields = []struct{ name, typ string }{
	{"entity", "text"}, {"entity_seq", "bigint"}, {"tenant", "text"}, {"tenant_unknown", "boolean"}, {"op", "text"},
	{"key_hash", "bigint"}, {"key", "text"}, {"lsn", "bigint"}, {"commit_lsn", "bigint"}, {"xid", "bigint"},
	{"commit_time", "timestamptz"}, {"size", "integer"}, {"envelope", "text"}, {"xid8", "bigint"},
}

const (
	// chunkMaxEntries is the most entries a chunk holds; the table's CHECK
	// and entriesIn's index bound rely on it, so it only ever shrinks.
	chunkMaxEntries = 4096
	// chunkEntries and chunkBytes end a chunk in the writer: lz4's window is
	// 64 KiB, so a longer chunk compresses no better, while every read of
	// one entry decompresses its chunk's columns whole.
	chunkEntries = 1024
	chunkBytes   = 128 << 10
)

// entriesIn is a subquery of the entries with lo < seq <= hi (SQL
// expressions over the enclosing query), as rows with a seq column and the
// named entry columns (entryFields names; "i" is not one), in seq order.
// Only the named arrays are read: a chunk's columns are stored, compressed
// and read separately, so a read of xids never decompresses an envelope.
//
// The rows come ordered by chunk_end (the chunk's last seq) and chunk_i
// (the entry's place in it), which is seq order: a query that orders by
// those two instead of seq walks the chunks in primary key order and sorts
// only within each chunk, so a LIMIT stops it after the chunks it needs
// (ordering by seq would decompress the whole window before the first
// row).
func (j *Journal) entriesIn(lo, hi string, cols ...string) string {
	var b strings.Builder
	b.WriteString("(SELECT c.first_seq + u.i - 1 AS seq, c.last_seq AS chunk_end, u.i AS chunk_i")
	for _, c := range cols {
		b.WriteString(", u." + c)
	}
	b.WriteString(" FROM " + j.sql.chunks + " c CROSS JOIN LATERAL unnest(")
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("c." + c)
	}
	b.WriteString(") WITH ORDINALITY AS u(" + strings.Join(cols, ", ") + ", i)")
	// last_seq < hi + chunkMaxEntries follows from first_seq <= hi and
	// bounds the primary key's range scan.
	b.WriteString(" WHERE c.last_seq > (" + lo + ") AND c.last_seq < (" + hi + ") + " + strconv.Itoa(chunkMaxEntries) +
		" AND c.first_seq <= (" + hi + ") AND c.first_seq + u.i - 1 > (" + lo + ") AND c.first_seq + u.i - 1 <= (" + hi + ")" +
		" ORDER BY c.last_seq, u.i)")
	return b.String()
}

// entriesView is the SQL of the entries view: every retained entry as a row,
// for operators and ad hoc queries (the journal's own reads use entriesIn,
// which reads only the chunks and columns they need).
func entriesView(schemaQ string) string {
	var names, cols []string
	for _, f := range entryFields {
		names = append(names, f.name)
		cols = append(cols, "c."+f.name)
	}
	return "CREATE VIEW " + schemaQ + ".entries AS SELECT c.first_seq + u.i - 1 AS seq, u." + strings.Join(names, ", u.") +
		" FROM " + schemaQ + ".chunks c CROSS JOIN LATERAL unnest(" + strings.Join(cols, ", ") + ") WITH ORDINALITY AS u(" +
		strings.Join(names, ", ") + ", i) WHERE c.first_seq + u.i - 1 >= (SELECT floor FROM " + schemaQ + ".retention)"
}

// PostgreSQL's type OIDs of the array elements.
const (
	oidBool        = 16
	oidInt8        = 20
	oidInt4        = 23
	oidText        = 25
	oidTimestamptz = 1184
)

// pgArray accumulates one column's elements in the binary array format.
type pgArray struct {
	oid     uint32
	data    []byte
	n       int
	nulls   bool
	nonNull bool
}

func (a *pgArray) reset() { a.data, a.n, a.nulls, a.nonNull = a.data[:0], 0, false, false }

func (a *pgArray) null() {
	a.data = binary.BigEndian.AppendUint32(a.data, math.MaxUint32)
	a.n++
	a.nulls = true
}

func (a *pgArray) int8(v int64) {
	a.data = binary.BigEndian.AppendUint32(a.data, 8)
	a.data = binary.BigEndian.AppendUint64(a.data, uint64(v))
	a.n++
	a.nonNull = true
}

func (a *pgArray) int4(v int32) {
	a.data = binary.BigEndian.AppendUint32(a.data, 4)
	a.data = binary.BigEndian.AppendUint32(a.data, uint32(v))
	a.n++
	a.nonNull = true
}

func (a *pgArray) bool(v bool) {
	a.data = binary.BigEndian.AppendUint32(a.data, 1)
	if v {
		a.data = append(a.data, 1)
	} else {
		a.data = append(a.data, 0)
	}
	a.n++
	a.nonNull = true
}

// str is text of a string, without converting it to a []byte first.
func (a *pgArray) str(v string) {
	a.data = binary.BigEndian.AppendUint32(a.data, uint32(len(v)))
	a.data = append(a.data, v...)
	a.n++
	a.nonNull = true
}

func (a *pgArray) text(v []byte) {
	a.data = binary.BigEndian.AppendUint32(a.data, uint32(len(v)))
	a.data = append(a.data, v...)
	a.n++
	a.nonNull = true
}

// field appends the array as one COPY binary field: its length, then the
// array header (one dimension, lower bound 1) and the elements.
func (a *pgArray) field(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(20+len(a.data)))
	b = binary.BigEndian.AppendUint32(b, 1) // dimensions
	if a.nulls {
		b = binary.BigEndian.AppendUint32(b, 1)
	} else {
		b = binary.BigEndian.AppendUint32(b, 0)
	}
	b = binary.BigEndian.AppendUint32(b, a.oid)
	b = binary.BigEndian.AppendUint32(b, uint32(a.n))
	b = binary.BigEndian.AppendUint32(b, 1) // lower bound
	return append(b, a.data...)
}

// chunkBuilder gathers consecutive entries into one chunk row.
type chunkBuilder struct {
	first, n int64
	bytes    int
	entity, entitySeq, tenant, unknown, op, keyHash, key,
	lsn, commitLSN, xid, commitTime, size, envelope, xid8 pgArray
}

func newChunkBuilder() *chunkBuilder {
	c := &chunkBuilder{}
	for _, a := range []struct {
		a   *pgArray
		oid uint32
	}{{&c.entity, oidText}, {&c.entitySeq, oidInt8}, {&c.tenant, oidText}, {&c.unknown, oidBool}, {&c.op, oidText},
		{&c.keyHash, oidInt8}, {&c.key, oidText}, {&c.lsn, oidInt8}, {&c.commitLSN, oidInt8}, {&c.xid, oidInt8},
		{&c.commitTime, oidTimestamptz}, {&c.size, oidInt4}, {&c.envelope, oidText}, {&c.xid8, oidInt8}} {
		a.a.oid = a.oid
	}
	return c
}

func (c *chunkBuilder) arrays() []*pgArray {
	return []*pgArray{&c.entity, &c.entitySeq, &c.tenant, &c.unknown, &c.op, &c.keyHash, &c.key,
		&c.lsn, &c.commitLSN, &c.xid, &c.commitTime, &c.size, &c.envelope, &c.xid8}
}

// capacity is the bytes its column buffers hold on to.
func (c *chunkBuilder) capacity() int {
	n := 0
	for _, a := range c.arrays() {
		n += cap(a.data)
	}
	return n
}

// full reports whether the chunk should end before another entry.
func (c *chunkBuilder) full() bool { return c.n >= chunkEntries || c.bytes >= chunkBytes }

// row appends the chunk as one COPY binary row to b and empties it; b is
// returned unchanged when the chunk is empty.
func (c *chunkBuilder) row(b []byte) []byte {
	if c.n == 0 {
		return b
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(chunkColumns)))
	b = appendInt8(b, c.first)
	b = appendInt8(b, c.first+c.n-1)
	for _, a := range c.arrays() {
		if a == &c.keyHash && !a.nonNull {
			// NULL, not an array of NULLs: chunks of entities without
			// tenants stay out of the key hash index.
			b = binary.BigEndian.AppendUint32(b, math.MaxUint32)
			continue
		}
		b = a.field(b)
	}
	for _, a := range c.arrays() {
		a.reset()
	}
	c.n, c.bytes = 0, 0
	return b
}

// migrationChunks moves the journal from one row per entry (the entries
// table of migrations 1 and 8) to chunks, in the migration's transaction:
// the existing entries are regrouped into chunks of at most chunkEntries
// consecutive seqs, the entries table is dropped and a view of the same
// name and columns takes its place. Seqs, envelopes and every column keep
// their values, so cursors, message ids and the published position mean
// what they meant. Column compression is lz4 where the server was built
// with it, else PostgreSQL's default (pglz).
var migrationChunks = `
CREATE TABLE %[1]s.chunks (
	first_seq      bigint        NOT NULL,
	last_seq       bigint        PRIMARY KEY,
	entity         text[]        NOT NULL,
	entity_seq     bigint[]      NOT NULL,
	tenant         text[]        NOT NULL,
	tenant_unknown boolean[]     NOT NULL,
	op             text[]        NOT NULL,
	key_hash       bigint[],
	key            text[]        NOT NULL,
	lsn            bigint[]      NOT NULL,
	commit_lsn     bigint[]      NOT NULL,
	xid            bigint[]      NOT NULL,
	commit_time    timestamptz[] NOT NULL,
	size           integer[]     NOT NULL,
	envelope       text[]        NOT NULL,
	xid8           bigint[]      NOT NULL,
	CHECK (first_seq >= 1 AND first_seq <= last_seq AND last_seq - first_seq < ` + strconv.Itoa(chunkMaxEntries) + `)
);
COMMENT ON TABLE %[1]s.chunks IS 'walcast journal: the entries, up to ` + strconv.Itoa(chunkMaxEntries) + ` consecutive seqs a row, each column an array with element i for seq first_seq+i-1 (compressed by PostgreSQL); read them through the entries view';
COMMENT ON COLUMN %[1]s.chunks.key_hash IS 'set only for entities that carry tenants (NULL for a chunk with none): finds the newest change of a key to route a key-only delete';
COMMENT ON COLUMN %[1]s.chunks.xid8 IS 'the source transaction''s full 64-bit id (xid8; xid holds the 32 bits pgoutput and the envelope carry); 0 for an entry of no transaction (xid 0); NULL when unknown (entries journaled before full ids were recorded): sync nodes compare them by xid alone';
CREATE INDEX chunks_key_hash ON %[1]s.chunks USING gin (key_hash) WHERE key_hash IS NOT NULL;
DO $lz4$ BEGIN
	ALTER TABLE %[1]s.chunks
		ALTER COLUMN entity SET COMPRESSION lz4, ALTER COLUMN entity_seq SET COMPRESSION lz4,
		ALTER COLUMN tenant SET COMPRESSION lz4, ALTER COLUMN tenant_unknown SET COMPRESSION lz4,
		ALTER COLUMN op SET COMPRESSION lz4, ALTER COLUMN key_hash SET COMPRESSION lz4,
		ALTER COLUMN key SET COMPRESSION lz4, ALTER COLUMN lsn SET COMPRESSION lz4,
		ALTER COLUMN commit_lsn SET COMPRESSION lz4, ALTER COLUMN xid SET COMPRESSION lz4,
		ALTER COLUMN commit_time SET COMPRESSION lz4, ALTER COLUMN size SET COMPRESSION lz4,
		ALTER COLUMN envelope SET COMPRESSION lz4, ALTER COLUMN xid8 SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
	NULL; -- a server built without lz4: pglz
END $lz4$;
INSERT INTO %[1]s.chunks (first_seq, last_seq, entity, entity_seq, tenant, tenant_unknown, op, key_hash, key,
		lsn, commit_lsn, xid, commit_time, size, envelope, xid8)
	SELECT min(seq), max(seq), array_agg(entity ORDER BY seq), array_agg(entity_seq ORDER BY seq),
		array_agg(tenant ORDER BY seq), array_agg(tenant_unknown ORDER BY seq), array_agg(op ORDER BY seq),
		CASE WHEN count(key_hash) > 0 THEN array_agg(key_hash ORDER BY seq) END, array_agg(key ORDER BY seq),
		array_agg(lsn ORDER BY seq), array_agg(commit_lsn ORDER BY seq), array_agg(xid ORDER BY seq),
		array_agg(commit_time ORDER BY seq), array_agg(size ORDER BY seq), array_agg(envelope ORDER BY seq),
		array_agg(xid8 ORDER BY seq)
	FROM (SELECT e.*, seq - row_number() OVER (ORDER BY seq) AS run FROM %[1]s.entries e) e
	GROUP BY run, (seq - 1) / ` + strconv.Itoa(chunkEntries) + `;
DROP TABLE %[1]s.entries;
` + entriesView("%[1]s") + `;
COMMENT ON VIEW %[1]s.entries IS 'walcast journal: every retained entry as a row, read from the chunks table';
`

// readColumns are the entry columns a read of envelopes selects (entryCols,
// and size for the byte bound); readColumnsXid8 adds the full xid.
var (
	readColumns     = []string{"entity", "entity_seq", "tenant", "tenant_unknown", "op", "lsn", "commit_lsn", "commit_time", "envelope", "size"}
	readColumnsXid8 = []string{"entity", "entity_seq", "tenant", "tenant_unknown", "op", "lsn", "commit_lsn", "commit_time", "envelope", "size", "xid8"}
)

// queryInOrder runs sql, a read that orders entriesIn's rows by chunk_end
// and chunk_i, with each of its rows passed to each, planned with sorts
// off: the planner, which cannot know how many entries a chunk holds,
// otherwise sorts the whole scan window (up to scanWindow entries,
// decompressed, spilled to disk) rather than each chunk as it is read, and
// a read of one page then costs as much as ten. One round trip: BEGIN,
// SET LOCAL, the read and COMMIT go as one batch.
func queryInOrder(ctx context.Context, conn *pgx.Conn, sql string, args []any, each func(pgx.Rows) error) error {
	b := &pgx.Batch{}
	b.Queue("BEGIN READ ONLY")
	b.Queue("SET LOCAL enable_sort = off")
	b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			if err := each(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	b.Queue("COMMIT")
	return conn.SendBatch(ctx, b).Close()
}
