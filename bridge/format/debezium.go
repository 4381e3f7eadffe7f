package format

import (
	"strconv"
	"time"
	"unsafe"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// DebeziumVersion is the value of source.version in Debezium events: it
// names the emitter, where Debezium puts its own release ("3.1.2.Final").
const DebeziumVersion = "bridge"

// DebeziumUnavailable is Debezium's default unavailable.value.placeholder,
// written for unchanged TOAST columns whose value the change does not carry.
const DebeziumUnavailable = "__debezium_unavailable_value"

// AppendDebezium appends c as the value of a Debezium PostgreSQL connector
// change event, as Kafka Connect's JsonConverter writes it with schemas
// disabled: the bare payload object, so existing Debezium consumers parse it
// unchanged. Keys come in Debezium's order:
//
//	"before", "after"  the old and new row, or null; rows are objects in table
//	                   column order (not written for op "m")
//	"source"           {"version": DebeziumVersion, "connector": "postgresql",
//	                   "name": c.Source, "ts_ms": commit time, "snapshot":
//	                   "true" for op "r" else "false", "db": c.Database,
//	                   "sequence": "[\"<commit LSN>\",\"<LSN>\"]", "ts_us",
//	                   "ts_ns", "schema", "table", "txId": c.Xid, "lsn": c.LSN,
//	                   "xmin": null, and "masked" when the route masked
//	                   columns: {"ssn": "redact", ...} as in the native
//	                   format}; LSNs are decimal integers
//	"op"               "c", "u", "d", "r", "t" or "m"
//	"ts_ms", "ts_us", "ts_ns"  the commit time again (see below)
//	"message"          only for op "m": {"prefix", "content": base64}
//	"transaction"      {"id": "<xid>:<commit LSN>", "total_order": Seq+1,
//	                   "data_collection_order": Seq+1}, or null without an xid
//
// Choices where the bridge cannot or does not copy Debezium exactly:
//
//   - The top-level ts_ms/ts_us/ts_ns are the commit time, not the time the
//     event was processed, so the encoding of a change never varies. When
//     the commit time is unknown (a non-transactional logical message) both
//     the source and the top-level times are the time of encoding, as
//     Debezium does for such messages.
//   - source.sequence is [commit end LSN, change LSN]. Debezium's first
//     element is the LSN of the previous commit it saw, which the bridge
//     does not track; the commit end LSN of the change's own transaction
//     orders events exactly the same way. An LSN of 0 is written as null;
//     so are source.lsn and source.txId when 0.
//   - transaction.data_collection_order equals total_order: the position
//     among the transaction's changes to the same table is not known. The
//     transaction block is always present (provide.transaction.metadata=true).
//   - A key change is one "u" event whose before holds the old key, where
//     Debezium emits a delete, a tombstone and a create. Tombstones after
//     deletes are a route's option (debezium.tombstones_on_delete), as are
//     the schema envelope (DebeziumEncoder) and the key (DebeziumKeyEncoder).
//   - source.snapshot is never "first" or "last".
//
// Column values follow Debezium's defaults, except numerics (see
// AppendDebeziumValue). Before images keep the key columns and write null
// for the columns Postgres did not send (cdc.Absent). Unchanged TOAST
// columns take their value from the before image when it has one, else
// Debezium's placeholder (DebeziumUnavailable, shaped by column type).
func AppendDebezium(dst []byte, c *cdc.Change) []byte {
	var cols []cdc.Column
	if c.Rel != nil {
		cols = c.Rel.Columns
	}
	ts := c.CommitTime
	if ts.IsZero() {
		ts = time.Now()
	}
	if c.Op == cdc.OpMessage {
		dst = append(dst, `{"source":`...)
	} else {
		dst = append(dst, `{"before":`...)
		if c.Op == cdc.OpTruncate {
			dst = append(dst, `null,"after":null`...)
		} else {
			dst = appendDebeziumRow(dst, cols, c.Before, nil)
			dst = append(dst, `,"after":`...)
			dst = appendDebeziumRow(dst, cols, c.After, c.Before)
		}
		dst = append(dst, `,"source":`...)
	}

	dst = appendDebeziumSource(dst, c, ts)
	dst = append(dst, `,"op":"`...)
	dst = append(dst, debeziumOp(c.Op)...)
	dst = append(dst, `","ts_ms":`...)
	dst = strconv.AppendInt(dst, ts.UnixMilli(), 10)
	dst = append(dst, `,"ts_us":`...)
	dst = strconv.AppendInt(dst, ts.UnixMicro(), 10)
	dst = append(dst, `,"ts_ns":`...)
	dst = strconv.AppendInt(dst, ts.UnixNano(), 10)
	if c.Op == cdc.OpMessage {
		dst = append(dst, `,"message":{"prefix":`...)
		dst = appendString(dst, c.Prefix)
		dst = append(dst, `,"content":`...)
		dst = appendBase64(dst, c.Content)
		dst = append(dst, '}')
	}
	dst = append(dst, `,"transaction":`...)
	if c.Xid == 0 {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, `{"id":"`...)
		dst = strconv.AppendUint(dst, uint64(c.Xid), 10)
		dst = append(dst, ':')
		dst = strconv.AppendUint(dst, uint64(c.CommitLSN), 10)
		dst = append(dst, `","total_order":`...)
		dst = strconv.AppendUint(dst, uint64(c.Seq)+1, 10)
		dst = append(dst, `,"data_collection_order":`...)
		dst = strconv.AppendUint(dst, uint64(c.Seq)+1, 10)
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

// AppendDebeziumSource appends the source block of c's Debezium events
// (the PostgreSQL connector's io.debezium.connector.postgresql.Source):
// the same object AppendDebezium writes, its times the commit time, or
// now when c has none.
func AppendDebeziumSource(dst []byte, c *cdc.Change) []byte {
	ts := c.CommitTime
	if ts.IsZero() {
		ts = time.Now()
	}
	return appendDebeziumSource(dst, c, ts)
}

func appendDebeziumSource(dst []byte, c *cdc.Change, ts time.Time) []byte {
	dst = append(dst, `{"version":"`+DebeziumVersion+`","connector":"postgresql","name":`...)
	dst = appendString(dst, c.Source)
	dst = append(dst, `,"ts_ms":`...)
	dst = strconv.AppendInt(dst, ts.UnixMilli(), 10)
	if c.Op == cdc.OpRead {
		dst = append(dst, `,"snapshot":"true","db":`...)
	} else {
		dst = append(dst, `,"snapshot":"false","db":`...)
	}
	dst = appendString(dst, c.Database)
	dst = append(dst, `,"sequence":"[`...)
	dst = appendSequenceLSN(dst, c.CommitLSN)
	dst = append(dst, ',')
	dst = appendSequenceLSN(dst, c.LSN)
	dst = append(dst, `]","ts_us":`...)
	dst = strconv.AppendInt(dst, ts.UnixMicro(), 10)
	dst = append(dst, `,"ts_ns":`...)
	dst = strconv.AppendInt(dst, ts.UnixNano(), 10)
	if c.Op == cdc.OpMessage {
		dst = append(dst, `,"schema":"","table":""`...)
	} else {
		dst = append(dst, `,"schema":`...)
		dst = appendString(dst, c.Schema)
		dst = append(dst, `,"table":`...)
		dst = appendString(dst, c.Table)
	}
	dst = append(dst, `,"txId":`...)
	dst = appendOptionalUint(dst, uint64(c.Xid))
	dst = append(dst, `,"lsn":`...)
	dst = appendOptionalUint(dst, uint64(c.LSN))
	dst = append(dst, `,"xmin":null`...)
	if m := c.Headers[HeaderMasked]; m != "" {
		dst = append(dst, `,"masked":`...)
		dst = AppendMasked(dst, m)
	}
	return append(dst, '}')
}

// AppendDebeziumKey appends the payload of c's Debezium key: the key columns
// (Column.Key) as an object, taken from After (Before for delete) with
// Debezium values; {"prefix": ...} for a logical message; null for truncate,
// when the row is nil, or when the relation has no key column. An unchanged
// TOAST key column is taken from Before when Before has it, else left out.
func AppendDebeziumKey(dst []byte, c *cdc.Change) []byte {
	var cols []cdc.Column
	if c.Rel != nil {
		cols = c.Rel.Columns
	}
	row, alt := c.After, c.Before
	switch c.Op {
	case cdc.OpMessage:
		dst = append(dst, `{"prefix":`...)
		dst = appendString(dst, c.Prefix)
		return append(dst, '}')
	case cdc.OpTruncate:
		return append(dst, "null"...)
	case cdc.OpDelete:
		row, alt = c.Before, nil
	}
	if row == nil {
		return append(dst, "null"...)
	}
	n := 0
	for i := range cols {
		if !cols[i].Key || i >= len(row) {
			continue
		}
		v := row[i]
		if omitted(v) {
			if i >= len(alt) || omitted(alt[i]) {
				continue
			}
			v = alt[i]
		}
		if n == 0 {
			dst = append(dst, '{')
		} else {
			dst = append(dst, ',')
		}
		n++
		dst = appendName(dst, cols, i)
		dst = AppendDebeziumValue(dst, v, &cols[i])
	}
	if n == 0 {
		return append(dst, "null"...)
	}
	return append(dst, '}')
}

func debeziumOp(op cdc.Op) string {
	switch op {
	case cdc.OpInsert:
		return "c"
	case cdc.OpUpdate:
		return "u"
	case cdc.OpDelete:
		return "d"
	case cdc.OpRead:
		return "r"
	case cdc.OpTruncate:
		return "t"
	case cdc.OpMessage:
		return "m"
	}
	return "?"
}

// appendSequenceLSN appends l as an element of source.sequence, a JSON
// array inside a JSON string: \"123\", or null for 0.
func appendSequenceLSN(dst []byte, l cdc.LSN) []byte {
	if l == 0 {
		return append(dst, "null"...)
	}
	dst = append(dst, '\\', '"')
	dst = strconv.AppendUint(dst, uint64(l), 10)
	return append(dst, '\\', '"')
}

func appendOptionalUint(dst []byte, v uint64) []byte {
	if v == 0 {
		return append(dst, "null"...)
	}
	return strconv.AppendUint(dst, v, 10)
}

// appendDebeziumRow appends row as an object of all its columns: Absent is
// null, Unchanged is alt's value for the column when alt has one, else the
// placeholder.
func appendDebeziumRow(dst []byte, cols []cdc.Column, row, alt []any) []byte {
	if row == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '{')
	for i, v := range row {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendName(dst, cols, i)
		var col *cdc.Column
		if i < len(cols) {
			col = &cols[i]
		}
		if _, ok := v.(cdc.UnchangedToast); ok && i < len(alt) && !omitted(alt[i]) {
			v = alt[i]
		}
		dst = AppendDebeziumValue(dst, v, col)
	}
	return append(dst, '}')
}

// AppendDebeziumValue appends v, a column value of the change model, as
// Debezium's PostgreSQL connector renders it with its default settings and
// the JSON converter; col (may be nil) gives the type where the Go value
// does not say enough. Settings emulated:
//
//   - decimal.handling.mode=string (Debezium's default, precise, needs the
//     schema to be read): numeric is a string as Java's BigDecimal.toString
//     writes it, "1234.50", with E notation below 1e-6 in magnitude
//     ("0.0000001" is "1E-7", "0.00000000" is "0E-8"); NaN, Infinity and
//     -Infinity are "NAN", "POSITIVE_INFINITY" and "NEGATIVE_INFINITY".
//   - binary.handling.mode=bytes: bytea is a base64 string.
//   - time.precision.mode=adaptive: timestamp is microseconds since the
//     epoch (io.debezium.time.MicroTimestamp; Debezium uses milliseconds
//     for timestamp(0..3), a type modifier the bridge does not see);
//     timestamptz is an ISO 8601 string in UTC, "2024-02-29T07:04:56.789012Z"
//     (ZonedTimestamp); date is days since the epoch (io.debezium.time.Date).
//   - infinity: timestamp ±infinity are 9223372036825200000 and
//     -9223372036832400000, timestamptz ones the strings "infinity" and
//     "-infinity", date ones 2146033979 and -2147472691 (Debezium's
//     +5877611-06-21 and -5877611-06-22 sentinels), as Debezium writes them.
//   - json and jsonb are strings holding the JSON text (io.debezium.data.Json).
//   - uuid, enums, text types and every type the bridge keeps as Postgres
//     text (interval, time, timetz, money, inet, ranges, ...) are strings;
//     Debezium would turn interval into microseconds, time into
//     microseconds past midnight and money into a plain decimal string.
//   - float NaN and ±Inf are "NaN", "Infinity", "-Infinity" (Jackson).
//   - arrays are arrays of their elements rendered the same way.
//   - PostGIS geometry and geography are Debezium's
//     io.debezium.data.geometry.Geometry and Geography structs:
//     {"wkb": base64 of the EWKB as PostGIS sends it, "srid": the EWKB's
//     SRID or null}.
//   - composites (which Debezium does not map) are objects of their fields
//     rendered the same way, in the type's order.
//   - cdc.Unchanged is the placeholder: ["__debezium_unavailable_value"]
//     for text, varchar, json and jsonb arrays, the placeholder's bytes as
//     numbers for int4, int8 and date arrays, base64 of its bytes for bytea,
//     and the string "__debezium_unavailable_value" otherwise.
//   - cdc.Absent is null.
func AppendDebeziumValue(dst []byte, v any, col *cdc.Column) []byte {
	switch v := v.(type) {
	case cdc.Numeric:
		return appendDebeziumNumeric(dst, v)
	case cdc.RawJSON:
		if len(v) == 0 {
			return append(dst, "null"...)
		}
		return appendString(dst, bytesString(v))
	case cdc.Timestamp:
		return strconv.AppendInt(dst, v.Unix()*1e6+int64(v.Nanosecond()/1e3), 10)
	case cdc.Date:
		return strconv.AppendInt(dst, floorDiv(v.Unix(), 86400), 10)
	case cdc.Infinity:
		switch debeziumTemporal(col) {
		case typeDate:
			if v < 0 {
				return append(dst, "-2147472691"...)
			}
			return append(dst, "2146033979"...)
		case typeTimestamp:
			if v < 0 {
				return append(dst, "-9223372036832400000"...)
			}
			return append(dst, "9223372036825200000"...)
		}
		return AppendValue(dst, v)
	case []any:
		dst = append(dst, '[')
		for i, e := range v {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendDebeziumValue(dst, e, col)
		}
		return append(dst, ']')
	case cdc.Record:
		dst = append(dst, '{')
		for i, n := range v.Names {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, n)
			dst = append(dst, ':')
			if i < len(v.Values) {
				dst = AppendDebeziumValue(dst, v.Values[i], nil)
			} else {
				dst = append(dst, "null"...)
			}
		}
		return append(dst, '}')
	case cdc.Geometry:
		dst = append(dst, `{"wkb":`...)
		dst = appendBase64(dst, v.EWKB)
		dst = append(dst, `,"srid":`...)
		if srid, ok := v.SRID(); ok {
			dst = strconv.AppendInt(dst, int64(srid), 10)
		} else {
			dst = append(dst, "null"...)
		}
		return append(dst, '}')
	case cdc.UnchangedToast:
		return appendDebeziumPlaceholder(dst, col)
	case cdc.AbsentValue:
		return append(dst, "null"...)
	}
	return AppendValue(dst, v)
}

