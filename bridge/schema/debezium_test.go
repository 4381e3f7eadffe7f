package schema_test

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/schema"
)

// sqlServerCustomers is the table of the schema change event example in
// Debezium's SQL Server connector documentation (debezium/debezium
// documentation/modules/ROOT/pages/connectors/sqlserver.adoc, "Schema
// change topic": "Message emitted to the SQL Server connector schema
// change topic"): testDB.dbo.customers (id, first_name, last_name,
// email, each varchar(255) NOT NULL), as a registry version of a Postgres
// table of that name.
func sqlServerCustomers() (*schema.Version, *cdc.Change) {
	r := &cdc.Relation{Schema: "dbo", Table: "customers", ReplicaIdentity: 'd', Columns: []cdc.Column{
		{Name: "id", Type: "int4", OID: 23, Key: true},
		{Name: "first_name", Type: "varchar", OID: 1043, Declared: "character varying(255)", NotNull: true},
		{Name: "last_name", Type: "varchar", OID: 1043, Declared: "character varying(255)", NotNull: true},
		{Name: "email", Type: "varchar", OID: 1043, Declared: "character varying(255)", NotNull: true},
	}}
	v := schema.FromRelation(r)
	v.Source, v.Version = "server1", 1
	c := &cdc.Change{Producer: "b.server1.e1", Source: "server1", Database: "testDB", CommitLSN: 24023119, LSN: 24023128,
		Xid: 555, TxSize: 1, CommitTime: time.UnixMilli(1588252618953).UTC(), Schema: "dbo", Table: "customers",
		Op: cdc.OpInsert, Rel: r, After: []any{int32(1), "a", "b", "c"}}
	return &v, c
}

// TestDebeziumSchemaEventGolden: a table's first version in the debezium
// format is Debezium's schema change value, as testdata/
// debezium_schema_change.json holds it: the SQL Server documentation's
// example (its ddl null too: the registry knows shapes, not statements)
// with what a Postgres source gives otherwise:
//
//   - the PostgreSQL connector's source block as the bridge writes it
//     (docs/formats.md#debezium), not SQL Server's;
//   - typeName and typeExpression are Postgres' type names, jdbcType the
//     JDBC driver's code for them (int4 → 4 INTEGER, varchar → 12
//     VARCHAR, as for the example's int and varchar);
//   - length and scale come from Postgres' type modifiers (varchar(255):
//     length 255), so int4 has neither where SQL Server's int has its
//     precision (10, 0); optional is false for the NOT NULL columns;
//   - every field of Debezium's Column struct is written, null when
//     unset, as the JSON converter does (comment, defaultValueExpression,
//     enumValues), and no attributes (not part of the Connect
//     serializer, ConnectTableChangeSerializer);
//   - id is "dbo"."customers": the PostgreSQL connector's table ids have
//     no catalog.
func TestDebeziumSchemaEventGolden(t *testing.T) {
	want, err := os.ReadFile("testdata/debezium_schema_change.json")
	require.NoError(t, err)
	var compact bytes.Buffer
	require.NoError(t, json.Compact(&compact, want))
	v, c := sqlServerCustomers()
	got := schema.AppendDebeziumSchemaEvent(nil, c, v, nil, false)
	require.Equal(t, compact.String(), string(got))

	// The next version is an ALTER; with schemas_enable, the value comes
	// with its schema, whose fields are the payload's.
	next := *v
	next.Version, next.Previous = 2, 1
	got = schema.AppendDebeziumSchemaEvent(nil, c, &next, v, true)
	var env struct {
		Schema  map[string]any `json:"schema"`
		Payload map[string]any `json:"payload"`
	}
	require.NoError(t, json.Unmarshal(got, &env), "%s", got)
	require.Equal(t, "io.debezium.connector.postgresql.SchemaChangeValue", env.Schema["name"])
	var fields []string
	for _, f := range env.Schema["fields"].([]any) {
		fields = append(fields, f.(map[string]any)["field"].(string))
	}
	require.Equal(t, []string{"source", "ts_ms", "databaseName", "schemaName", "ddl", "tableChanges"}, fields)
	require.Len(t, env.Payload, len(fields))
	require.Equal(t, "ALTER", env.Payload["tableChanges"].([]any)[0].(map[string]any)["type"])
	var colFields []string
	tc := env.Schema["fields"].([]any)[5].(map[string]any)["items"].(map[string]any)
	tbl := tc["fields"].([]any)[2].(map[string]any)
	cols := tbl["fields"].([]any)[2].(map[string]any)["items"].(map[string]any)
	for _, f := range cols["fields"].([]any) {
		colFields = append(colFields, f.(map[string]any)["field"].(string))
	}
	col := env.Payload["tableChanges"].([]any)[0].(map[string]any)["table"].(map[string]any)["columns"].([]any)[0].(map[string]any)
	require.Len(t, col, len(colFields))
	for _, f := range colFields {
		require.Contains(t, col, f)
	}

	// Debezium's key of schema change events.
	require.Equal(t, `{"databaseName":"testDB"}`, string(schema.DebeziumSchemaChangeKey(nil, "testDB", false)))
	require.Equal(t, `{"schema":{"type":"struct","fields":[{"type":"string","optional":false,"field":"databaseName"}],"optional":false,"name":"io.debezium.connector.postgresql.SchemaChangeKey","version":1},"payload":{"databaseName":"testDB"}}`,
		string(schema.DebeziumSchemaChangeKey(nil, "testDB", true)))
}

