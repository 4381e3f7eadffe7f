package route

// CEL for routes: the filter and transform expressions, compiled once per
// route without knowing the tables (syntax, undeclared names, result
// type), then once per relation against its columns and their types
// (a misspelt column is an error there), and evaluated per change with an
// activation that reads the change in place: no map is built per change.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/ext"
	"github.com/google/cel-go/interpreter"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
)

// The names of the row types the typed environments declare: after and
// before are Rows, key is a Key.
const (
	rowTypeName = "bridge.Row"
	keyTypeName = "bridge.Key"
)

// baseEnv is the environment every expression compiles in: the scalar
// variables, the standard library, the string extensions and numeric
// comparisons across int, uint and double. It is built once and never
// changed (Extend copies it).
var baseEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("op", cel.StringType),
		cel.Variable("schema", cel.StringType),
		cel.Variable("table", cel.StringType),
		cel.Variable("source", cel.StringType),
		cel.Variable("commit_time", cel.TimestampType),
		cel.Variable("xid", cel.IntType),
		cel.CrossTypeNumericComparisons(true),
		cel.DefaultUTCTimeZone(true),
		ext.Strings(),
	)
})

// anyEnv is baseEnv with the rows as dyn: it checks an expression
// without knowing the tables, and evaluates it for changes without a
// relation (logical messages).
var anyEnv = sync.OnceValues(func() (*cel.Env, error) {
	base, err := baseEnv()
	if err != nil {
		return nil, err
	}
	return base.Extend(
		cel.Variable("before", cel.DynType),
		cel.Variable("after", cel.DynType),
		cel.Variable("key", cel.DynType),
	)
})

// exprKind is what an expression is for: its result type differs.
type exprKind int

const (
	exprFilter exprKind = iota
	exprTransform
)

func (k exprKind) String() string {
	if k == exprFilter {
		return "filter"
	}
	return "transform"
}

// wrapperRE finds CEL's name of a nullable type, wrapper(string).
var wrapperRE = regexp.MustCompile(`wrapper\(([a-z_]+)\)`)

// celErrors are the CEL compile errors at path: "routes[2].filter:1:14:
// undeclared reference to 'afterr'".
func celErrors(path string, iss *cel.Issues, where string) []string {
	var out []string
	for _, e := range iss.Errors() {
		text := wrapperRE.ReplaceAllString(strings.TrimSuffix(e.Message, " (in container '')"), "$1") // every column is nullable: say its type
		msg := fmt.Sprintf("%s:%d:%d: %s", path, e.Location.Line(), e.Location.Column()+1, text)
		if where != "" {
			msg += " (" + where + ")"
		}
		out = append(out, msg)
	}
	return out
}

// compileExpr compiles src in env and checks its result type for kind. It
// returns the program, or the problems, each starting with path and the
// CEL position.
func compileExpr(env *cel.Env, path, src string, kind exprKind, where string) (cel.Program, []string) {
	ast, iss := env.Compile(src)
	if iss != nil && iss.Err() != nil {
		return nil, celErrors(path, iss, where)
	}
	if msg := checkResult(ast.OutputType(), kind); msg != "" {
		if where != "" {
			msg += " (" + where + ")"
		}
		return nil, []string{fmt.Sprintf("%s: %s", path, msg)}
	}
	prg, err := env.Program(ast, cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, []string{fmt.Sprintf("%s: %v", path, err)}
	}
	return prg, nil
}

// checkResult says what is wrong with an expression's result type t for
// kind, or "".
func checkResult(t *cel.Type, kind exprKind) string {
	switch {
	case t.IsExactType(types.DynType):
		return ""
	case kind == exprFilter && !t.IsExactType(types.BoolType):
		return fmt.Sprintf("a filter must be a condition (bool), this one is %s", t)
	case kind == exprTransform && t.Kind() != types.MapKind && t.Kind() != types.StructKind:
		return fmt.Sprintf("a transform must produce a map, e.g. {\"id\": after.id, \"status\": after.status}, this one produces %s", t)
	}
	return ""
}

