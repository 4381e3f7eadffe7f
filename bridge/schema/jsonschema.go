package schema

import (
	"encoding/json"
	"strings"
)

// Formats are the formats whose row rendering the registry describes
// (cloudevents' data is the native object).
var Formats = []string{"native", "debezium", "cloudevents"}

// RowSchema returns a JSON Schema (2020-12) of the row (a change's after,
// or a full before) of v as format renders it. A column may be absent (an
// unchanged TOAST value, a partial before image); no other property is
// allowed. A column may be null unless it is a key column or NOT NULL as
// the WAL says it (not inferred from the catalog, which may be newer than
// the rows: NOT NULL with pgoutput), and not a float or numeric one (a
// NaN that wal2json before 2.6 sends as null). A character varying(n) or
// character(n) value has at most n characters.
func RowSchema(v *Version, format string) json.RawMessage {
	props := map[string]any{}
	nullInferred := v.nullInferred()
	for _, c := range v.Columns {
		s := typeSchema(c.Type, format)
		if n := c.MaxLength(); n > 0 {
			if it, ok := s["items"].(map[string]any); ok {
				it["maxLength"] = n
			} else {
				s["maxLength"] = n
			}
		}
		notNull := c.Key && v.ReplicaIdentity != "full" ||
			c.NotNull && !nullInferred && c.Type != "float4" && c.Type != "float8" && c.Type != "numeric"
		if !notNull {
			s = nullable(s)
		}
		s["description"] = "Postgres type " + c.TypeName()
		props[c.Name] = s
	}
	doc := map[string]any{
		"$schema":              "https://json-schema.org/draft/2020-12/schema",
		"$id":                  "bridge:" + VersionKey(v.Source, v.Schema, v.Table, v.Version) + ":" + format,
		"title":                v.Schema + "." + v.Table + " row, " + format + " format",
		"type":                 "object",
		"properties":           props,
		"additionalProperties": false,
	}
	b, _ := json.Marshal(doc)
	return b
}

func nullable(s map[string]any) map[string]any {
	switch t := s["type"].(type) {
	case string:
		s["type"] = []string{t, "null"}
	case []string:
		s["type"] = append(t, "null")
	case nil:
		// any value: null included
	}
	return s
}

// typeSchema returns the schema of one value of Postgres type typ.
func typeSchema(typ, format string) map[string]any {
	if strings.HasPrefix(typ, "_") { // an array
		return map[string]any{"type": "array", "items": nullable(typeSchema(typ[1:], format))}
	}
	deb := format == "debezium"
	switch typ {
	case "bool":
		return map[string]any{"type": "boolean"}
	case "int2", "int4", "int8", "oid", "xid":
		return map[string]any{"type": "integer"}
	case "float4", "float8":
		if deb {
			return map[string]any{"type": []string{"number", "string"}}
		}
		return map[string]any{"type": []string{"number", "string"}} // NaN, ±Infinity as strings
	case "numeric":
		if deb {
			return map[string]any{"type": "string"}
		}
		return map[string]any{"type": []string{"number", "string"}}
	case "json", "jsonb":
		if deb {
			return map[string]any{"type": "string", "contentMediaType": "application/json"}
		}
		return map[string]any{} // any JSON value
	case "bytea":
		return map[string]any{"type": "string", "contentEncoding": "base64"}
	case "timestamptz":
		return map[string]any{"type": "string"}
	case "timestamp", "date":
		if deb {
			return map[string]any{"type": "integer"}
		}
		return map[string]any{"type": "string"}
	case "uuid":
		return map[string]any{"type": "string", "format": "uuid"}
	case "text", "varchar", "bpchar", "char", "name", "time", "timetz", "interval", "inet", "cidr",
		"macaddr", "macaddr8", "money", "bit", "varbit", "tsvector", "tsquery", "xml":
		return map[string]any{"type": "string"}
	}
	return map[string]any{} // a composite, a domain, an enum, an extension's type: not constrained
}

// fill sets v's JSON schemas for every format.
func fill(v *Version) {
	v.JSONSchema = map[string]json.RawMessage{}
	for _, f := range Formats {
		v.JSONSchema[f] = RowSchema(v, f)
	}
}