// TestDebeziumTableChangeColumns: a schema change event's columns take
// optional from NOT NULL and the key, length and scale from the type's
// modifier (Declared): numeric(p,s) is length p, scale s; varchar(n),
// char(n), bit(n) length n; no modifier, a time precision or an array
// neither.
func TestDebeziumTableChangeColumns(t *testing.T) {
	type col struct {
		Name     string `json:"name"`
		Length   *int   `json:"length"`
		Scale    *int   `json:"scale"`
		Optional bool   `json:"optional"`
	}
	n := func(i int) *int { return &i }
	cols := func(identity byte, cs ...cdc.Column) []col {
		t.Helper()
		r := &cdc.Relation{Schema: "public", Table: "t", ReplicaIdentity: identity, Columns: cs}
		v := schema.FromRelation(r)
		v.Source, v.Version = "shop", 1
		c := &cdc.Change{Source: "shop", Database: "db", Schema: "public", Table: "t", Op: cdc.OpInsert, Rel: r}
		got := schema.AppendDebeziumSchemaEvent(nil, c, &v, nil, false)
		var ev struct {
			TableChanges []struct {
				Table struct {
					Columns []col `json:"columns"`
				} `json:"table"`
			} `json:"tableChanges"`
		}
		require.NoError(t, json.Unmarshal(got, &ev), "%s", got)
		require.Len(t, ev.TableChanges, 1)
		return ev.TableChanges[0].Table.Columns
	}

	require.Equal(t, []col{
		{Name: "id", Optional: false},
		{Name: "total", Length: n(10), Scale: n(2), Optional: false},
		{Name: "qty", Length: n(5), Scale: n(0), Optional: true},
		{Name: "ratio", Optional: true},
		{Name: "rounded", Length: n(3), Scale: n(-2), Optional: true},
		{Name: "code", Length: n(20), Optional: true},
		{Name: "flag", Length: n(3), Optional: false},
		{Name: "bits", Length: n(8), Optional: true},
		{Name: "vbits", Length: n(16), Optional: true},
		{Name: "at", Optional: false},
		{Name: "tags", Optional: true},
		{Name: "note", Optional: true},
	}, cols('d',
		cdc.Column{Name: "id", Type: "int8", OID: 20, Key: true, NotNull: true},
		cdc.Column{Name: "total", Type: "numeric", OID: 1700, Declared: "numeric(10,2)", NotNull: true},
		cdc.Column{Name: "qty", Type: "numeric", OID: 1700, Declared: "numeric(5,0)"},
		cdc.Column{Name: "ratio", Type: "numeric", OID: 1700},
		cdc.Column{Name: "rounded", Type: "numeric", OID: 1700, Declared: "numeric(3,-2)"},
		cdc.Column{Name: "code", Type: "varchar", OID: 1043, Declared: "character varying(20)"},
		cdc.Column{Name: "flag", Type: "bpchar", OID: 1042, Declared: "character(3)", NotNull: true},
		cdc.Column{Name: "bits", Type: "bit", OID: 1560, Declared: "bit(8)"},
		cdc.Column{Name: "vbits", Type: "varbit", OID: 1562, Declared: "bit varying(16)"},
		cdc.Column{Name: "at", Type: "timestamptz", OID: 1184, Declared: "timestamp(3) with time zone", NotNull: true},
		cdc.Column{Name: "tags", Type: "_varchar", OID: 1015, Declared: "character varying(20)[]"},
		cdc.Column{Name: "note", Type: "text", OID: 25},
	))

	// With REPLICA IDENTITY FULL, the key does not make a column required;
	// NOT NULL does.
	require.Equal(t, []col{
		{Name: "id", Optional: false},
		{Name: "note", Optional: true},
	}, cols('f',
		cdc.Column{Name: "id", Type: "int8", OID: 20, Key: true, NotNull: true},
		cdc.Column{Name: "note", Type: "text", OID: 25, Key: true},
	))
}

