package format

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// customers is the table of Debezium's PostgreSQL connector documentation
// (debezium/debezium documentation/modules/ROOT/pages/connectors/
// postgresql.adoc, "Change event keys" and "create events"):
// CREATE TABLE customers (id SERIAL, first_name VARCHAR(255) NOT NULL,
// last_name VARCHAR(255) NOT NULL, email VARCHAR(255) NOT NULL,
// PRIMARY KEY(id)), in the schema the documentation's schema names use.
var customers = &cdc.Relation{ID: 16390, Schema: "inventory", Table: "customers", ReplicaIdentity: 'd', Columns: []cdc.Column{
	{Name: "id", Type: "int4", OID: 23, Key: true},
	{Name: "first_name", Type: "varchar", OID: 1043, Declared: "character varying(255)", NotNull: true},
	{Name: "last_name", Type: "varchar", OID: 1043, Declared: "character varying(255)", NotNull: true},
	{Name: "email", Type: "varchar", OID: 1043, Declared: "character varying(255)", NotNull: true},
}}

// documentedCreate is the documentation's create event: its row, LSNs
// (source.sequence ["24023119","24023128"], lsn 24023128), txId 555 and
// commit time (ts_ms 1559033904863, ts_us 1559033904863123).
func documentedCreate() *cdc.Change {
	return &cdc.Change{Producer: "b.PostgreSQL_server.e1", Source: "PostgreSQL_server", Database: "postgres",
		CommitLSN: 24023119, LSN: 24023128, Seq: 0, TxSize: 1, Xid: 555,
		CommitTime: time.UnixMicro(1559033904863123).UTC(),
		Schema:     "inventory", Table: "customers", Op: cdc.OpInsert, Rel: customers,
		After: []any{int32(1), "Anne", "Kretchmar", "annek@noanswer.org"}}
}

// TestDebeziumEnvelopeGolden: with schemas_enable, the create event of
// Debezium's PostgreSQL documentation ("create events": its value with
// schema and payload) byte for byte (key order included), as
// testdata/debezium_envelope.json holds it. That file is the
// documentation's example with what the bridge knowingly does otherwise:
//
//   - first_name, last_name and email are optional although NOT NULL:
//     with REPLICA IDENTITY DEFAULT a delete's before image has the key
//     only and null for them, which a required field refuses (Debezium
//     writes zero values there instead); the bridge requires NOT NULL
//     columns with REPLICA IDENTITY FULL only (TestDebeziumRequired);
//   - the source schema is the one Debezium's code builds
//     (SchemaFactory.sourceInfoSchemaBuilder and
//     PostgresSourceInfoStructMaker: snapshot the io.debezium.data.Enum
//     string with default "false", sequence, ts_us and ts_ns optional,
//     version 1), where the documentation's example is older; origin and
//     origin_lsn (Debezium 3.2) are not written;
//   - the envelope has the transaction block and version 2
//     (SchemaFactory.datatypeEnvelopeSchema, Envelope.SCHEMA_VERSION);
//   - the payload is the bridge's (docs/formats.md#debezium): version
//     "bridge", snapshot "false", the commit time for every ts, the
//     transaction block last.
func TestDebeziumEnvelopeGolden(t *testing.T) {
	want, err := os.ReadFile("testdata/debezium_envelope.json")
	require.NoError(t, err)
	var compact bytes.Buffer
	require.NoError(t, json.Compact(&compact, want))
	enc := DebeziumEncoder(DebeziumOptions{SchemasEnable: true})
	got := enc(nil, documentedCreate())
	require.Equal(t, compact.String(), string(got))
	// Built once per relation: the second is the same.
	require.Equal(t, string(got), string(enc(nil, documentedCreate())))
	// Without the option, the bare payload.
	require.Equal(t, string(AppendDebezium(nil, documentedCreate())), string(DebeziumEncoder(DebeziumOptions{})(nil, documentedCreate())))
}

