package replication

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// journalRelations returns the relation OIDs of journal j's own tables when
// the journal lives in the database conn is connected to, and nil when it
// lives elsewhere (DESIGN §4.10). Identity, not name: the source database
// has the journal only if a table schema.meta there holds this journal's id,
// so a source schema that happens to share the journal's name is data.
//
// When the source role may not read schema.meta, every table of the schema
// is taken to be the journal's (ok is false so the caller can say so).
func journalRelations(ctx context.Context, conn *pgconn.PgConn, schema string, id [16]byte) (oids map[uint32]bool, ok bool, err error) {
	lit := "convert_from(decode('" + hex.EncodeToString([]byte(schema)) + "', 'hex'), 'UTF8')"
	res, err := conn.Exec(ctx, `SELECT c.oid, c.relname = 'meta' FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = `+lit+` AND c.relkind IN ('r', 'p')`).ReadAll()
	if err != nil {
		return nil, false, fmt.Errorf("look up the journal's tables in the source database: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) == 0 {
		return nil, true, nil
	}
	all := map[uint32]bool{}
	hasMeta := false
	for _, row := range res[0].Rows {
		oid, perr := strconv.ParseUint(string(row[0]), 10, 32)
		if perr != nil {
			return nil, false, fmt.Errorf("look up the journal's tables: relation OID %q: %w", row[0], perr)
		}
		all[uint32(oid)] = true
		hasMeta = hasMeta || string(row[1]) == "t"
	}
	if !hasMeta {
		return nil, true, nil
	}
	ident := `"` + strings.ReplaceAll(schema, `"`, `""`) + `"`
	res, err = conn.Exec(ctx, "SELECT journal_id::text FROM "+ident+".meta").ReadAll()
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return all, false, nil
		}
		return nil, false, fmt.Errorf("read the journal id in the source database: %w", err)
	}
	want := uuidString(id)
	for _, r := range res {
		for _, row := range r.Rows {
			if string(row[0]) == want {
				return all, true, nil
			}
		}
	}
	return nil, true, nil
}

func uuidString(id [16]byte) string {
	h := hex.EncodeToString(id[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
