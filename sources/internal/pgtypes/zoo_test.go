package pgtypes

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// zooColumn is one column of the type zoo: its SQL type, the name and kind
// the resolver must report, and SQL literals for rows 1, 2, ... (row 0 is
// NULL in every column; rows beyond a column's values are NULL too).
type zooColumn struct {
	name, sqlType string
	wantType      string
	wantKind      Kind
	vals          []string
}

var zooSetup = []string{
	`CREATE EXTENSION citext`,
	`CREATE TYPE mood AS ENUM ('sad', 'ok', 'it''s "complicated", {really}')`,
	`CREATE DOMAIN posint AS int CHECK (VALUE > 0)`,
	`CREATE DOMAIN label AS text`,
	`CREATE DOMAIN intlist AS int[]`,
	`CREATE DOMAIN moodlabel AS mood`,
	`CREATE TYPE addr AS (street text, no int, tags text[], at timestamptz, "we,ird ""name""" numeric)`,
	`CREATE TYPE gone AS (a int, b text, c int)`,
	`ALTER TYPE gone DROP ATTRIBUTE b`,
	`CREATE DOMAIN addrdom AS addr`,
	// An extension type the bridge does not know, as pgvector's vector
	// arrives: a base type with its own text input and output.
	`CREATE TYPE vec`,
	`CREATE FUNCTION vec_in(cstring) RETURNS vec LANGUAGE internal IMMUTABLE STRICT AS 'textin'`,
	`CREATE FUNCTION vec_out(vec) RETURNS cstring LANGUAGE internal IMMUTABLE STRICT AS 'textout'`,
	`CREATE TYPE vec (INPUT = vec_in, OUTPUT = vec_out, LIKE = text)`,
}

