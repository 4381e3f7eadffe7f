package route

// Shaping: what a route publishes of the changes it takes. A route's
// filter, columns, mask and transform compile once per route (New: syntax,
// names, result types, without the tables) and once per relation the
// route sees (shapeFor: against its columns and their types), then apply
// per change with what that compiled: a column projection, a mask per
// kept column, and the two programs.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
	"github.com/bridgecdc/bridge/bridge/wasm"
	"github.com/bridgecdc/bridge/config"
)

// columnRule is a compiled config.Columns.
type columnRule struct {
	path             string // "routes[0].columns[1]"
	tables           []string
	include, exclude []string
	exact            bool // it applies to one table, named: its columns must exist there
}

// maskKind is what a mask does to a value.
type maskKind uint8

const (
	maskNone maskKind = iota
	maskRedact
	maskHash
	maskTruncate
)

func (k maskKind) String() string {
	return [...]string{"", "redact", "hash", "truncate"}[k]
}

// maskRule is a compiled config.Mask.
type maskRule struct {
	path     string // "routes[0].mask[1]"
	tables   []string
	redact   []string
	hash     []string
	truncate map[string]int
	key      *hasher
	exact    bool
}

// kind returns what r does to column name, and the path naming it.
func (r *maskRule) kind(name string) (maskKind, int, string) {
	if i := slices.Index(r.redact, name); i >= 0 {
		return maskRedact, 0, fmt.Sprintf("%s.redact[%d]", r.path, i)
	}
	if i := slices.Index(r.hash, name); i >= 0 {
		return maskHash, 0, fmt.Sprintf("%s.hash[%d]", r.path, i)
	}
	if n, ok := r.truncate[name]; ok {
		return maskTruncate, n, r.path + ".truncate." + name
	}
	return maskNone, 0, ""
}

