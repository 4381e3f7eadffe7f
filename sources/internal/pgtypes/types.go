// Package pgtypes turns PostgreSQL text-format values, as pgoutput and
// wal2json send them, into the value types of the change model (see the
// "Value types" comment in bridge/cdc), and resolves type OIDs and names to
// the Types that decode them.
//
// Decoding assumes the session settings a walsender uses for logical
// decoding: DateStyle=ISO, TimeZone=UTC, IntervalStyle=postgres and
// extra_float_digits=3.
package pgtypes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// Kind selects how a type's text form is decoded.
type Kind uint8

// The kinds of values. Text is the zero Kind: anything without a better Go
// form keeps Postgres' text.
const (
	// Text decodes to string: text, varchar, bpchar, name, "char", citext,
	// uuid, enums, xml, interval, time, timetz, inet, cidr, macaddr, money,
	// bit, tsvector, ranges, geometric and composite types, and every type
	// this package does not know.
	Text Kind = iota
	// Bool decodes "t"/"f" to bool.
	Bool
	// Int decodes int2, int4, int8 and oid to int64.
	Int
	// Float decodes float4 and float8 to float64, including NaN and ±Inf.
	Float
	// Numeric decodes to cdc.Numeric, the exact text, "NaN", "Infinity" or
	// "-Infinity".
	Numeric
	// Bytea decodes the hex ("\x...") or escape format to []byte.
	Bytea
	// JSON decodes json and jsonb to cdc.RawJSON after checking it is valid.
	JSON
	// TimestampTZ decodes to a time.Time in UTC, or cdc.Infinity.
	TimestampTZ
	// Timestamp decodes to cdc.Timestamp, or cdc.Infinity.
	Timestamp
	// Date decodes to cdc.Date, or cdc.Infinity.
	Date
	// Array decodes an array literal to []any, nested for more dimensions,
	// with elements decoded by the type's Elem.
	Array
	// Composite decodes a composite (row) value, (1,"a b"), to cdc.Record,
	// each field decoded by its type in Fields. A value whose number of
	// fields differs from Fields (the type was altered since it was
	// resolved) keeps Postgres' text.
	Composite
	// Geometry decodes PostGIS' geometry, hex EWKB, to cdc.Geometry.
	Geometry
	// Geography decodes PostGIS' geography, hex EWKB, to cdc.Geometry with
	// Geography set.
	Geography
)

var kindNames = [...]string{
	Text: "text", Bool: "bool", Int: "int", Float: "float", Numeric: "numeric", Bytea: "bytea",
	JSON: "json", TimestampTZ: "timestamptz", Timestamp: "timestamp", Date: "date", Array: "array",
	Composite: "composite", Geometry: "geometry", Geography: "geography",
}

// String returns the kind's lower-case name.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Type is a resolved PostgreSQL type. Types returned by a Resolver are shared
// and must not be modified.
type Type struct {
	// OID is the type's OID.
	OID uint32
	// Name is how the bridge reports the type: the typname for types in
	// pg_catalog ("int4", "_text", "timestamptz"), "schema.typname" for
	// others ("public.mood"). Names are not quoted.
	Name string
	// Kind selects the decoder. A domain has its base type's Kind.
	Kind Kind
	// Elem is the element type of an array (Kind Array), or of the array a
	// domain is based on; nil otherwise.
	Elem *Type
	// Delim separates array elements: for arrays the element type's
	// typdelim (',' for every built-in type but box's ';'), for other types
	// their own typdelim.
	Delim byte
	// Fields are a composite type's attributes in order (Kind Composite),
	// or those of the composite type a domain is based on; nil otherwise.
	Fields []Field
	// names holds the Fields' names, shared by the Records decoded.
	names []string
}

// Field is one attribute of a composite type.
type Field struct {
	Name string
	Type *Type
}

// DecodeText decodes the text form of one non-NULL value. The result never
// aliases b. Errors name the type and show the start of the value.
func (t *Type) DecodeText(b []byte) (any, error) {
	v, err := t.decode(b)
	if err != nil {
		return nil, fmt.Errorf("decoding %s value %q: %w", t.Name, shorten(b), err)
	}
	return v, nil
}