// TestDebeziumKeyGolden: the documentation's key ("Change event keys") as
// the JSON converter writes it; its example is hand-written (a "name" and
// "index" per field, "INT32" and "1" as strings), which no converter
// emits: this is the JsonConverter's rendering of that key struct.
func TestDebeziumKeyGolden(t *testing.T) {
	key := DebeziumKeyEncoder(true)
	got, ok := key(nil, documentedCreate())
	require.True(t, ok)
	require.Equal(t, `{"schema":{"type":"struct","fields":[{"type":"int32","optional":false,"field":"id"}],"optional":false,"name":"PostgreSQL_server.inventory.customers.Key"},"payload":{"id":1}}`, string(got))
	got, ok = DebeziumKeyEncoder(false)(nil, documentedCreate())
	require.True(t, ok)
	require.Equal(t, `{"id":1}`, string(got))

	// A delete's key comes from its before image; a table without key
	// columns, and a truncate, have none.
	del := documentedCreate()
	del.Op, del.Before, del.After = cdc.OpDelete, []any{int32(7), cdc.Absent, cdc.Absent, cdc.Absent}, nil
	got, ok = key(nil, del)
	require.True(t, ok)
	require.Contains(t, string(got), `"payload":{"id":7}}`)
	nokey := documentedCreate()
	nokey.Rel = &cdc.Relation{Schema: "inventory", Table: "log", Columns: []cdc.Column{{Name: "line", Type: "text"}}}
	nokey.After = []any{"x"}
	got, ok = key([]byte("keep"), nokey)
	require.False(t, ok)
	require.Equal(t, "keep", string(got))
	tr := documentedCreate()
	tr.Op, tr.After = cdc.OpTruncate, nil
	_, ok = key(nil, tr)
	require.False(t, ok)
	msg := &cdc.Change{Source: "s", Op: cdc.OpMessage, Prefix: "app", Content: []byte("hi")}
	got, ok = key(nil, msg)
	require.True(t, ok)
	require.Equal(t, `{"schema":{"type":"struct","fields":[{"type":"string","optional":true,"field":"prefix"}],"optional":false,"name":"io.debezium.connector.postgresql.MessageKey","version":1},"payload":{"prefix":"app"}}`, string(got))
}

// TestDebeziumRequired: the Value struct requires key columns, and with
// REPLICA IDENTITY FULL the NOT NULL columns as the WAL says them (not
// pgoutput's, read from the catalog; not float or numeric ones); inserts
// and deletes conform either way.
func TestDebeziumRequired(t *testing.T) {
	cols := []cdc.Column{
		{Name: "id", Type: "int8", OID: 20, Key: true, NotNull: true},
		{Name: "name", Type: "varchar", OID: 1043, Declared: "character varying(20)", NotNull: true},
		{Name: "price", Type: "numeric", OID: 1700, Declared: "numeric(10,2)", NotNull: true},
		{Name: "note", Type: "text", OID: 25},
	}
	ts := time.Date(2024, 2, 29, 7, 4, 56, 0, time.UTC)
	row := []any{int64(1), "a", cdc.Numeric("1.50"), nil}
	for _, tc := range []struct {
		name     string
		identity byte
		inferred cdc.Inferred
		key      bool // with FULL, every column is flagged
		want     []bool
	}{
		{"default", 'd', 0, false, []bool{false, true, true, true}},
		{"full", 'f', 0, true, []bool{false, false, true, true}},
		{"full, NOT NULL from the catalog", 'f', cdc.InferredNotNull, true, []bool{true, true, true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := append([]cdc.Column(nil), cols...)
			if tc.key {
				for i := range cs {
					cs[i].Key = true
				}
			}
			rel := &cdc.Relation{Schema: "public", Table: "items", ReplicaIdentity: tc.identity, Inferred: tc.inferred, Columns: cs}
			var v struct {
				Schema struct {
					Fields []struct {
						Field  string `json:"field"`
						Fields []struct {
							Optional bool `json:"optional"`
						} `json:"fields"`
					} `json:"fields"`
				} `json:"schema"`
			}
			ins := cdc.Change{Source: "shop", Database: "db", CommitLSN: 100, LSN: 90, Xid: 7, TxSize: 1, CommitTime: ts,
				Schema: "public", Table: "items", Rel: rel, Op: cdc.OpInsert, After: row}
			enc := DebeziumEncoder(DebeziumOptions{SchemasEnable: true})
			b := enc(nil, &ins)
			require.NoError(t, json.Unmarshal(b, &v), "%s", b)
			require.Equal(t, "after", v.Schema.Fields[1].Field)
			var got []bool
			for _, f := range v.Schema.Fields[1].Fields {
				got = append(got, f.Optional)
			}
			require.Equal(t, tc.want, got)

			before := row
			if tc.identity == 'd' {
				before = []any{int64(1), cdc.Absent, cdc.Absent, cdc.Absent}
			}
			del := with(ins, func(c *cdc.Change) { c.Op, c.After, c.Before = cdc.OpDelete, nil, before })
			for _, c := range []cdc.Change{ins, del} {
				var m struct {
					Schema  map[string]any `json:"schema"`
					Payload any            `json:"payload"`
				}
				b := enc(nil, &c)
				require.NoError(t, json.Unmarshal(b, &m), "%s", b)
				require.NoError(t, connectCheck(m.Schema, m.Payload, "", nil), "%s", b)
			}
		})
	}
}

