package route

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
	"github.com/bridgecdc/bridge/config"
)

// route is a compiled config.Route.
type route struct {
	idx     int
	name    string // config name: the destination in message ids (cdc.Change.Dest)
	cont    bool   // continue: a change it takes goes on to the routes after it
	sources []string
	tables  []string
	ops     []cdc.Op
	sinks   []int // indexes into the pipeline's sinks
	subject *template.Template
	// schemaSubject is the subject of schema change events (schema_subject);
	// nil: subject.
	schemaSubject *template.Template
	onSchema      string // on_schema_change: "" (continue), "pause" or "dead_letter"
	// deadLetter is the dead_letter_subject template; nil: the default
	// (DeadLetterDefault of the change's subject).
	deadLetter *template.Template
	encode     format.Encoder
	format     string
	shape      *shaper // filter, columns, mask, transform; nil when none

	// deb holds the debezium format's options (nil for another format);
	// debKey encodes the Debezium-Key header (debezium.key: header).
	deb    *format.DebeziumOptions
	debKey func(dst []byte, c *cdc.Change) ([]byte, bool)

	perRow bool     // the template reads .Key, .Col or .Out: no cache
	cols   []string // the columns the template reads as {{.Col.x}}
	keys   []string // the columns the template reads as {{.Key.x}}
	outs   []string // the transform's keys the template reads as {{.Out.x}}

	mu    sync.Mutex
	cache map[subjectKey]string

	// hint is the size of the last payload encoded: the next one is
	// encoded into a buffer of about that size, in one allocation.
	hint atomic.Int64
	// wasmHint is hint for the native input of WebAssembly modules.
	wasmHint atomic.Int64
}

// maxHint caps the buffer presized from route.hint.
const maxHint = 16 << 10

type subjectKey struct {
	schema, table, prefix string
	op                    cdc.Op
}

// SubjectData is what a route's subject template sees. Every value is
// subject-safe: characters NATS does not allow in a token ('.', '*', '>',
// whitespace) become '_', and an empty value becomes '_'.
type SubjectData struct {
	Source, Schema, Table, Op, Prefix string
	// Key holds the row's key columns, Col every column of the row (the new
	// row, or the old one for deletes), as text: {{.Col.tenant_id}}.
	// A NULL value, a value the change does not carry (an unchanged TOAST
	// value, a non-key column of a delete) and every column of a change
	// without a row (truncate, logical message) render as "_". A column the
	// table does not have, or a {{.Key.x}} that is not part of the table's
	// key, is an error naming the route, the table and the column. They
	// hold the row as the route publishes it: a masked column's masked
	// value; a column the route leaves out is refused.
	Key, Col map[string]string
	// Out holds the top-level values of the route's transform result, as
	// text: {{.Out.aggregate_type}}. A key the result lacks, or a null
	// value, renders as "_".
	Out map[string]string
}

// Router assigns each change its route: subject, payload and sinks. It is
// safe for concurrent use.
type Router struct {
	routes   []*route
	fanout   bool // some route has continue
	unrouted string
	// contextPrefix is the prefix of trace context messages, consumed
	// rather than published; "" when tracing is off.
	contextPrefix string
	// ddl: DDL events are published (schemas.ddl; DDLDests).
	ddl bool
}

// New compiles cfg's routes. sinkIndex maps sink names to the indexes
// Route returns. contextPrefix is the prefix of the logical messages that
// carry a writer's trace context (telemetry.tracing.context_prefix; "" when
// tracing is off): a route consumes them instead of publishing them unless
// it lists the message op. Every error names its YAML path.
func New(cfg *config.Config, sinkIndex map[string]int, contextPrefix string, opts ...Option) (*Router, error) {
	return NewFor(cfg, "", sinkIndex, contextPrefix, opts...)
}

// Option configures a Router.
type Option func(*options)

type options struct {
	log       *slog.Logger
	wasmCache string // where WebAssembly modules' compiled code is kept; "": in memory
}