// bytesString returns b as a string without copying; the string must not
// outlive b or be used after b changes.
func bytesString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// appendDebeziumNumeric writes n as java.math.BigDecimal.toString does for
// new BigDecimal(n): the unscaled digits with a decimal point, or E notation
// when the adjusted exponent is below -6.
func appendDebeziumNumeric(dst []byte, n cdc.Numeric) []byte {
	switch n {
	case "NaN":
		return append(dst, `"NAN"`...)
	case "Infinity":
		return append(dst, `"POSITIVE_INFINITY"`...)
	case "-Infinity":
		return append(dst, `"NEGATIVE_INFINITY"`...)
	}
	s := string(n)
	neg := false
	i := 0
	if i < len(s) && (s[i] == '-' || s[i] == '+') {
		neg = s[i] == '-'
		i++
	}
	intStart := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	intPart := s[intStart:i]
	fracPart := ""
	if i < len(s) && s[i] == '.' {
		i++
		fracStart := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		fracPart = s[fracStart:i]
	}
	if i != len(s) || intPart == "" && fracPart == "" {
		// Not Postgres' plain decimal form: keep the text.
		return appendString(dst, s)
	}
	// The unscaled value is intPart+fracPart without leading zeros.
	for len(intPart) > 0 && intPart[0] == '0' {
		intPart = intPart[1:]
	}
	frac := fracPart
	if intPart == "" {
		for len(frac) > 0 && frac[0] == '0' {
			frac = frac[1:]
		}
	}
	ulen := len(intPart) + len(frac)
	zero := ulen == 0
	if zero {
		ulen = 1
	}
	scale := len(fracPart)
	adjusted := ulen - 1 - scale

	dst = append(dst, '"')
	if neg && !zero {
		dst = append(dst, '-')
	}
	if adjusted >= -6 {
		// Plain notation: Postgres' text is already canonical apart from
		// the sign of zero and superfluous leading zeros.
		if intPart == "" {
			dst = append(dst, '0')
		} else {
			dst = append(dst, intPart...)
		}
		if scale > 0 {
			dst = append(dst, '.')
			dst = append(dst, fracPart...)
		}
		return append(dst, '"')
	}
	// E notation: only reachable when intPart is empty (|n| < 1e-6).
	if zero {
		dst = append(dst, '0')
	} else {
		dst = append(dst, frac[0])
		if len(frac) > 1 {
			dst = append(dst, '.')
			dst = append(dst, frac[1:]...)
		}
	}
	dst = append(dst, 'E')
	dst = strconv.AppendInt(dst, int64(adjusted), 10)
	return append(dst, '"')
}

