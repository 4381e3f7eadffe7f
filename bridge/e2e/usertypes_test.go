package e2e_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// userTypesDDL makes the types users store beside the built-in ones:
// PostGIS geometry and geography, enums and arrays of them, domains,
// composites (nested, in arrays, over a domain), multi-dimensional arrays,
// ranges and multiranges, and vec, a type of an extension the bridge does
// not know, made the way pgvector's vector arrives: a base type with its
// own text input and output.
const userTypesDDL = `
CREATE EXTENSION postgis;
CREATE TYPE ut_mood AS ENUM ('sad', 'ok', 'it''s "complicated", {really}');
CREATE DOMAIN ut_posint AS int CHECK (VALUE > 0);
CREATE DOMAIN ut_label AS text;
CREATE TYPE ut_inner AS (code text, n int);
CREATE TYPE ut_addr AS (street text, no int, tags text[], mood ut_mood, inner_ ut_inner, "we,ird ""name""" ut_label, span int4range);
CREATE DOMAIN ut_addrdom AS ut_addr;
CREATE TYPE vec;
CREATE FUNCTION vec_in(cstring) RETURNS vec LANGUAGE internal IMMUTABLE STRICT AS 'textin';
CREATE FUNCTION vec_out(vec) RETURNS cstring LANGUAGE internal IMMUTABLE STRICT AS 'textout';
CREATE TYPE vec (INPUT = vec_in, OUTPUT = vec_out, LIKE = text);
CREATE DOMAIN ut_vecdom AS vec;
CREATE TABLE ut (
  id int PRIMARY KEY,
  c_mood ut_mood, c_mood_arr ut_mood[], c_mood_2d ut_mood[][],
  c_posint ut_posint, c_label ut_label, c_posint_arr ut_posint[],
  c_addr ut_addr, c_addr_arr ut_addr[], c_addrdom ut_addrdom,
  c_int_3d int[][][], c_text_2d text[][],
  c_int4range int4range, c_numrange numrange, c_tstzrange tstzrange, c_daterange daterange, c_range_arr int4range[],
  c_int4multi int4multirange, c_nummulti nummultirange, c_datemulti datemultirange,
  c_geom geometry, c_geom_srid geometry(Polygon, 4326), c_geom_3d geometry, c_geom_coll geometry, c_geom_arr geometry[],
  c_geog geography, c_geog_line geography(LineString),
  c_vec vec, c_vec_arr vec[], c_vecdom ut_vecdom
);
-- Debezium's rendering of a PostGIS value, from Postgres' own functions.
CREATE FUNCTION ut_dbz(geometry) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN $1 IS NULL THEN 'null'::jsonb ELSE
    jsonb_build_object('wkb', replace(encode(ST_AsEWKB($1), 'base64'), E'\n', ''), 'srid', NULLIF(ST_SRID($1), 0)) END $$;
CREATE FUNCTION ut_dbz(geometry[]) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
  SELECT jsonb_agg(ut_dbz(g) ORDER BY o) FROM unnest($1) WITH ORDINALITY u(g, o) $$;
`