var zoo = []zooColumn{
	{"c_int2", "int2", "int2", Int, []string{"0", "-32768", "32767"}},
	{"c_int4", "int4", "int4", Int, []string{"42", "-2147483648", "2147483647"}},
	{"c_int8", "int8", "int8", Int, []string{"0", "-9223372036854775808", "9223372036854775807"}},
	{"c_float4", "float4", "float4", Float, []string{"1.1", "'NaN'", "'Infinity'", "'-Infinity'", "3.4028235e38", "1e-45", "'-0'"}},
	{"c_float8", "float8", "float8", Float, []string{"0.1", "'NaN'", "'Infinity'", "'-Infinity'", "1e308", "5e-324", "1e100", "1e-7", "123456789012345680", "-1.5"}},
	{"c_numeric", "numeric", "numeric", Numeric, []string{"'1.500'", "'NaN'", "'Infinity'", "'-Infinity'",
		"'1234567890123456789012345678901234567890'", "'-0.0000000000000000000000000000000000001234'", "0", "'-1234567890123456789012345678901234567890.0987654321'"}},
	{"c_numeric_scaled", "numeric(10,2)", "numeric", Numeric, []string{"12.5", "-0.01"}},
	{"c_bool", "bool", "bool", Bool, []string{"true", "false"}},
	{"c_text", "text", "text", Text, []string{"'héllo wörld 🎉'", `E'quote " backslash \\ tab \t newline \n cr \r'`, "'NULL'", "''",
		"'{}'", `E'\u2028\u2029'`, `E'\x01\x1f\x7f'`}},
	{"c_varchar", "varchar(20)", "varchar", Text, []string{"'abc'", "''", "'ünï'"}},
	{"c_char", "char(3)", "bpchar", Text, []string{"'ab'", "'xyz'", "''"}},
	{"c_qchar", `"char"`, "char", Text, []string{"'a'"}},
	{"c_name", "name", "name", Text, []string{"'pg_class'"}},
	{"c_citext", "citext", "public.citext", Text, []string{"'MiXeD'"}},
	{"c_bytea", "bytea", "bytea", Bytea, []string{`'\x00ff10'`, `''`, `decode('DEADBEEF', 'hex')`, `sha256('x')`, `'\\'::bytea`}},
	{"c_json", "json", "json", JSON, []string{`'{"a": [1, 2.50, "x"], "b": null, "a": 3}'`, `'"string"'`, `'123.4500'`, `'[]'`,
		`' { "sp" : true , "n": 1e400 } '`, `'{"u": "\u00e9\ud83c\udf89"}'`}},
	{"c_jsonb", "jsonb", "jsonb", JSON, []string{`'{"nested": {"deep": [1, {"x": "ü"}]}, "emoji": "🎉"}'`, `'null'`, `'1e400'`,
		`'[1.10, -0, true, "\\\"", "\u2028"]'`, `'{}'`}},
	{"c_uuid", "uuid", "uuid", Text, []string{"'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"}},
	{"c_timestamptz", "timestamptz", "timestamptz", TimestampTZ, []string{"'2024-02-29 12:34:56.789012+05:30'", "'infinity'", "'-infinity'",
		"'0044-03-15 12:00:00.5 BC'", "'10000-01-01 00:00:00+00'", "'1970-01-01 00:00:00+00'", "'2000-01-01 00:00:00.000001+00'", "'4714-11-24 00:00:00+00 BC'"}},
	{"c_timestamp", "timestamp", "timestamp", Timestamp, []string{"'2024-02-29 12:34:56.789012'", "'infinity'", "'-infinity'",
		"'4713-01-01 00:00:00 BC'", "'294276-12-31 23:59:59.999999'", "'2000-01-01 00:00:00.5'"}},
	{"c_date", "date", "date", Date, []string{"'2024-02-29'", "'infinity'", "'-infinity'", "'4713-01-01 BC'", "'5874897-12-31'", "'0001-01-01'"}},
	{"c_time", "time", "time", Text, []string{"'12:34:56.789'", "'24:00'"}},
	{"c_timetz", "timetz", "timetz", Text, []string{"'12:34:56+05:30'"}},
	{"c_interval", "interval", "interval", Text, []string{"'1 year 2 mons 3 days 04:05:06.789'", "'-1 day'", "'0'"}},
	{"c_mood", "mood", "public.mood", Text, []string{"'sad'", `'it''s "complicated", {really}'`}},
	{"c_moodlabel", "moodlabel", "public.moodlabel", Text, []string{"'ok'"}},
	{"c_posint", "posint", "public.posint", Int, []string{"7", "2147483647"}},
	{"c_label", "label", "public.label", Text, []string{"'a label'", "''"}},
	{"c_oid", "oid", "oid", Int, []string{"4294967295", "0"}},
	{"c_inet", "inet", "inet", Text, []string{"'192.168.0.1/24'", "'::1'"}},
	{"c_cidr", "cidr", "cidr", Text, []string{"'10.0.0.0/8'"}},
	{"c_macaddr", "macaddr", "macaddr", Text, []string{"'08:00:2b:01:02:03'"}},
	{"c_money", "money", "money", Text, []string{"1234.56", "-1"}},
	{"c_bit", "bit(4)", "bit", Text, []string{"B'1010'"}},
	{"c_varbit", "varbit", "varbit", Text, []string{"B'101'"}},
	{"c_xml", "xml", "xml", Text, []string{"'<a x=\"1\">t</a>'"}},
	{"c_point", "point", "point", Text, []string{"'(1.5,2)'"}},
	{"c_tsvector", "tsvector", "tsvector", Text, []string{"'a fat cat'"}},
	{"c_int4range", "int4range", "int4range", Text, []string{"'[1,5)'", "'empty'"}},
	{"c_int4_arr", "int4[]", "_int4", Array, []string{"'{1,2,3}'", "'{}'", "'{NULL,1}'", "'[0:2]={1,2,3}'"}},
	{"c_text_arr", "text[]", "_text", Array, []string{`ARRAY['a,b', '{c}', 'd"e', 'f\g', NULL, 'NULL', '', ' sp ', 'héllo', 'x;y']`, "'{}'"}},
	{"c_int_2d", "int[][]", "_int4", Array, []string{"'{{1,2},{3,4}}'", "'[0:1][5:6]={{1,NULL},{3,4}}'", "'{{{1}},{{2}}}'"}},
	{"c_mood_arr", "mood[]", "public._mood", Array, []string{`ARRAY['sad', 'it''s "complicated", {really}', NULL]::mood[]`}},
	{"c_jsonb_arr", "jsonb[]", "_jsonb", Array, []string{`ARRAY['{"a": 1, "b": "x,y"}', '[1, "x"]', 'null', NULL]::jsonb[]`}},
	{"c_json_arr", "json[]", "_json", Array, []string{`ARRAY['{"a": "\\\""}', '2']::json[]`}},
	{"c_numeric_arr", "numeric[]", "_numeric", Array, []string{`ARRAY['1.50', 'NaN', NULL, '1234567890123456789012345678901234567890', '-Infinity']::numeric[]`}},
	{"c_bool_arr", "bool[]", "_bool", Array, []string{"'{t,f,NULL}'"}},
	{"c_float8_arr", "float8[]", "_float8", Array, []string{`ARRAY['NaN', 1.5, '-Infinity', 1e-7]::float8[]`}},
	{"c_bytea_arr", "bytea[]", "_bytea", Array, []string{`ARRAY['\x00ff'::bytea, '\x'::bytea, NULL, '\\'::bytea]`}},
	{"c_date_arr", "date[]", "_date", Array, []string{`ARRAY['2024-01-01', 'infinity', NULL, '0001-01-01 BC']::date[]`}},
	{"c_tstz_arr", "timestamptz[]", "_timestamptz", Array, []string{`ARRAY['2024-01-01 00:00:00+00', '-infinity', '2024-06-30 23:59:59.999999-07']::timestamptz[]`}},
	{"c_ts_arr", "timestamp[]", "_timestamp", Array, []string{`ARRAY['2024-01-01 00:00:00.25']::timestamp[]`}},
	{"c_uuid_arr", "uuid[]", "_uuid", Array, []string{`ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11']::uuid[]`}},
	{"c_box_arr", "box[]", "_box", Array, []string{`ARRAY['((1,1),(0,0))'::box, '((2,2),(1,1))'::box]`}},
	{"c_posint_arr", "posint[]", "public._posint", Array, []string{`ARRAY[1, 2]::posint[]`}},
	{"c_intlist", "intlist", "public.intlist", Array, []string{`'{1,NULL,3}'`}},
	{"c_intlist_arr", "intlist[]", "public._intlist", Array, []string{`ARRAY['{1,2}'::intlist, '{}'::intlist]`}},
	{"c_interval_arr", "interval[]", "_interval", Array, []string{`ARRAY['1 day'::interval, '-00:00:01']`}},
	{"c_citext_arr", "citext[]", "public._citext", Array, []string{`ARRAY['A b'::citext]`}},
	{"c_addr", "addr", "public.addr", Composite, []string{`ROW('Main St, "2" (rear)', 7, ARRAY['a b', NULL, 'c,d'], '2024-02-29 12:00:00+02', 1.50)`,
		`ROW(NULL, NULL, NULL, NULL, NULL)`, `ROW('', 0, '{}', 'infinity', 'NaN')`, `ROW(E'back\\slash', -1, ARRAY[E'\\', ''], NULL, NULL)`}},
	{"c_addr_arr", "addr[]", "public._addr", Array, []string{`ARRAY[ROW('a', 1, NULL, NULL, NULL)::addr, NULL, ROW('"q"', 2, '{1}', NULL, NULL)::addr]`}},
	{"c_gone", "gone", "public.gone", Composite, []string{`ROW(1, 3)`}},
	{"c_addrdom", "addrdom", "public.addrdom", Composite, []string{`ROW('d', 1, NULL, NULL, NULL)`}},
	{"c_int8range", "int8range", "int8range", Text, []string{"'(,10]'", "'[-5,)'"}},
	{"c_numrange", "numrange", "numrange", Text, []string{"'[1.5,2.25]'"}},
	{"c_tstzrange", "tstzrange", "tstzrange", Text, []string{"'[2024-01-01 00:00+02,infinity)'"}},
	{"c_daterange", "daterange", "daterange", Text, []string{"'[2024-01-01,2024-02-01)'"}},
	{"c_int4multirange", "int4multirange", "int4multirange", Text, []string{"'{[1,3), [5,7)}'", "'{}'"}},
	{"c_nummultirange", "nummultirange", "nummultirange", Text, []string{"'{[1.5,2]}'"}},
	{"c_int4range_arr", "int4range[]", "_int4range", Array, []string{`ARRAY['[1,2)'::int4range, 'empty']`}},
	{"c_int_3d", "int[][][]", "_int4", Array, []string{"'{{{1,2},{3,4}},{{5,6},{7,NULL}}}'"}},
	{"c_text_2d", "text[][]", "_text", Array, []string{`'{{"a,b","c"},{NULL,"{d}"}}'`}},
	{"c_mood_2d", "mood[][]", "public._mood", Array, []string{"'{{sad,ok},{ok,sad}}'"}},
	{"c_vec", "vec", "public.vec", Text, []string{"'[1,2.5,-3]'"}},
	{"c_vec_arr", "vec[]", "public._vec", Array, []string{`ARRAY['[1,2]'::vec, '[3]'::vec]`}},
}