// TestDebeziumEnvelopeConforms: for a change of every type the bridge
// maps, and for updates, deletes, truncates, snapshot reads and logical
// messages, the payload is what its schema says, read as Kafka Connect's
// JsonConverter reads a value against its schema (connectCheck).
func TestDebeziumEnvelopeConforms(t *testing.T) {
	rel := &cdc.Relation{Schema: "public", Table: "zoo", ReplicaIdentity: 'd', Columns: []cdc.Column{
		{Name: "id", Type: "int8", OID: 20, Key: true},
		{Name: "b", Type: "bool", OID: 16},
		{Name: "s", Type: "int2", OID: 21},
		{Name: "i", Type: "int4", OID: 23},
		{Name: "r", Type: "float4", OID: 700},
		{Name: "f", Type: "float8", OID: 701},
		{Name: "n", Type: "numeric", OID: 1700},
		{Name: "t", Type: "text", OID: 25},
		{Name: "by", Type: "bytea", OID: 17},
		{Name: "d", Type: "date", OID: 1082},
		{Name: "ts", Type: "timestamp", OID: 1114},
		{Name: "tz", Type: "timestamptz", OID: 1184},
		{Name: "j", Type: "jsonb", OID: 3802},
		{Name: "u", Type: "uuid", OID: 2950},
		{Name: "iv", Type: "interval", OID: 1186},
		{Name: "ia", Type: "_int4", OID: 1007},
		{Name: "ta", Type: "_text", OID: 1009},
		{Name: "g", Type: "public.geometry", OID: 90001},
		{Name: "mood", Type: "public.mood", OID: 90002},
	}}
	ts := time.Date(2024, 2, 29, 7, 4, 56, 789012000, time.UTC)
	row := []any{int64(1), true, int16(2), int32(3), float32(1.5), 2.25, cdc.Numeric("1234.50"), "x", []byte{1, 2},
		cdc.Date{Time: ts}, cdc.Timestamp{Time: ts}, ts, cdc.RawJSON(`{"a":1}`), "0e3f0c3e-7d4b-4a8b-9c35-7b6bd1f3e0a1",
		"1 day", []any{int32(1), nil}, []any{"a", "b"}, cdc.Geometry{EWKB: []byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 240, 63, 0, 0, 0, 0, 0, 0, 0, 64}},
		"happy"}
	nulls := make([]any, len(row))
	nulls[0] = int64(2)
	base := cdc.Change{Source: "shop", Database: "db", CommitLSN: 100, LSN: 90, Xid: 7, TxSize: 1, CommitTime: ts,
		Schema: "public", Table: "zoo", Rel: rel}
	enc := DebeziumEncoder(DebeziumOptions{SchemasEnable: true})
	for name, c := range map[string]cdc.Change{
		"insert":   with(base, func(c *cdc.Change) { c.Op, c.After = cdc.OpInsert, row }),
		"nulls":    with(base, func(c *cdc.Change) { c.Op, c.After = cdc.OpInsert, nulls }),
		"update":   with(base, func(c *cdc.Change) { c.Op, c.After, c.Before = cdc.OpUpdate, row, row }),
		"toast":    with(base, func(c *cdc.Change) { c.Op, c.After = cdc.OpUpdate, append(append([]any{}, row[:7]...), cdc.Unchanged) }),
		"delete":   with(base, func(c *cdc.Change) { c.Op, c.Before = cdc.OpDelete, nulls }),
		"truncate": with(base, func(c *cdc.Change) { c.Op = cdc.OpTruncate }),
		"read":     with(base, func(c *cdc.Change) { c.Op, c.After = cdc.OpRead, row }),
		"message": {Source: "shop", Database: "db", CommitLSN: 100, LSN: 90, Xid: 7, TxSize: 1, CommitTime: ts,
			Op: cdc.OpMessage, Prefix: "app", Content: []byte("hello"), Transactional: true},
	} {
		t.Run(name, func(t *testing.T) {
			var v struct {
				Schema  map[string]any `json:"schema"`
				Payload any            `json:"payload"`
			}
			b := enc(nil, &c)
			require.NoError(t, json.Unmarshal(b, &v), "%s", b)
			// The bridge writes ts_us and ts_ns at the top of a message
			// event too, which Debezium's MessageValue has not: a reader
			// goes by the schema and leaves them.
			extra := map[string]bool{}
			if c.Op == cdc.OpMessage {
				extra["ts_us"], extra["ts_ns"] = true, true
			}
			require.NoError(t, connectCheck(v.Schema, v.Payload, "", extra), "%s", b)
		})
	}
}