// userTypesRow is the row with id; the same values for the row read by the
// snapshot (1) and the rows streamed (2, 3), whose row 3 is all NULLs.
func userTypesRow(id int) string {
	if id == 3 {
		return `INSERT INTO ut (id) VALUES (3)`
	}
	return fmt.Sprintf(`INSERT INTO ut VALUES (%d,
  'it''s "complicated", {really}', ARRAY['sad', NULL, 'it''s "complicated", {really}']::ut_mood[], '{{sad,ok},{ok,sad}}',
  7, 'a "label", (with) {braces}', ARRAY[1, 2]::ut_posint[],
  ROW('Main St, "2" (rear) \ back', 7, ARRAY['a b', NULL, 'c,d', ''], 'ok', ROW('x,"y"', -1), '', '[1,5)'),
  ARRAY[ROW('a', 1, '{}', NULL, NULL, NULL, 'empty')::ut_addr, NULL, ROW(NULL, NULL, NULL, NULL, ROW(NULL, NULL), NULL, NULL)::ut_addr],
  ROW('dom', 2, NULL, 'sad', NULL, 'l', NULL),
  '{{{1,2},{3,4}},{{5,6},{7,NULL}}}', '{{"a,b","c"},{NULL,"{d}"}}',
  '[1,5)', '(1.5,2.25]', '[2024-01-01 00:00+02,infinity)', '[2024-01-01,2024-02-01)', ARRAY['[1,2)'::int4range, 'empty'],
  '{[1,3), [5,7)}', '{[1.5,2]}', '{[2024-01-01,2024-01-05), [2024-02-01,)}',
  'LINESTRING(0 0, 1.5 2.25)', 'SRID=4326;POLYGON((0 0, 1 0, 1 1, 0 0), (0.25 0.25, 0.5 0.25, 0.5 0.5, 0.25 0.25))',
  'SRID=3857;POINT(123456789.123456789 0.1 -3)', 'GEOMETRYCOLLECTION(POINT(1 2), MULTIPOLYGON(((0 0, 1 0, 1 1, 0 0))), LINESTRING EMPTY)',
  ARRAY['POINT(1 2)'::geometry, NULL, 'SRID=4326;MULTIPOINT((3 4), (5 6))'],
  'POINT(-71.0625 42.25)', 'LINESTRING(-71.0625 42.25, -70.5 43)',
  '[1,2.5,-3]', ARRAY['[1,2]'::vec, '[3]'::vec], '[0.5]')`, id)
}