// zooPostGISSetup and zooPostGIS are the zoo's PostGIS part, a test of its
// own (TestTypeZooPostGIS): the PostgreSQL builds of other majors the
// version matrix runs have no PostGIS.
var zooPostGISSetup = []string{
	`CREATE EXTENSION postgis`,
	`CREATE TYPE place AS (name text, home addr, mood mood, pos geometry, span int4range)`,
}

var zooPostGIS = []zooColumn{
	{"c_place", "place", "public.place", Composite, []string{`ROW('home', ROW('x', 1, ARRAY['y'], NULL, 2)::addr, 'sad', 'SRID=4326;POINT(1.5 2)', '[1,5)')`,
		`ROW(NULL, ROW(NULL, NULL, NULL, NULL, NULL)::addr, NULL, NULL, 'empty')`}},
	{"c_geom", "geometry", "public.geometry", Geometry, []string{"'SRID=3857;POINT(1 2)'", "'LINESTRING(0 0, 1.5 2.25)'", "'POLYGON EMPTY'"}},
	{"c_geog", "geography", "public.geography", Geography, []string{"'POINT(-71.0625 42.25)'"}},
	{"c_geom_arr", "geometry[]", "public._geometry", Array, []string{"ARRAY['POINT(1 2)'::geometry, NULL, 'POINT(3 4)']"}},
}

