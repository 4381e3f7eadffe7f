package format

import (
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// geoCases pair PostGIS 3.3's text form of a geometry (hex EWKB) with
// to_jsonb of the same value, both read off a real server.
var geoCases = []struct{ wkt, ewkb, geojson string }{
	{"SRID=3857;POINT(1 2)", "0101000020110F0000000000000000F03F0000000000000040", `{"crs": {"type": "name", "properties": {"name": "EPSG:3857"}}, "type": "Point", "coordinates": [1, 2]}`},
	{"POINT(1.5 -2)", "0101000000000000000000F83F00000000000000C0", `{"type": "Point", "coordinates": [1.5, -2]}`},
	{"SRID=4326;POINT(1 2 3)", "01010000A0E6100000000000000000F03F00000000000000400000000000000840", `{"crs": {"type": "name", "properties": {"name": "EPSG:4326"}}, "type": "Point", "coordinates": [1, 2, 3]}`},
	{"POINT EMPTY", "0101000000000000000000F87F000000000000F87F", `{"type": "Point", "coordinates": []}`},
	{"POINTM(1 2 3)", "0101000040000000000000F03F00000000000000400000000000000840", `{"type": "Point", "coordinates": [1, 2]}`},
	{"POINTZM(1 2 3 4)", "01010000C0000000000000F03F000000000000004000000000000008400000000000001040", `{"type": "Point", "coordinates": [1, 2, 3]}`},
	{"LINESTRING(0 0,1.5 2.25)", "01020000000200000000000000000000000000000000000000000000000000F83F0000000000000240", `{"type": "LineString", "coordinates": [[0, 0], [1.5, 2.25]]}`},
	{"LINESTRING EMPTY", "010200000000000000", `{"type": "LineString", "coordinates": []}`},
	{"POLYGON with a hole", "0103000000020000000400000000000000000000000000000000000000000000000000F03F0000000000000000000000000000F03F000000000000F03F00000000000000000000000000000000040000009A9999999999C93F9A9999999999C93F000000000000E03F9A9999999999C93F000000000000E03F000000000000E03F9A9999999999C93F9A9999999999C93F",
		`{"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0]], [[0.2, 0.2], [0.5, 0.2], [0.5, 0.5], [0.2, 0.2]]]}`},
	{"MULTIPOINT((1 2),(3 4))", "0104000000020000000101000000000000000000F03F0000000000000040010100000000000000000008400000000000001040", `{"type": "MultiPoint", "coordinates": [[1, 2], [3, 4]]}`},
	{"MULTILINESTRING((0 0,1 1),(2 2,3 3))", "01050000000200000001020000000200000000000000000000000000000000000000000000000000F03F000000000000F03F0102000000020000000000000000000040000000000000004000000000000008400000000000000840",
		`{"type": "MultiLineString", "coordinates": [[[0, 0], [1, 1]], [[2, 2], [3, 3]]]}`},
	{"SRID=4269;MULTIPOLYGON(...)", "0106000020AD100000020000000103000000010000000400000000000000000000000000000000000000000000000000F03F0000000000000000000000000000F03F000000000000F03F000000000000000000000000000000000103000000010000000400000000000000000014400000000000001440000000000000184000000000000014400000000000001840000000000000184000000000000014400000000000001440",
		`{"crs": {"type": "name", "properties": {"name": "EPSG:4269"}}, "type": "MultiPolygon", "coordinates": [[[[0, 0], [1, 0], [1, 1], [0, 0]]], [[[5, 5], [6, 5], [6, 6], [5, 5]]]]}`},
	{"GEOMETRYCOLLECTION EMPTY", "010700000000000000", `{"type": "GeometryCollection", "geometries": []}`},
	{"POINT(123456789.123456789 0.1)", "0101000000756B7E54346F9D419A9999999999B93F", `{"type": "Point", "coordinates": [123456789.12345679, 0.1]}`},
	{"POINT(1e300 -1e-300)", "01010000009C7500883CE4377E59F3F8C21F6EA581", `{"type": "Point", "coordinates": [1e300, -1e-300]}`},
	// ST_AsBinary(..., 'XDR'): big-endian WKB.
	{"POINT(1 2) big-endian", "00000000013FF00000000000004000000000000000", `{"type": "Point", "coordinates": [1, 2]}`},
}

func geom(t *testing.T, h string, geography bool) cdc.Geometry {
	t.Helper()
	b, err := hex.DecodeString(h)
	require.NoError(t, err)
	return cdc.Geometry{EWKB: b, Geography: geography}
}

func jsonValue(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal(b, &v), "%s", b)
	return v
}