func with(c cdc.Change, f func(*cdc.Change)) cdc.Change {
	f(&c)
	return c
}

// connectCheck checks value against a Connect schema in the JSON
// converter's form, as JsonConverter.convertToConnect reads it: a missing
// or null value needs an optional schema (or a default); int8 to int64
// take integral numbers, float32 and float64 numbers, boolean booleans,
// string strings, bytes base64 strings; arrays their items; structs an
// object whose every key is a field (except the keys of extra, at the
// top).
func connectCheck(schema map[string]any, value any, path string, extra map[string]bool) error {
	if value == nil {
		if schema["optional"] == true || schema["default"] != nil {
			return nil
		}
		return fmt.Errorf("%s: null for a required %v", path, schema["type"])
	}
	switch typ := schema["type"]; typ {
	case "int8", "int16", "int32", "int64":
		n, ok := value.(float64)
		if !ok || n != float64(int64(n)) {
			return fmt.Errorf("%s: %v (%T) is not an integer (%s)", path, value, value, typ)
		}
	case "float32", "float64":
		if _, ok := value.(float64); !ok {
			return fmt.Errorf("%s: %v is not a number (%s)", path, value, typ)
		}
	case "boolean":
		if _, ok := value.(bool); !ok {
			return fmt.Errorf("%s: %v is not a boolean", path, value)
		}
	case "string":
		if _, ok := value.(string); !ok {
			return fmt.Errorf("%s: %v (%T) is not a string", path, value, value)
		}
	case "bytes":
		s, ok := value.(string)
		if !ok {
			return fmt.Errorf("%s: %v is not base64 bytes", path, value)
		}
		if _, err := base64.StdEncoding.DecodeString(s); err != nil {
			return fmt.Errorf("%s: %q: %w", path, s, err)
		}
	case "array":
		a, ok := value.([]any)
		if !ok {
			return fmt.Errorf("%s: %v is not an array", path, value)
		}
		items := schema["items"].(map[string]any)
		for i, e := range a {
			if err := connectCheck(items, e, fmt.Sprintf("%s[%d]", path, i), nil); err != nil {
				return err
			}
		}
	case "struct":
		obj, ok := value.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %v is not an object", path, value)
		}
		known := map[string]bool{}
		for _, f := range schema["fields"].([]any) {
			fs := f.(map[string]any)
			name := fs["field"].(string)
			known[name] = true
			if err := connectCheck(fs, obj[name], path+"."+name, nil); err != nil {
				return err
			}
		}
		for k := range obj {
			if !known[k] && !extra[k] {
				return fmt.Errorf("%s: %q is not a field of %v", path, k, schema["name"])
			}
		}
	default:
		return fmt.Errorf("%s: unknown schema type %v", path, typ)
	}
	return nil
}

// TestDebeziumTypes pins the Connect types and JDBC types of the common
// Postgres types to Debezium's (PostgresValueConverter with the settings
// the format emulates; the JDBC driver's TypeInfoCache).
func TestDebeziumTypes(t *testing.T) {
	for typ, want := range map[string]ConnectType{
		"int2": {Type: "int16"}, "int4": {Type: "int32"}, "int8": {Type: "int64"}, "bool": {Type: "boolean"},
		"float4": {Type: "float32"}, "float8": {Type: "float64"}, "numeric": {Type: "string"}, "text": {Type: "string"},
		"bytea": {Type: "bytes"}, "date": {Type: "int32", Name: "io.debezium.time.Date"},
		"timestamp":   {Type: "int64", Name: "io.debezium.time.MicroTimestamp"},
		"timestamptz": {Type: "string", Name: "io.debezium.time.ZonedTimestamp"},
		"jsonb":       {Type: "string", Name: "io.debezium.data.Json"}, "uuid": {Type: "string", Name: "io.debezium.data.Uuid"},
	} {
		require.Equal(t, want, DebeziumConnectType(typ), typ)
	}
	for typ, want := range map[string]int{"int2": 5, "int4": 4, "int8": -5, "numeric": 2, "float4": 7, "float8": 8,
		"bpchar": 1, "varchar": 12, "text": 12, "bytea": -2, "bool": -7, "date": 91, "time": 92, "timestamptz": 93,
		"jsonb": 1111, "uuid": 1111, "_int4": 2003, "public.mood": 1111} {
		require.Equal(t, want, DebeziumJDBCType(typ), typ)
	}
}