// names returns every column r names.
func (r *maskRule) names() []string {
	out := slices.Concat(r.redact, r.hash)
	for n := range r.truncate {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// hasher computes keyed HMAC-SHA256s, reusing its hash states.
type hasher struct {
	key  []byte
	pool sync.Pool // *hashState
}

type hashState struct {
	mac hash.Hash
	buf []byte // the input, for strings
	sum [sha256.Size]byte
	hex [2 * sha256.Size]byte
}

func newHasher(key string) *hasher {
	h := &hasher{key: []byte(key)}
	h.pool.New = func() any { return &hashState{mac: hmac.New(sha256.New, h.key)} }
	return h
}

// sum returns the lowercase hex HMAC of b, or of s when b is nil.
func (h *hasher) sum(b []byte, s string) string {
	st := h.pool.Get().(*hashState)
	if b == nil {
		st.buf = append(st.buf[:0], s...)
		b = st.buf
	}
	st.mac.Reset()
	st.mac.Write(b)
	hex.Encode(st.hex[:], st.mac.Sum(st.sum[:0]))
	out := string(st.hex[:])
	if cap(st.buf) > 4096 {
		st.buf = nil // a large value must not stay pooled
	}
	h.pool.Put(st)
	return out
}

// shaper is a route's compiled shaping.
type shaper struct {
	path      string // "routes[0]"
	filter    string
	transform string
	// anyFilter and anyTransform are compiled without a table: for
	// changes without a relation (logical messages).
	anyFilter, anyTransform cel.Program
	columns                 []columnRule
	masks                   []maskRule
	subjCols                []string // the columns the subject template reads as {{.Col.x}}
	// wasmFilter and wasmTransform are the route's WebAssembly modules,
	// nil when none.
	wasmFilter, wasmTransform *wasm.Module
	ops                       []cdc.Op // the route's match.ops; none: every op

	noRel relShape                 // for changes without a relation
	last  atomic.Pointer[relShape] // the relation seen last: most changes share it
	mu    sync.Mutex
	rels  map[*cdc.Relation]*relShape
	sigs  map[string]*relShape // by relation signature: a snapshot's relations are new per chunk
}

// maxRelShapes bounds a shaper's caches.
const maxRelShapes = 4096

// relShape is a route's shaping compiled for one relation.
type relShape struct {
	src *cdc.Relation
	// out describes the published rows: src without the columns left
	// out, hashed columns as text. It is src when nothing changes.
	out  *cdc.Relation
	keep []int      // indexes in src of out's columns; nil: all of them
	ops  []columnOp // per out column; nil: no mask
	// masked is the Bridge-Masked header: the masked columns and their
	// masks, "" when none; headers holds it alone, shared by the changes
	// of the relation (read-only).
	masked    string
	headers   map[string]string
	filter    cel.Program
	transform cel.Program
	err       error // the relation cannot be shaped: every change of it fails
	// schemaVal and tableVal are src's names as CEL values.
	schemaVal, tableVal ref.Val
}

// columnOp masks one column.
type columnOp struct {
	kind maskKind
	n    int // truncate: characters (runes) kept
	h    *hasher
	name string
}

// identity reports whether rs publishes rows as they are.
func (rs *relShape) identity() bool { return rs.keep == nil && rs.ops == nil }

// newShaper compiles rc's shaping, or returns nil when it has none. Every
// problem is a *config.FieldError at its YAML path.
func newShaper(idx int, rc config.Route, cols []string, o options) (*shaper, []error) {
	if rc.Filter == "" && rc.Transform == "" && len(rc.Columns) == 0 && len(rc.Mask) == 0 && !rc.WASMFilter.Set() && !rc.WASMTransform.Set() {
		return nil, nil
	}
	p := fmt.Sprintf("routes[%d]", idx)
	s := &shaper{path: p, filter: rc.Filter, transform: rc.Transform, subjCols: cols,
		rels: map[*cdc.Relation]*relShape{}, sigs: map[string]*relShape{}}
	var errs []error
	env, err := anyEnv()
	if err != nil {
		return nil, []error{fmt.Errorf("%s: setting up CEL: %w", p, err)}
	}
	compile := func(key, src string, kind exprKind) cel.Program {
		prg, msgs := compileExpr(env, p+"."+key, src, kind, "")
		for _, m := range msgs {
			errs = append(errs, fieldError(m))
		}
		return prg
	}
	if rc.Filter != "" {
		s.anyFilter = compile("filter", rc.Filter, exprFilter)
	}
	if rc.Transform != "" {
		s.anyTransform = compile("transform", rc.Transform, exprTransform)
	}
	s.noRel = relShape{filter: s.anyFilter, transform: s.anyTransform}
	loadWASM := func(key string, kind wasm.Kind, w config.WASM) *wasm.Module {
		if !w.Set() {
			return nil
		}
		if o.log == nil {
			o.log = slog.Default()
		}
		m, err := wasm.Load(context.Background(), kind, wasm.Config{At: p + "." + key, Module: w.Module, SHA256: w.SHA256,
			Function: w.Function, Timeout: w.Timeout, MaxMemory: int64(w.MaxMemoryMiB) << 20, CacheDir: o.wasmCache, Log: o.log.With("route", p+"."+key)})
		if err != nil {
			errs = append(errs, err)
		}
		return m
	}
	s.wasmFilter = loadWASM("wasm_filter", wasm.Filter, rc.WASMFilter)
	s.wasmTransform = loadWASM("wasm_transform", wasm.Transform, rc.WASMTransform)
	for _, op := range rc.Match.Ops {
		s.ops = append(s.ops, cdc.Op(op))
	}
	// A rule for one table named without a glob must name its columns: a
	// rule for several tables may name a column some of them lack
	// (validate --connect checks that one of them has it).
	exact := func(tables []string) bool {
		if len(tables) == 0 {
			tables = rc.Match.Tables
		}
		return len(tables) == 1 && !isGlob(tables[0])
	}
	for j, c := range rc.Columns {
		s.columns = append(s.columns, columnRule{path: fmt.Sprintf("%s.columns[%d]", p, j), tables: c.Tables,
			include: c.Include, exclude: c.Exclude, exact: exact(c.Tables)})
	}
	for j, m := range rc.Mask {
		r := maskRule{path: fmt.Sprintf("%s.mask[%d]", p, j), tables: m.Tables, redact: m.Redact, hash: m.Hash,
			truncate: m.Truncate, exact: exact(m.Tables)}
		if len(m.Hash) > 0 {
			r.key = newHasher(m.HashKey)
		}
		s.masks = append(s.masks, r)
	}
	return s, errs
}

// fieldError turns "path: msg" or "path:line:col: msg" into a FieldError
// at that path (the CEL position stays in the path, as editors read it).
func fieldError(m string) error {
	p, msg, ok := strings.Cut(m, ": ")
	if !ok {
		return errors.New(m)
	}
	return &config.FieldError{Path: p, Msg: msg}
}

// appliesTo reports whether globs (empty: every table) take table.
func appliesTo(globs []string, table string) bool {
	if len(globs) == 0 {
		return true
	}
	for _, g := range globs {
		if ok, _ := path.Match(g, table); ok {
			return true
		}
	}
	return false
}

// shapeFor returns the shaping of rel, compiling it on first use. rel may
// be nil (logical messages): the programs compiled without a table apply.
func (s *shaper) shapeFor(rel *cdc.Relation) *relShape {
	if rel == nil {
		return &s.noRel
	}
	if rs := s.last.Load(); rs != nil && rs.src == rel {
		return rs
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rs, ok := s.rels[rel]
	if !ok {
		sig := signature(rel)
		if old, ok := s.sigs[sig]; ok {
			cp := *old
			cp.src = rel
			if old.out == old.src {
				cp.out = rel
			}
			rs = &cp
		} else {
			rs = s.compile(rel)
			if len(s.sigs) >= maxRelShapes {
				clear(s.sigs)
			}
			s.sigs[sig] = rs
		}
		if len(s.rels) >= maxRelShapes {
			clear(s.rels)
		}
		s.rels[rel] = rs
	}
	s.last.Store(rs)
	return rs
}

// signature identifies what a relation's shaping depends on.
func signature(rel *cdc.Relation) string {
	var b strings.Builder
	b.WriteString(rel.Schema)
	b.WriteByte('.')
	b.WriteString(rel.Table)
	for _, c := range rel.Columns {
		b.WriteByte(0)
		b.WriteString(c.Name)
		b.WriteByte(1)
		b.WriteString(c.Type)
		b.WriteByte(1)
		b.WriteString(strconv.FormatUint(uint64(c.OID), 10))
		if c.Key {
			b.WriteByte(2)
		}
	}
	return b.String()
}

// compile compiles s for rel. Problems make rs.err, which names the
// table, each YAML path and the fix.
func (s *shaper) compile(rel *cdc.Relation) *relShape {
	rs := &relShape{src: rel, out: rel, schemaVal: types.String(rel.Schema), tableVal: types.String(rel.Table)}
	msgs := s.check(rel, rs)
	if len(msgs) > 0 {
		rs.err = errors.New(strings.Join(msgs, "; "))
	}
	return rs
}

// check compiles s for rel into rs and returns the problems, each naming
// its YAML path and the table.
func (s *shaper) check(rel *cdc.Relation, rs *relShape) []string {
	table := rel.Schema + "." + rel.Table
	where := "checked against " + table
	var msgs []string
	bad := func(format string, args ...any) { msgs = append(msgs, fmt.Sprintf(format, args...)) }
	has := func(name string) bool {
		return slices.ContainsFunc(rel.Columns, func(c cdc.Column) bool { return c.Name == name })
	}
	isKey := func(name string) bool {
		return slices.ContainsFunc(rel.Columns, func(c cdc.Column) bool { return c.Name == name && c.Key })
	}

	// compile compiles src against cols.
	compile := func(src string, kind exprKind, cols []cdc.Column) cel.Program {
		p := s.path + "." + kind.String()
		env, err := relEnv(cols)
		if err != nil {
			bad("%s: setting up CEL for %s: %v", p, table, err)
			return nil
		}
		prg, m := compileExpr(env, p, src, kind, where)
		msgs = append(msgs, m...)
		return prg
	}
	if s.filter != "" {
		rs.filter = compile(s.filter, exprFilter, rel.Columns)
	}

	// Columns: the first rule for the table.
	keep := make([]bool, len(rel.Columns))
	for i := range keep {
		keep[i] = true
	}
	var colRule *columnRule
	for j := range s.columns {
		if appliesTo(s.columns[j].tables, table) {
			colRule = &s.columns[j]
			break
		}
	}
	if colRule != nil {
		if colRule.exact {
			for k, n := range colRule.include {
				if !has(n) {
					bad("%s.include[%d]: %s has no column %q (its columns: %s)", colRule.path, k, table, n, columnNames(rel, false))
				}
			}
			for k, n := range colRule.exclude {
				if !has(n) {
					bad("%s.exclude[%d]: %s has no column %q (its columns: %s)", colRule.path, k, table, n, columnNames(rel, false))
				}
			}
		}
		for k, n := range colRule.exclude {
			if isKey(n) {
				bad("%s.exclude[%d]: %q is part of the key of %s, which every message keeps so that consumers can address the row; remove it from exclude, or mask it with hash",
					colRule.path, k, n, table)
			}
		}
		for i, c := range rel.Columns {
			switch {
			case c.Key:
			case len(colRule.include) > 0:
				keep[i] = slices.Contains(colRule.include, c.Name)
			default:
				keep[i] = !slices.Contains(colRule.exclude, c.Name)
			}
		}
	}

	// The subject must not read what the route leaves out.
	for _, n := range s.subjCols {
		if i := slices.IndexFunc(rel.Columns, func(c cdc.Column) bool { return c.Name == n }); i >= 0 && !keep[i] {
			bad("%s.subject reads {{.Col.%s}}, but %s leaves %q out of %s; publish the column, or take the subject from another one",
				s.path, n, colRule.path, n, table)
		}
	}

	// Masks: for each kept column, the first rule naming it.
	ops := make([]columnOp, len(rel.Columns))
	for j := range s.masks {
		r := &s.masks[j]
		if !appliesTo(r.tables, table) {
			continue
		}
		for _, n := range r.names() {
			kind, size, at := r.kind(n)
			i := slices.IndexFunc(rel.Columns, func(c cdc.Column) bool { return c.Name == n })
			if i < 0 {
				if r.exact {
					bad("%s: %s has no column %q (its columns: %s)", at, table, n, columnNames(rel, false))
				}
				continue
			}
			if !keep[i] || ops[i].kind != maskNone {
				continue // left out, or masked by an earlier rule
			}
			col := rel.Columns[i]
			switch {
			case col.Key && kind == maskRedact:
				bad("%s: %q is part of the key of %s; a redacted key could not address the row: hash it instead", at, n, table)
				continue
			case col.Key && kind == maskTruncate:
				bad("%s: %q is part of the key of %s; a truncated key could address several rows: hash it instead", at, n, table)
				continue
			case kind == maskTruncate:
				if !truncatable(col) {
					bad("%s: %s.%s is %s, and truncate applies to text and bytea columns; redact or hash it instead", at, table, n, col.Type)
					continue
				}
			}
			ops[i] = columnOp{kind: kind, n: size, h: r.key, name: n}
		}
	}
	// The published relation.
	var out []cdc.Column
	var kept []int
	var outOps []columnOp
	var masked []string
	changed := false
	for i, c := range rel.Columns {
		if !keep[i] {
			changed = true
			continue
		}
		op := ops[i]
		if op.kind == maskHash {
			c.Type, c.OID = "text", 25
			changed = true
		}
		if op.kind != maskNone {
			masked = append(masked, headerEscape(c.Name)+"="+op.kind.String())
		}
		out = append(out, c)
		kept = append(kept, i)
		outOps = append(outOps, op)
	}
	if changed {
		cp := *rel
		cp.Columns = out
		rs.out = &cp
	}
	if len(kept) != len(rel.Columns) {
		rs.keep = kept
	}
	if len(masked) > 0 {
		rs.ops = outOps
		rs.masked = strings.Join(masked, ",")
		rs.headers = map[string]string{format.HeaderMasked: rs.masked}
	}

	if s.transform != "" {
		rs.transform = compile(s.transform, exprTransform, transformColumns(rs.out.Columns, rs.ops))
	}

	// Changes whose rows the expressions may read but which have none, or
	// only the key: found now rather than on the first such change.
	if len(msgs) == 0 && (rs.filter != nil || rs.transform != nil) {
		if s.takes(cdc.OpTruncate) {
			c := &cdc.Change{Op: cdc.OpTruncate, Schema: rel.Schema, Table: rel.Table, Rel: rel}
			if m := s.dryRun(rs, c, "every truncate of "+table+" (before, after and key are null)"); m != "" {
				msgs = append(msgs, m)
			}
		}
		if s.takes(cdc.OpDelete) {
			what := "every delete of " + table + " (after is null; before holds the key columns only, as with REPLICA IDENTITY DEFAULT)"
			if rel.ReplicaIdentity == 'f' {
				what = "every delete of " + table + " (after is null)"
			}
			c := &cdc.Change{Op: cdc.OpDelete, Schema: rel.Schema, Table: rel.Table, Rel: rel, Before: sampleBefore(rel)}
			if m := s.dryRun(rs, c, what); m != "" {
				msgs = append(msgs, m)
			}
		}
	}
	return msgs
}

// takes reports whether the route takes changes of op.
func (s *shaper) takes(op cdc.Op) bool { return len(s.ops) == 0 || slices.Contains(s.ops, op) }

// dryRun runs rs's filter and, when it takes c, rs's transform on c, a
// change made up to stand for every change of its kind (what): one
// without rows, or with a key-only before image. It returns the problem,
// naming the expression's path, or "". Only an error reading a column
// the change lacks counts (c's values are made up, its shape is not); a
// filter reading a row the change has none of rejects it, as on a real
// change, and a transform reading one fails.
func (s *shaper) dryRun(rs *relShape, c *cdc.Change, what string) string {
	fix := fmt.Sprintf("guard it with op (e.g. op != %q && ...), or list the ops the route takes in match.ops", string(c.Op))
	if rs.filter != nil {
		take, err := evalFilter(rs.filter, c, rs)
		if re := asRowError(err); re != nil && !re.noRow {
			return fmt.Sprintf("%s.filter fails on %s: %v; test the column with has(...), or %s", s.path, what, err, fix)
		}
		if !take {
			return ""
		}
	}
	if rs.transform == nil {
		return ""
	}
	cp := *c
	if err := rs.apply(&cp); err != nil {
		return ""
	}
	err := eval(rs.transform, &cp, rs, func(v ref.Val) error {
		if _, isNull := v.(types.Null); isNull {
			return rowErrorf("the result is null, and a transform must produce a map")
		}
		_, err := appendJSON(nil, v)
		return err
	})
	if asRowError(err) != nil {
		return fmt.Sprintf("%s.transform fails on %s: %v; %s", s.path, what, err, fix)
	}
	return ""
}

// sampleBefore is the before image of a delete of rel: the key columns
// (every column with REPLICA IDENTITY FULL) with a value of their type,
// the others absent.
func sampleBefore(rel *cdc.Relation) []any {
	row := make([]any, len(rel.Columns))
	for i, c := range rel.Columns {
		if !c.Key && rel.ReplicaIdentity != 'f' {
			row[i] = cdc.Absent
			continue
		}
		switch t := columnType(c); {
		case t.IsExactType(types.IntType):
			row[i] = int64(1)
		case t.IsExactType(types.DoubleType):
			row[i] = cdc.Numeric("1")
		case t.IsExactType(types.BoolType):
			row[i] = true
		case t.IsExactType(types.BytesType):
			row[i] = []byte("1")
		case t.IsExactType(types.TimestampType):
			row[i] = time.Unix(0, 0).UTC()
		case t.Kind() == types.ListKind:
			row[i] = []any{}
		default:
			row[i] = "1"
		}
	}
	return row
}

// truncatable reports whether truncate applies to col: text and bytea,
// and the types the bridge does not know (domains, enums, extension
// types), whose values mostly arrive as text; a value that does not is an
// error on its change.
func truncatable(col cdc.Column) bool {
	t := columnType(col)
	if t.IsExactType(types.StringType) || t.IsExactType(types.BytesType) {
		return true
	}
	if !t.IsExactType(types.DynType) {
		return false
	}
	_, builtin := builtinOIDs[col.OID]
	return !builtin && (col.OID != 0 || scalarType(col.Type) == nil) // json, jsonb are dyn but known
}

// transformColumns returns the columns as a transform sees them: a
// redacted column is always null, so it is dyn.
func transformColumns(cols []cdc.Column, ops []columnOp) []cdc.Column {
	if ops == nil {
		return cols
	}
	out := slices.Clone(cols)
	for i := range out {
		if ops[i].kind == maskRedact {
			out[i].Type, out[i].OID = "", 0
		}
	}
	return out
}

// headerEscape percent-encodes the bytes of a column name that the
// Bridge-Masked header uses as separators, and control characters.
func headerEscape(name string) string {
	if !strings.ContainsFunc(name, func(r rune) bool { return r == ',' || r == '=' || r == '%' || r < 0x20 || r == 0x7f }) {
		return name
	}
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c == ',' || c == '=' || c == '%' || c < 0x20 || c == 0x7f {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// apply makes c's rows the published ones: columns left out, values
// masked, c.Rel the published relation, and the Bridge-Masked header.
// The rows are new slices: the source's are never written.
func (rs *relShape) apply(c *cdc.Change) error {
	if rs.identity() {
		return nil
	}
	var err error
	if c.Before, err = rs.project(c.Before); err != nil {
		return err
	}
	if c.After, err = rs.project(c.After); err != nil {
		return err
	}
	c.Rel = rs.out
	if rs.masked != "" && (c.Before != nil || c.After != nil) { // a truncate has no row to mask
		if c.Headers == nil {
			c.Headers = rs.headers // shared, never written: whoever adds a header copies the map (telemetry does)
		} else {
			h := make(map[string]string, len(c.Headers)+1)
			maps.Copy(h, c.Headers)
			h[format.HeaderMasked] = rs.masked
			c.Headers = h
		}
	}
	return nil
}

// project returns row as published.
func (rs *relShape) project(row []any) ([]any, error) {
	if row == nil {
		return nil, nil
	}
	n := len(row)
	if rs.keep != nil {
		n = len(rs.keep)
	}
	out := make([]any, n)
	for j := range out {
		i := j
		if rs.keep != nil {
			i = rs.keep[j]
		}
		if i >= len(row) {
			out[j] = cdc.Absent
			continue
		}
		v := row[i]
		if rs.ops != nil && rs.ops[j].kind != maskNone && v != nil && !omitted(v) {
			var err error
			if v, err = rs.ops[j].mask(v); err != nil {
				return nil, err
			}
		}
		out[j] = v
	}
	return out, nil
}

// mask returns v masked; v is not NULL and not a marker.
func (op *columnOp) mask(v any) (any, error) {
	switch op.kind {
	case maskRedact:
		return nil, nil
	case maskHash:
		switch x := v.(type) {
		case string:
			return op.h.sum(nil, x), nil
		case []byte:
			return op.h.sum(x, ""), nil
		}
		var scratch [64]byte
		b := format.AppendValue(scratch[:0], v)
		if len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' {
			b = b[1 : len(b)-1]
		}
		return op.h.sum(b, ""), nil
	case maskTruncate:
		switch x := v.(type) {
		case string:
			return truncateRunes(x, op.n), nil
		case []byte:
			if len(x) > op.n {
				return x[:op.n:op.n], nil
			}
			return x, nil
		}
		return nil, fmt.Errorf("column %q holds a %T value, and truncate applies to text and bytea; redact or hash it instead", op.name, v)
	}
	return v, nil
}

// truncateRunes returns the first n characters of s.
func truncateRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}
