package journal

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
)

// Acquire makes the caller the journal's appender: it bumps the fencing
// generation and returns the new one, which every later Append, Advance,
// AppendResync and SetSource must present. Any appender holding an older
// generation is refused from then on; an append already holding the meta row
// lock when Acquire runs commits first and Acquire waits for it.
func (j *Journal) Acquire(ctx context.Context) (int64, error) {
	var gen int64
	if err := j.queryRow(ctx, "UPDATE "+j.sql.meta+" SET generation = generation + 1 RETURNING generation", nil, &gen); err != nil {
		return 0, opErr("journal.Acquire", err, "")
	}
	return gen, nil
}

// Generation returns the current fencing generation.
func (j *Journal) Generation(ctx context.Context) (int64, error) {
	var gen int64
	if err := j.queryRow(ctx, "SELECT generation FROM "+j.sql.meta, nil, &gen); err != nil {
		return 0, opErr("journal.Generation", err, "")
	}
	return gen, nil
}

func fencedErr(op string, gen int64) error {
	return &Error{Op: op, Err: fmt.Errorf("%w (generation %d is no longer current)", ErrFenced, gen),
		Fix: "another walcast run took over this journal; this process must stop replicating and restart as a standby"}
}

// AppendResult reports what an append did.
type AppendResult struct {
	// Watermark is the journal watermark after the append.
	Watermark decoder.LSN
	// FirstSeq and LastSeq bound the contiguous seqs assigned, in the order
	// the changes were given; both are 0 when no entry was written.
	FirstSeq, LastSeq int64
	// Entries is the number of entries written (LastSeq-FirstSeq+1, or 0).
	Entries int
	// Transactions is the number of source transactions journaled (including
	// empty ones, which only advance the watermark); Skipped the number
	// skipped as replays (commit end LSN at or below the watermark).
	Transactions, Skipped int
	// TenantUnknown counts key-only changes whose tenant could not be
	// resolved (DESIGN §5); they are delivered to no tenant-scoped reader.
	TenantUnknown int
}

// Append journals a batch of committed source transactions, in commit order,
// in one Postgres transaction: it assigns contiguous seqs and per-entity
// contiguous entitySeqs, writes every change with COPY (streaming spilled
// transactions without materialising them), advances the watermark to the
// greatest commit end LSN journaled and notifies waiting readers.
//
// Transactions whose EndLSN is at or below the watermark (or at or below an
// earlier transaction of the same batch) are replays and are skipped. An
// empty transaction above the watermark writes no entry but advances it.
//
// gen must be the current fencing generation (Acquire); otherwise the error
// wraps ErrFenced and nothing is written, even when Acquire races the append.
// On any error nothing is written. The caller keeps ownership of the
// transactions (it closes them).
func (j *Journal) Append(ctx context.Context, gen int64, txs []*decoder.Transaction) (AppendResult, error) {
	return j.append(ctx, "journal.Append", gen, txs, appendOpts{})
}

// Advance moves the watermark to lsn without writing an entry, when lsn is
// above it: for positions the replicator may confirm although no published
// change was there (a keepalive while nothing is in flight), so that the slot
// never runs ahead of the watermark. Fenced like Append.
func (j *Journal) Advance(ctx context.Context, gen int64, lsn decoder.LSN) (AppendResult, error) {
	tx := decoder.NewTransaction(0, lsn, lsn, time.Time{}, nil)
	return j.append(ctx, "journal.Advance", gen, []*decoder.Transaction{tx}, appendOpts{})
}

// Resync describes a resync entry (DESIGN §4.2, §5).
type Resync struct {
	// Reason is an operator-facing explanation carried in the envelope.
	Reason string
	// Watermark is the position the new stream starts from. When
	// ResetWatermark is set it replaces the watermark even if lower (a
	// restored or promoted source, whose LSNs can lie behind the old ones);
	// otherwise the watermark is kept.
	Watermark      decoder.LSN
	ResetWatermark bool
	// Source, when non-nil, is recorded in the same transaction.
	Source *Source
	// Time is the envelope's commitTime; zero means now.
	Time time.Time
}