// columnType is the CEL type of a column: by the OID of a built-in type,
// else by its name (relations built in code carry no OID); dyn for
// everything else (domains, enums, extension types), which the bridge
// decodes by the base type.
func columnType(col cdc.Column) *cel.Type {
	name := col.Type
	if n, ok := builtinOIDs[col.OID]; ok {
		name = n
	} else if col.OID != 0 {
		return cel.DynType
	}
	if elem, ok := strings.CutPrefix(name, "_"); ok {
		if t := scalarType(elem); t != nil {
			return cel.ListType(t)
		}
		return cel.ListType(cel.DynType)
	}
	if t := scalarType(name); t != nil {
		return t
	}
	return cel.DynType
}

// scalarType maps a built-in type name to its CEL type, or nil.
func scalarType(name string) *cel.Type {
	switch name {
	case "bool":
		return cel.BoolType
	case "int2", "int4", "int8", "oid":
		return cel.IntType
	case "float4", "float8", "numeric":
		return cel.DoubleType
	case "bytea":
		return cel.BytesType
	case "json", "jsonb":
		return cel.DynType
	case "timestamptz", "timestamp", "date":
		return cel.TimestampType
	case "text", "varchar", "bpchar", "char", "name", "uuid", "time", "timetz", "interval",
		"inet", "cidr", "macaddr", "macaddr8", "money", "xml", "bit", "varbit", "tsvector",
		"tsquery", "pg_lsn", "point", "line", "lseg", "box", "path", "polygon", "circle",
		"int4range", "int8range", "numrange", "tsrange", "tstzrange", "daterange", "xid", "xid8", "cid", "tid":
		return cel.StringType
	}
	return nil
}

// builtinOIDs names the built-in types (and their arrays) whose OIDs are
// fixed across PostgreSQL versions; a column of another OID is dyn.
var builtinOIDs = map[uint32]string{
	16: "bool", 17: "bytea", 18: "char", 19: "name", 20: "int8", 21: "int2", 23: "int4", 25: "text", 26: "oid",
	27: "tid", 28: "xid", 29: "cid", 114: "json", 142: "xml", 600: "point", 601: "lseg", 602: "path", 603: "box",
	604: "polygon", 628: "line", 650: "cidr", 700: "float4", 701: "float8", 718: "circle", 774: "macaddr8",
	790: "money", 829: "macaddr", 869: "inet", 1042: "bpchar", 1043: "varchar", 1082: "date", 1083: "time",
	1114: "timestamp", 1184: "timestamptz", 1186: "interval", 1266: "timetz", 1560: "bit", 1562: "varbit",
	1700: "numeric", 2950: "uuid", 3220: "pg_lsn", 3614: "tsvector", 3615: "tsquery", 3802: "jsonb",
	3904: "int4range", 3906: "numrange", 3908: "tsrange", 3910: "tstzrange", 3912: "daterange", 3926: "int8range",
	5069: "xid8",
	1000: "_bool", 1001: "_bytea", 1002: "_char", 1003: "_name", 1016: "_int8", 1005: "_int2", 1007: "_int4",
	1009: "_text", 1028: "_oid", 199: "_json", 1021: "_float4", 1022: "_float8", 1014: "_bpchar", 1015: "_varchar",
	1182: "_date", 1183: "_time", 1115: "_timestamp", 1185: "_timestamptz", 1187: "_interval", 1231: "_numeric",
	2951: "_uuid", 3807: "_jsonb", 1041: "_inet",
}

// rowProvider declares the row types of one relation on top of the
// environment's own provider: Row with every column, Key with the key
// columns. Field access reads the change's row by position.
type rowProvider struct {
	types.Provider
	row, key   map[string]*types.FieldType
	rowN, keyN []string
}

func newRowProvider(base types.Provider, cols []cdc.Column) *rowProvider {
	p := &rowProvider{Provider: base, row: map[string]*types.FieldType{}, key: map[string]*types.FieldType{}}
	for i, c := range cols {
		if _, dup := p.row[c.Name]; dup {
			continue
		}
		t := columnType(c)
		if !t.IsExactType(types.DynType) {
			t = cel.NullableType(t) // any column may be NULL
		}
		ft := fieldType(i, c.Name, t)
		p.row[c.Name], p.rowN = ft, append(p.rowN, c.Name)
		if c.Key {
			p.key[c.Name], p.keyN = ft, append(p.keyN, c.Name)
		}
	}
	return p
}