// WithLogger gives the router the logger of what routes' WebAssembly
// modules print (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithWASMCache keeps the compiled code of routes' WebAssembly modules in
// dir (<data_dir>/wasm for a running bridge), so a restart does not
// compile them again. Default: compiled once per process, nothing written.
func WithWASMCache(dir string) Option { return func(o *options) { o.wasmCache = dir } }

// NewFor is New for the pipeline of one source: it compiles only the routes
// whose match can take source's changes, so sinkIndex needs only the sinks
// those routes name (config.Config.RouteSinks). source "" compiles every route.
func NewFor(cfg *config.Config, source string, sinkIndex map[string]int, contextPrefix string, opts ...Option) (*Router, error) {
	o := options{log: slog.Default()}
	for _, f := range opts {
		f(&o)
	}
	r := &Router{unrouted: cfg.Unrouted, contextPrefix: contextPrefix, ddl: cfg.Schemas.DDL}
	var errs []error
	for i, rc := range cfg.Routes {
		if source != "" && len(rc.Match.Sources) > 0 && !slices.Contains(rc.Match.Sources, source) {
			continue
		}
		p := fmt.Sprintf("routes[%d]", i)
		rt := &route{idx: i, name: rc.Name, cont: rc.Continue, sources: rc.Match.Sources, tables: rc.Match.Tables, cache: map[subjectKey]string{}, onSchema: rc.OnSchemaChange}
		r.fanout = r.fanout || rc.Continue
		for _, op := range rc.Match.Ops {
			rt.ops = append(rt.ops, cdc.Op(op))
		}
		for j, s := range rc.Sinks {
			idx, ok := sinkIndex[s]
			if !ok {
				errs = append(errs, &config.FieldError{Path: fmt.Sprintf("%s.sinks[%d]", p, j), Msg: fmt.Sprintf("no sink named %q", s)})
				continue
			}
			rt.sinks = append(rt.sinks, idx)
		}
		f := rc.Format
		if f == "" {
			f = "native"
		}
		enc, ok := format.Lookup(f)
		if !ok {
			errs = append(errs, &config.FieldError{Path: p + ".format", Msg: fmt.Sprintf("unknown format %q (known: %s)", f, strings.Join(format.Names(), ", "))})
		}
		rt.encode, rt.format = enc, f
		if f == "debezium" {
			o := format.DebeziumOptions{SchemasEnable: rc.Debezium.SchemasEnable, Key: rc.Debezium.Key == "header",
				Tombstones: rc.Debezium.TombstonesOnDelete}
			rt.deb, rt.encode = &o, format.DebeziumEncoder(o)
			if o.Key {
				rt.debKey = format.DebeziumKeyEncoder(o.SchemasEnable)
			}
			// A tombstone is a second message of the delete: Each publishes it.
			r.fanout = r.fanout || o.Tombstones
		}
		subj := rc.Subject
		if subj == "" {
			subj = "cdc.{{.Source}}.{{.Schema}}.{{.Table}}"
		}
		tmpl, err := template.New(p).Option("missingkey=zero").Parse(subj)
		if err != nil {
			errs = append(errs, &config.FieldError{Path: p + ".subject", Msg: err.Error()})
		} else {
			rt.subject = tmpl
			rt.perRow = strings.Contains(subj, ".Key") || strings.Contains(subj, ".Col") || strings.Contains(subj, ".Out")
			rt.cols, rt.keys = RowRefs(subj)
			rt.outs = OutRefs(subj)
			// Test-render it so mistakes show at validate time.
			sample := map[string]string{}
			for _, m := range rowRef.FindAllStringSubmatch(subj, -1) {
				sample[m[2]] = "v"
			}
			if _, err := render(tmpl, SubjectData{Source: "src", Schema: "public", Table: "t", Op: "insert",
				Key: sample, Col: sample, Out: sample}); err != nil {
				errs = append(errs, &config.FieldError{Path: p + ".subject", Msg: err.Error()})
			}
			if len(rt.outs) > 0 && rc.Transform == "" && !rc.WASMTransform.Set() {
				errs = append(errs, &config.FieldError{Path: p + ".subject", Msg: fmt.Sprintf(
					"reads {{.Out.%s}}, the result of a transform, but the route has none; set transform, or read the row with {{.Col.%s}}", rt.outs[0], rt.outs[0])})
			}
		}
		if rc.SchemaSubject != "" {
			st, err := template.New(p + ".schema_subject").Option("missingkey=zero").Parse(rc.SchemaSubject)
			if err == nil {
				_, err = render(st, SubjectData{Source: "src", Schema: "public", Table: "t", Op: string(cdc.OpSchema), Prefix: "_"})
			}
			if err != nil {
				errs = append(errs, &config.FieldError{Path: p + ".schema_subject", Msg: err.Error()})
			}
			rt.schemaSubject = st
		}
		if rc.DeadLetterSubject != "" {
			dt, err := template.New(p + ".dead_letter_subject").Option("missingkey=zero").Parse(rc.DeadLetterSubject)
			if err == nil {
				_, err = render(dt, SubjectData{Source: "src", Schema: "public", Table: "t", Op: string(cdc.OpInsert), Prefix: "_"})
			}
			if err != nil {
				errs = append(errs, &config.FieldError{Path: p + ".dead_letter_subject", Msg: err.Error()})
			}
			rt.deadLetter = dt
		}
		sh, serrs := newShaper(i, rc, rt.cols, o)
		errs = append(errs, serrs...)
		rt.shape = sh
		r.routes = append(r.routes, rt)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return r, nil
}

func render(t *template.Template, d SubjectData) (string, error) {
	var sb strings.Builder
	if err := t.Execute(&sb, d); err != nil {
		return "", err
	}
	s := sb.String()
	if s == "" || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") || strings.Contains(s, "..") || strings.ContainsAny(s, " \t\r\n*>") {
		return "", fmt.Errorf("subject %q is not a valid NATS subject", s)
	}
	return s, nil
}