// AppendResync journals an op:"resync" envelope (entity "", no tenant). Every
// cursor from before it gets ResyncRequired from Changes. Fenced like Append.
func (j *Journal) AppendResync(ctx context.Context, gen int64, r Resync) (AppendResult, error) {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	r.Time = r.Time.UTC()
	wm := r.Watermark
	if !r.ResetWatermark {
		cur, err := j.Watermark(ctx)
		if err != nil {
			return AppendResult{}, err
		}
		wm = cur
	}
	var body bytes.Buffer
	body.WriteString(`{"lsn":"`)
	body.WriteString(wm.String())
	body.WriteString(`","commitLsn":"`)
	body.WriteString(wm.String())
	body.WriteString(`","xid":0,"commitTime":"`)
	body.WriteString(r.Time.Format("2006-01-02T15:04:05.000000Z07:00"))
	body.WriteString(`","op":"resync","reason":`)
	reason, _ := json.Marshal(r.Reason)
	body.Write(reason)
	body.WriteString(`}`)
	tx := decoder.NewTransaction(0, wm, wm, r.Time, []decoder.Change{{LSN: wm, Op: decoder.OpResync, Body: body.Bytes()}})
	return j.append(ctx, "journal.AppendResync", gen, []*decoder.Transaction{tx}, appendOpts{force: true, resetWatermark: r.ResetWatermark, source: r.Source})
}

type appendOpts struct {
	force          bool // journal even at or below the watermark (resync)
	resetWatermark bool // set the watermark to the last transaction's EndLSN even if lower
	source         *Source
}

// entryColumns is the COPY column order; copySource.row follows it.
var entryColumns = []string{"seq", "entity", "entity_seq", "tenant", "tenant_unknown", "op",
	"key_hash", "key", "lsn", "commit_lsn", "xid", "commit_time", "size", "envelope"}

func (j *Journal) append(ctx context.Context, op string, gen int64, txs []*decoder.Transaction, o appendOpts) (res AppendResult, err error) {
	if gen < 1 {
		return AppendResult{}, &Error{Op: op, Err: fmt.Errorf("%w (generation %d was never acquired)", ErrFenced, gen), Fix: "call Acquire before appending"}
	}
	j.appendMu.Lock()
	defer j.appendMu.Unlock()
	defer func() {
		if err != nil {
			j.cacheNext = 0 // the outcome may be ambiguous: reload next time
		}
	}()

	conn, err := j.pool.acquire(ctx)
	if err != nil {
		return AppendResult{}, opErr(op, err, "")
	}
	defer j.pool.release(conn)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return AppendResult{}, opErr(op, err, "")
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit

	var curGen, wm, nextSeq int64
	if err := tx.QueryRow(ctx, "SELECT generation, watermark, next_seq FROM "+j.sql.meta+" FOR UPDATE").Scan(&curGen, &wm, &nextSeq); err != nil {
		return AppendResult{}, opErr(op, err, "")
	}
	if curGen != gen {
		return AppendResult{}, fencedErr(op, gen)
	}

	// Replays: keep transactions strictly above the running watermark.
	kept := make([]*decoder.Transaction, 0, len(txs))
	newWM := wm
	for _, t := range txs {
		if t.EndLSN > math.MaxInt64 {
			return AppendResult{}, opErr(op, fmt.Errorf("commit end LSN %s does not fit the journal's bigint", t.EndLSN), "")
		}
		if !o.force && int64(t.EndLSN) <= newWM {
			res.Skipped++
			continue
		}
		kept = append(kept, t)
		if o.resetWatermark || int64(t.EndLSN) > newWM {
			newWM = int64(t.EndLSN)
		}
	}
	res.Transactions = len(kept)

	if j.cacheNext != nextSeq {
		if err := j.loadEntitySeqs(ctx, tx); err != nil {
			return AppendResult{}, opErr(op, err, "")
		}
		j.cacheNext = nextSeq
	}
	resolve, err := j.lookupTenants(ctx, tx, kept)
	if err != nil {
		return AppendResult{}, opErr(op, err, "")
	}

	src := &copySource{txs: kept, next: nextSeq, base: j.entitySeqs, dirty: map[string]int64{}, resolve: resolve}
	if _, err := tx.CopyFrom(ctx, j.sql.entriesIdent, entryColumns, src); err != nil {
		if src.err != nil {
			err = src.err
		}
		return AppendResult{}, opErr(op, fmt.Errorf("copy entries: %w", err), "")
	}
	if src.err != nil { // a source error stops the COPY early without failing it
		return AppendResult{}, opErr(op, src.err, "")
	}
	written := src.next - nextSeq

	b := &pgx.Batch{}
	b.Queue("UPDATE "+j.sql.meta+" SET watermark = $1, next_seq = $2, appended_bytes = appended_bytes + $3, resync_seq = greatest(resync_seq, $4)",
		newWM, src.next, src.bytes, src.resyncSeq)
	if o.source != nil {
		b.Queue("UPDATE "+j.sql.meta+" SET system_id = $1, timeline = $2, slot = $3", o.source.SystemID, o.source.Timeline, o.source.Slot)
	}
	if len(src.dirty) > 0 {
		ents := make([]string, 0, len(src.dirty))
		seqs := make([]int64, 0, len(src.dirty))
		for e, s := range src.dirty {
			ents = append(ents, e)
			seqs = append(seqs, s)
		}
		b.Queue("INSERT INTO "+j.sql.entitySeqs+" (entity, last_seq) SELECT * FROM unnest($1::text[], $2::bigint[]) "+
			"ON CONFLICT (entity) DO UPDATE SET last_seq = excluded.last_seq", ents, seqs)
	}
	if written > 0 {
		b.Queue("SELECT pg_notify($1, $2)", j.channel, strconv.FormatInt(src.next-1, 10))
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return AppendResult{}, opErr(op, err, "")
	}
	if err := tx.Commit(ctx); err != nil {
		return AppendResult{}, opErr(op, fmt.Errorf("commit: %w", err), "")
	}

	for e, s := range src.dirty {
		j.entitySeqs[e] = s
	}
	j.cacheNext = src.next
	res.Watermark = decoder.LSN(newWM)
	res.Entries = int(written)
	if written > 0 {
		res.FirstSeq, res.LastSeq = nextSeq, src.next-1
	}
	res.TenantUnknown = src.unknown
	return res, nil
}