// ddlContent is a message as the trigger writes it (jsonb's key order).
const ddlContent = `{"v": 1, "ddl": "ALTER TABLE t DROP COLUMN c;", "tag": "ALTER TABLE", "user": "app", "table": "t", "schema": "public", "dropped": [{"type": "table column", "table": {"name": "t", "schema": "public"}, "schema": "public", "identity": "public.t.c", "original": true}], "objects": [{"type": "table", "table": {"name": "t", "schema": "public"}, "schema": "public", "identity": "public.t"}], "search_path": "\"$user\", public"}`

func TestDDLEvent(t *testing.T) {
	m, err := schema.ParseDDL([]byte(ddlContent))
	require.NoError(t, err)
	require.Equal(t, "t", m.TableName())
	c := &cdc.Change{Source: "shop", Database: "db", CommitLSN: 0x1A2B3C8, LSN: 0x1A2B300, Seq: 1, TxSize: 3, Xid: 812,
		CommitTime: time.Date(2026, 12, 6, 7, 1, 2, 123456000, time.UTC), Op: cdc.OpMessage, Prefix: cdc.DDLPrefix,
		Content: []byte(ddlContent), Transactional: true}
	b, err := json.Marshal(schema.NewDDLEvent(m, c))
	require.NoError(t, err)
	require.JSONEq(t, `{"op":"ddl","source":"shop","schema":"public","table":"t","commit_lsn":"0/1A2B3C8","seq":1,"tx_size":3,"xid":812,
		"commit_time":"2026-12-06T07:01:02.123456Z","tag":"ALTER TABLE","ddl":"ALTER TABLE t DROP COLUMN c;",
		"objects":[{"type":"table","identity":"public.t","schema":"public","table":{"schema":"public","name":"t"}}],
		"dropped":[{"type":"table column","identity":"public.t.c","schema":"public","table":{"schema":"public","name":"t"},"original":true}],
		"user":"app","search_path":"\"$user\", public"}`, string(b))

	// In the debezium format: the statement, no tableChanges.
	c.Schema, c.Table, c.Op = "public", "t", cdc.OpDDL
	deb := string(schema.AppendDebeziumDDLEvent(nil, c, m, false))
	require.True(t, json.Valid([]byte(deb)), deb)
	require.Contains(t, deb, `"databaseName":"db","schemaName":"public","ddl":"ALTER TABLE t DROP COLUMN c;","tableChanges":[]}`)
	require.Contains(t, deb, `"schema":"public","table":"t"`)

	// A command on no table.
	none := strings.Replace(strings.Replace(ddlContent, `"table": "t"`, `"table": null`, 1), `"schema": "public", "dropped"`, `"schema": null, "dropped"`, 1)
	m, err = schema.ParseDDL([]byte(none))
	require.NoError(t, err)
	require.Nil(t, m.Table)
	require.Equal(t, "", m.TableName())
	require.Equal(t, "", m.Schema)

	for _, bad := range []string{`not json`, `{"v": 1}`, `{"tag": "X"}`} {
		_, err := schema.ParseDDL([]byte(bad))
		require.Error(t, err, bad)
	}
}

func TestDDLSetupSQL(t *testing.T) {
	sql := schema.DDLSetupSQL(`my "schema"`)
	require.Contains(t, sql, `CREATE OR REPLACE FUNCTION "my ""schema""".bridge_ddl_command_end() RETURNS event_trigger`)
	require.Contains(t, sql, `CREATE EVENT TRIGGER bridge_ddl_command_end ON ddl_command_end EXECUTE FUNCTION "my ""schema""".bridge_ddl_command_end();`)
	require.Contains(t, sql, `pg_logical_emit_message(true, '`+cdc.DDLPrefix+`', msg::text)`)
	require.Contains(t, sql, `pg_logical_emit_message(true, 'bridge_heartbeat', '')`)
	require.NotContains(t, sql, "%!") // no fmt mistakes
	require.True(t, strings.HasSuffix(sql, "COMMIT;\n"))
	rm := schema.DDLRemoveSQL("public")
	require.Contains(t, rm, "DROP EVENT TRIGGER IF EXISTS bridge_ddl_command_end;")
	require.Contains(t, rm, `DROP FUNCTION IF EXISTS "public".bridge_ddl_sql_drop();`)
}
