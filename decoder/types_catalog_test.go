package decoder

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/walcast/walcast/internal/pgtest"
)

// catalogRow is a pg_type row of a real server.
type catalogRow struct {
	oid, elem uint32
	ns, name  string
	category  string
	length    int
	elemDelim string // typdelim of the element type, for arrays
}

func (r catalogRow) String() string {
	return r.ns + "." + r.name + " (" + strconv.FormatUint(uint64(r.oid), 10) + ")"
}

// TestCatalogTypes checks the decoder's built-in tables against the
// harness's PostgreSQL:
//   - every type below FirstGenbkiObjectId lives in pg_catalog, so no other
//     type is taken for built in;
//   - every varlena array type below it is in arrayElem with its element
//     type and delimiter;
//   - every pg_catalog type resolves by name (a domain's Type message) to the
//     rule its OID has (catalogType against builtinType), and those from
//     FirstGenbkiObjectId up, which arrive in Type messages under their own
//     names, to an array of strings or text.
func TestCatalogTypes(t *testing.T) {
	url := pgtest.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
SELECT t.oid::int8, t.typelem::int8, t.typnamespace::regnamespace::text, t.typname::text,
       t.typcategory::text, t.typlen::int, coalesce(e.typdelim::text, '')
FROM pg_type t LEFT JOIN pg_type e ON e.oid = t.typelem
WHERE t.oid < 16384 ORDER BY t.oid`)
	if err != nil {
		t.Fatal(err)
	}
	var types []catalogRow
	for rows.Next() {
		var r catalogRow
		var oid, elem int64
		if err := rows.Scan(&oid, &elem, &r.ns, &r.name, &r.category, &r.length, &r.elemDelim); err != nil {
			t.Fatal(err)
		}
		r.oid, r.elem = uint32(oid), uint32(elem)
		types = append(types, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(types) < 400 {
		t.Fatalf("only %d types below 16384", len(types))
	}
	arrays := 0
	for _, r := range types {
		if r.category == "P" {
			continue // pseudo-types (record, _record, ...): no column or domain is of one
		}
		// int2vector and oidvector have typelem but print as "1 2 3": text.
		isArray := r.category == "A" && r.length == -1 && r.elem != 0 && r.name != "int2vector" && r.name != "oidvector"
		if r.oid < firstGenbkiOID {
			if r.ns != "pg_catalog" {
				t.Errorf("%s: below FirstGenbkiObjectId outside pg_catalog", r)
			}
			if elem, ok := arrayElem[r.oid]; ok != isArray || (isArray && elem != r.elem) {
				t.Errorf("%s: arrayElem has %d, %v; pg_type typelem %d, array %v", r, elem, ok, r.elem, isArray)
			}
			if isArray {
				arrays++
				if d := builtinType(r.oid).delim; string(d) != r.elemDelim {
					t.Errorf("%s: delimiter %q, pg_type %q", r, d, r.elemDelim)
				}
			}
			if got, want := catalogType(r.name), builtinType(r.oid); got != want {
				t.Errorf("%s: by name %+v, by OID %+v", r, got, want)
			}
			continue
		}
		if r.ns != "pg_catalog" {
			continue
		}
		want := colType{kind: kText}
		if isArray {
			want = colType{kind: kArray, elem: kText, delim: ','}
		}
		if got := catalogType(r.name); got != want {
			t.Errorf("%s: by name %+v, want %+v", r, got, want)
		}
	}
	if arrays != len(arrayElem) {
		t.Errorf("%d array types below FirstGenbkiObjectId, arrayElem has %d", arrays, len(arrayElem))
	}
}