// sessionSettings are the settings a walsender applies for logical decoding.
var sessionSettings = []string{"SET TimeZone = 'UTC'", "SET DateStyle = 'ISO'", "SET IntervalStyle = 'postgres'", "SET extra_float_digits = 3"}

// TestTypeZoo decodes every column of the zoo as the server's output
// function prints it (the text result format, as pgoutput sends it) and
// compares the result with to_jsonb of the same column.
func TestTypeZoo(t *testing.T) {
	runZoo(t, "zoo", zooSetup, zoo)
}

// TestTypeZooPostGIS is TestTypeZoo for PostGIS geometry and geography,
// arrays of them and a composite holding one.
func TestTypeZooPostGIS(t *testing.T) {
	runZoo(t, "zoogis", append(append([]string{}, zooSetup...), zooPostGISSetup...), zooPostGIS)
}

// runZoo makes database db with setup and table zoo of columns zoo, one
// row per value, and checks each decoded value against to_jsonb.
func runZoo(t *testing.T, db string, zooSetup []string, zoo []zooColumn) {
	s := server(t)
	s.ExecT(t, "CREATE DATABASE "+db)
	ctx := t.Context()
	var cols, inserts []string
	nrows := 1
	for _, c := range zoo {
		cols = append(cols, c.name+" "+c.sqlType)
		nrows = max(nrows, len(c.vals)+1)
	}
	for r := range nrows {
		vals := []string{strconv.Itoa(r)}
		for _, c := range zoo {
			v := "NULL"
			if r > 0 && r <= len(c.vals) {
				v = c.vals[r-1]
			}
			vals = append(vals, v)
		}
		inserts = append(inserts, "INSERT INTO zoo VALUES ("+strings.Join(vals, ", ")+")")
	}
	setup := append(append([]string{}, zooSetup...), "CREATE TABLE zoo (id int PRIMARY KEY, "+strings.Join(cols, ", ")+")")
	require.NoError(t, s.Exec(ctx, db, append(setup, inserts...)...))

	conn := s.Conn(t, db)
	for _, q := range sessionSettings {
		_, err := conn.Exec(ctx, q)
		require.NoError(t, err)
	}
	res := NewResolver(conn)

	// Resolve each column's type from pg_attribute.
	types := map[string]*Type{}
	wireOIDs := map[string]uint32{} // the protocol reports a domain's base type
	for _, c := range zoo {
		var oid, wire uint32
		require.NoError(t, conn.QueryRow(ctx, `SELECT a.atttypid, CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
			FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
			WHERE a.attrelid = 'zoo'::regclass AND a.attname = $1`, c.name).Scan(&oid, &wire))
		wireOIDs[c.name] = wire
		typ, err := res.Lookup(ctx, oid)
		require.NoError(t, err, c.name)
		assert.Equal(t, c.wantType, typ.Name, c.name)
		assert.Equal(t, c.wantKind, typ.Kind, c.name)
		assert.Equal(t, oid, typ.OID, c.name)
		types[c.name] = typ
	}

	// One query per row: every column in text form, then to_jsonb of every
	// column, then bytea in base64.
	var sel []string
	for _, c := range zoo {
		sel = append(sel, c.name)
	}
	for _, c := range zoo {
		sel = append(sel, "to_jsonb("+c.name+")")
	}
	if slices.ContainsFunc(zoo, func(c zooColumn) bool { return c.name == "c_bytea" }) {
		sel = append(sel, "encode(c_bytea, 'base64')")
	} else {
		sel = append(sel, "NULL")
	}
	q := "SELECT " + strings.Join(sel, ", ") + " FROM zoo WHERE id = $1"
	formats := make([]int16, len(sel))
	for r := range nrows {
		rr := conn.PgConn().ExecParams(ctx, q, [][]byte{[]byte(strconv.Itoa(r))}, nil, nil, formats).Read()
		require.NoError(t, rr.Err)
		require.Len(t, rr.Rows, 1)
		row := rr.Rows[0]
		for i, c := range zoo {
			t.Run(fmt.Sprintf("row%d/%s", r, c.name), func(t *testing.T) {
				typ := types[c.name]
				require.Equal(t, wireOIDs[c.name], rr.FieldDescriptions[i].DataTypeOID)
				text, oracle := row[i], row[len(zoo)+i]
				if text == nil {
					assert.Nil(t, oracle, "to_jsonb of NULL")
					require.True(t, r == 0 || r > len(c.vals), "unexpected NULL")
					return
				}
				got, err := typ.DecodeText(text)
				require.NoError(t, err)
				if c.name == "c_bytea" {
					b64 := strings.ReplaceAll(string(row[len(sel)-1]), "\n", "")
					want, err := base64.StdEncoding.DecodeString(b64)
					require.NoError(t, err)
					assert.Equal(t, want, got, "text %q", text)
					return
				}
				want := decodeOracle(t, oracle)
				if c.sqlType == "oid" {
					// to_jsonb prints oid as a string; we decode it as a number.
					want = json.Number(want.(string))
				}
				checkOracle(t, fmt.Sprintf("%s text %q", c.name, text), got, want)
			})
		}
	}
}

