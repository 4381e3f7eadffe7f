package format

import (
	"strconv"
	"strings"
	"sync"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// The debezium format's options (a route's debezium block): Kafka
// Connect's schemas.enable=true envelope, message keys and tombstones, as
// Debezium's users run it. The structures follow Debezium's own
// (debezium/debezium: io.debezium.data.Envelope, io.debezium.schema.
// SchemaFactory, io.debezium.connector.postgresql.PostgresSourceInfoStructMaker
// and PostgresSchemaFactory) and Kafka's JsonConverter, which writes a
// schema as {"type", "items" | "fields", "optional", "name", "version",
// "parameters", "default"} and a struct's field with "field" last.

// DebeziumOptions are the options of a route's debezium format
// (config.DebeziumFormat).
type DebeziumOptions struct {
	// SchemasEnable wraps every value as the JSON converter does with
	// schemas.enable=true: {"schema": <Connect schema>, "payload": <value>}.
	SchemasEnable bool
	// Key puts the message key (DebeziumKey) in the HeaderDebeziumKey
	// header; the router sets it.
	Key bool
	// Tombstones follows each delete with a tombstone (an empty payload);
	// the router publishes it.
	Tombstones bool
}

// HeaderDebeziumKey is the header holding a change's Debezium message key
// (the JSON converter's rendering of Debezium's key, with the schema
// envelope when SchemasEnable) when a route's debezium.key is "header".
const HeaderDebeziumKey = "Debezium-Key"

// DebeziumEnvelopeVersion is the version of Debezium's Envelope schema
// (io.debezium.data.Envelope.SCHEMA_VERSION).
const DebeziumEnvelopeVersion = 2

// DebeziumEncoder returns the encoder of the debezium format with o:
// AppendDebezium, wrapped in the schema envelope when o.SchemasEnable.
// The envelope's schema depends only on the change's relation (its
// columns as the route publishes them) and source: it is built once per
// relation and reused.
func DebeziumEncoder(o DebeziumOptions) Encoder {
	if !o.SchemasEnable {
		return AppendDebezium
	}
	cache := &schemaCache{m: map[schemaCacheKey][]byte{}}
	return func(dst []byte, c *cdc.Change) []byte {
		dst = append(dst, `{"schema":`...)
		dst = append(dst, cache.get(c, false)...)
		dst = append(dst, `,"payload":`...)
		dst = AppendDebezium(dst, c)
		return append(dst, '}')
	}
}

// DebeziumKeyEncoder returns a function appending c's Debezium message
// key as the JSON converter writes it: the key payload
// (AppendDebeziumKey), wrapped in {"schema": <the key's Connect schema>,
// "payload": ...} when schemasEnable. ok is false when c has no key (a
// table without key columns, a truncate): Debezium's key is then null.
func DebeziumKeyEncoder(schemasEnable bool) func(dst []byte, c *cdc.Change) (_ []byte, ok bool) {
	cache := &schemaCache{m: map[schemaCacheKey][]byte{}}
	return func(dst []byte, c *cdc.Change) ([]byte, bool) {
		start := len(dst)
		if schemasEnable {
			dst = append(dst, `{"schema":`...)
			dst = append(dst, cache.get(c, true)...)
			dst = append(dst, `,"payload":`...)
		}
		at := len(dst)
		dst = AppendDebeziumKey(dst, c)
		if string(dst[at:]) == "null" {
			return dst[:start], false
		}
		if schemasEnable {
			dst = append(dst, '}')
		}
		return dst, true
	}
}

type schemaCacheKey struct {
	rel    *cdc.Relation
	source string
	op     cdc.Op // OpMessage, or "" for the table envelope
	key    bool
}

// schemaCache holds the Connect schemas built for relations. A relation
// is immutable once decoded, and a new shape is a new relation, so its
// pointer identifies its schema; the map is cleared past maxSchemas.
type schemaCache struct {
	mu sync.Mutex
	m  map[schemaCacheKey][]byte
}

const maxSchemas = 4096

func (s *schemaCache) get(c *cdc.Change, key bool) []byte {
	k := schemaCacheKey{rel: c.Rel, source: c.Source, key: key}
	if c.Op == cdc.OpMessage {
		k = schemaCacheKey{source: c.Source, op: cdc.OpMessage, key: key}
	}
	s.mu.Lock()
	b, ok := s.m[k]
	s.mu.Unlock()
	if ok {
		return b
	}
	if key {
		b = debeziumKeySchema(c)
	} else {
		b = DebeziumValueSchema(nil, c)
	}
	s.mu.Lock()
	if len(s.m) >= maxSchemas {
		clear(s.m)
	}
	s.m[k] = b
	s.mu.Unlock()
	return b
}

// DebeziumValueSchema appends the Connect schema of c's Debezium value:
// for a row change, the table's Envelope (version 2) named
// "<source>.<schema>.<table>.Envelope", with before and after the table's
// Value struct (one field per column of c.Rel, in table order, required
// as debeziumRequired says, the others optional), source, transaction,
// op, ts_ms, ts_us and ts_ns; for a logical message, Debezium's
// io.debezium.connector.postgresql.MessageValue.
func DebeziumValueSchema(dst []byte, c *cdc.Change) []byte {
	if c.Op == cdc.OpMessage {
		dst = append(dst, `{"type":"struct","fields":[{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"},`...)
		dst = append(dst, debeziumSourceSchema...)
		dst = append(dst, `,`...)
		dst = append(dst, debeziumTransactionSchema...)
		dst = append(dst, `,{"type":"struct","fields":[{"type":"string","optional":true,"field":"prefix"},{"type":"bytes","optional":true,"field":"content"}],"optional":false,"name":"io.debezium.connector.postgresql.Message","version":1,"field":"message"}],"optional":false,"name":"io.debezium.connector.postgresql.MessageValue","version":1}`...)
		return dst
	}
	prefix := c.Source + "." + c.Schema + "." + c.Table
	var cols []cdc.Column
	if c.Rel != nil {
		cols = c.Rel.Columns
	}
	dst = append(dst, `{"type":"struct","fields":[`...)
	for _, f := range []string{"before", "after"} {
		dst = append(dst, `{"type":"struct","fields":[`...)
		for i := range cols {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendConnectField(dst, &cols[i], !debeziumRequired(c.Rel, &cols[i]), cols[i].Name)
		}
		dst = append(dst, `],"optional":true,"name":`...)
		dst = appendString(dst, prefix+".Value")
		dst = append(dst, `,"field":"`+f+`"},`...)
	}
	dst = append(dst, debeziumSourceSchema...)
	dst = append(dst, ',')
	dst = append(dst, debeziumTransactionSchema...)
	dst = append(dst, `,{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"},{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"}],"optional":false,"name":`...)
	dst = appendString(dst, prefix+".Envelope")
	dst = append(dst, `,"version":`+strconv.Itoa(DebeziumEnvelopeVersion)+`}`...)
	return dst
}

// debeziumRequired reports whether the Value struct of rel requires col:
// whether no value the bridge writes for it, in a before or an after
// image, is null (Kafka Connect's JSON converter refuses a null in a
// required field). That is a key column (but for REPLICA IDENTITY FULL,
// whose flags mark every column), and a NOT NULL column as the WAL says
// it (not read from the catalog, which may be newer than the row:
// pgoutput's NOT NULL) of a table whose before images carry every column
// (REPLICA IDENTITY FULL: with another identity, a delete's before has
// the key only, the other columns null), unless its type is float4,
// float8 or numeric (wal2json before 2.6 sends NaN as null).
func debeziumRequired(rel *cdc.Relation, col *cdc.Column) bool {
	full := rel.ReplicaIdentity == 'f'
	if col.Key && !full {
		return true
	}
	switch col.Type {
	case "float4", "float8", "numeric":
		return false
	}
	return col.NotNull && full && rel.Inferred&(cdc.InferredNotNull|cdc.InferredColumns) == 0
}

// debeziumKeySchema returns the Connect schema of c's key:
// "<source>.<schema>.<table>.Key", the key columns, required; for a
// logical message, io.debezium.connector.postgresql.MessageKey.
func debeziumKeySchema(c *cdc.Change) []byte {
	if c.Op == cdc.OpMessage {
		return []byte(`{"type":"struct","fields":[{"type":"string","optional":true,"field":"prefix"}],"optional":false,"name":"io.debezium.connector.postgresql.MessageKey","version":1}`)
	}
	var cols []cdc.Column
	if c.Rel != nil {
		cols = c.Rel.Columns
	}
	dst := []byte(`{"type":"struct","fields":[`)
	n := 0
	for i := range cols {
		if !cols[i].Key {
			continue
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		dst = appendConnectField(dst, &cols[i], false, cols[i].Name)
	}
	dst = append(dst, `],"optional":false,"name":`...)
	dst = appendString(dst, c.Source+"."+c.Schema+"."+c.Table+".Key")
	return append(dst, '}')
}

// debeziumSourceSchema is the Connect schema of the source block
// (io.debezium.connector.postgresql.Source, version 1) as the bridge
// writes it: Debezium's fields up to xmin (Debezium 3.2 added origin and
// origin_lsn, which the bridge does not write).
const debeziumSourceSchema = `{"type":"struct","fields":[` +
	`{"type":"string","optional":false,"field":"version"},` +
	`{"type":"string","optional":false,"field":"connector"},` +
	`{"type":"string","optional":false,"field":"name"},` +
	`{"type":"int64","optional":false,"field":"ts_ms"},` +
	`{"type":"string","optional":true,"name":"io.debezium.data.Enum","version":1,"parameters":{"allowed":"true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},"default":"false","field":"snapshot"},` +
	`{"type":"string","optional":false,"field":"db"},` +
	`{"type":"string","optional":true,"field":"sequence"},` +
	`{"type":"int64","optional":true,"field":"ts_us"},` +
	`{"type":"int64","optional":true,"field":"ts_ns"},` +
	`{"type":"string","optional":false,"field":"schema"},` +
	`{"type":"string","optional":false,"field":"table"},` +
	`{"type":"int64","optional":true,"field":"txId"},` +
	`{"type":"int64","optional":true,"field":"lsn"},` +
	`{"type":"int64","optional":true,"field":"xmin"}` +
	`],"optional":false,"name":"io.debezium.connector.postgresql.Source","version":1,"field":"source"}`

// debeziumTransactionSchema is the transaction block's schema (event.block).
const debeziumTransactionSchema = `{"type":"struct","fields":[` +
	`{"type":"string","optional":false,"field":"id"},` +
	`{"type":"int64","optional":false,"field":"total_order"},` +
	`{"type":"int64","optional":false,"field":"data_collection_order"}` +
	`],"optional":true,"name":"event.block","version":1,"field":"transaction"}`

// appendConnectField appends the Connect schema of col's values as
// AppendDebeziumValue renders them, with "field": name last (name ""
// leaves it out: an array's items).
func appendConnectField(dst []byte, col *cdc.Column, optional bool, name string) []byte {
	typ := col.Type
	if strings.HasPrefix(typ, "_") {
		elem := *col
		elem.Type, elem.OID = typ[1:], 0
		dst = append(dst, `{"type":"array","items":`...)
		dst = appendConnectField(dst, &elem, true, "")
		dst = append(dst, `,"optional":`...)
		dst = strconv.AppendBool(dst, optional)
	} else {
		t := DebeziumConnectType(typ)
		if t.Fields != "" {
			dst = append(dst, `{"type":"struct","fields":`...)
			dst = append(dst, t.Fields...)
		} else {
			dst = append(dst, `{"type":"`...)
			dst = append(dst, t.Type...)
			dst = append(dst, '"')
		}
		dst = append(dst, `,"optional":`...)
		dst = strconv.AppendBool(dst, optional)
		if t.Name != "" {
			dst = append(dst, `,"name":`...)
			dst = appendString(dst, t.Name)
			dst = append(dst, `,"version":1`...)
		}
	}
	if name != "" {
		dst = append(dst, `,"field":`...)
		dst = appendString(dst, name)
	}
	return append(dst, '}')
}

// ConnectType is the Connect schema of a column's values in the debezium
// format.
type ConnectType struct {
	Type string // int16, int32, int64, float32, float64, boolean, string, bytes, struct
	Name string // Debezium's logical type (version 1), or ""
	// Fields is the JSON array of a struct's fields, for Type "struct".
	Fields string
}

// DebeziumConnectType returns the Connect schema of the values of Postgres
// type typ (not an array) as AppendDebeziumValue renders them with the
// settings it emulates (decimal.handling.mode=string,
// time.precision.mode=adaptive, binary.handling.mode=bytes). Types the
// bridge keeps as Postgres' text (interval, time, money, ranges, enums, an
// extension's type) are strings; so are composites, whose values are
// objects the schema does not describe.
func DebeziumConnectType(typ string) ConnectType {
	switch typ {
	case "bool":
		return ConnectType{Type: "boolean"}
	case "int2":
		return ConnectType{Type: "int16"}
	case "int4":
		return ConnectType{Type: "int32"}
	case "int8", "oid":
		return ConnectType{Type: "int64"}
	case "float4":
		return ConnectType{Type: "float32"}
	case "float8":
		return ConnectType{Type: "float64"}
	case "bytea":
		return ConnectType{Type: "bytes"}
	case "date":
		return ConnectType{Type: "int32", Name: "io.debezium.time.Date"}
	case "timestamp":
		return ConnectType{Type: "int64", Name: "io.debezium.time.MicroTimestamp"}
	case "timestamptz":
		return ConnectType{Type: "string", Name: "io.debezium.time.ZonedTimestamp"}
	case "json", "jsonb":
		return ConnectType{Type: "string", Name: "io.debezium.data.Json"}
	case "uuid":
		return ConnectType{Type: "string", Name: "io.debezium.data.Uuid"}
	case "xml":
		return ConnectType{Type: "string", Name: "io.debezium.data.Xml"}
	}
	if g := strings.TrimPrefix(typ, "public."); g == "geometry" || g == "geography" {
		name := "io.debezium.data.geometry.Geometry"
		if g == "geography" {
			name = "io.debezium.data.geometry.Geography"
		}
		return ConnectType{Type: "struct", Name: name,
			Fields: `[{"type":"bytes","optional":false,"field":"wkb"},{"type":"int32","optional":true,"field":"srid"}]`}
	}
	return ConnectType{Type: "string"}
}

// DebeziumJDBCType returns the java.sql.Types code Debezium's PostgreSQL
// connector gives a column of Postgres type typ (as the PostgreSQL JDBC
// driver's TypeInfoCache maps it; arrays are ARRAY, types it does not know
// OTHER): the jdbcType of a schema change event's column.
func DebeziumJDBCType(typ string) int {
	if strings.HasPrefix(typ, "_") {
		return 2003 // ARRAY
	}
	switch typ {
	case "int2":
		return 5 // SMALLINT
	case "int4":
		return 4 // INTEGER
	case "int8", "oid":
		return -5 // BIGINT
	case "numeric":
		return 2 // NUMERIC
	case "float4":
		return 7 // REAL
	case "float8", "money":
		return 8 // DOUBLE
	case "char", "bpchar":
		return 1 // CHAR
	case "varchar", "text", "name":
		return 12 // VARCHAR
	case "bytea":
		return -2 // BINARY
	case "bool", "bit":
		return -7 // BIT
	case "date":
		return 91 // DATE
	case "time", "timetz":
		return 92 // TIME
	case "timestamp", "timestamptz":
		return 93 // TIMESTAMP
	}
	return 1111 // OTHER
}

// DebeziumSourceSchema is the Connect schema of the source block, as a
// struct's field "source" (for the schema change value's schema).
const DebeziumSourceSchema = debeziumSourceSchema
