package schema

import (
	"strconv"
	"strings"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
)

// Schema change events and DDL events in the debezium format: Debezium's
// schema change value (io.debezium.schema.SchemaFactory's
// schemaHistoryConnectorValueSchema, its tableChanges as
// io.debezium.relational.history.ConnectTableChangeSerializer writes
// them), as Kafka Connect's JSON converter renders it: every field of
// every struct, null when unset. Debezium's PostgreSQL connector has no
// schema change topic; the bridge writes what its relational connectors
// write (SQL Server's, whose ddl is null as the bridge's schema change
// events' is), with the PostgreSQL connector's source block.

// DebeziumSchemaChangeKey is the message key of Debezium's schema change
// events: {"databaseName": <database>} (SchemaChangeKey), with its schema
// when schemasEnable.
func DebeziumSchemaChangeKey(dst []byte, database string, schemasEnable bool) []byte {
	if schemasEnable {
		dst = append(dst, `{"schema":{"type":"struct","fields":[{"type":"string","optional":false,"field":"databaseName"}],"optional":false,"name":"io.debezium.connector.postgresql.SchemaChangeKey","version":1},"payload":`...)
	}
	dst = append(dst, `{"databaseName":`...)
	dst = format.AppendValue(dst, database)
	dst = append(dst, '}')
	if schemasEnable {
		dst = append(dst, '}')
	}
	return dst
}

// AppendDebeziumSchemaEvent appends the debezium format's payload of the
// schema change event announcing v (prev: the version before, nil for
// the table's first) before change c: a schema change value whose ddl is
// null and whose tableChanges holds the table as v describes it, type
// CREATE for a table's first version and ALTER for the next ones.
func AppendDebeziumSchemaEvent(dst []byte, c *cdc.Change, v, prev *Version, schemasEnable bool) []byte {
	typ := "ALTER"
	if prev == nil {
		typ = "CREATE"
	}
	return appendSchemaChangeValue(dst, c, v.Schema, nil, func(dst []byte) []byte {
		return appendTableChange(dst, typ, v)
	}, schemasEnable)
}

// AppendDebeziumDDLEvent appends the debezium format's payload of the DDL
// event of m, decoded from change c: a schema change value whose ddl is
// the statement and whose tableChanges is empty (the table's new shape
// comes with the schema change event before its first change).
func AppendDebeziumDDLEvent(dst []byte, c *cdc.Change, m DDLMessage, schemasEnable bool) []byte {
	ddl := m.DDL
	return appendSchemaChangeValue(dst, c, m.Schema, &ddl, nil, schemasEnable)
}

func appendSchemaChangeValue(dst []byte, c *cdc.Change, schemaName string, ddl *string, changes func([]byte) []byte, schemasEnable bool) []byte {
	if schemasEnable {
		dst = append(dst, `{"schema":`...)
		dst = append(dst, debeziumSchemaChangeValueSchema...)
		dst = append(dst, `,"payload":`...)
	}
	ts := c.CommitTime
	dst = append(dst, `{"source":`...)
	dst = format.AppendDebeziumSource(dst, c)
	dst = append(dst, `,"ts_ms":`...)
	if ts.IsZero() {
		dst = append(dst, '0')
	} else {
		dst = strconv.AppendInt(dst, ts.UnixMilli(), 10)
	}
	dst = append(dst, `,"databaseName":`...)
	dst = format.AppendValue(dst, c.Database)
	dst = append(dst, `,"schemaName":`...)
	if schemaName == "" {
		dst = append(dst, "null"...)
	} else {
		dst = format.AppendValue(dst, schemaName)
	}
	dst = append(dst, `,"ddl":`...)
	if ddl == nil {
		dst = append(dst, "null"...)
	} else {
		dst = format.AppendValue(dst, *ddl)
	}
	dst = append(dst, `,"tableChanges":[`...)
	if changes != nil {
		dst = changes(dst)
	}
	dst = append(dst, "]}"...)
	if schemasEnable {
		dst = append(dst, '}')
	}
	return dst
}

