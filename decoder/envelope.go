// Package decoder turns pgoutput (logical replication protocol v2) messages
// into walcast change envelopes, grouped into committed transactions in commit
// order. It owns the relation and type cache, transaction assembly (including
// streamed in-progress transactions, spilled to disk past a memory budget),
// value decoding and the JSON encoding of envelopes.
//
// It is pure: it imports no other walcast package and no network code. It is
// fed raw XLogData payloads by the replication loop and its output is consumed
// by the journal.
//
// # Envelopes
//
// key holds the relation's replica-identity columns (every column under
// REPLICA IDENTITY FULL) taken from the new row, or from the old row for a
// delete; it is absent when the relation has none. before is the old row
// exactly as Postgres sent it: the key columns for a key-only ('K') old row,
// the whole row under FULL, absent when none was sent. An unchanged TOASTed
// column Postgres did not send is listed in unchanged and left out of after,
// never null — unless the old row (FULL) carries its value, which is then
// used. A logical decoding message's entity is its prefix.
//
// # Values
//
// Column values become JSON by these rules (DESIGN §3), applied to the text
// form Postgres sends under the
// session settings the replication connection fixes (TimeZone=UTC,
// DateStyle=ISO, IntervalStyle=iso_8601, extra_float_digits=3,
// bytea_output=hex):
//
//   - bool: true/false.
//   - int2, int4, oid, xid, cid: JSON numbers.
//   - int8: a JSON number when -2^53 <= v <= 2^53 (every such integer is an
//     exact float64), otherwise a JSON string of its decimal digits.
//   - numeric: a JSON number when the value is an integer with
//     |v| <= 2^53, or has at most 15 significant digits (any decimal of 15
//     significant digits survives a round trip through float64 and back to
//     the shortest decimal) and lies within 1e-300..1e300; otherwise a JSON
//     string of its exact text. NaN and ±Infinity are strings.
//   - float4, float8: JSON numbers in Postgres's shortest exact form;
//     NaN, Infinity and -Infinity are strings.
//   - json, jsonb: embedded as JSON when the text is valid JSON in valid
//     UTF-8 nested at most MaxEmbeddedJSONDepth (1,000) levels deep;
//     otherwise (a SQL_ASCII database can hold such json; PostgreSQL
//     accepts documents deeper than JSON readers do) a JSON string of the
//     text. The JSON literal null is embedded as null, like
//     SQL NULL; the row's JSON-null list (below) tells them apart.
//   - bytea: the bytes in standard base64.
//   - timestamptz: RFC 3339 in UTC with exactly six fractional digits,
//     "2026-11-29T23:21:24.123456Z". timestamp (without time zone): the same
//     form without a zone designator, "2026-11-29T23:21:24.123456", because it
//     names no instant. 'infinity', '-infinity', BC dates and years beyond
//     9999 are strings of Postgres's text.
//   - arrays of any of these: JSON arrays, nested per dimension, NULL
//     elements as null. An array with explicit bounds ("[0:1]={...}") is
//     a string of its text, since JSON arrays cannot carry lower bounds.
//   - domains: exactly as their base type, the type at the end of the chain
//     of domains: a domain over bool is true/false, over jsonb embedded
//     JSON, over bytea base64, over timestamptz RFC 3339, over int4[] an
//     array of numbers, over an enum or a composite a string. pgoutput's
//     Type message names a domain by its base type, and only a base type in
//     pg_catalog counts as built in: a type that merely shares a built-in's
//     name in another schema (a public._int4) does not.
//   - arrays of enums, composites and every other type not built in:
//     arrays of strings of the elements' text. pgoutput names an array of a
//     domain "_name" without its element type; when the caller describes
//     it (Config.ArrayElement; ColumnInfo.Element for snapshot reads) the
//     elements are encoded exactly as the domain's base type (an array of a
//     domain over int4 is [1,2]), otherwise as strings (["1","2"]). A
//     domain over int4[] is [1,2].
//   - the types initdb creates (OIDs from 10000 to 16383, such as those of
//     information_schema) are not built in: pgoutput describes them in Type
//     messages like user types, and the rules above apply.
//     information_schema.cardinal_number, a domain over int4, is a number;
//     sql_identifier, a domain over name, a string; sql_identifier[] an
//     array of strings.
//   - everything else — text, varchar, uuid, inet, interval, bit strings,
//     ranges, date, time, enums, composites, unknown OIDs: a JSON string of
//     the text.
//
// Whenever a value does not have the form its type promises, it is written as
// a JSON string of its text rather than as invalid JSON. Strings never carry
// invalid UTF-8: each invalid byte becomes U+FFFD. (A logical decoding
// message's content is embedded when it is valid JSON in valid UTF-8 and
// base64 otherwise, so that its bytes are never altered.)
//
// SQL NULL and JSON null. A json or jsonb column (or a domain over one) can
// hold SQL NULL or the JSON literal null, and both are written null in the
// row. A before or after row in which any such column holds the JSON literal
// null is followed by beforeJsonNull or afterJsonNull, the names of those
// columns in column order:
//
//	"after":{"id":1,"doc":null,"meta":null},"afterJsonNull":["doc"]
//
// Here doc holds JSON null and meta is SQL NULL. The lists are absent when
// empty, so an envelope without JSON nulls is unchanged and a reader that
// ignores the lists reads both as null. key carries no list: its values are
// always those of the same columns of after (insert, update) or before
// (delete). This keeps every value where and as it was — a marker in the
// value's place, say {"$jsonNull":true}, would be indistinguishable from a
// document of that shape, and a different form for SQL NULL would change the
// common case — and it costs nothing unless a JSON null occurs. Inside arrays
// (jsonb[]) a JSON null element and a NULL element are both null; the lists
// name columns only.
package decoder

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// LSN is a PostgreSQL WAL position.
type LSN uint64