// Token makes s safe as one NATS subject token.
func Token(s string) string {
	if s == "" {
		return "_"
	}
	ok := true
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.' || c == '*' || c == '>' || c <= ' ' || c == 0x7f:
			ok = false
		}
	}
	if ok {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		if c == '.' || c == '*' || c == '>' || c <= ' ' || c == 0x7f {
			b[i] = '_'
		}
	}
	return string(b)
}

func (rt *route) matches(c *cdc.Change) bool {
	if len(rt.sources) > 0 && !slices.Contains(rt.sources, c.Source) {
		return false
	}
	if len(rt.ops) > 0 && !slices.Contains(rt.ops, c.Op) {
		return false
	}
	if len(rt.tables) > 0 {
		if c.Op == cdc.OpMessage {
			return false
		}
		name := c.Schema + "." + c.Table
		for _, g := range rt.tables {
			if ok, _ := path.Match(g, name); ok {
				return true
			}
		}
		return false
	}
	return true
}

// rowRef finds the values a template reads: {{.Col.x}}, {{.Key.x}},
// {{.Out.x}}.
var rowRef = regexp.MustCompile(`\.(Col|Key|Out)\.([A-Za-z_][A-Za-z0-9_]*)`)

// OutRefs returns the keys of the transform's result the subject template
// tmpl reads as {{.Out.x}}, each once, in order of appearance.
func OutRefs(tmpl string) []string {
	var outs []string
	for _, m := range rowRef.FindAllStringSubmatch(tmpl, -1) {
		if m[1] == "Out" && !slices.Contains(outs, m[2]) {
			outs = append(outs, m[2])
		}
	}
	return outs
}

// RowRefs returns the columns the subject template tmpl reads as
// {{.Col.x}} and as {{.Key.x}}, each once, in order of appearance.
func RowRefs(tmpl string) (cols, keys []string) {
	for _, m := range rowRef.FindAllStringSubmatch(tmpl, -1) {
		if m[1] == "Col" && !slices.Contains(cols, m[2]) {
			cols = append(cols, m[2])
		}
		if m[1] == "Key" && !slices.Contains(keys, m[2]) {
			keys = append(keys, m[2])
		}
	}
	return cols, keys
}

