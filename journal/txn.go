package journal

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/walcast/walcast/decoder"
)

// Transactions in the journal.
//
// An append journals whole source transactions (write.go takes
// decoder.Transactions, each complete, streamed ones included once their
// stream commit arrived), so the entries of one transaction are contiguous
// in seq, share commit_lsn (the commit end LSN), and the horizon is always a
// transaction boundary. Nothing of this is stored beyond commit_lsn: a
// reader finds where a transaction ends within its scope by looking at the
// next entry of that scope (Entry.TxnEnd), and TxnRest describes the part of
// a transaction after a seq for readers that must look further.

// TxnMember is one (entity, tenant) class of entries of a transaction, as
// TxnRest reports them.
type TxnMember struct {
	Entity        string
	Tenant        string
	HasTenant     bool
	TenantUnknown bool
}

// txnRestFirstWindow and txnRestMaxWindow bound the entries one query of
// TxnRest scans: the first window is small (the next transaction usually
// starts right after), later ones grow to the largest.
const (
	txnRestFirstWindow = 64
	txnRestMaxWindow   = 16384
)

// TxnRest returns, for the transaction whose commit end LSN is commit, the
// last seq of each (entity, tenant) class among its entries after seq
// after; empty when the transaction has no entry after it. It reads the
// journal from after+1 until an entry of another transaction or the
// horizon, in bounded windows (one query for an ordinary transaction; a
// transaction of n more entries costs about n/16384 queries), and only the
// columns that classify entries, never envelopes.
func (j *Journal) TxnRest(ctx context.Context, after int64, commit decoder.LSN) (map[TxnMember]int64, error) {
	const op = "journal.TxnRest"
	ctx, cancel := j.callCtx(ctx)
	defer cancel()
	conn, err := j.pool.acquire(ctx)
	if err != nil {
		return nil, opErr(op, err, "")
	}
	defer j.pool.release(conn)
	out := map[TxnMember]int64{}
	lo, w := after, int64(txnRestFirstWindow)
	for {
		var horizon int64
		ended := false
		err := queryInOrder(ctx, conn, `SELECT b.horizon, e.same, e.entity, e.tenant, e.tenant_unknown, e.last
			FROM (SELECT m.next_seq - 1 AS horizon FROM `+j.sql.meta+` m LIMIT 1) b
			LEFT JOIN LATERAL (
				SELECT e.commit_lsn = $3::bigint AS same, e.entity, e.tenant, e.tenant_unknown, max(e.seq) AS last
				FROM `+j.entriesIn("$1::bigint", "$1::bigint + $2::bigint", "entity", "tenant", "tenant_unknown", "commit_lsn")+` e
				GROUP BY 1, 2, 3, 4
			) e ON true`, []any{lo, w, int64(commit)}, func(rows pgx.Rows) error {
			var same, unknown pgtype.Bool
			var entity, tenant pgtype.Text
			var last pgtype.Int8
			if err := rows.Scan(&horizon, &same, &entity, &tenant, &unknown, &last); err != nil {
				return err
			}
			switch {
			case !same.Valid: // no entry in the window
			case !same.Bool:
				ended = true
			default:
				k := TxnMember{Entity: entity.String, Tenant: tenant.String, HasTenant: tenant.Valid, TenantUnknown: unknown.Bool}
				out[k] = max(out[k], last.Int64)
			}
			return nil
		})
		if err != nil {
			return nil, opErr(op, err, "")
		}
		if ended || lo+w >= horizon {
			return out, nil
		}
		lo += w
		w = min(w*4, txnRestMaxWindow)
	}
}

// sees reports whether a reader of scope s is given entries of class k.
func (s scope) sees(k TxnMember) bool {
	if len(s.entities) > 0 {
		if _, ok := slices.BinarySearch(s.entities, k.Entity); !ok {
			return false
		}
	}
	switch {
	case s.allTenants:
		return true
	case k.TenantUnknown:
		return false
	case !k.HasTenant:
		return true
	}
	return s.tenant != "" && k.Tenant == s.tenant
}
