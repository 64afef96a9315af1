package main

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

func newTypesCmd(env Env) *cobra.Command {
	var (
		lang   string
		url    string
		schema string
		tables []string
	)
	cmd := &cobra.Command{
		Use:   "types",
		Short: "Print client types of the published tables, from the journal's catalog",
		Long: `types reads the catalog walcast run journals (the newest version of every
published table: key columns, published columns, their types and
nullability) and prints one TypeScript interface per table, the row as
envelopes and live() deliver it, for @walcast/client's live<Row>() and
subscribe<Row>():

  walcast types --lang ts --journal-url "$WALCAST_JOURNAL_URL" > src/walcast-types.ts

Column types map by the envelope's value rules:
  bool                              boolean
  int2, int4, oid, xid, cid         number
  int8                              Int8 = number | string (a string beyond ±2^53)
  numeric                           Numeric = number | string (a string when not
                                    exact in a float64; NaN, ±Infinity)
  float4, float8                    Float = number | 'NaN' | 'Infinity' | '-Infinity'
  json, jsonb                       Json (any JSON value)
  bytea                             string (base64)
  timestamp, timestamptz            string (RFC 3339, microseconds; timestamptz in UTC)
  arrays of these                   PgArray<T> (nested per dimension, null
                                    elements; a string when it has explicit bounds)
  domains                           as their base type
  text, varchar, uuid, date, time,  string
  interval, enums, ranges, anything else
A column that may be NULL adds | null. Each interface is followed by its key
type (the key columns, Pick<Row, …>), and the interface Tables maps every
topic to its row type.

It only reads the journal: it never creates or migrates one, and a journal
that is missing or at another version than this walcast's is an error that
says what to run.

Exit status: 0; 1 when the catalog names no published table (walcast run has
not started on this journal, or --table matched none); 2 for a bad flag, an
unreachable journal, or one missing or at another version.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if lang != "ts" {
				return usageErrorf("types: --lang %q is not supported: give --lang ts (TypeScript)", lang)
			}
			if url == "" {
				return usageErrorf("types: --journal-url is required (or set WALCAST_JOURNAL_URL): the database holding walcast run's journal")
			}
			want := map[string]bool{}
			for _, t := range tables {
				s, n, err := parseTable(t)
				if err != nil {
					return usageErrorf("types: --table %q is not schema.table (a bare name is in public; double-quote a name that holds a dot: public.\"a.b\")", t)
				}
				want[decoder.EntityName(s, n)] = true
			}
			j, err := journal.Open(cmd.Context(), journal.Config{URL: url, Schema: schema, MaxConns: 1, ReadOnly: true})
			if err != nil {
				return startupError(err)
			}
			defer j.Close()
			entries, err := j.CatalogTables(cmd.Context())
			if err != nil {
				return startupError(err)
			}
			var pub []journal.CatalogEntry
			for _, e := range entries {
				if e.Published && (len(want) == 0 || want[e.Entity()]) {
					pub = append(pub, e)
				}
			}
			if len(pub) == 0 {
				what := "no published table"
				if len(want) > 0 {
					what = "no published table named by --table"
				}
				return withCode(exitFailed, fmt.Errorf("types: the catalog of journal schema %q has %s: walcast run writes it when it starts on this journal (check --journal-url and --journal-schema)", schema, what))
			}
			return withCode(exitFailed, writeTypeScript(cmd.OutOrStdout(), schema, pub))
		},
	}
	cmd.Flags().StringVar(&lang, "lang", "", "language of the types: ts (TypeScript)")
	cmd.Flags().StringVar(&url, "journal-url", "", "journal database (the --journal-url of walcast run, or its --database-url when that is unset)")
	cmd.Flags().StringVar(&schema, "journal-schema", journal.DefaultSchema, "schema of the journal")
	cmd.Flags().StringSliceVar(&tables, "table", nil, "only these tables, schema.table (a bare name is in public; repeat or separate with commas); default every published table")
	return cmd
}

// tsPrelude declares the types the interfaces use for the values whose
// JSON form depends on the value (decoder's Values rules).
const tsPrelude = `/** A json or jsonb value (a document JSON readers reject arrives as its text, a string). */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
/** int8: a number from -2^53 to 2^53, beyond that a string of its decimal digits. */
export type Int8 = number | string;
/**
 * numeric: a number when a float64 holds it exactly (an integer within
 * ±2^53, or at most 15 significant digits within 1e-300..1e300), otherwise
 * a string of its exact text; NaN, Infinity and -Infinity are strings.
 */
export type Numeric = number | string;
/** float4, float8: a number; NaN, Infinity and -Infinity are strings. */
export type Float = number | 'NaN' | 'Infinity' | '-Infinity';
/**
 * An array: nested per dimension, NULL elements as null; an array with
 * explicit bounds ('[0:1]={…}') arrives as a string of its text.
 */
export type PgArray<T> = PgArrayOf<T> | string;
export type PgArrayOf<T> = (T | null | PgArrayOf<T>)[];
`

// tsType is the TypeScript type of the values of c (NULL aside).
func tsType(c journal.CatalogColumn) string {
	j := decoder.JSONOf(c.ColumnInfo())
	var t string
	switch j.Kind {
	case decoder.JSONBool:
		t = "boolean"
	case decoder.JSONInteger:
		t = "number"
	case decoder.JSONInt8:
		t = "Int8"
	case decoder.JSONFloat:
		t = "Float"
	case decoder.JSONNumeric:
		t = "Numeric"
	case decoder.JSONEmbedded:
		t = "Json"
	default: // strings: text, bytea (base64), timestamps, everything else
		t = "string"
	}
	if j.Array {
		return "PgArray<" + t + ">"
	}
	return t
}

// builtinTypeNames names the built-in types a column comment mentions;
// others are named by their oid.
var builtinTypeNames = map[uint32]string{
	16: "bool", 17: "bytea", 18: "char", 19: "name", 20: "int8", 21: "int2", 23: "int4", 25: "text", 26: "oid", 28: "xid", 29: "cid",
	114: "json", 142: "xml", 650: "cidr", 700: "float4", 701: "float8", 829: "macaddr", 869: "inet", 1042: "bpchar", 1043: "varchar",
	1082: "date", 1083: "time", 1114: "timestamp", 1184: "timestamptz", 1186: "interval", 1266: "timetz", 1560: "bit", 1562: "varbit",
	1700: "numeric", 2950: "uuid", 3802: "jsonb", 3904: "int4range", 3906: "numrange", 3912: "daterange", 3926: "int8range",
	3910: "tstzrange", 3908: "tsrange",
	1000: "bool[]", 1001: "bytea[]", 1005: "int2[]", 1007: "int4[]", 1009: "text[]", 1015: "varchar[]", 1016: "int8[]",
	1021: "float4[]", 1022: "float8[]", 1115: "timestamp[]", 1182: "date[]", 1185: "timestamptz[]", 1231: "numeric[]",
	2951: "uuid[]", 199: "json[]", 3807: "jsonb[]",
}

// pgTypeName is how a column comment names c's type.
func pgTypeName(c journal.CatalogColumn) string {
	if c.BaseName != "" {
		n := c.BaseName
		if strings.HasPrefix(n, "_") {
			n = n[1:] + "[]"
		}
		if c.BaseSchema != "" && c.BaseSchema != "pg_catalog" {
			n = c.BaseSchema + "." + n
		}
		return n
	}
	if n, ok := builtinTypeNames[c.TypeOID]; ok {
		return n
	}
	return fmt.Sprintf("type oid %d", c.TypeOID)
}

var tsIdent = regexp.MustCompile(`^[A-Za-z_$][A-Za-z0-9_$]*$`)

// tsProp is a column name as a property name: bare when an identifier,
// otherwise a string literal.
func tsProp(name string) string {
	if tsIdent.MatchString(name) {
		return name
	}
	b, _ := json.Marshal(name)
	return string(b)
}

// pascal turns a SQL name into a PascalCase identifier: letters and digits
// kept, every other character a word break.
func pascal(s string) string {
	var b strings.Builder
	up := true
	for _, r := range s {
		if !(unicode.IsLetter(r) || unicode.IsDigit(r)) || r > unicode.MaxASCII {
			up = true
			continue
		}
		if up {
			r = unicode.ToUpper(r)
			up = false
		}
		b.WriteRune(r)
	}
	return b.String()
}

// typeNames picks an interface name per table: the table's name in
// PascalCase, prefixed by its schema's outside public or where two
// tables would share a name; a numeric suffix where they still would.
func typeNames(entries []journal.CatalogEntry) []string {
	reserved := map[string]bool{"Json": true, "Int8": true, "Numeric": true, "Float": true, "PgArray": true, "PgArrayOf": true, "Tables": true}
	short := func(e journal.CatalogEntry) string {
		n := pascal(e.Name)
		if e.Schema != "public" {
			n = pascal(e.Schema) + n
		}
		return n
	}
	count := map[string]int{}
	for _, e := range entries {
		count[short(e)]++
	}
	used := map[string]bool{}
	names := make([]string, len(entries))
	for i, e := range entries {
		n := short(e)
		if count[n] > 1 || reserved[n] {
			n = pascal(e.Schema) + "_" + pascal(e.Name)
		}
		if n == "" || !unicode.IsLetter(rune(n[0])) {
			n = "T" + n
		}
		base := n
		for k := 2; used[n] || used[n+"Key"] || reserved[n] || reserved[n+"Key"]; k++ {
			n = fmt.Sprintf("%s%d", base, k)
		}
		used[n], used[n+"Key"] = true, true
		names[i] = n
	}
	return names
}

// writeTypeScript prints the TypeScript module of entries (published
// tables, in name order).
func writeTypeScript(w io.Writer, schema string, entries []journal.CatalogEntry) error {
	var b strings.Builder
	fmt.Fprintf(&b, "// Row types of the tables published through walcast, from the catalog of\n// journal schema %q. Generated by `walcast types --lang ts`; do not edit.\n\n", schema)
	b.WriteString(tsPrelude)
	names := typeNames(entries)
	for i, e := range entries {
		name := names[i]
		fmt.Fprintf(&b, "\n/**\n * %s (catalog version %d): replica identity %s", e.Entity(), e.Version, e.ReplicaIdentity)
		if keys := e.KeyColumns(); len(keys) > 0 {
			fmt.Fprintf(&b, ", key %s", strings.Join(keys, ", "))
		}
		if e.TenantColumn != "" {
			fmt.Fprintf(&b, ", tenant column %s", e.TenantColumn)
		}
		b.WriteString(".")
		if e.RowFilter != "" {
			fmt.Fprintf(&b, "\n * Rows: WHERE %s.", strings.ReplaceAll(e.RowFilter, "*/", "* /"))
		}
		if e.TenantUnscoped {
			b.WriteString("\n * Its tenant column is not published: no reader gets its rows.")
		}
		fmt.Fprintf(&b, "\n */\nexport interface %s {\n", name)
		for _, c := range e.Columns {
			var notes []string
			notes = append(notes, strings.ReplaceAll(pgTypeName(c), "*/", "* /"))
			if c.Key {
				notes = append(notes, "key")
			}
			if c.NotNull {
				notes = append(notes, "not null")
			}
			t := tsType(c)
			if !c.NotNull {
				t += " | null"
			}
			fmt.Fprintf(&b, "  /** %s */\n  %s: %s;\n", strings.Join(notes, ", "), tsProp(c.Name), t)
		}
		b.WriteString("}\n")
		var keys []string
		for _, k := range e.KeyColumns() {
			q, _ := json.Marshal(k)
			keys = append(keys, string(q))
		}
		fmt.Fprintf(&b, "/** The key columns of %s: an envelope's key. */\n", e.Entity())
		if len(keys) == 0 {
			fmt.Fprintf(&b, "export type %sKey = Record<string, never>;\n", name)
		} else {
			fmt.Fprintf(&b, "export type %sKey = Pick<%s, %s>;\n", name, name, strings.Join(keys, " | "))
		}
	}
	b.WriteString("\n/** The row type of every topic: live<Tables['public.orders']>(…). */\nexport interface Tables {\n")
	for i, e := range entries {
		t, _ := json.Marshal(e.Entity())
		fmt.Fprintf(&b, "  %s: %s;\n", t, names[i])
	}
	b.WriteString("}\n")
	_, err := io.WriteString(w, b.String())
	return err
}