// Postgres type OIDs the Debezium rendering depends on.
const (
	oidBytea       = 17
	oidJSONArray   = 199
	oidDate        = 1082
	oidDateArray   = 1182
	oidInt4Array   = 1007
	oidInt8Array   = 1016
	oidTextArray   = 1009
	oidVarchArray  = 1015
	oidTimestamp   = 1114
	oidTSArray     = 1115
	oidTimestampTZ = 1184
	oidTSTZArray   = 1185
	oidJSONBArray  = 3807
)

type temporalType uint8

const (
	typeOther temporalType = iota
	typeDate
	typeTimestamp
	typeTimestampTZ
)

// debeziumTemporal classifies col, or the element type of an array col, as
// a date or timestamp type by OID, falling back to its name.
func debeziumTemporal(col *cdc.Column) temporalType {
	if col == nil {
		return typeOther
	}
	switch col.OID {
	case oidDate, oidDateArray:
		return typeDate
	case oidTimestamp, oidTSArray:
		return typeTimestamp
	case oidTimestampTZ, oidTSTZArray:
		return typeTimestampTZ
	}
	switch col.Type {
	case "date", "_date":
		return typeDate
	case "timestamp", "_timestamp":
		return typeTimestamp
	case "timestamptz", "_timestamptz":
		return typeTimestampTZ
	}
	return typeOther
}

// appendDebeziumPlaceholder appends the unavailable-value placeholder in the
// shape Debezium gives it for col's type (UnchangedToastedPlaceholder).
func appendDebeziumPlaceholder(dst []byte, col *cdc.Column) []byte {
	var oid uint32
	var name string
	if col != nil {
		oid, name = col.OID, col.Type
	}
	switch {
	case oid == oidBytea || oid == 0 && name == "bytea":
		return append(dst, `"X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="`...)
	case oid == oidTextArray || oid == oidVarchArray || oid == oidJSONArray || oid == oidJSONBArray ||
		oid == 0 && (name == "_text" || name == "_varchar" || name == "_json" || name == "_jsonb"):
		return append(dst, `["`+DebeziumUnavailable+`"]`...)
	case oid == oidInt4Array || oid == oidInt8Array || oid == oidDateArray ||
		oid == 0 && (name == "_int4" || name == "_int8" || name == "_date"):
		dst = append(dst, '[')
		for i := 0; i < len(DebeziumUnavailable); i++ {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendUint(dst, uint64(DebeziumUnavailable[i]), 10)
		}
		return append(dst, ']')
	}
	return append(dst, `"`+DebeziumUnavailable+`"`...)
}
