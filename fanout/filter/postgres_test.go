package filter

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// pgCol is a column of the cross-check table: its SQL type, its
// ColumnInfo, the text forms its rows take and the filter values tested
// against it (each a JSON constant and the text PostgreSQL reads it from).
type pgCol struct {
	name, sqlType string
	info          decoder.ColumnInfo
	rowValues     []string
	constants     func(r *rand.Rand) (js, text string)
}

func pgCols() []pgCol {
	num := func(vals ...string) func(r *rand.Rand) (string, string) {
		return func(r *rand.Rand) (string, string) {
			v := vals[r.IntN(len(vals))]
			return v, v
		}
	}
	i8s := []string{"0", "1", "-1", "42", "9007199254740992", "9007199254740993", "-9007199254740993", "9223372036854775807", "-9223372036854775808", "123456789"}
	nums := []string{"0", "1.5", "1.50", "-1.5", "0.1", "9007199254740992", "9007199254740993", "1e-20", "0.00000000000000000001",
		"123456789012345678901234567890.123456789", "123456789012345678901234567890.12345678", "-42", "NaN", "Infinity", "-Infinity"}
	f8s := []string{"0", "-0", "0.1", "0.30000000000000004", "0.3", "1e308", "-1e308", "5e-324", "2.5", "-2.5", "NaN", "Infinity", "-Infinity"}
	texts := []string{"", "a", "A", "Z", "z", "é", "%", ".*", `\`, "a b", "ab", "a\t", "\x01", "😀", "zz", "paid", "Paid", "eu", "us", "a%b", "'", `"`}
	tss := []string{"2026-11-29 23:21:24.123456+00", "2026-11-29 23:21:24+00", "1999-12-31 23:59:59.999999+00", "2000-01-01 00:00:00+00",
		"1970-01-01 00:00:00+00", "2024-02-29 12:00:00+00", "infinity", "-infinity", "0044-03-15 12:00:00+00 BC", "10000-01-01 00:00:00+00"}
	f4s := []string{"0", "-0", "0.1", "1.5", "-1.5", "3.4028235e38", "16777217", "NaN", "Infinity", "-Infinity"}
	bps := []string{"", "a", "a ", " a", "ab", "abcd", "A", "é"}
	uuids := []string{"00000000-0000-0000-0000-000000000000", "0b7e5a1c-61f2-4b0e-9d0a-6f1c2e3d4a5b", "ffffffff-ffff-ffff-ffff-ffffffffffff",
		"0b7e5a1c-61f2-4b0e-9d0a-6f1c2e3d4a5c", "a0000000-0000-0000-0000-000000000000"}
	tsns := []string{"2026-11-29 23:21:24.123456", "2026-11-29 23:21:24", "2000-01-01 00:00:00", "1999-12-31 23:59:59.999999",
		"infinity", "-infinity", "0044-03-15 12:00:00 BC", "10000-01-01 00:00:00"}
	return []pgCol{
		{name: "i4", sqlType: "int4", info: decoder.ColumnInfo{TypeOID: 23},
			rowValues: []string{"0", "1", "-1", "2", "100", "2147483647", "-2147483648", "7"},
			constants: num("0", "1", "-1", "2", "100", "2147483647", "-2147483648", "50", "3")},
		{name: "i8", sqlType: "int8", info: decoder.ColumnInfo{TypeOID: 20}, rowValues: i8s,
			constants: func(r *rand.Rand) (string, string) {
				v := i8s[r.IntN(len(i8s))]
				if r.IntN(2) == 0 {
					return strconv.Quote(v), v
				}
				return v, v
			}},
		{name: "n", sqlType: "numeric", info: decoder.ColumnInfo{TypeOID: 1700}, rowValues: nums,
			constants: func(r *rand.Rand) (string, string) {
				v := nums[r.IntN(len(nums))]
				if _, err := strconv.ParseFloat(v, 64); err != nil || v == "NaN" || strings.Contains(v, "Inf") || r.IntN(2) == 0 {
					return strconv.Quote(v), v
				}
				return v, v
			}},
		{name: "f8", sqlType: "float8", info: decoder.ColumnInfo{TypeOID: 701}, rowValues: f8s,
			constants: func(r *rand.Rand) (string, string) {
				v := f8s[r.IntN(len(f8s))]
				if v == "NaN" || strings.Contains(v, "Inf") {
					return strconv.Quote(v), v
				}
				return v, v
			}},
		{name: "tx", sqlType: "text", info: decoder.ColumnInfo{TypeOID: 25}, rowValues: texts,
			constants: func(r *rand.Rand) (string, string) {
				v := texts[r.IntN(len(texts))]
				js, _ := json.Marshal(v)
				return string(js), v
			}},
		{name: "f4", sqlType: "float4", info: decoder.ColumnInfo{TypeOID: 700}, rowValues: f4s,
			constants: func(r *rand.Rand) (string, string) {
				v := f4s[r.IntN(len(f4s))]
				if v == "NaN" || strings.Contains(v, "Inf") {
					return strconv.Quote(v), v
				}
				return v, v
			}},
		{name: "bp", sqlType: "char(4)", info: decoder.ColumnInfo{TypeOID: 1042}, rowValues: bps,
			constants: func(r *rand.Rand) (string, string) {
				v := bps[r.IntN(len(bps))]
				return strconv.Quote(v), v
			}},
		{name: "u", sqlType: "uuid", info: decoder.ColumnInfo{TypeOID: 2950}, rowValues: uuids,
			constants: func(r *rand.Rand) (string, string) {
				v := uuids[r.IntN(len(uuids))]
				if r.IntN(2) == 0 {
					v = strings.ToUpper(v)
				}
				return strconv.Quote(v), v
			}},
		{name: "tsn", sqlType: "timestamp", info: decoder.ColumnInfo{TypeOID: 1114}, rowValues: tsns,
			constants: func(r *rand.Rand) (string, string) {
				v := []string{"2026-11-29T23:21:24.123456", "2026-11-29T23:21:24", "2000-01-01T00:00:00", "1999-12-31T23:59:59.999999",
					"9999-12-31T23:59:59", "0001-01-01T00:00:00", "infinity", "-infinity"}[r.IntN(8)]
				return strconv.Quote(v), v
			}},
		{name: "b", sqlType: "bool", info: decoder.ColumnInfo{TypeOID: 16}, rowValues: []string{"true", "false"},
			constants: num("true", "false")},
		{name: "ts", sqlType: "timestamptz", info: decoder.ColumnInfo{TypeOID: 1184}, rowValues: tss,
			constants: func(r *rand.Rand) (string, string) {
				var v string
				switch r.IntN(5) {
				case 0:
					v = []string{"infinity", "-infinity"}[r.IntN(2)]
				case 1, 2:
					// One of the rows' instants, written with another offset.
					base := []time.Time{time.Date(2026, 11, 29, 23, 21, 24, 123456000, time.UTC), time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC),
						time.Date(1999, 12, 31, 23, 59, 59, 999999000, time.UTC)}[r.IntN(3)]
					zone := time.FixedZone("", (r.IntN(29)-14)*1800)
					v = base.In(zone).Format("2006-01-02T15:04:05.999999Z07:00")
				default:
					v = time.Date(1900+r.IntN(200), time.Month(1+r.IntN(12)), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1e6)*1000, time.UTC).
						Format(time.RFC3339Nano)
				}
				return strconv.Quote(v), v
			}},
	}
}