// String formats the LSN as PostgreSQL does: upper/lower 32 bits in hex.
func (l LSN) String() string {
	return strconv.FormatUint(uint64(l>>32), 16) + "/" + strconv.FormatUint(uint64(uint32(l)), 16)
}

// MarshalText implements encoding.TextMarshaler (JSON as "0/1A2B3C8").
func (l LSN) MarshalText() ([]byte, error) { return []byte(strings.ToUpper(l.String())), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (l *LSN) UnmarshalText(b []byte) error {
	v, err := ParseLSN(string(b))
	*l = v
	return err
}

// ParseLSN parses "X/X" as printed by PostgreSQL.
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("decoder: invalid LSN %q: want X/X", s)
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("decoder: invalid LSN %q: want X/X in hex", s)
	}
	return LSN(h<<32 | l), nil
}

// Op is an envelope's operation.
type Op string

// The operations of DESIGN §3.
const (
	OpInsert   Op = "insert"
	OpUpdate   Op = "update"
	OpDelete   Op = "delete"
	OpTruncate Op = "truncate"
	OpMessage  Op = "message"
	OpResync   Op = "resync"
	// Snapshots (see RowEncoder): a row read from a table, carried like an
	// insert, and the markers that bracket one table's snapshot.
	OpRead          Op = "read"
	OpSnapshotBegin Op = "snapshot-begin"
	OpSnapshotEnd   Op = "snapshot-end"
)

// TenantState says how a change's tenant is known.
type TenantState uint8

const (
	// TenantNone: the entity has no tenant column (or none is configured), or
	// the row's tenant value is NULL. The change belongs to no tenant.
	TenantNone TenantState = iota
	// TenantKnown: Tenant holds the row's tenant value.
	TenantKnown
	// TenantUnresolved: the entity has a tenant column but Postgres did not
	// send it (a key-only DELETE under REPLICA IDENTITY DEFAULT). The journal
	// resolves it from the newest journaled change of the same key.
	TenantUnresolved
)

// Change is one decoded row change (or truncate, or logical message).
//
// Body is the complete envelope JSON object except for "seq" and "entitySeq",
// which the journal assigns, and "tenant" when TenantState is
// TenantUnresolved. It always starts with `{"lsn":` and ends with `}`, so the
// journal can prepend the sequence fields and append a resolved tenant without
// re-encoding.
type Change struct {
	LSN         LSN
	Entity      string // EntityName(schema, table); the message prefix for op "message"
	Op          Op
	Key         []byte // canonical JSON object of the key columns; nil when there is none
	Tenant      string
	TenantState TenantState
	Body        []byte

	// Tenanted says the entity has a tenant column (Config.TenantColumn
	// names one of its columns), whatever this row's value: the journal then
	// keeps the key findable, to route later key-only changes and moves.
	Tenanted bool
	// OldKey, OldTenant and OldTenantState describe the row an update
	// replaced, so that the journal can tell when a row changed tenant
	// (DESIGN §5). OldKey is the old row's key object, a view into Body
	// (its "before"), set only when Postgres sent the old row (a key
	// change, REPLICA IDENTITY FULL) and its key differs from Key; nil means
	// the key did not change. OldTenantState is TenantKnown (OldTenant) or
	// TenantNone (a NULL tenant) when the old row carried the tenant column
	// (REPLICA IDENTITY FULL, or an identity that includes it), and
	// TenantUnresolved when the entity has a tenant column the old row did
	// not carry (REPLICA IDENTITY DEFAULT): the journal then takes the old
	// tenant from the newest journaled change of the old key. For changes
	// other than updates, and entities without a tenant column, all three
	// are zero (TenantNone).
	OldKey         []byte
	OldTenant      string
	OldTenantState TenantState
}