func (t *Type) decode(b []byte) (any, error) {
	switch t.Kind {
	case Text:
		return string(b), nil
	case Bool:
		return parseBool(b)
	case Int:
		return parseInt(b)
	case Float:
		return parseFloat(b)
	case Numeric:
		return parseNumeric(b)
	case Bytea:
		return parseBytea(b)
	case JSON:
		if !json.Valid(b) {
			return nil, errors.New("invalid JSON")
		}
		return cdc.RawJSON(bytes.Clone(b)), nil
	case TimestampTZ:
		v, err := parseTimestamp(b, true)
		if err != nil {
			return nil, err
		}
		if ts, ok := v.(cdc.Timestamp); ok {
			return ts.Time, nil
		}
		return v, nil
	case Timestamp:
		return parseTimestamp(b, false)
	case Date:
		return parseDate(b)
	case Array:
		if t.Elem == nil {
			return nil, errors.New("array type without element type")
		}
		elem := t.Elem
		return parseArray(b, t.Delim, func(b []byte) (any, error) {
			v, err := elem.decode(b)
			if err != nil {
				return nil, fmt.Errorf("element %q of type %s: %w", shorten(b), elem.Name, err)
			}
			return v, nil
		})
	case Composite:
		return t.decodeRecord(b)
	case Geometry, Geography:
		return parseGeometry(b, t.Kind == Geography)
	}
	return nil, fmt.Errorf("unknown kind %d", t.Kind)
}

// shorten returns at most 64 bytes of b, cut at a rune boundary, with "…"
// appended when it cut.
func shorten(b []byte) string {
	const max = 64
	if len(b) <= max {
		return string(b)
	}
	n := max
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return string(b[:n]) + "…"
}

func parseBool(b []byte) (any, error) {
	switch string(b) {
	case "t", "true":
		return true, nil
	case "f", "false":
		return false, nil
	}
	return nil, errors.New("invalid boolean")
}

func parseInt(b []byte) (any, error) {
	// Hand-rolled to avoid converting b to a string.
	if len(b) == 0 || len(b) > 20 {
		return nil, errors.New("invalid integer")
	}
	neg := b[0] == '-'
	i := 0
	if neg || b[0] == '+' {
		i = 1
	}
	if i == len(b) {
		return nil, errors.New("invalid integer")
	}
	var u uint64
	for ; i < len(b); i++ {
		c := b[i]
		if c < '0' || c > '9' {
			return nil, errors.New("invalid integer")
		}
		if u > (math.MaxUint64-9)/10 {
			return nil, errors.New("integer out of range")
		}
		u = u*10 + uint64(c-'0')
	}
	if neg {
		if u > 1<<63 {
			return nil, errors.New("integer out of range")
		}
		return -int64(u), nil
	}
	if u > math.MaxInt64 {
		return nil, errors.New("integer out of range")
	}
	return int64(u), nil
}

func parseFloat(b []byte) (any, error) {
	switch string(b) {
	case "NaN":
		return math.NaN(), nil
	case "Infinity":
		return math.Inf(1), nil
	case "-Infinity":
		return math.Inf(-1), nil
	}
	if len(b) == 0 || !isFloatByte(b[len(b)-1]) {
		return nil, errors.New("invalid float")
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return nil, errors.New("invalid float")
	}
	return f, nil
}

func isFloatByte(c byte) bool { return c >= '0' && c <= '9' || c == '.' }

// parseNumeric checks the form numeric_out produces: an optional '-', digits,
// and an optional '.' followed by digits; or NaN, Infinity, -Infinity.
func parseNumeric(b []byte) (any, error) {
	switch string(b) {
	case "NaN", "Infinity", "-Infinity":
		return cdc.Numeric(b), nil
	}
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	start := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	if i == start {
		return nil, errors.New("invalid numeric")
	}
	if i < len(b) && b[i] == '.' {
		i++
		start = i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == start {
			return nil, errors.New("invalid numeric")
		}
	}
	if i != len(b) {
		return nil, errors.New("invalid numeric")
	}
	return cdc.Numeric(b), nil
}

// parseBytea decodes the hex format ("\x0aff", whitespace allowed between
// byte pairs) or the escape format (printable bytes, "\\" and "\ooo").
func parseBytea(b []byte) (any, error) {
	if len(b) >= 2 && b[0] == '\\' && b[1] == 'x' {
		out := make([]byte, 0, (len(b)-2)/2)
		for i := 2; i < len(b); {
			if c := b[i]; c == ' ' || c == '\t' || c == '\n' || c == '\r' {
				i++
				continue
			}
			if i+1 >= len(b) {
				return nil, errors.New("odd number of hex digits")
			}
			hi, ok1 := unhex(b[i])
			lo, ok2 := unhex(b[i+1])
			if !ok1 || !ok2 {
				return nil, errors.New("invalid hex digit")
			}
			out = append(out, hi<<4|lo)
			i += 2
		}
		return out, nil
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		if i+1 < len(b) && b[i+1] == '\\' {
			out = append(out, '\\')
			i++
			continue
		}
		if i+3 < len(b) && isOctal(b[i+1]) && b[i+1] <= '3' && isOctal(b[i+2]) && isOctal(b[i+3]) {
			out = append(out, (b[i+1]-'0')<<6|(b[i+2]-'0')<<3|(b[i+3]-'0'))
			i += 3
			continue
		}
		return nil, errors.New("invalid escape sequence")
	}
	return out, nil
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