// genFilter builds a random filter over cols as JSON and as SQL with text
// parameters, the SQL rendered only here: the package never writes SQL.
func genFilter(r *rand.Rand, cols []pgCol, depth int, params *[]string) (js, sql string) {
	if depth < 3 && r.IntN(3) == 0 {
		switch r.IntN(3) {
		case 0:
			js, sql := genFilter(r, cols, depth+1, params)
			return `{"not":` + js + `}`, "(NOT " + sql + ")"
		default:
			word := []string{"and", "or"}[r.IntN(2)]
			var jss, sqls []string
			for range 2 + r.IntN(3) {
				j, s := genFilter(r, cols, depth+1, params)
				jss, sqls = append(jss, j), append(sqls, s)
			}
			return `{"` + word + `":[` + strings.Join(jss, ",") + `]}`, "(" + strings.Join(sqls, " "+strings.ToUpper(word)+" ") + ")"
		}
	}
	c := cols[r.IntN(len(cols))]
	ref := c.name
	if c.sqlType == "text" || c.sqlType == "char(4)" {
		ref += ` COLLATE "C"`
	}
	param := func(text string) string {
		*params = append(*params, text)
		typ := c.sqlType
		if typ == "char(4)" {
			typ = "bpchar" // no length: a longer value is not cut to fit
		}
		return fmt.Sprintf("$%d::%s", len(*params), typ)
	}
	ops := []string{"=", "<>", "<", "<=", ">", ">=", "in", "is null", "is not null"}
	switch op := ops[r.IntN(len(ops))]; op {
	case "is null", "is not null":
		return `{"col":"` + c.name + `","op":"` + op + `"}`, "(" + c.name + " " + strings.ToUpper(op) + ")"
	case "in":
		var jss, sqls []string
		for range 1 + r.IntN(4) {
			j, text := c.constants(r)
			jss, sqls = append(jss, j), append(sqls, param(text))
		}
		return `{"col":"` + c.name + `","op":"in","values":[` + strings.Join(jss, ",") + `]}`, "(" + ref + " IN (" + strings.Join(sqls, ", ") + "))"
	default:
		j, text := c.constants(r)
		return `{"col":"` + c.name + `","op":"` + op + `","value":` + j + `}`, "(" + ref + " " + op + " " + param(text) + ")"
	}
}