// Envelope is the decoded form of an envelope (DESIGN §3), for readers and
// tests. The hot path never builds one; it writes Change.Body directly.
type Envelope struct {
	Seq        int64                      `json:"seq,omitempty"`
	EntitySeq  int64                      `json:"entitySeq,omitempty"`
	LSN        LSN                        `json:"lsn"`
	CommitLSN  LSN                        `json:"commitLsn"`
	Xid        uint32                     `json:"xid"`
	CommitTime time.Time                  `json:"commitTime"`
	Entity     string                     `json:"entity,omitempty"`
	Op         Op                         `json:"op"`
	Key        map[string]json.RawMessage `json:"key,omitempty"`
	Before     map[string]json.RawMessage `json:"before,omitempty"`
	After      map[string]json.RawMessage `json:"after,omitempty"`
	Unchanged  []string                   `json:"unchanged,omitempty"`
	// The json and jsonb columns of Before and After holding the JSON
	// literal null rather than SQL NULL (see Values in the package doc).
	BeforeJSONNull []string      `json:"beforeJsonNull,omitempty"`
	AfterJSONNull  []string      `json:"afterJsonNull,omitempty"`
	Truncate       *TruncateInfo `json:"truncate,omitempty"`
	// Logical decoding messages (op "message").
	Prefix        string          `json:"prefix,omitempty"`
	Content       json.RawMessage `json:"content,omitempty"`
	Transactional *bool           `json:"transactional,omitempty"`
	Tenant        string          `json:"tenant,omitempty"`
	TenantUnknown bool            `json:"tenantUnknown,omitempty"`
	// Moved is "tenant" on the delete the journal writes before an update
	// that moved its row to another tenant (see journal's package doc).
	Moved    string `json:"moved,omitempty"`
	Oversize bool   `json:"oversize,omitempty"`
	// Quarantine describes a change walcast could not carry as-is (op
	// "quarantine"); see Quarantine.
	Quarantine *Quarantine `json:"quarantine,omitempty"`
}

// TruncateInfo carries the options of a TRUNCATE.
type TruncateInfo struct {
	Cascade         bool `json:"cascade"`
	RestartIdentity bool `json:"restartIdentity"`
}

// Transaction is one committed source transaction and its changes in order.
//
// A large streamed transaction may hold its changes in a spill file rather
// than in memory; read them with Changes and release the transaction with
// Close once it has been journaled (or discarded).
type Transaction struct {
	Xid uint32 // the xid pgoutput sends: the low 32 bits of Xid8
	// Xid8 is the transaction's full 64-bit id (PostgreSQL's xid8, epoch<<32
	// | Xid), which pgoutput does not send: the replicator sets it before
	// the transaction is journaled. 0 when not known.
	Xid8       uint64
	CommitLSN  LSN // LSN of the commit record
	EndLSN     LSN // end of the commit record: the position acknowledged once journaled
	CommitTime time.Time

	n     int
	mem   []Change
	spill changeSource // nil when every change is in mem

	// For a spilled transaction: its changes by entity and op, counted as
	// they were written (spillCounted false: too many groups, not kept).
	spillCounts  []spillCount
	spillCounted bool

	controls [][]byte // Config.ControlPrefix message contents, in order
}

// Controls returns the contents of the transaction's control messages
// (Config.ControlPrefix), in the order they were emitted; nil when none.
// They are not changes: Len does not count them.
func (tx *Transaction) Controls() [][]byte { return tx.controls }

// spillCount is a spilled transaction's number of changes of one entity and op.
type spillCount struct {
	entity string
	op     uint8
	n      int
}