// subjectFor renders c's subject; out holds the transform's values the
// template reads ({{.Out.x}}), nil without a transform.
func (rt *route) subjectFor(c *cdc.Change, out map[string]string) (string, error) {
	if rt.perRow {
		d := SubjectData{Source: Token(c.Source), Schema: Token(c.Schema), Table: Token(c.Table), Op: string(c.Op), Prefix: Token(c.Prefix)}
		if c.Op == cdc.OpMessage {
			d.Schema, d.Table = "_message", Token(c.Prefix)
		}
		var err error
		if d.Key, d.Col, err = rt.rowTokens(c); err != nil {
			return "", fmt.Errorf("routes[%d].subject for %s: %w", rt.idx, where(c), err)
		}
		if len(rt.outs) > 0 {
			d.Out = make(map[string]string, len(rt.outs))
			for _, k := range rt.outs {
				d.Out[k] = "_"
				if v, ok := out[k]; ok {
					d.Out[k] = Token(v)
				}
			}
		}
		s, err := render(rt.subject, d)
		if err != nil {
			return "", fmt.Errorf("routes[%d].subject for %s: %w", rt.idx, where(c), err)
		}
		return s, nil
	}
	k := subjectKey{schema: c.Schema, table: c.Table, op: c.Op, prefix: c.Prefix}
	rt.mu.Lock()
	s, ok := rt.cache[k]
	rt.mu.Unlock()
	if ok {
		return s, nil
	}
	d := SubjectData{Source: Token(c.Source), Schema: Token(c.Schema), Table: Token(c.Table), Op: string(c.Op), Prefix: Token(c.Prefix)}
	if c.Op == cdc.OpMessage {
		d.Schema, d.Table = "_message", Token(c.Prefix)
	}
	s, err := render(rt.subject, d)
	if err != nil {
		return "", fmt.Errorf("routes[%d].subject for %s: %w", rt.idx, where(c), err)
	}
	rt.mu.Lock()
	if len(rt.cache) > 10000 {
		clear(rt.cache)
	}
	rt.cache[k] = s
	rt.mu.Unlock()
	return s, nil
}

// Route finds the first route that takes c (its match, then its filter),
// shapes c as that route publishes it (columns, masks: c.Rel, c.Before,
// c.After and the Bridge-Masked header become the published ones), sets
// c.Subject, c.Payload and c.Dest (the route's name), and returns the
// indexes of the sinks c goes to. ok is false when no route takes c and
// the policy is to drop, or when routes matched c but their filters
// rejected it (whatever the policy). An error (a filter or transform that
// fails on c, a route that cannot shape c's table) names the route's YAML
// path, the table and the change's position.
//
// Route ignores continue: with a router that has Fanout, Each finds every
// destination.
func (r *Router) Route(c *cdc.Change) (sinks []int, ok bool, err error) {
	filtered := false
	for i := 0; i < len(r.routes); i++ {
		rt, rs, take, consumed, err := r.take(c, i, &filtered)
		if err != nil || consumed {
			return nil, false, err
		}
		if !take {
			continue
		}
		return rt.publish(c, rs) // ok false: its wasm_transform dropped c
	}
	return nil, false, r.unroutedErr(c, filtered)
}

// Fanout reports whether a change can have several destinations (a route
// has continue): the caller must route with Each.
func (r *Router) Fanout() bool { return r.fanout }