// fieldType reads column i of a *rowVal.
func fieldType(i int, name string, t *cel.Type) *types.FieldType {
	return &types.FieldType{
		Type: t,
		IsSet: func(obj any) bool {
			r, ok := obj.(*rowVal)
			return ok && r.has(i)
		},
		GetFrom: func(obj any) (any, error) {
			r, ok := obj.(*rowVal)
			if !ok {
				return nil, &rowError{noRow: true, msg: fmt.Sprintf("no row to read %q from (before, after and key are null when the change has no such row)", name)}
			}
			v, ok := r.at(i)
			if !ok {
				return nil, rowErrorf("column %q is not in this row (an unchanged TOAST value, or a column the before image does not carry): test it with has(...)", name)
			}
			return celValue(v), nil
		},
	}
}

func (p *rowProvider) FindStructType(name string) (*types.Type, bool) {
	if name == rowTypeName || name == keyTypeName {
		return types.NewTypeTypeWithParam(types.NewObjectType(name)), true
	}
	return p.Provider.FindStructType(name)
}

func (p *rowProvider) FindStructFieldNames(name string) ([]string, bool) {
	switch name {
	case rowTypeName:
		return p.rowN, true
	case keyTypeName:
		return p.keyN, true
	}
	return p.Provider.FindStructFieldNames(name)
}

func (p *rowProvider) FindStructFieldType(name, field string) (*types.FieldType, bool) {
	var m map[string]*types.FieldType
	switch name {
	case rowTypeName:
		m = p.row
	case keyTypeName:
		m = p.key
	default:
		return p.Provider.FindStructFieldType(name, field)
	}
	ft, ok := m[field]
	return ft, ok
}

// relEnv returns the environment of a relation with columns cols: before
// and after are Rows, key a Key.
func relEnv(cols []cdc.Column) (*cel.Env, error) {
	base, err := baseEnv()
	if err != nil {
		return nil, err
	}
	p := newRowProvider(base.CELTypeProvider(), cols)
	return base.Extend(
		cel.CustomTypeProvider(p),
		cel.Variable("before", cel.ObjectType(rowTypeName)),
		cel.Variable("after", cel.ObjectType(rowTypeName)),
		cel.Variable("key", cel.ObjectType(keyTypeName)),
	)
}

// rowError is an expression reading a row or a column the change does not
// carry: whatever the values, every change of that kind fails the same
// way. noRow marks a field read from a row the change has none of (after
// of a delete, every row of a truncate): a filter doing so rejects the
// change.
type rowError struct {
	msg   string
	noRow bool
}

func (e *rowError) Error() string { return e.msg }

func rowErrorf(format string, args ...any) error { return &rowError{msg: fmt.Sprintf(format, args...)} }

// asRowError returns the rowError err is or wraps, or nil.
func asRowError(err error) *rowError {
	if err == nil {
		return nil
	}
	var re *rowError
	if errors.As(err, &re) {
		return re
	}
	return nil
}

// rowVal is a row of a change as CEL sees it: its columns by position.
// alt, when set, supplies the value of a column row holds as Unchanged
// (the key of an update whose key column is an unchanged TOAST value).
type rowVal struct {
	row, alt []any
	cols     []cdc.Column
	keyOnly  bool
}

// at returns the value of column i, false when the row does not carry it.
func (r *rowVal) at(i int) (any, bool) {
	if i >= len(r.row) {
		return nil, false
	}
	v := r.row[i]
	if omitted(v) {
		if i < len(r.alt) && !omitted(r.alt[i]) {
			return r.alt[i], true
		}
		return nil, false
	}
	return v, true
}

func (r *rowVal) has(i int) bool { _, ok := r.at(i); return ok }

// index returns the position of column name, or -1.
func (r *rowVal) index(name string) int {
	for i, c := range r.cols {
		if c.Name == name && (!r.keyOnly || c.Key) {
			return i
		}
	}
	return -1
}

func (r *rowVal) ConvertToNative(t reflect.Type) (any, error) {
	return nil, fmt.Errorf("a row does not convert to %v", t)
}

