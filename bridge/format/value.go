package format

import (
	"encoding/base64"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// AppendValue appends v, a column value of the change model (see the "Value
// types" comment in bridge/cdc), as JSON, the way Postgres' to_jsonb renders
// it, except:
//
//   - []byte (bytea) is a standard base64 string;
//   - time.Time (timestamptz) is RFC 3339 in UTC with "Z" and at most
//     microseconds, trailing zeros trimmed: "2024-02-29T07:04:56.789Z";
//   - cdc.Timestamp is "2006-01-02T15:04:05.999999" without a zone, and
//     cdc.Date is "2006-01-02";
//   - years outside 0000-9999 are written as ISO 8601 expanded years in
//     astronomical numbering: "10000-01-01", "-0043-03-15" (44 BC);
//   - cdc.Infinity is "infinity" or "-infinity";
//   - float NaN and ±Inf, and numeric NaN and ±Infinity, are the strings
//     "NaN", "Infinity" and "-Infinity";
//   - cdc.Numeric is a bare JSON number with its exact digits (a value
//     that is not a JSON number is written as a string);
//   - cdc.RawJSON is embedded verbatim and must be valid JSON (empty is
//     null); []any is an array of values; cdc.Record (a composite) is an
//     object of its fields in the type's order, as to_jsonb writes it;
//   - cdc.Geometry is GeoJSON, as PostGIS' to_jsonb(geometry) writes it,
//     for geography too (to_jsonb writes geography as hex EWKB): see
//     appendGeometry;
//   - strings have control characters, '"', '\\', U+2028 and U+2029
//     escaped, and each byte of invalid UTF-8 replaced with U+FFFD;
//   - cdc.Unchanged and cdc.Absent, which AppendNative leaves out, are the
//     strings "unchanged_toast" and "absent";
//   - any other Go type is written as a string formatted with fmt's %v.
//
// Every output is valid JSON as long as RawJSON values are.
func AppendValue(dst []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(dst, "null"...)
	case bool:
		if v {
			return append(dst, "true"...)
		}
		return append(dst, "false"...)
	case int64:
		return strconv.AppendInt(dst, v, 10)
	case float64:
		return appendFloat(dst, v, 64)
	case cdc.Numeric:
		return appendNumeric(dst, v)
	case string:
		return appendString(dst, v)
	case []byte:
		return appendBase64(dst, v)
	case cdc.RawJSON:
		if len(v) == 0 {
			return append(dst, "null"...)
		}
		return append(dst, v...)
	case time.Time:
		dst = append(dst, '"')
		dst = appendDateTime(dst, v.UTC())
		return append(dst, `Z"`...)
	case cdc.Timestamp:
		dst = append(dst, '"')
		dst = appendDateTime(dst, v.Time)
		return append(dst, '"')
	case cdc.Date:
		dst = append(dst, '"')
		dst = appendDate(dst, v.Time)
		return append(dst, '"')
	case cdc.Infinity:
		if v < 0 {
			return append(dst, `"-infinity"`...)
		}
		return append(dst, `"infinity"`...)
	case []any:
		dst = append(dst, '[')
		for i, e := range v {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendValue(dst, e)
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
				dst = AppendValue(dst, v.Values[i])
			} else {
				dst = append(dst, "null"...)
			}
		}
		return append(dst, '}')
	case cdc.Geometry:
		return appendGeometry(dst, v)
	case cdc.UnchangedToast:
		return append(dst, `"unchanged_toast"`...)
	case cdc.AbsentValue:
		return append(dst, `"absent"`...)
	case int:
		return strconv.AppendInt(dst, int64(v), 10)
	case int32:
		return strconv.AppendInt(dst, int64(v), 10)
	case int16:
		return strconv.AppendInt(dst, int64(v), 10)
	case int8:
		return strconv.AppendInt(dst, int64(v), 10)
	case uint64:
		return strconv.AppendUint(dst, v, 10)
	case uint32:
		return strconv.AppendUint(dst, uint64(v), 10)
	case uint:
		return strconv.AppendUint(dst, uint64(v), 10)
	case float32:
		return appendFloat(dst, float64(v), 32)
	}
	return appendString(dst, fmt.Sprint(v))
}

// appendFloat writes f as encoding/json does: the shortest representation
// that round-trips, with an exponent only for very large or small values.
func appendFloat(dst []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(dst, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(dst, `"-Infinity"`...)
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	dst = strconv.AppendFloat(dst, f, format, -1, bits)
	if format == 'e' {
		// Turn e-09 into e-9.
		if n := len(dst); n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst
}

func appendNumeric(dst []byte, n cdc.Numeric) []byte {
	switch n {
	case "NaN", "Infinity", "-Infinity":
		dst = append(dst, '"')
		dst = append(dst, n...)
		return append(dst, '"')
	}
	if isJSONNumber(string(n)) {
		return append(dst, n...)
	}
	return appendString(dst, string(n))
}

// isJSONNumber reports whether s matches JSON's number grammar.
func isJSONNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == start {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == start {
			return false
		}
	}
	return i == len(s)
}

func appendBase64(dst []byte, b []byte) []byte {
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, b)
	return append(dst, '"')
}

// safeASCII[c] is true for ASCII bytes that a JSON string holds unescaped.
var safeASCII = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

const hexDigits = "0123456789abcdef"

// appendString appends s as a quoted JSON string.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	dst = appendStringBody(dst, s)
	return append(dst, '"')
}

// appendStringBody appends s escaped for a JSON string, without quotes.
func appendStringBody(dst []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if safeASCII[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(dst, s[start:]...)
}

// appendDate appends the date of t's wall clock as "2006-01-02", with
// expanded years outside 0000-9999.
func appendDate(dst []byte, t time.Time) []byte {
	y, m, d := t.Date()
	dst = appendYear(dst, y)
	dst = append(dst, '-')
	dst = append2(dst, int(m))
	dst = append(dst, '-')
	return append2(dst, d)
}

// appendDateTime appends t's wall clock as "2006-01-02T15:04:05.999999",
// microseconds truncated and trailing zeros trimmed.
func appendDateTime(dst []byte, t time.Time) []byte {
	dst = appendDate(dst, t)
	h, mi, s := t.Clock()
	dst = append(dst, 'T')
	dst = append2(dst, h)
	dst = append(dst, ':')
	dst = append2(dst, mi)
	dst = append(dst, ':')
	dst = append2(dst, s)
	if us := t.Nanosecond() / 1000; us != 0 {
		var frac [7]byte
		frac[0] = '.'
		for i := 6; i >= 1; i-- {
			frac[i] = byte('0' + us%10)
			us /= 10
		}
		n := 7
		for frac[n-1] == '0' {
			n--
		}
		dst = append(dst, frac[:n]...)
	}
	return dst
}

func appendYear(dst []byte, y int) []byte {
	if y < 0 {
		dst = append(dst, '-')
		y = -y
	}
	if y >= 10000 {
		return strconv.AppendInt(dst, int64(y), 10)
	}
	return append(dst, byte('0'+y/1000), byte('0'+y/100%10), byte('0'+y/10%10), byte('0'+y%10))
}

func append2(dst []byte, v int) []byte {
	return append(dst, byte('0'+v/10), byte('0'+v%10))
}
