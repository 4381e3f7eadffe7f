package route

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
	"github.com/bridgecdc/bridge/config"
)

// route is a compiled config.Route.
type route struct {
	idx     int
	sources []string
	tables  []string
	ops     []cdc.Op
	sinks   []int // indexes into the pipeline's sinks
	subject *template.Template
	encode  format.Encoder

	perRow bool     // the template reads .Key or .Col: no cache
	cols   []string // the columns the template reads as {{.Col.x}}
	keys   []string // the columns the template reads as {{.Key.x}}

	mu    sync.Mutex
	cache map[subjectKey]string

	// hint is the size of the last payload encoded: the next one is
	// encoded into a buffer of about that size, in one allocation.
	hint atomic.Int64
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
	// key, is an error naming the route, the table and the column.
	Key, Col map[string]string
}

// Router assigns each change its route: subject, payload and sinks. It is
// safe for concurrent use.
type Router struct {
	routes   []*route
	unrouted string
	// contextPrefix is the prefix of trace context messages, consumed
	// rather than published; "" when tracing is off.
	contextPrefix string
}

// New compiles cfg's routes. sinkIndex maps sink names to the indexes
// Route returns. contextPrefix is the prefix of the logical messages that
// carry a writer's trace context (telemetry.tracing.context_prefix; "" when
// tracing is off): a route consumes them instead of publishing them unless
// it lists the message op. Every error names its YAML path.
func New(cfg *config.Config, sinkIndex map[string]int, contextPrefix string) (*Router, error) {
	r := &Router{unrouted: cfg.Unrouted, contextPrefix: contextPrefix}
	var errs []error
	for i, rc := range cfg.Routes {
		p := fmt.Sprintf("routes[%d]", i)
		rt := &route{idx: i, sources: rc.Match.Sources, tables: rc.Match.Tables, cache: map[subjectKey]string{}}
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
		rt.encode = enc
		subj := rc.Subject
		if subj == "" {
			subj = "cdc.{{.Source}}.{{.Schema}}.{{.Table}}"
		}
		tmpl, err := template.New(p).Option("missingkey=zero").Parse(subj)
		if err != nil {
			errs = append(errs, &config.FieldError{Path: p + ".subject", Msg: err.Error()})
		} else {
			rt.subject = tmpl
			rt.perRow = strings.Contains(subj, ".Key") || strings.Contains(subj, ".Col")
			rt.cols, rt.keys = RowRefs(subj)
			// Test-render it so mistakes show at validate time.
			sample := map[string]string{}
			for _, m := range rowRef.FindAllStringSubmatch(subj, -1) {
				sample[m[2]] = "v"
			}
			if _, err := render(tmpl, SubjectData{Source: "src", Schema: "public", Table: "t", Op: "insert",
				Key: sample, Col: sample}); err != nil {
				errs = append(errs, &config.FieldError{Path: p + ".subject", Msg: err.Error()})
			}
		}
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

// rowRef finds the columns a template reads: {{.Col.x}}, {{.Key.x}}.
var rowRef = regexp.MustCompile(`\.(Col|Key)\.([A-Za-z_][A-Za-z0-9_]*)`)

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

func (rt *route) subjectFor(c *cdc.Change) (string, error) {
	if rt.perRow {
		d := SubjectData{Source: Token(c.Source), Schema: Token(c.Schema), Table: Token(c.Table), Op: string(c.Op), Prefix: Token(c.Prefix)}
		if c.Op == cdc.OpMessage {
			d.Schema, d.Table = "_message", Token(c.Prefix)
		}
		var err error
		if d.Key, d.Col, err = rt.rowTokens(c); err != nil {
			return "", fmt.Errorf("routes[%d].subject for %s.%s: %w", rt.idx, c.Schema, c.Table, err)
		}
		s, err := render(rt.subject, d)
		if err != nil {
			return "", fmt.Errorf("routes[%d].subject for %s.%s: %w", rt.idx, c.Schema, c.Table, err)
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
		return "", fmt.Errorf("routes[%d].subject: %w", rt.idx, err)
	}
	rt.mu.Lock()
	if len(rt.cache) > 10000 {
		clear(rt.cache)
	}
	rt.cache[k] = s
	rt.mu.Unlock()
	return s, nil
}

// Route finds the first matching route for c, sets c.Subject and c.Payload,
// and returns the indexes of the sinks c goes to. ok is false when no route
// matches and the policy is to drop.
func (r *Router) Route(c *cdc.Change) (sinks []int, ok bool, err error) {
	for _, rt := range r.routes {
		if !rt.matches(c) {
			continue
		}
		if r.isContext(c) && !slices.Contains(rt.ops, cdc.OpMessage) {
			return nil, false, nil // consumed: trace context only
		}
		subj, err := rt.subjectFor(c)
		if err != nil {
			return nil, false, err
		}
		c.Subject = subj
		h := min(rt.hint.Load(), maxHint) // a large row must not inflate the small ones after it
		c.Payload = rt.encode(make([]byte, 0, h+h/4+64), c)
		rt.hint.Store(int64(len(c.Payload)))
		return rt.sinks, true, nil
	}
	if r.unrouted == "error" && !r.isContext(c) {
		return nil, false, fmt.Errorf("no route matches %s %s.%s (unrouted: error); add a route or set unrouted: drop", c.Op, c.Schema, c.Table)
	}
	return nil, false, nil
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