func (r *rowVal) ConvertToType(t ref.Type) ref.Val {
	if t.TypeName() == r.Type().TypeName() {
		return r
	}
	if t == types.TypeType {
		return r.Type().(*types.Type)
	}
	return types.NewErr("a row does not convert to %s", t.TypeName())
}

func (r *rowVal) Equal(o ref.Val) ref.Val {
	q, ok := o.(*rowVal)
	if !ok {
		return types.False
	}
	return types.Bool(r == q)
}

func (r *rowVal) Type() ref.Type {
	if r.keyOnly {
		return types.NewObjectType(keyTypeName)
	}
	return types.NewObjectType(rowTypeName)
}

func (r *rowVal) Value() any { return r }

// Get implements traits.Indexer, for the rows of the untyped environment.
func (r *rowVal) Get(k ref.Val) ref.Val {
	s, ok := k.(types.String)
	if !ok {
		return types.NewErr("no such key: %v", k)
	}
	i := r.index(string(s))
	if i < 0 {
		return types.NewErr("no such key: %s", s)
	}
	v, ok := r.at(i)
	if !ok {
		return types.WrapErr(rowErrorf("column %q is not in this row (an unchanged TOAST value, or a column the before image does not carry): test it with has(...)", s))
	}
	return celValue(v)
}

// IsSet implements traits.FieldTester, for has() in the untyped environment.
func (r *rowVal) IsSet(f ref.Val) ref.Val {
	s, ok := f.(types.String)
	if !ok {
		return types.False
	}
	i := r.index(string(s))
	return types.Bool(i >= 0 && r.has(i))
}

var (
	_ traits.Indexer     = (*rowVal)(nil)
	_ traits.FieldTester = (*rowVal)(nil)
)

// Bounds of CEL timestamps, for ±infinity and dates beyond them.
var (
	minTimestamp = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTimestamp = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)
)

func clampTime(t time.Time) ref.Val {
	switch {
	case t.Before(minTimestamp):
		t = minTimestamp
	case t.After(maxTimestamp):
		t = maxTimestamp
	}
	return types.Timestamp{Time: t}
}

// celValue converts a column value of the change model to CEL: numeric
// to double, json to maps, lists and scalars (an object keeps its text
// for a transform that publishes it whole), dates and timestamps to
// timestamps (±infinity to the ends of CEL's range), arrays to lists, and
// the types kept as Postgres text to strings.
func celValue(v any) ref.Val {
	switch v := v.(type) {
	case nil:
		return types.NullValue
	case bool:
		return types.Bool(v)
	case int64:
		return types.Int(v)
	case float64:
		return types.Double(v)
	case cdc.Numeric:
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return types.String(v)
		}
		return types.Double(f)
	case string:
		return types.String(v)
	case []byte:
		return types.Bytes(v)
	case cdc.RawJSON:
		return jsonValue(v)
	case time.Time:
		return clampTime(v)
	case cdc.Timestamp:
		return clampTime(v.Time)
	case cdc.Date:
		return clampTime(v.Time)
	case cdc.Infinity:
		if v < 0 {
			return types.Timestamp{Time: minTimestamp}
		}
		return types.Timestamp{Time: maxTimestamp}
	case []any:
		vals := make([]ref.Val, len(v))
		for i, e := range v {
			vals[i] = celValue(e)
		}
		return types.NewRefValList(types.DefaultTypeAdapter, vals)
	case cdc.Record:
		m := make(map[ref.Val]ref.Val, len(v.Names))
		for i, n := range v.Names {
			if i < len(v.Values) {
				m[types.String(n)] = celValue(v.Values[i])
			}
		}
		return types.NewRefValMap(types.DefaultTypeAdapter, m)
	case int:
		return types.Int(v)
	case int32:
		return types.Int(v)
	case float32:
		return types.Double(v)
	}
	return types.String(fmt.Sprint(v))
}

// jsonObj is a json object column: a CEL map that remembers its text, so
// that a transform publishing it whole publishes it as it was.
type jsonObj struct {
	traits.Mapper
	raw []byte
}

