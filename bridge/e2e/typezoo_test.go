package e2e_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// zooColumns are the type-zoo table's columns; every value is compared with
// what Postgres itself stored, read back through to_jsonb.
const zooDDL = `
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE DOMAIN email AS text;
CREATE TABLE zoo (
  id int PRIMARY KEY,
  c_int2 int2, c_int4 int4, c_int8 int8,
  c_float4 float4, c_float8 float8, c_float8_nan float8, c_float8_inf float8, c_float8_ninf float8,
  c_numeric numeric, c_numeric_big numeric(40,10), c_numeric_nan numeric, c_numeric_inf numeric, c_numeric_ninf numeric,
  c_bool bool, c_text text, c_varchar varchar(20), c_char char(3), c_bytea bytea,
  c_json json, c_jsonb jsonb, c_uuid uuid,
  c_tstz timestamptz, c_tstz_inf timestamptz, c_ts timestamp, c_ts_ninf timestamp,
  c_date date, c_date_inf date, c_date_ninf date,
  c_interval interval, c_mood mood, c_posint posint, c_email email,
  c_int4_arr int4[], c_text_arr text[], c_int_2d int[][], c_mood_arr mood[], c_jsonb_arr jsonb[], c_numeric_arr numeric[],
  c_bool_arr bool[], c_inet inet, c_money money, c_time time
)`

var zooRows = []string{
	`INSERT INTO zoo VALUES (1,
  -32768, 2147483647, 9223372036854775807,
  1.5, 3.141592653589793, 'NaN', 'Infinity', '-Infinity',
  12345.6789, 123456789012345678901234567890.1234567890, 'NaN', 'Infinity', '-Infinity',
  true, 'héllo "wörld" \ back\slash 🚀 ' || chr(10) || 'line', 'varchar', 'ab', '\x00ff10',
  '{"a": [1, 2.50, "x"], "b": null}', '{"z": {"y": "ü"}, "n": 1.0}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  '2024-02-29 13:14:15.123456+02', 'infinity', '1999-12-31 23:59:59.5', '-infinity',
  '2024-01-31', 'infinity', '-infinity',
  '1 day 02:03:04', 'happy', 7, 'a@b.c',
  '{1,2,NULL,4}', '{"a,b","c\"d",NULL,"{x}","", " sp "}', '{{1,2},{3,4}}', '{sad,happy}', ARRAY['{"k":1}'::jsonb, '[]'], '{1.10,NaN,-2}',
  '{t,f,NULL}', '192.168.0.1/24', 12.34, '13:14:15')`,
	`INSERT INTO zoo (id) VALUES (2)`,
}

func TestTypeZooValueByValue(t *testing.T) {
	defer parallel(t)()
	eachMajor(t, typeZooValueByValue)
}

func typeZooValueByValue(t *testing.T, major int) {
	e := newEnvMajor(t, major)
	e.pg.ExecT(t, zooDDL)
	r := e.start(e.config("zoo", ""))
	waitReady(t, r)
	e.pg.ExecT(t, zooRows...)
	ms := e.waitCount("CDC_zoo", len(zooRows), 30*time.Second)

	conn := e.pg.Conn(t, "")
	types := map[string]string{}
	rows, err := conn.Query(t.Context(), `SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'zoo'::regclass AND attnum > 0 AND NOT attisdropped`)
	require.NoError(t, err)
	for rows.Next() {
		var n, ty string
		require.NoError(t, rows.Scan(&n, &ty))
		types[n] = ty
	}
	require.NoError(t, rows.Err())

	for i, m := range ms {
		// Re-decode our payload keeping exact numbers.
		var body struct {
			After map[string]json.RawMessage `json:"after"`
		}
		require.NoError(t, json.Unmarshal(m.Raw, &body))
		id := i + 1
		var oracleText []byte
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT to_jsonb(z)::text FROM zoo z WHERE id = $1`, id).Scan(&oracleText))
		oracle := decodeNumbers(t, oracleText)
		require.Len(t, body.After, len(oracle), "row %d: column count", id)
		for col, want := range oracle {
			raw, ok := body.After[col]
			require.True(t, ok, "row %d: column %s missing", id, col)
			got := decodeNumbers(t, raw)
			t.Run(fmt.Sprintf("row%d/%s", id, col), func(t *testing.T) {
				compareZoo(t, types[col], want, got)
			})
		}
	}
}

func decodeNumbers(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var out any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	require.NoError(t, d.Decode(&out))
	if m, ok := out.(map[string]any); ok {
		return m
	}
	return map[string]any{"": out}
}

// compareZoo compares our value with Postgres' to_jsonb rendering of the
// same column. The documented differences: bytea is base64 (Postgres: \x hex)
// and timestamptz is RFC 3339 in UTC (Postgres: the session's offset).
func compareZoo(t *testing.T, typ string, want, got any) {
	t.Helper()
	want, got = unwrap(want), unwrap(got)
	switch {
	case want == nil:
		require.Nil(t, got)
	case typ == "bytea":
		b, err := base64.StdEncoding.DecodeString(got.(string))
		require.NoError(t, err)
		require.Equal(t, want, `\x`+hex.EncodeToString(b))
	case strings.HasPrefix(typ, "timestamp with time zone") && want != "infinity" && want != "-infinity":
		w, err := time.Parse(time.RFC3339Nano, want.(string))
		require.NoError(t, err)
		g, err := time.Parse(time.RFC3339Nano, got.(string))
		require.NoError(t, err)
		require.True(t, w.Equal(g), "want %s, got %s", w, g)
		require.True(t, strings.HasSuffix(got.(string), "Z"), "timestamptz must be UTC: %s", got)
	case strings.HasPrefix(typ, "real") || strings.HasPrefix(typ, "double"):
		if s, ok := want.(string); ok { // NaN, Infinity
			require.Equal(t, s, got)
			return
		}
		wf, _ := want.(json.Number).Float64()
		gf, _ := got.(json.Number).Float64()
		require.Equal(t, wf, gf)
	case strings.HasPrefix(typ, "json"):
		// Postgres renders a json column as its text; compare semantically.
		require.Equal(t, canon(t, want), canon(t, got))
	default:
		require.True(t, reflect.DeepEqual(want, got), "want %#v, got %#v", want, got)
	}
}

func unwrap(v any) any {
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		if x, ok := m[""]; ok {
			return x
		}
	}
	return v
}

func canon(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var x any
	require.NoError(t, json.Unmarshal(b, &x))
	b, _ = json.Marshal(x)
	return string(b)
}