// appendTableChange appends one element of tableChanges: the table as v
// describes it. Debezium's id is the table's double-quoted name
// ("schema"."table": the PostgreSQL connector's table ids have no
// catalog). A column is optional unless it is NOT NULL as the version
// says it (with pgoutput the catalog's, as Debezium's connector reads it
// too) or part of the key (but for REPLICA IDENTITY FULL, whose key is the
// whole row); primaryKeyColumnNames is the key (empty with REPLICA
// IDENTITY FULL). length and scale come from the type's modifier
// (debeziumLengthScale), else are null.
func appendTableChange(dst []byte, typ string, v *Version) []byte {
	full := v.ReplicaIdentity == "full"
	dst = append(dst, `{"type":"`...)
	dst = append(dst, typ...)
	dst = append(dst, `","id":`...)
	dst = format.AppendValue(dst, quoteIdent(v.Schema)+"."+quoteIdent(v.Table))
	dst = append(dst, `,"table":{"defaultCharsetName":null,"primaryKeyColumnNames":[`...)
	if !full {
		for i, k := range v.Key {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = format.AppendValue(dst, k)
		}
	}
	dst = append(dst, `],"columns":[`...)
	for i, c := range v.Columns {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"name":`...)
		dst = format.AppendValue(dst, c.Name)
		dst = append(dst, `,"jdbcType":`...)
		dst = strconv.AppendInt(dst, int64(format.DebeziumJDBCType(c.Type)), 10)
		dst = append(dst, `,"nativeType":null,"typeName":`...)
		dst = format.AppendValue(dst, c.Type)
		dst = append(dst, `,"typeExpression":`...)
		dst = format.AppendValue(dst, c.Type)
		dst = append(dst, `,"charsetName":null,"length":`...)
		length, scale := debeziumLengthScale(c)
		dst = appendOptInt(dst, length)
		dst = append(dst, `,"scale":`...)
		dst = appendOptInt(dst, scale)
		dst = append(dst, `,"position":`...)
		dst = strconv.AppendInt(dst, int64(i+1), 10)
		dst = append(dst, `,"optional":`...)
		dst = strconv.AppendBool(dst, !c.NotNull && (!c.Key || full))
		dst = append(dst, `,"autoIncremented":false,"generated":false,"comment":null,"defaultValueExpression":null,"enumValues":null}`...)
	}
	return append(dst, `],"comment":null}}`...)
}

// debeziumLengthScale returns the length and scale Debezium's column
// description gives c, from its type's modifier (Declared), nil for none
// (null): numeric(p,s) is length p and scale s (numeric(p): scale 0; a
// negative scale as PostgreSQL 15 allows it, as is); character
// varying(n), character(n), bit(n) and bit varying(n) are length n. Other
// types (the precision of a time type included), arrays and types without
// a modifier have neither.
func debeziumLengthScale(c Column) (length, scale *int) {
	_, n := modArgs(c.Declared)
	switch c.Type {
	case "numeric":
		switch len(n) {
		case 1:
			return &n[0], new(int)
		case 2:
			return &n[0], &n[1]
		}
	case "varchar", "bpchar", "bit", "varbit":
		if len(n) == 1 {
			return &n[0], nil
		}
	}
	return nil, nil
}

// appendOptInt appends *n, or null for nil.
func appendOptInt(dst []byte, n *int) []byte {
	if n == nil {
		return append(dst, "null"...)
	}
	return strconv.AppendInt(dst, int64(*n), 10)
}

// quoteIdent double-quotes an identifier as Debezium's
// TableId.toDoubleQuotedString does: the name between double quotes,
// inner double quotes doubled.
func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// debeziumSchemaChangeValueSchema is the Connect schema of the schema
// change value (SchemaFactory.schemaHistoryConnectorValueSchema), for
// schemas.enable=true.
var debeziumSchemaChangeValueSchema = `{"type":"struct","fields":[` +
	debeziumSourceSchema + `,` +
	`{"type":"int64","optional":false,"field":"ts_ms"},` +
	`{"type":"string","optional":true,"field":"databaseName"},` +
	`{"type":"string","optional":true,"field":"schemaName"},` +
	`{"type":"string","optional":true,"field":"ddl"},` +
	`{"type":"array","items":{"type":"struct","fields":[` +
	`{"type":"string","optional":false,"field":"type"},` +
	`{"type":"string","optional":false,"field":"id"},` +
	`{"type":"struct","fields":[` +
	`{"type":"string","optional":true,"field":"defaultCharsetName"},` +
	`{"type":"array","items":{"type":"string","optional":false},"optional":true,"field":"primaryKeyColumnNames"},` +
	`{"type":"array","items":{"type":"struct","fields":[` +
	`{"type":"string","optional":false,"field":"name"},` +
	`{"type":"int32","optional":false,"field":"jdbcType"},` +
	`{"type":"int32","optional":true,"field":"nativeType"},` +
	`{"type":"string","optional":false,"field":"typeName"},` +
	`{"type":"string","optional":true,"field":"typeExpression"},` +
	`{"type":"string","optional":true,"field":"charsetName"},` +
	`{"type":"int32","optional":true,"field":"length"},` +
	`{"type":"int32","optional":true,"field":"scale"},` +
	`{"type":"int32","optional":false,"field":"position"},` +
	`{"type":"boolean","optional":true,"field":"optional"},` +
	`{"type":"boolean","optional":true,"field":"autoIncremented"},` +
	`{"type":"boolean","optional":true,"field":"generated"},` +
	`{"type":"string","optional":true,"field":"comment"},` +
	`{"type":"string","optional":true,"field":"defaultValueExpression"},` +
	`{"type":"array","items":{"type":"string","optional":false},"optional":true,"field":"enumValues"}` +
	`],"optional":false,"name":"io.debezium.connector.schema.Column","version":1},"optional":false,"field":"columns"},` +
	`{"type":"string","optional":true,"field":"comment"}` +
	`],"optional":true,"name":"io.debezium.connector.schema.Table","version":1,"field":"table"}` +
	`],"optional":false,"name":"io.debezium.connector.schema.Change","version":1},"optional":false,"field":"tableChanges"}` +
	`],"optional":false,"name":"io.debezium.connector.postgresql.SchemaChangeValue","version":1}`

// debeziumSourceSchema is the source block's Connect schema.
var debeziumSourceSchema = format.DebeziumSourceSchema