// jsonValue converts JSON text to CEL values: numbers to int when
// integral and in range, else double.
func jsonValue(raw []byte) ref.Val {
	if len(raw) == 0 {
		return types.NullValue
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var x any
	if err := d.Decode(&x); err != nil {
		return types.NewErr("json value does not parse: %v", err)
	}
	v := jsonToCEL(x)
	if m, ok := v.(traits.Mapper); ok {
		return &jsonObj{Mapper: m, raw: raw}
	}
	return v
}

func jsonToCEL(x any) ref.Val {
	switch x := x.(type) {
	case nil:
		return types.NullValue
	case bool:
		return types.Bool(x)
	case string:
		return types.String(x)
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return types.Int(i)
		}
		f, _ := x.Float64()
		return types.Double(f)
	case []any:
		vals := make([]ref.Val, len(x))
		for i, e := range x {
			vals[i] = jsonToCEL(e)
		}
		return types.NewRefValList(types.DefaultTypeAdapter, vals)
	case map[string]any:
		m := make(map[ref.Val]ref.Val, len(x))
		for k, e := range x {
			m[types.String(k)] = jsonToCEL(e)
		}
		return types.NewRefValMap(types.DefaultTypeAdapter, m)
	}
	return types.NewErr("unexpected json value %T", x)
}

// activation gives an expression the change: scalar variables from the
// change, rows read in place.
type activation struct {
	c                  *cdc.Change
	before, after, key rowVal
	// rel, schema and table come from the relation's compiled shaping:
	// its names as CEL values, made once rather than per change.
	rel           *cdc.Relation
	schema, table ref.Val
}

// opVals are the ops as CEL values, made once.
var opVals = func() map[cdc.Op]ref.Val {
	m := map[cdc.Op]ref.Val{}
	for _, op := range []cdc.Op{cdc.OpInsert, cdc.OpUpdate, cdc.OpDelete, cdc.OpTruncate, cdc.OpMessage, cdc.OpRead, cdc.OpControl} {
		m[op] = types.String(op)
	}
	return m
}()

// reset points a at c.
func (a *activation) reset(c *cdc.Change, rs *relShape) {
	a.c = c
	if rs != nil && rs.src != nil {
		a.rel, a.schema, a.table = rs.src, rs.schemaVal, rs.tableVal
	}
	var cols []cdc.Column
	if c.Rel != nil {
		cols = c.Rel.Columns
	}
	a.before = rowVal{row: c.Before, cols: cols}
	a.after = rowVal{row: c.After, cols: cols}
	a.key = rowVal{cols: cols, keyOnly: true}
	switch c.Op {
	case cdc.OpTruncate, cdc.OpMessage, cdc.OpControl:
	case cdc.OpDelete:
		a.key.row = c.Before
	default:
		a.key.row, a.key.alt = c.After, c.Before
	}
}

func (a *activation) ResolveName(name string) (any, bool) {
	c := a.c
	switch name {
	case "op":
		if v, ok := opVals[c.Op]; ok {
			return v, true
		}
		return types.String(c.Op), true
	case "schema":
		if a.rel != nil && a.rel.Schema == c.Schema {
			return a.schema, true
		}
		return types.String(c.Schema), true
	case "table":
		if a.rel != nil && a.rel.Table == c.Table {
			return a.table, true
		}
		return types.String(c.Table), true
	case "source":
		return types.String(c.Source), true
	case "before":
		if c.Before == nil {
			return types.NullValue, true
		}
		return &a.before, true
	case "after":
		if c.After == nil {
			return types.NullValue, true
		}
		return &a.after, true
	case "key":
		if a.key.row == nil || !a.hasKey() {
			return types.NullValue, true
		}
		return &a.key, true
	case "commit_time":
		return types.Timestamp{Time: c.CommitTime.UTC()}, true
	case "xid":
		return types.Int(c.Xid), true
	}
	return nil, false
}

// hasKey reports whether the relation has a key column.
func (a *activation) hasKey() bool {
	for _, c := range a.key.cols {
		if c.Key {
			return true
		}
	}
	return false
}

func (a *activation) Parent() interpreter.Activation { return nil }

// activations recycles activations: one per evaluation, none allocated
// in the steady state.
var activations = sync.Pool{New: func() any { return new(activation) }}