func TestGeometryGeoJSON(t *testing.T) {
	for _, c := range geoCases {
		t.Run(c.wkt, func(t *testing.T) {
			g := geom(t, c.ewkb, false)
			got := AppendValue(nil, g)
			assert.Equal(t, jsonValue(t, []byte(c.geojson)), jsonValue(t, got), "%s", got)
		})
	}
}

func TestGeographyGeoJSON(t *testing.T) {
	// SRID 4326 is GeoJSON's own: no crs, as ST_AsGeoJSON(geography) writes it.
	got := AppendValue(nil, geom(t, "0101000020E6100000000000000000F03F0000000000000040", true))
	assert.JSONEq(t, `{"type":"Point","coordinates":[1,2]}`, string(got))
	got = AppendValue(nil, geom(t, "0101000020AD100000000000000000F03F0000000000000040", true))
	assert.JSONEq(t, `{"type":"Point","crs":{"type":"name","properties":{"name":"EPSG:4269"}},"coordinates":[1,2]}`, string(got))
}

func TestGeometryNotGeoJSON(t *testing.T) {
	for name, h := range map[string]string{
		"circular string":  "01080000000300000000000000000000000000000000000000000000000000F03F000000000000F03F00000000000000400000000000000000",
		"truncated":        "0101000000000000000000F83F",
		"trailing bytes":   "0101000000000000000000F83F00000000000000C000",
		"huge point count": "0102000000FFFFFFFF",
		"bad member":       "0104000000010000000102000000000000000",
	} {
		t.Run(name, func(t *testing.T) {
			if len(h)%2 == 1 {
				h += "0"
			}
			g := geom(t, h, false)
			assert.Equal(t, `"`+g.String()+`"`, string(AppendValue(nil, g)), "Postgres' text form")
		})
	}
}

func TestGeometryDebezium(t *testing.T) {
	g := geom(t, "0101000020110F0000000000000000F03F0000000000000040", false)
	assert.JSONEq(t, `{"wkb":"AQEAACARDwAAAAAAAAAA8D8AAAAAAAAAQA==","srid":3857}`, string(AppendDebeziumValue(nil, g, nil)))
	g = geom(t, "0101000000000000000000F83F00000000000000C0", false)
	assert.JSONEq(t, `{"wkb":"AQEAAAAAAAAAAAD4PwAAAAAAAADA","srid":null}`, string(AppendDebeziumValue(nil, g, nil)))
	assert.JSONEq(t, `[{"wkb":"AQEAAAAAAAAAAAD4PwAAAAAAAADA","srid":null},null]`, string(AppendDebeziumValue(nil, []any{g, nil}, nil)))
}

func TestRecordRendering(t *testing.T) {
	at := time.Date(2024, 2, 29, 10, 0, 0, 0, time.UTC)
	inner := cdc.Record{Names: []string{"x", "b"}, Values: []any{cdc.Numeric("1.50"), []byte{0xff}}, Text: `(1.50,"\\xff")`}
	r := cdc.Record{Names: []string{"name", `we,ird "name"`, "at", "day", "inner", "tags"},
		Values: []any{"a \"b\"", nil, at, cdc.Date{Time: at.Truncate(24 * time.Hour)}, inner, []any{"t", nil}}, Text: "(...)"}
	assert.Equal(t, `{"name":"a \"b\"","we,ird \"name\"":null,"at":"2024-02-29T10:00:00Z","day":"2024-02-29","inner":{"x":1.50,"b":"/w=="},"tags":["t",null]}`,
		string(AppendValue(nil, r)))
	assert.Equal(t, `{"name":"a \"b\"","we,ird \"name\"":null,"at":"2024-02-29T10:00:00Z","day":19782,"inner":{"x":"1.50","b":"/w=="},"tags":["t",null]}`,
		string(AppendDebeziumValue(nil, r, nil)))
	assert.Equal(t, "(...)", r.String())
}