func decodeOracle(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	require.NoError(t, d.Decode(&v), "to_jsonb %s", b)
	return v
}

// checkOracle compares a decoded value with the to_jsonb rendering of the
// same value, by the decoded value's Go type.
func checkOracle(t *testing.T, where string, got, want any) {
	t.Helper()
	switch g := got.(type) {
	case nil:
		assert.Nil(t, want, where)
	case bool:
		assert.Equal(t, want, g, where)
	case int64:
		assert.Equal(t, json.Number(strconv.FormatInt(g, 10)), want, where)
	case float64:
		switch {
		case math.IsNaN(g):
			assert.Equal(t, "NaN", want, where)
		case math.IsInf(g, 1):
			assert.Equal(t, "Infinity", want, where)
		case math.IsInf(g, -1):
			assert.Equal(t, "-Infinity", want, where)
		default:
			n, ok := want.(json.Number)
			require.True(t, ok, "%s: oracle %#v is not a number", where, want)
			f, err := strconv.ParseFloat(string(n), 64)
			require.NoError(t, err, where)
			assert.Equal(t, f, g, where)
		}
	case cdc.Numeric:
		switch g {
		case "NaN", "Infinity", "-Infinity":
			assert.Equal(t, string(g), want, where)
		default:
			assert.Equal(t, json.Number(g), want, where)
		}
	case string:
		assert.Equal(t, want, g, where)
	case []byte:
		// Inside arrays to_jsonb shows bytea in its hex text form.
		s, ok := want.(string)
		require.True(t, ok && strings.HasPrefix(s, `\x`), "%s: oracle %#v", where, want)
		b, err := hex.DecodeString(s[2:])
		require.NoError(t, err)
		assert.Equal(t, b, g, where)
	case cdc.RawJSON:
		d := json.NewDecoder(bytes.NewReader(g))
		d.UseNumber()
		var v any
		require.NoError(t, d.Decode(&v), where)
		assert.True(t, jsonEqual(v, want), "%s: decoded %s, to_jsonb %#v", where, g, want)
	case cdc.Infinity:
		assert.Equal(t, g.String(), want, where)
	case time.Time:
		assert.Equal(t, time.UTC, g.Location(), where)
		s, _ := want.(string)
		w, ok := oracleTime(s, true)
		require.True(t, ok, "%s: oracle %q", where, s)
		assert.True(t, w.Equal(g), "%s: got %v, to_jsonb %q", where, g, s)
	case cdc.Timestamp:
		s, _ := want.(string)
		w, ok := oracleTime(s, false)
		require.True(t, ok, "%s: oracle %q", where, s)
		assert.True(t, w.Equal(g.Time), "%s: got %v, to_jsonb %q", where, g, s)
	case cdc.Date:
		s, _ := want.(string)
		w, ok := oracleDate(s)
		require.True(t, ok, "%s: oracle %q", where, s)
		assert.True(t, w.Equal(g.Time), "%s: got %v, to_jsonb %q", where, g, s)
	case []any:
		w, ok := want.([]any)
		require.True(t, ok, "%s: oracle %#v is not an array", where, want)
		require.Len(t, g, len(w), where)
		for i := range g {
			checkOracle(t, fmt.Sprintf("%s[%d]", where, i), g[i], w[i])
		}
	case cdc.Record:
		w, ok := want.(map[string]any)
		require.True(t, ok, "%s: oracle %#v is not an object", where, want)
		require.Len(t, g.Values, len(w), where)
		require.Len(t, g.Names, len(g.Values), where)
		for i, n := range g.Names {
			fw, ok := w[n]
			require.True(t, ok, "%s: field %s missing from the oracle %#v", where, n, w)
			checkOracle(t, where+"."+n, g.Values[i], fw)
		}
	case cdc.Geometry:
		// to_jsonb writes geometry as GeoJSON (bridge/format renders
		// that; its tests compare it) and geography as its text, hex EWKB.
		if g.Geography {
			assert.Equal(t, want, g.String(), where)
			return
		}
		w, ok := want.(map[string]any)
		require.True(t, ok, "%s: oracle %#v is not GeoJSON", where, want)
		srid, has := g.SRID()
		_, crs := w["crs"]
		assert.Equal(t, has && srid != 0, crs, "%s: SRID %d and the oracle's crs", where, srid)
	default:
		t.Errorf("%s: unexpected Go type %T", where, got)
	}
}