// Each routes c to every route that takes it, in the routes' order: the
// first that takes it and, while the route that took it has continue, the
// next ones that take it. For each, it calls emit with a copy of c as that
// route publishes it (Route's shaping, subject, payload and Dest; a shallow
// copy emit may keep) and the sinks' indexes; c itself is not changed. It
// returns how many destinations c had (0: dropped or filtered, as Route's
// ok false) and Route's errors; emit's error stops it and is returned as
// is.
func (r *Router) Each(c *cdc.Change, emit func(d *cdc.Change, sinks []int) error) (int, error) {
	filtered := false
	n := 0
	for i := 0; i < len(r.routes); i++ {
		d := *c // as committed: every route shapes it afresh
		rt, rs, take, consumed, err := r.take(&d, i, &filtered)
		if err != nil {
			return n, err
		}
		if consumed {
			return n, nil
		}
		if !take {
			continue
		}
		sinks, ok, err := rt.publish(&d, rs)
		if err != nil {
			return n, err
		}
		if !ok { // its wasm_transform dropped it: a deliberate drop, as a filter's
			filtered = true
			if !rt.cont {
				break
			}
			continue
		}
		n++
		if err := emit(&d, sinks); err != nil {
			return n, err
		}
		if rt.deb != nil && rt.deb.Tombstones && d.Op == cdc.OpDelete {
			if err := emit(tombstone(&d, rt.name), sinks); err != nil {
				return n, err
			}
		}
		if !rt.cont {
			break
		}
	}
	if n == 0 {
		return 0, r.unroutedErr(c, filtered)
	}
	return n, nil
}

// take reports whether route i takes c and, when it does, shapes c as
// the route publishes it and sets c.Dest (publish then sets the subject
// and payload, with rs, the table's shaping: nil when the route has none).
// consumed means c is a trace context message no route publishes; a
// route's filter that rejects c sets *filtered.
func (r *Router) take(c *cdc.Change, i int, filtered *bool) (rt *route, rs *relShape, take, consumed bool, err error) {
	rt = r.routes[i]
	if !rt.matches(c) {
		return rt, nil, false, false, nil
	}
	if r.isContext(c) && !slices.Contains(rt.ops, cdc.OpMessage) {
		return rt, nil, false, true, nil // consumed: trace context only
	}
	if IsDDLMessage(c) {
		return rt, nil, false, true, nil // consumed: published as a DDL event, or not at all (DDLDests)
	}
	if rt.shape == nil {
		c.Dest = rt.name
		return rt, nil, true, false, nil
	}
	rs = rt.shape.shapeFor(c.Rel)
	if rs.err != nil {
		return rt, nil, false, false, rs.err // each problem names its YAML path and the table
	}
	if rs.filter != nil {
		take, err := rt.filter(rs, c)
		if err != nil {
			return rt, nil, false, false, err
		}
		if !take {
			*filtered = true
			return rt, nil, false, false, nil // the next routes may take it
		}
	}
	var committed cdc.Change // c as it came, for the routes after one whose wasm_filter rejects it
	if rt.shape.wasmFilter != nil {
		committed = *c
	}
	if err := rs.apply(c); err != nil {
		return rt, nil, false, false, fmt.Errorf("%s.mask on %s: %w", rt.shape.path, where(c), err)
	}
	if m := rt.shape.wasmFilter; m != nil {
		take, err := m.Filter(context.Background(), rt.native(c))
		if err != nil {
			*c = committed
			return rt, nil, false, false, fmt.Errorf("%s.wasm_filter on %s: %w; nothing from this change on is published or acknowledged until the module (or the route) is fixed", rt.shape.path, where(c), err)
		}
		if !take {
			*c = committed // the routes after this one shape it afresh
			*filtered = true
			return rt, nil, false, false, nil
		}
	}
	c.Dest = rt.name
	return rt, rs, true, false, nil
}

// native returns c in the native format, the input of the route's
// WebAssembly modules, in a buffer of the route's (about the size of the
// last one).
func (rt *route) native(c *cdc.Change) []byte {
	h := min(rt.wasmHint.Load(), maxHint)
	b := format.AppendNative(make([]byte, 0, h+h/4+64), c)
	rt.wasmHint.Store(int64(len(b)))
	return b
}

// unroutedErr is the error for c when no route took it: one when the
// policy is unrouted: error and no filter rejected it.
func (r *Router) unroutedErr(c *cdc.Change, filtered bool) error {
	if r.unrouted == "error" && !r.isContext(c) && !IsDDLMessage(c) && !filtered {
		return fmt.Errorf("no route matches %s %s.%s at commit LSN %s, change %d of the transaction (unrouted: error); add a route or set unrouted: drop",
			c.Op, c.Schema, c.Table, c.CommitLSN, c.Seq+1)
	}
	return nil
}