// The filter agrees with PostgreSQL: for random rows (with NULLs, NaN,
// infinities, int8 past 2^53, long numerics, float4, padded character(n),
// uuids, BC and far-future times, control characters) and random filters, the rows Match accepts are those
// PostgreSQL's WHERE clause of the same filter returns, with text compared
// under COLLATE "C".
func TestAgreesWithPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := pgx.ParseConfig(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	// The settings the replication connection fixes, under which
	// the decoder's value rules apply to the text forms read below.
	for k, v := range map[string]string{"TimeZone": "UTC", "DateStyle": "ISO", "IntervalStyle": "iso_8601", "extra_float_digits": "3", "bytea_output": "hex"} {
		cfg.RuntimeParams[k] = v
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 1))
	t.Logf("seed %d", seed)

	cols := pgCols()
	ddl := "CREATE TABLE t (id int4 PRIMARY KEY"
	infos := []decoder.ColumnInfo{{Name: "id", TypeOID: 23, Key: true}}
	for _, c := range cols {
		ddl += ", " + c.name + " " + c.sqlType
		c.info.Name = c.name
		infos = append(infos, c.info)
	}
	if _, err := conn.Exec(ctx, ddl+")"); err != nil {
		t.Fatal(err)
	}
	const rows = 400
	for id := 1; id <= rows; id++ {
		sql := "INSERT INTO t VALUES ($1::int4"
		params := [][]byte{[]byte(strconv.Itoa(id))}
		for i, c := range cols {
			sql += fmt.Sprintf(", $%d::%s", i+2, c.sqlType)
			if r.IntN(7) == 0 {
				params = append(params, nil)
			} else {
				params = append(params, []byte(c.rowValues[r.IntN(len(c.rowValues))]))
			}
		}
		if err := conn.PgConn().ExecParams(ctx, sql+")", params, nil, nil, nil).Read().Err; err != nil {
			t.Fatalf("%s %q: %v", sql, params, err)
		}
	}

	// Each row as an envelope's after carries it: the text forms, encoded
	// by the decoder's rules.
	res := conn.PgConn().ExecParams(ctx, "SELECT * FROM t ORDER BY id", nil, nil, nil, nil).Read()
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	enc := decoder.NewRowEncoder("public", "t", infos, "")
	idx := make([]int, len(infos))
	for i := range idx {
		idx[i] = i
	}
	images := make([]Row, len(res.Rows))
	for i, row := range res.Rows {
		var vals []json.RawMessage
		if err := json.Unmarshal(enc.Values(nil, row, idx), &vals); err != nil {
			t.Fatal(err)
		}
		m := make(map[string]json.RawMessage, len(vals))
		for k, v := range vals {
			m[infos[k].Name] = v
		}
		images[i] = Row{Values: m}
	}

	matched := 0
	for range 600 {
		var params []string
		js, where := genFilter(r, cols, 0, &params)
		f, err := Compile([]byte(js), infos, Limits{})
		if err != nil {
			t.Fatalf("Compile(%s): %v", js, err)
		}
		var got []int
		for i, img := range images {
			switch f.Match(img) {
			case Matches:
				got = append(got, i+1)
			case Undecided:
				t.Fatalf("filter %s undecided on the full row %s", js, res.Rows[i])
			}
		}
		p := make([][]byte, len(params))
		for i, s := range params {
			p[i] = []byte(s)
		}
		sql := "SELECT id FROM t WHERE " + where + " ORDER BY id"
		out := conn.PgConn().ExecParams(ctx, sql, p, nil, nil, nil).Read()
		if out.Err != nil {
			t.Fatalf("%s %q: %v", sql, params, out.Err)
		}
		var want []int
		for _, row := range out.Rows {
			id, _ := strconv.Atoi(string(row[0]))
			want = append(want, id)
		}
		if !slices.Equal(got, want) {
			var diff []string
			for _, id := range symmetricDiff(got, want) {
				b, _ := json.Marshal(images[id-1].Values)
				diff = append(diff, fmt.Sprintf("id %d in Match %v, in SQL %v: %s", id, slices.Contains(got, id), slices.Contains(want, id), b))
			}
			t.Fatalf("seed %d: filter %s\nSQL %s %q\n%s", seed, js, sql, params, strings.Join(diff, "\n"))
		}
		if len(want) > 0 && len(want) < rows {
			matched++
		}
	}
	if matched < 200 {
		t.Errorf("only %d of 600 filters selected some rows but not all; the generator needs values that hit", matched)
	}
}

func symmetricDiff(a, b []int) []int {
	var out []int
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			out = append(out, x)
		}
	}
	slices.Sort(out)
	return out
}
