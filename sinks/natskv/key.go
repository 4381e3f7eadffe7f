package natskv

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/kvkey"
)

// Keys. A row is filed under
//
//	[<key_prefix>.]<schema>.<table>.<value>[.<value>...]
//
// with one token for each key column (the replica identity: the primary
// key, or the index of REPLICA IDENTITY USING INDEX) in the table's column
// order. Each token is kvkey's escape of the value's text (ValueText):
// bytes outside [A-Za-z0-9_-] as "=XX" (upper-case hex of each UTF-8 byte),
// the empty string as a lone "=". So "public.orders.42",
// "public.order_items.42.7", "public.users.ada=40example=2Ecom",
// "public.cities.M=C3=BCnchen". A row key always has at least three tokens
// after the prefix; the table's own key "[<key_prefix>.]<schema>.<table>"
// holds its last TRUNCATE (see truncate.go) and is never a row's.

// errNoKey: the table has no key columns.
var errNoKey = errors.New("the table has no primary key or replica identity index")

// TableKey returns the key of a table: its rows are filed under TableKey + "." + values.
func TableKey(prefix, schema, table string) string {
	b := make([]byte, 0, len(prefix)+len(schema)+len(table)+8)
	return string(appendTableKey(b, prefix, schema, table))
}

func appendTableKey(dst []byte, prefix, schema, table string) []byte {
	if prefix != "" {
		dst = append(dst, prefix...)
		dst = append(dst, '.')
	}
	dst = kvkey.Append(dst, schema)
	dst = append(dst, '.')
	return kvkey.Append(dst, table)
}

// RowKey returns the key of the row whose key columns have the texts values.
func RowKey(prefix, schema, table string, values ...string) string {
	b := appendTableKey(make([]byte, 0, 64), prefix, schema, table)
	for _, v := range values {
		b = append(b, '.')
		b = kvkey.Append(b, v)
	}
	return string(b)
}

// ParseKey splits a key of this sink's bucket into schema, table and the
// texts of the row's key values (none for a table's own key), after
// removing prefix (the sink's key_prefix).
func ParseKey(key, prefix string) (schema, table string, values []string, err error) {
	rest := key
	if prefix != "" {
		var ok bool
		if rest, ok = strings.CutPrefix(key, prefix+"."); !ok {
			return "", "", nil, fmt.Errorf("key %q does not start with the prefix %q", key, prefix+".")
		}
	}
	toks := strings.Split(rest, ".")
	if len(toks) < 2 {
		return "", "", nil, fmt.Errorf("key %q has no table", key)
	}
	out := make([]string, len(toks))
	for i, t := range toks {
		if out[i], err = kvkey.Unescape(t); err != nil {
			return "", "", nil, fmt.Errorf("key %q: %w", key, err)
		}
	}
	return out[0], out[1], out[2:], nil
}

// rowValues returns the texts of the key columns of row (rel's layout),
// taking a column row does not carry (an unchanged TOAST value) from
// other when it has it. ok is false when a key value is missing from both
// (a partial old row); err names what is wrong with the key.
func rowValues(rel *cdc.Relation, row, other []any) (vals []string, ok bool, err error) {
	for i, col := range rel.Columns {
		if !col.Key {
			continue
		}
		var v any = cdc.Absent
		if i < len(row) {
			v = row[i]
		}
		switch v.(type) {
		case cdc.AbsentValue, cdc.UnchangedToast:
			if i < len(other) {
				v = other[i]
			}
		}
		switch v.(type) {
		case cdc.AbsentValue, cdc.UnchangedToast:
			return nil, false, nil
		case nil:
			return nil, false, fmt.Errorf("key column %q is null", col.Name)
		}
		vals = append(vals, ValueText(v))
	}
	if vals == nil {
		return nil, false, errNoKey
	}
	return vals, true, nil
}

// ValueText is the text of a key value in a key, before escaping: as the
// native format renders the value, without JSON's quotes. Integers and
// numerics with every digit; text, uuid, enums and other types as
// Postgres prints them; booleans "true"/"false"; timestamptz RFC 3339 in
// UTC with "Z" and at most microseconds ("2024-02-29T07:04:56.789Z");
// timestamp "2024-02-29T07:04:56.789"; date "2024-02-29";
// "infinity"/"-infinity"; bytea standard base64; float8 the shortest
// decimal that reads back ("NaN", "Infinity", "-Infinity"); json and jsonb
// their JSON text; arrays as JSON arrays.
func ValueText(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	case bool:
		return strconv.FormatBool(v)
	case cdc.Numeric:
		return string(v)
	case float64:
		return floatText(v)
	case []byte:
		return base64.StdEncoding.EncodeToString(v)
	case cdc.RawJSON:
		return string(v)
	case time.Time:
		return v.UTC().Format("2006-01-02T15:04:05.999999Z")
	case cdc.Timestamp:
		return v.Format("2006-01-02T15:04:05.999999")
	case cdc.Date:
		return v.Format("2006-01-02")
	case cdc.Infinity:
		return v.String()
	case []any:
		return string(appendArray(nil, v))
	}
	return fmt.Sprint(v)
}

func floatText(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		return strconv.FormatFloat(f, 'e', -1, 64)
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// appendArray appends a as a JSON array: elements that are text in
// ValueText are JSON strings, numbers, booleans and null are bare.
func appendArray(dst []byte, a []any) []byte {
	dst = append(dst, '[')
	for i, e := range a {
		if i > 0 {
			dst = append(dst, ',')
		}
		switch e := e.(type) {
		case nil:
			dst = append(dst, "null"...)
		case int64, bool, cdc.Numeric, cdc.RawJSON:
			dst = append(dst, ValueText(e)...)
		case float64:
			if math.IsNaN(e) || math.IsInf(e, 0) {
				dst = appendJSONString(dst, floatText(e))
			} else {
				dst = append(dst, floatText(e)...)
			}
		case []any:
			dst = appendArray(dst, e)
		default:
			dst = appendJSONString(dst, ValueText(e))
		}
	}
	return append(dst, ']')
}

func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s) // a string always encodes
	return append(dst, b...)
}