// eval runs prg, compiled for rs (nil: for no relation), on c and hands the result to use, which must not keep it:
// a row in it reads the change through an activation that is recycled
// when use returns.
func eval(prg cel.Program, c *cdc.Change, rs *relShape, use func(ref.Val) error) error {
	a := activations.Get().(*activation)
	a.reset(c, rs)
	out, _, err := prg.Eval(a)
	if err == nil {
		err = use(out)
	}
	*a = activation{}
	activations.Put(a)
	return err
}

// evalFilter runs prg, a filter compiled for rs (nil: for no relation),
// on c. A filter's result holds no row, so it may outlive the activation.
func evalFilter(prg cel.Program, c *cdc.Change, rs *relShape) (bool, error) {
	a := activations.Get().(*activation)
	a.reset(c, rs)
	out, _, err := prg.Eval(a)
	*a = activation{}
	activations.Put(a)
	if err != nil {
		return false, err
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, fmt.Errorf("the result is %s, not a bool", out.Type().TypeName())
	}
	return bool(b), nil
}

// appendJSON appends v, a transform's result or a part of it, as JSON:
// maps as objects with their keys sorted (a row keeps its column order and
// a json column its text), lists as arrays, and scalars as the native
// format writes column values.
func appendJSON(dst []byte, v ref.Val) ([]byte, error) {
	switch v := v.(type) {
	case *rowVal:
		dst = append(dst, '{')
		n := 0
		for i, c := range v.cols {
			if v.keyOnly && !c.Key {
				continue
			}
			x, ok := v.at(i)
			if !ok {
				continue
			}
			if n > 0 {
				dst = append(dst, ',')
			}
			n++
			dst = appendValue(dst, c.Name)
			dst = append(dst, ':')
			dst = appendValue(dst, x)
		}
		return append(dst, '}'), nil
	case *jsonObj:
		return append(dst, v.raw...), nil
	case types.Null:
		return append(dst, "null"...), nil
	case types.Bool:
		return appendValue(dst, bool(v)), nil
	case types.Int:
		return appendValue(dst, int64(v)), nil
	case types.Uint:
		return strconv.AppendUint(dst, uint64(v), 10), nil
	case types.Double:
		return appendValue(dst, float64(v)), nil
	case types.String:
		return appendValue(dst, string(v)), nil
	case types.Bytes:
		return appendValue(dst, []byte(v)), nil
	case types.Timestamp:
		return appendValue(dst, v.Time), nil
	case types.Duration:
		return appendValue(dst, v.Duration.String()), nil
	case *types.Err:
		return nil, v
	case traits.Mapper:
		keys := make([]string, 0, 8)
		vals := map[string]ref.Val{}
		for it := v.Iterator(); it.HasNext() == types.True; {
			k := it.Next()
			var ks string
			if s, ok := k.(types.String); ok {
				ks = string(s)
			} else {
				ks = fmt.Sprint(k.Value())
			}
			keys = append(keys, ks)
			vals[ks] = v.Get(k)
		}
		slices.Sort(keys)
		dst = append(dst, '{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendValue(dst, k)
			dst = append(dst, ':')
			var err error
			if dst, err = appendJSON(dst, vals[k]); err != nil {
				return nil, err
			}
		}
		return append(dst, '}'), nil
	case traits.Lister:
		dst = append(dst, '[')
		n := 0
		for it := v.Iterator(); it.HasNext() == types.True; n++ {
			if n > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendJSON(dst, it.Next()); err != nil {
				return nil, err
			}
		}
		return append(dst, ']'), nil
	}
	return nil, fmt.Errorf("a value of type %s cannot be published", v.Type().TypeName())
}

// tokenOf renders a value of a transform's result as subject text: a
// string as is, null as "", anything else as its JSON without quotes.
func tokenOf(v ref.Val) (string, error) {
	switch v := v.(type) {
	case types.String:
		return string(v), nil
	case types.Null:
		return "", nil
	}
	b, err := appendJSON(nil, v)
	if err != nil {
		return "", err
	}
	return strings.Trim(string(b), `"`), nil
}

// appendValue appends a column value as the native format writes it.
func appendValue(dst []byte, v any) []byte { return format.AppendValue(dst, v) }

// omitted reports whether v marks a value the row does not carry.
func omitted(v any) bool {
	switch v.(type) {
	case cdc.UnchangedToast, cdc.AbsentValue:
		return true
	}
	return false
}
