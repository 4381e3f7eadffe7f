package pgtypes

import "fmt"

// sqlNames are the built-in types format_type prints by another name
// than their typname (without a modifier, or with -1 given).
var sqlNames = map[uint32]string{
	16:   "boolean",
	18:   `"char"`,
	21:   "smallint",
	23:   "integer",
	20:   "bigint",
	700:  "real",
	701:  "double precision",
	1042: "bpchar",
	1043: "character varying",
	1083: "time without time zone",
	1114: "timestamp without time zone",
	1184: "timestamp with time zone",
	1266: "time with time zone",
	1560: `"bit"`,
	1562: "bit varying",
}

// formatBuiltin returns format_type(oid, typmod) of a built-in type (an
// array of one too) without asking the server; ok is false for another
// type, and for an interval with a modifier (its fields).
func formatBuiltin(oid uint32, typmod int32) (string, bool) {
	t := builtins[oid]
	if t == nil {
		return "", false
	}
	if t.Kind == Array && t.Elem != nil && t.Name == "_"+t.Elem.Name {
		s, ok := formatBuiltin(t.Elem.OID, typmod)
		if !ok {
			return "", false
		}
		return s + "[]", true
	}
	if typmod >= 0 {
		switch oid {
		case 1043:
			return fmt.Sprintf("character varying(%d)", typmod-4), true
		case 1042:
			return fmt.Sprintf("character(%d)", typmod-4), true
		case 1700:
			m := typmod - 4
			scale := ((m & 0x7ff) ^ 1024) - 1024
			return fmt.Sprintf("numeric(%d,%d)", (m>>16)&0xffff, scale), true
		case 1083:
			return fmt.Sprintf("time(%d) without time zone", typmod), true
		case 1266:
			return fmt.Sprintf("time(%d) with time zone", typmod), true
		case 1114:
			return fmt.Sprintf("timestamp(%d) without time zone", typmod), true
		case 1184:
			return fmt.Sprintf("timestamp(%d) with time zone", typmod), true
		case 1560:
			return fmt.Sprintf("bit(%d)", typmod), true
		case 1562:
			return fmt.Sprintf("bit varying(%d)", typmod), true
		}
		return "", false
	}
	if n, ok := sqlNames[oid]; ok {
		return n, true
	}
	return t.Name, true
}