// jsonEqual compares decoded JSON, numbers as exact decimals.
func jsonEqual(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		bn, ok := b.(json.Number)
		if !ok {
			return false
		}
		x, ok1 := new(big.Rat).SetString(string(a))
		y, ok2 := new(big.Rat).SetString(string(bn))
		return ok1 && ok2 && x.Cmp(y) == 0
	case []any:
		bs, ok := b.([]any)
		if !ok || len(a) != len(bs) {
			return false
		}
		for i := range a {
			if !jsonEqual(a[i], bs[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		bm, ok := b.(map[string]any)
		if !ok || len(a) != len(bm) {
			return false
		}
		for k, v := range a {
			if w, ok := bm[k]; !ok || !jsonEqual(v, w) {
				return false
			}
		}
		return true
	default:
		return a == b
	}
}

// The oracle's own reading of to_jsonb's timestamps, written independently
// of the decoder: "2024-02-29T07:04:56.789012+00:00", "0044-03-15T12:00:00.5+00:00 BC".
var (
	oracleTS   = regexp.MustCompile(`^(\d{4,})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(\.\d+)?(?:([+-])(\d\d):(\d\d))?( BC)?$`)
	oracleDays = regexp.MustCompile(`^(\d{4,})-(\d\d)-(\d\d)( BC)?$`)
)

func oracleTime(s string, tz bool) (time.Time, bool) {
	m := oracleTS.FindStringSubmatch(s)
	if m == nil || (m[8] != "") != tz {
		return time.Time{}, false
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	y := n(1)
	if m[11] != "" {
		y = -(y - 1)
	}
	ns := 0
	if m[7] != "" {
		f, _ := strconv.ParseFloat("0"+m[7], 64)
		ns = int(math.Round(f*1e6)) * 1000
	}
	w := time.Date(y, time.Month(n(2)), n(3), n(4), n(5), n(6), ns, time.UTC)
	if tz {
		off := time.Duration(n(9))*time.Hour + time.Duration(n(10))*time.Minute
		if m[8] == "-" {
			off = -off
		}
		w = w.Add(-off)
	}
	return w, true
}

func oracleDate(s string) (time.Time, bool) {
	m := oracleDays.FindStringSubmatch(s)
	if m == nil {
		return time.Time{}, false
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	y := n(1)
	if m[4] != "" {
		y = -(y - 1)
	}
	return time.Date(y, time.Month(n(2)), n(3), 0, 0, 0, 0, time.UTC), true
}