func (j *Journal) loadEntitySeqs(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, "SELECT entity, last_seq FROM "+j.sql.entitySeqs)
	if err != nil {
		return err
	}
	m := map[string]int64{}
	var e string
	var s int64
	_, err = pgx.ForEachRow(rows, []any{&e, &s}, func() error { m[e] = s; return nil })
	if err != nil {
		return err
	}
	j.entitySeqs = m
	return nil
}

// tenantRes is what is known of a key's tenant: found says a change of the
// key is known (journaled or earlier in the batch); tenant is nil when that
// change had no tenant.
type tenantRes struct {
	found  bool
	tenant *string
}

// lookupTenants finds, for every key of a key-only change with an unresolved
// tenant, the tenant of the newest journaled change of that key. It returns
// nil when the batch has no such change (the common case: one cheap pass over
// in-memory changes). The map is entity → key → resolution and also covers
// keys resolved later in the batch itself (copySource updates it).
func (j *Journal) lookupTenants(ctx context.Context, tx pgx.Tx, txs []*decoder.Transaction) (map[string]map[string]*tenantRes, error) {
	var ents, keys []string
	var hashes []int64
	var m map[string]map[string]*tenantRes
	for _, t := range txs {
		it := t.Changes()
		for it.Next() {
			c := it.Change()
			if c.TenantState != decoder.TenantUnresolved || c.Key == nil {
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
			if _, ok := km[string(c.Key)]; ok {
				continue
			}
			km[string(c.Key)] = &tenantRes{}
			ents = append(ents, c.Entity)
			keys = append(keys, string(c.Key))
			hashes = append(hashes, keyHash(c.Entity, c.Key))
		}
		if err := it.Err(); err != nil {
			return nil, fmt.Errorf("read transaction %d: %w", t.Xid, err)
		}
	}
	if m == nil {
		return nil, nil
	}
	rows, err := tx.Query(ctx, `SELECT u.entity, u.key, l.tenant FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(entity, key, h)
		JOIN LATERAL (SELECT e.tenant FROM `+j.sql.entries+` e
			WHERE e.key_hash = u.h AND e.entity = u.entity AND e.key = u.key AND NOT e.tenant_unknown
			ORDER BY e.seq DESC LIMIT 1) l ON true`, ents, keys, hashes)
	if err != nil {
		return nil, err
	}
	var e, k string
	var tenant *string
	_, err = pgx.ForEachRow(rows, []any{&e, &k, &tenant}, func() error {
		m[e][k] = &tenantRes{found: true, tenant: tenant}
		return nil
	})
	if err != nil {
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

// copySource streams a batch's changes into COPY as journal rows.
type copySource struct {
	txs     []*decoder.Transaction
	ti      int
	cur     *decoder.Transaction
	it      *decoder.ChangeIter
	next    int64                            // seq of the next row
	base    map[string]int64                 // entitySeqs before the batch (read only)
	dirty   map[string]int64                 // entitySeqs assigned in the batch
	resolve map[string]map[string]*tenantRes // nil when no change needs resolving

	buf       []byte
	row       [14]any
	bytes     int64
	unknown   int
	resyncSeq int64
	err       error
}

func (s *copySource) Next() bool {
	for {
		if s.err != nil {
			return false
		}
		if s.it == nil {
			if s.ti >= len(s.txs) {
				return false
			}
			s.cur = s.txs[s.ti]
			s.ti++
			s.it = s.cur.Changes()
		}
		if s.it.Next() {
			s.err = s.build(s.it.Change())
			return s.err == nil
		}
		if err := s.it.Err(); err != nil {
			s.err = fmt.Errorf("read transaction %d: %w", s.cur.Xid, err)
			return false
		}
		s.it = nil
	}
}

func (s *copySource) Values() ([]any, error) { return s.row[:], nil }

func (s *copySource) Err() error { return s.err }

var (
	seqPrefix       = []byte(`{"seq":`)
	entitySeqInfix  = []byte(`,"entitySeq":`)
	tenantUnknownKV = []byte(`,"tenantUnknown":true}`)
)

func (s *copySource) build(c *decoder.Change) error {
	t := s.cur
	body := c.Body
	if len(body) < 3 || body[0] != '{' || body[1] != '"' || body[len(body)-1] != '}' {
		return fmt.Errorf("change at %s in transaction %d: body is not a JSON object starting with a field", c.LSN, t.Xid)
	}
	if c.LSN > math.MaxInt64 {
		return fmt.Errorf("change LSN %s does not fit the journal's bigint", c.LSN)
	}
	seq := s.next
	s.next++
	es, ok := s.dirty[c.Entity]
	if !ok {
		es = s.base[c.Entity]
	}
	es++
	s.dirty[c.Entity] = es
	if c.Op == decoder.OpResync {
		s.resyncSeq = seq
	}

	var tenant any
	unknown := false
	var suffix []byte // replaces the body's closing brace when non-nil
	switch c.TenantState {
	case decoder.TenantKnown:
		tenant = c.Tenant
	case decoder.TenantUnresolved:
		var r *tenantRes
		if c.Key != nil && s.resolve != nil {
			r = s.resolve[c.Entity][string(c.Key)]
		}
		switch {
		case r == nil || !r.found:
			unknown = true
			s.unknown++
			suffix = tenantUnknownKV
		case r.tenant != nil:
			tenant = *r.tenant
			q, _ := json.Marshal(*r.tenant)
			suffix = append(append([]byte(`,"tenant":`), q...), '}')
		}
	}
	if s.resolve != nil && c.Key != nil && c.TenantState != decoder.TenantUnresolved {
		if r := s.resolve[c.Entity][string(c.Key)]; r != nil {
			r.found = true
			r.tenant = nil
			if c.TenantState == decoder.TenantKnown {
				v := c.Tenant
				r.tenant = &v
			}
		}
	}

	b := append(s.buf[:0], seqPrefix...)
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, entitySeqInfix...)
	b = strconv.AppendInt(b, es, 10)
	b = append(b, ',')
	if suffix == nil {
		b = append(b, body[1:]...)
	} else {
		b = append(b, body[1:len(body)-1]...)
		b = append(b, suffix...)
	}
	s.buf = b

	var keyHashV, keyV any
	if c.Key != nil {
		keyHashV = keyHash(c.Entity, c.Key)
		keyV = c.Key
	}
	s.bytes += int64(len(b))
	s.row = [14]any{seq, c.Entity, es, tenant, unknown, string(c.Op), keyHashV, keyV,
		int64(c.LSN), int64(t.EndLSN), int64(t.Xid), t.CommitTime, int32(len(b)), b}
	return nil
}