// changeSource yields spilled changes; implemented by the decoder's spill file.
type changeSource interface {
	open() (changeReader, error)
	close() error
}

type changeReader interface {
	// next fills c (whose buffers it may reuse) and reports false at the end.
	next(c *Change) (bool, error)
	close() error
}

// NewTransaction builds an in-memory transaction, for tests and for entries
// the journal writes itself (resync).
func NewTransaction(xid uint32, commitLSN, endLSN LSN, commitTime time.Time, changes []Change) *Transaction {
	return &Transaction{Xid: xid, CommitLSN: commitLSN, EndLSN: endLSN, CommitTime: commitTime, n: len(changes), mem: changes}
}

// Len is the number of changes in the transaction.
func (tx *Transaction) Len() int { return tx.n }

// Changes returns an iterator over the transaction's changes in order. It may
// be called more than once; each iterator reads from the start.
func (tx *Transaction) Changes() *ChangeIter {
	return &ChangeIter{tx: tx, i: -1}
}

// Close releases the transaction's spill file, if any. It is idempotent.
func (tx *Transaction) Close() error {
	if tx.spill == nil {
		return nil
	}
	err := tx.spill.close()
	tx.spill = closedSource{}
	return err
}

// closedSource stands in for a spill file after Close, so that iterating a
// closed transaction fails instead of yielding nothing.
type closedSource struct{}

func (closedSource) open() (changeReader, error) { return nil, errClosed }
func (closedSource) close() error                { return nil }

// ChangeIter iterates over a transaction's changes:
//
//	it := tx.Changes()
//	for it.Next() { c := it.Change() ... }
//	if err := it.Err(); err != nil { ... }
//
// The *Change returned by Change is valid only until the next call to Next;
// copy what must be kept.
type ChangeIter struct {
	tx  *Transaction
	i   int
	r   changeReader
	cur Change
	err error
}

// Next advances to the next change and reports whether there is one.
func (it *ChangeIter) Next() bool {
	if it.err != nil {
		return false
	}
	if it.tx.spill == nil {
		it.i++
		return it.i < len(it.tx.mem)
	}
	if it.r == nil {
		it.r, it.err = it.tx.spill.open()
		if it.err != nil {
			return false
		}
	}
	ok, err := it.r.next(&it.cur)
	if err != nil || !ok {
		it.err = err
		if cerr := it.r.close(); it.err == nil {
			it.err = cerr
		}
		it.r = nil
		it.tx = &Transaction{} // exhausted: further Next calls report false
		return false
	}
	return true
}

// Change is the current change.
func (it *ChangeIter) Change() *Change {
	if it.tx.spill == nil && it.i >= 0 && it.i < len(it.tx.mem) {
		return &it.tx.mem[it.i]
	}
	return &it.cur
}

// Err is the error that stopped iteration, if any.
func (it *ChangeIter) Err() error { return it.err }

// EntityName forms an envelope's entity from a relation's schema and table:
// "schema.table", with a component double-quoted (embedded quotes doubled)
// when it contains '.' or '"' or is empty, so that SplitEntity can always
// take it apart again.
func EntityName(schema, table string) string {
	return quoteEntityPart(schema) + "." + quoteEntityPart(table)
}

func quoteEntityPart(s string) string {
	if s != "" && !strings.ContainsAny(s, `."`) {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// SplitEntity reverses EntityName. It reports false for a string EntityName
// cannot produce.
func SplitEntity(entity string) (schema, table string, ok bool) {
	schema, rest, ok := cutEntityPart(entity)
	if !ok || !strings.HasPrefix(rest, ".") {
		return "", "", false
	}
	table, rest, ok = cutEntityPart(rest[1:])
	if !ok || rest != "" {
		return "", "", false
	}
	return schema, table, true
}

// cutEntityPart reads one component (quoted or bare) from the start of s.
func cutEntityPart(s string) (part, rest string, ok bool) {
	if !strings.HasPrefix(s, `"`) {
		i := strings.IndexByte(s, '.')
		if i < 0 {
			i = len(s)
		}
		if i == 0 || strings.Contains(s[:i], `"`) {
			return "", "", false
		}
		return s[:i], s[i:], true
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] != '"' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '"' {
			b.WriteByte('"')
			i++
			continue
		}
		return b.String(), s[i+1:], true
	}
	return "", "", false
}