// filter runs rs's filter on c.
func (rt *route) filter(rs *relShape, c *cdc.Change) (bool, error) {
	take, err := evalFilter(rs.filter, c, rs)
	if re := asRowError(err); re != nil && re.noRow {
		return false, nil // a condition on a row the change does not have: not taken
	}
	if err != nil {
		return false, fmt.Errorf("%s.filter on %s: %w; guard the expression (has(after.x), after.x != null, op == ...) or narrow the route's match",
			rt.shape.path, where(c), err)
	}
	return take, nil
}

// publish sets c's subject and payload for rt, whose shaping rs (nil:
// none) has been applied to c.
func (rt *route) publish(c *cdc.Change, rs *relShape) ([]int, bool, error) {
	var body []byte
	var out map[string]string
	if rs != nil && rs.transform != nil {
		err := eval(rs.transform, c, rs, func(v ref.Val) error {
			if _, isNull := v.(types.Null); isNull {
				return rowErrorf("the result is null, and a transform must produce a map")
			}
			var err error
			if body, err = appendJSON(nil, v); err != nil {
				return err
			}
			if len(rt.outs) > 0 {
				out, err = outTokens(v, rt.outs)
			}
			return err
		})
		if err != nil {
			return nil, false, fmt.Errorf("%s.transform on %s: %w; guard the expression (op == ..., has(after.x)) or narrow the route's match",
				rt.shape.path, where(c), err)
		}
	}
	if rs != nil && rt.shape.wasmTransform != nil {
		var keep bool
		var err error
		body, keep, err = rt.shape.wasmTransform.Transform(context.Background(), rt.native(c), nil)
		if err != nil {
			return nil, false, fmt.Errorf("%s.wasm_transform on %s: %w; nothing from this change on is published or acknowledged until the module (or the route) is fixed", rt.shape.path, where(c), err)
		}
		if !keep {
			return nil, false, nil // dropped by the module
		}
		if len(rt.outs) > 0 {
			if out, err = jsonOutTokens(body, rt.outs); err != nil {
				return nil, false, fmt.Errorf("%s.wasm_transform on %s: %w", rt.shape.path, where(c), err)
			}
		}
	}
	subj, err := rt.subjectFor(c, out)
	if err != nil {
		return nil, false, err
	}
	if c.DeadLetter != "" && rt.onSchema == "dead_letter" {
		dl, err := rt.deadLetterSubject(c.Source, c.Schema, c.Table, c.Op, subj)
		if err != nil {
			return nil, false, err
		}
		c.Headers = DeadLetterHeaders(c.Headers, c.DeadLetter, subj)
		subj = dl
	}
	c.Subject = subj
	if rt.debKey != nil {
		rt.setDebeziumKey(c)
	}
	switch {
	case body == nil:
		h := min(rt.hint.Load(), maxHint) // a large row must not inflate the small ones after it
		c.Payload = rt.encode(make([]byte, 0, h+h/4+64), c)
		rt.hint.Store(int64(len(c.Payload)))
	case rt.format == "cloudevents":
		c.Payload = format.AppendCloudEventData(make([]byte, 0, len(body)+512), c, body)
	default:
		c.Payload = body
	}
	return rt.sinks, true, nil
}

// outTokens returns the values of keys in a transform's result v, as text.
func outTokens(v ref.Val, keys []string) (map[string]string, error) {
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		var x ref.Val
		switch m := v.(type) {
		case *rowVal:
			i := m.index(k)
			if i < 0 {
				continue
			}
			raw, ok := m.at(i)
			if !ok {
				continue
			}
			x = celValue(raw)
		case traits.Mapper:
			var found bool
			if x, found = m.Find(types.String(k)); !found {
				continue
			}
		default:
			continue
		}
		t, err := tokenOf(x)
		if err != nil {
			return nil, fmt.Errorf("{{.Out.%s}}: %w", k, err)
		}
		if t != "" {
			out[k] = t
		}
	}
	return out, nil
}