// TestUserTypesEveryFormat streams the types users store through both
// source types and all three formats, a row read by the initial snapshot
// and two written while streaming, and compares every delivered value with
// Postgres' own rendering of the same value: to_jsonb (GeoJSON for
// geometry), ST_AsGeoJSON for geography, and Debezium's {wkb, srid} from
// ST_AsEWKB and ST_SRID.
func TestUserTypesEveryFormat(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, userTypesDDL, userTypesRow(1))

	var srcs, sinks, routes strings.Builder
	type combo struct{ source, plugin, format string }
	var combos []combo
	for _, plugin := range []string{"pgoutput", "wal2json"} {
		for _, format := range []string{"native", "debezium", "cloudevents"} {
			name := plugin[:3] + "_" + format[:3]
			combos = append(combos, combo{name, plugin, format})
			fmt.Fprintf(&srcs, "  %s:\n    type: %s\n    config:\n      dsn: %s\n      slot: slot_%s\n      tables: [public.ut]\n      snapshot: {mode: initial}\n",
				name, plugin, e.pg.DSN(""), name)
			if plugin == "pgoutput" {
				fmt.Fprintf(&srcs, "      publication: pub_%s\n", name)
			}
			// A sink and a stream per source: a stream holds one writer's messages.
			fmt.Fprintf(&sinks, "  %s:\n    type: nats_jetstream\n    config:\n      stream: CDC_ut_%s\n      subjects: [\"cdc.ut.%s\"]\n", name, name, name)
			fmt.Fprintf(&routes, "  - match: {sources: [%s]}\n    sinks: [%s]\n    format: %s\n    subject: \"cdc.ut.%s\"\n", name, name, format, name)
		}
	}
	y := fmt.Sprintf("name: ut\ndata_dir: %s\nnats:\n  url: %s\nsources:\n%scheckpoint:\n  interval: 200ms\nhttp:\n  listen: \"127.0.0.1:0\"\nsinks:\n%sroutes:\n%s",
		filepath.Join(e.dir, "data"), e.natsURL(), srcs.String(), sinks.String(), routes.String())
	cfg := filepath.Join(e.dir, "ut.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(y), 0o644))
	r := e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, userTypesRow(2), userTypesRow(3))
	var ms []msg
	for _, c := range combos {
		// Row 1 read by the snapshot, rows 2 and 3 inserted; a snapshot
		// still running may read rows 2 and 3 too.
		ms = append(ms, e.waitCount("CDC_ut_"+c.source, 3, 2*time.Minute)...)
	}

	// The oracle: Postgres' rendering of each row, native and Debezium.
	conn := e.pg.Conn(t, "")
	_, err := conn.Exec(t.Context(), "SET TimeZone = 'UTC'")
	require.NoError(t, err)
	oracle := map[string]map[string]any{} // "<format>/<id>" → column → value
	for id := 1; id <= 3; id++ {
		var native, dbz []byte
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT
			to_jsonb(u) - 'c_geog' - 'c_geog_line' || jsonb_build_object('c_geog', ST_AsGeoJSON(c_geog)::jsonb, 'c_geog_line', ST_AsGeoJSON(c_geog_line)::jsonb),
			to_jsonb(u) || jsonb_build_object('c_geom', ut_dbz(c_geom), 'c_geom_srid', ut_dbz(c_geom_srid), 'c_geom_3d', ut_dbz(c_geom_3d),
				'c_geom_coll', ut_dbz(c_geom_coll), 'c_geom_arr', ut_dbz(c_geom_arr), 'c_geog', ut_dbz(c_geog::geometry), 'c_geog_line', ut_dbz(c_geog_line::geometry))
			FROM ut u WHERE id = $1`, id).Scan(&native, &dbz))
		oracle[fmt.Sprintf("native/%d", id)] = exactJSON(t, native).(map[string]any)
		oracle[fmt.Sprintf("debezium/%d", id)] = exactJSON(t, dbz).(map[string]any)
	}

	seen := map[string]int{}
	var reads []string
	for _, m := range ms {
		name := strings.TrimPrefix(m.Subject, "cdc.ut.")
		var c combo
		for _, x := range combos {
			if x.source == name {
				c = x
			}
		}
		require.NotEmpty(t, c.source, "subject %s", m.Subject)
		body := exactJSON(t, m.Raw).(map[string]any)
		if c.format == "cloudevents" {
			body = body["data"].(map[string]any)
		}
		if op, _ := body["op"].(string); op == "read" || op == "r" {
			reads = append(reads, name+"/"+fmt.Sprint(body["after"].(map[string]any)["id"]))
		}
		after, ok := body["after"].(map[string]any)
		require.True(t, ok, "%s: no after in %s", name, m.Raw)
		id64, err := after["id"].(json.Number).Int64()
		require.NoError(t, err)
		id := int(id64)
		seen[fmt.Sprintf("%s/%d", name, id)]++
		want := oracle[fmt.Sprintf("native/%d", id)]
		if c.format == "debezium" {
			want = oracle[fmt.Sprintf("debezium/%d", id)]
		}
		require.Len(t, after, len(want), "%s row %d: columns", name, id)
		for col, w := range want {
			g, ok := after[col]
			require.True(t, ok, "%s row %d: column %s missing", name, id, col)
			if !sameJSON(w, g) {
				gb, _ := json.Marshal(g)
				wb, _ := json.Marshal(w)
				t.Errorf("%s row %d, column %s:\n delivered %s\n postgres  %s", name, id, col, gb, wb)
			}
		}
	}
	for _, c := range combos {
		for id := 1; id <= 3; id++ {
			require.NotZero(t, seen[fmt.Sprintf("%s/%d", c.source, id)], "%s: row %d never arrived", c.source, id)
		}
		require.Contains(t, reads, c.source+"/1", "%s: row 1 is read by the snapshot", c.source)
	}
}

// exactJSON decodes b keeping numbers' digits.
func exactJSON(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	require.NoError(t, d.Decode(&v), "%s", b)
	return v
}

// sameJSON compares decoded JSON, numbers by their exact value (1.50 = 1.5,
// 1e3 = 1000).
func sameJSON(a, b any) bool {
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
			if !sameJSON(a[i], bs[i]) {
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
			if w, ok := bm[k]; !ok || !sameJSON(v, w) {
				return false
			}
		}
		return true
	default:
		return a == b
	}
}
