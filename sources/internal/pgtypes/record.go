package pgtypes

import (
	"errors"
	"fmt"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// decodeRecord decodes a composite value as record_out writes it and
// record_in reads it:
//
//	(1,"a b",,"x""y","c\\d")    fields separated by ','; empty unquoted is NULL
//
// A quoted field may hold anything: "" is a quote, a backslash escapes the
// next byte; outside quotes a backslash escapes too. Nested composites and
// arrays are fields holding their own text form.
func (t *Type) decodeRecord(b []byte) (any, error) {
	raw, err := splitRecord(b)
	if err != nil {
		return nil, err
	}
	if len(t.Fields) == 0 && len(raw) == 1 && raw[0] == nil {
		raw = raw[:0] // "()" of a type without attributes
	}
	if len(raw) != len(t.Fields) {
		// The type changed since it was resolved (ALTER TYPE ... ADD or
		// DROP ATTRIBUTE): keep the text rather than misname fields.
		return string(b), nil
	}
	vals := make([]any, len(raw))
	for i, f := range raw {
		if f == nil {
			continue
		}
		v, err := t.Fields[i].Type.decode(f)
		if err != nil {
			return nil, fmt.Errorf("field %s of type %s: %w", t.Fields[i].Name, t.Fields[i].Type.Name, err)
		}
		vals[i] = v
	}
	return cdc.Record{Names: t.names, Values: vals, Text: string(b)}, nil
}

// splitRecord returns the unescaped fields of a record literal; a NULL
// field is nil, an empty string "" is a non-nil empty slice.
func splitRecord(b []byte) ([][]byte, error) {
	i := 0
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	if i >= len(b) || b[i] != '(' {
		return nil, errors.New("malformed record literal: expected '('")
	}
	i++
	var out [][]byte
	for {
		if i >= len(b) {
			return nil, errors.New("malformed record literal: unexpected end")
		}
		if b[i] == ',' || b[i] == ')' {
			out = append(out, nil) // NULL
		} else {
			f := []byte{}
			quoted := false
			for i < len(b) && (quoted || b[i] != ',' && b[i] != ')') {
				c := b[i]
				switch {
				case c == '\\':
					i++
					if i >= len(b) {
						return nil, errors.New("malformed record literal: unexpected end after '\\'")
					}
					f = append(f, b[i])
				case c == '"' && quoted && i+1 < len(b) && b[i+1] == '"':
					f = append(f, '"')
					i++
				case c == '"':
					quoted = !quoted
				default:
					f = append(f, c)
				}
				i++
			}
			if quoted {
				return nil, errors.New("malformed record literal: unterminated quoted field")
			}
			out = append(out, f)
		}
		if i >= len(b) {
			return nil, errors.New("malformed record literal: unexpected end")
		}
		if b[i] == ')' {
			i++
			break
		}
		i++ // ','
	}
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	if i != len(b) {
		return nil, errors.New("malformed record literal: junk after ')'")
	}
	return out, nil
}

// parseGeometry decodes PostGIS' text form, hex EWKB, checking its header
// (byte order and type) so that the formats can rely on it.
func parseGeometry(b []byte, geography bool) (any, error) {
	if len(b)%2 != 0 {
		return nil, errors.New("odd number of hex digits in EWKB")
	}
	out := make([]byte, len(b)/2)
	for i := range out {
		hi, ok1 := unhex(b[2*i])
		lo, ok2 := unhex(b[2*i+1])
		if !ok1 || !ok2 {
			return nil, errors.New("invalid hex digit in EWKB")
		}
		out[i] = hi<<4 | lo
	}
	if len(out) < 5 || out[0] > 1 {
		return nil, errors.New("not EWKB: too short or unknown byte order")
	}
	return cdc.Geometry{EWKB: out, Geography: geography}, nil
}