// where names a change for errors: its table, op and position.
func where(c *cdc.Change) string {
	t := c.Schema + "." + c.Table
	if c.Op == cdc.OpMessage {
		t = "message " + strconv.Quote(c.Prefix)
	}
	return fmt.Sprintf("%s (%s at commit LSN %s, change %d of the transaction)", t, c.Op, c.CommitLSN, c.Seq+1)
}

// isContext reports whether c is a trace context message (see
// config.Tracing.ContextPrefix).
func (r *Router) isContext(c *cdc.Change) bool {
	return r.contextPrefix != "" && c.Op == cdc.OpMessage && c.Prefix == r.contextPrefix
}

// rowTokens renders the row's key and columns as subject tokens. A change
// without a row (truncate, logical message) renders every column the
// template reads as "_"; a column the table does not have, or a key
// column that is not part of its key, is an error.
func (rt *route) rowTokens(c *cdc.Change) (key, col map[string]string, err error) {
	row := c.After
	if row == nil {
		row = c.Before
	}
	key, col = map[string]string{}, map[string]string{}
	if c.Rel == nil || row == nil {
		for _, n := range rt.cols {
			col[n] = "_"
		}
		for _, n := range rt.keys {
			key[n] = "_"
		}
		return key, col, nil
	}
	for i, v := range row {
		if i >= len(c.Rel.Columns) {
			break
		}
		var t string
		switch v.(type) {
		case nil, cdc.UnchangedToast, cdc.AbsentValue:
			t = "_"
		default:
			b := format.AppendValue(nil, v)
			t = Token(strings.Trim(string(b), `"`))
		}
		name := c.Rel.Columns[i].Name
		col[name] = t
		if c.Rel.Columns[i].Key {
			key[name] = t
		}
	}
	for _, n := range rt.cols {
		if _, ok := col[n]; !ok {
			return nil, nil, fmt.Errorf("column %q ({{.Col.%s}}) is not a column of %s.%s (its columns: %s); change the template, or limit the route's match.tables to tables that have it",
				n, n, c.Schema, c.Table, columnNames(c.Rel, false))
		}
	}
	for _, n := range rt.keys {
		if _, ok := key[n]; ok {
			continue
		}
		if _, ok := col[n]; ok {
			return nil, nil, fmt.Errorf("column %q ({{.Key.%s}}) is not part of the key of %s.%s (its key: %s); write {{.Col.%s}}, or limit the route's match.tables to tables whose key has it",
				n, n, c.Schema, c.Table, columnNames(c.Rel, true), n)
		}
		return nil, nil, fmt.Errorf("column %q ({{.Key.%s}}) is not a column of %s.%s (its key: %s); change the template, or limit the route's match.tables to tables that have it",
			n, n, c.Schema, c.Table, columnNames(c.Rel, true))
	}
	return key, col, nil
}

// columnNames lists rel's columns (only its key columns when key is set)
// for messages.
func columnNames(rel *cdc.Relation, key bool) string {
	var names []string
	for _, c := range rel.Columns {
		if !key || c.Key {
			names = append(names, c.Name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// jsonOutTokens returns the values of keys in body, a JSON object, as
// subject text: a string's text, a number or boolean as written; a
// missing key or null is left out.
func jsonOutTokens(body []byte, keys []string) (map[string]string, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("reading the body for {{.Out.x}}: %w", err)
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		raw, ok := top[k]
		if !ok || string(raw) == "null" {
			continue
		}
		switch raw[0] {
		case '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, fmt.Errorf("{{.Out.%s}}: %w", k, err)
			}
			out[k] = s
		case '{', '[':
			return nil, fmt.Errorf("{{.Out.%s}} is a JSON %s, and a subject token must be a string, number or boolean", k, map[byte]string{'{': "object", '[': "array"}[raw[0]])
		default:
			out[k] = string(raw)
		}
	}
	return out, nil
}
