package route

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/template"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

// What a route can render, known before the first change: the subjects of
// its changes and of the control messages it carries, as patterns whose
// "*" tokens stand for what only a change tells (a column value, a table a
// glob matches).

// Patterns is what one route's subject template can render.
type Patterns struct {
	// Route is the route's index in bridge.yaml.
	Route int
	// Template is the subject template, the default one when the route
	// sets none.
	Template string
	// Data holds, per source the route takes changes from, the subjects of
	// those changes, sorted: literal tokens where the route's match fixes
	// them (the source; schema and table of a match.tables entry without
	// glob characters; the ops listed), "*" where only the change tells.
	Data map[string][]string
	// Control holds, per source and sink, the subject of the control
	// messages (resync) the route carries to that sink (see
	// Router.ControlDests).
	Control map[string]map[string]string
}

// wild marks a value known only per change while a pattern is rendered: a
// token holding it becomes "*".
const wild = "\x01"

// SubjectPatterns returns what each of cfg's routes can render. Routes
// whose template does not parse are left out (New reports them).
func SubjectPatterns(cfg *config.Config) []Patterns {
	var out []Patterns
	srcNames := make([]string, 0, len(cfg.Sources))
	for n := range cfg.Sources {
		srcNames = append(srcNames, n)
	}
	sort.Strings(srcNames)
	tmpls := make([]*template.Template, len(cfg.Routes))
	for i, rc := range cfg.Routes {
		subj := subjectOf(rc)
		t, err := template.New("").Option("missingkey=zero").Parse(subj)
		if err != nil {
			continue
		}
		tmpls[i] = t
		p := Patterns{Route: i, Template: subj, Data: map[string][]string{}, Control: map[string]map[string]string{}}
		cols, keys := RowRefs(subj)
		for _, src := range routeSources(rc, srcNames) {
			var subs []string
			for _, d := range dataVariants(rc, src) {
				if s, ok := pattern(t, d, cols, keys, wild); ok && !slices.Contains(subs, s) {
					subs = append(subs, s)
				}
			}
			// Schema change events on a subject of their own (SchemaDests).
			if st := schemaTemplate(cfg, rc); st != nil {
				for _, d := range dataVariants(rc, src) {
					d.Op = string(cdc.OpSchema)
					if s, ok := pattern(st, d, nil, nil, "_"); ok && !slices.Contains(subs, s) {
						subs = append(subs, s)
					}
				}
			}
			// Held tables' changes and events on the dead-letter subject
			// (on_schema_change: dead_letter).
			if cfg.Schemas.Enabled && rc.OnSchemaChange == "dead_letter" {
				if rc.DeadLetterSubject == "" {
					for _, s := range subs {
						if d := DeadLetterDefault(s); !slices.Contains(subs, d) {
							subs = append(subs, d)
						}
					}
				} else if dt, err := template.New("").Option("missingkey=zero").Parse(rc.DeadLetterSubject); err == nil {
					for _, d := range dataVariants(rc, src) {
						for _, op := range []string{d.Op, string(cdc.OpSchema)} {
							d.Op = op
							if s, ok := pattern(dt, d, nil, nil, "_"); ok && !slices.Contains(subs, s) {
								subs = append(subs, s)
							}
						}
					}
				}
			}
			// DDL events on schema_subject, with .Op "ddl" (DDLDests); on
			// the route's subject, they render as its changes do.
			if st := ddlTemplate(cfg, rc); st != nil {
				for _, d := range dataVariants(rc, src) {
					d.Op = string(cdc.OpDDL)
					if s, ok := pattern(st, d, nil, nil, "_"); ok && !slices.Contains(subs, s) {
						subs = append(subs, s)
					}
				}
			}
			sort.Strings(subs)
			if len(subs) > 0 {
				p.Data[src] = subs
			}
		}
		out = append(out, p)
	}
	// Control messages: per source, the routes listing the control op, or
	// else every route of the source; a sink gets the subject of the first
	// such route naming it (Router.ControlDests).
	for _, src := range srcNames {
		explicit := false
		for _, rc := range cfg.Routes {
			if slices.Contains(routeSources(rc, srcNames), src) && slices.Contains(rc.Match.Ops, string(cdc.OpControl)) {
				explicit = true
			}
		}
		seen := map[string]bool{}
		for i, rc := range cfg.Routes {
			if tmpls[i] == nil || !slices.Contains(routeSources(rc, srcNames), src) ||
				slices.Contains(rc.Match.Ops, string(cdc.OpControl)) != explicit {
				continue
			}
			cols, keys := RowRefs(subjectOf(rc))
			d := SubjectData{Source: Token(src), Schema: cdc.ControlSchema, Table: Token(cdc.ControlResync), Op: string(cdc.OpControl), Prefix: "_"}
			s, ok := pattern(tmpls[i], d, cols, keys, "_") // row values render "_" in control messages
			if !ok {
				continue
			}
			for _, sink := range rc.Sinks {
				if seen[sink] {
					continue
				}
				seen[sink] = true
				for k := range out {
					if out[k].Route == i {
						if out[k].Control[src] == nil {
							out[k].Control[src] = map[string]string{}
						}
						out[k].Control[src][sink] = s
					}
				}
			}
		}
	}
	return out
}

// schemaTemplate returns rc's schema_subject when rc carries schema change
// events on it (schemas on, its ops empty or listing schema); nil when not.
func schemaTemplate(cfg *config.Config, rc config.Route) *template.Template {
	if !cfg.Schemas.Enabled || rc.SchemaSubject == "" || (len(rc.Match.Ops) > 0 && !slices.Contains(rc.Match.Ops, string(cdc.OpSchema))) {
		return nil
	}
	t, err := template.New("").Option("missingkey=zero").Parse(rc.SchemaSubject)
	if err != nil {
		return nil
	}
	return t
}

// subjectOf returns rc's subject template, or the default one.
func subjectOf(rc config.Route) string {
	if rc.Subject == "" {
		return "cdc.{{.Source}}.{{.Schema}}.{{.Table}}"
	}
	return rc.Subject
}

// routeSources returns the configured sources rc takes changes from.
func routeSources(rc config.Route, all []string) []string {
	if len(rc.Match.Sources) == 0 {
		return all
	}
	var out []string
	for _, s := range all {
		if slices.Contains(rc.Match.Sources, s) {
			out = append(out, s)
		}
	}
	return out
}

// maxVariants bounds the renders of one route for one source: past it the
// ops become unknown, then the tables.
const maxVariants = 1000

// dataVariants returns the SubjectData a route's changes from src can
// render with: one per match.tables entry and op listed, wild where the
// match leaves a value open.
func dataVariants(rc config.Route, src string) []SubjectData {
	type table struct{ schema, name string }
	tables := []table{{wild, wild}}
	if len(rc.Match.Tables) > 0 {
		tables = tables[:0]
		for _, g := range rc.Match.Tables {
			schema, name, ok := strings.Cut(g, ".")
			if !ok { // a glob without a dot may match schema and table at once
				tables = append(tables, table{wild, wild})
				continue
			}
			t := table{Token(schema), Token(name)}
			if isGlob(schema) {
				t.schema = wild
			}
			if isGlob(name) || strings.Contains(name, ".") {
				t.name = wild
			}
			tables = append(tables, t)
		}
	}
	var ops []string
	for _, op := range rc.Match.Ops {
		if op != string(cdc.OpControl) {
			ops = append(ops, op)
		}
	}
	if len(rc.Match.Ops) > 0 && len(ops) == 0 {
		return nil // a control route takes no changes
	}
	if len(ops) == 0 || len(ops)*len(tables) > maxVariants {
		ops = []string{wild}
	}
	if len(ops)*len(tables) > maxVariants {
		tables = []table{{wild, wild}}
	}
	var out []SubjectData
	for _, t := range tables {
		for _, op := range ops {
			d := SubjectData{Source: Token(src), Schema: t.schema, Table: t.name, Op: op, Prefix: wild}
			if op == string(cdc.OpMessage) {
				d.Schema, d.Table = "_message", wild
			}
			out = append(out, d)
		}
	}
	return out
}

func isGlob(s string) bool { return strings.ContainsAny(s, `*?[\`) }

// pattern renders t with d and the columns the template reads set to
// fill, and turns every token holding wild into "*". ok is false when the
// template fails.
func pattern(t *template.Template, d SubjectData, cols, keys []string, fill string) (string, bool) {
	d.Col, d.Key, d.Out = map[string]string{}, map[string]string{}, map[string]string{}
	for _, c := range cols {
		d.Col[c] = fill
	}
	for _, k := range keys {
		d.Key[k] = fill
	}
	for _, o := range OutRefs(t.Root.String()) {
		d.Out[o] = fill
	}
	var sb strings.Builder
	if err := t.Execute(&sb, d); err != nil {
		return "", false
	}
	toks := strings.Split(sb.String(), ".")
	for i, tok := range toks {
		if strings.Contains(tok, wild) {
			toks[i] = "*"
		}
	}
	return strings.Join(toks, "."), true
}

// Within reports whether every subject the pattern can stand for ("*"
// tokens for any one token, no ">") matches the NATS subject filter.
func Within(pattern, filter string) bool {
	for {
		pt, prest, pmore := strings.Cut(pattern, ".")
		ft, frest, fmore := strings.Cut(filter, ".")
		switch {
		case ft == ">":
			return true
		case ft != "*" && ft != pt:
			return false
		case !pmore || !fmore:
			return pmore == fmore
		}
		pattern, filter = prest, frest
	}
}

// WithinAny reports whether pattern is within one of filters. For
// patterns without ">" that is the same as being within their union: a
// "*" token can take a value no filter names.
func WithinAny(pattern string, filters []string) bool {
	for _, f := range filters {
		if Within(pattern, f) {
			return true
		}
	}
	return false
}

// CheckSubjects reports every route whose template can render, for a
// source it takes changes from, a subject outside the subjects of a sink
// it writes to. accepted holds, by sink name, the subjects of the sinks
// that know them from their configuration (sinks.SubjectLimiter). Each
// error names the route's subject path, the subjects, the sink's key and
// the fix.
func CheckSubjects(cfg *config.Config, accepted map[string]sinks.SubjectSet) error {
	if len(accepted) == 0 {
		return nil
	}
	var errs []error
	for _, p := range SubjectPatterns(cfg) {
		rc := cfg.Routes[p.Route]
		for _, sink := range rc.Sinks {
			set, ok := accepted[sink]
			if !ok {
				continue
			}
			var parts []string
			for _, src := range sortedKeys(p.Data, p.Control) {
				var out []string
				for _, s := range p.Data[src] {
					if !WithinAny(s, set.Filters) {
						out = append(out, s)
					}
				}
				// A control subject within an uncovered data pattern says nothing more.
				if s, ok := p.Control[src][sink]; ok && !WithinAny(s, set.Filters) && !WithinAny(s, out) {
					out = append(out, s+" (control messages)")
				}
				if len(out) > 0 {
					parts = append(parts, fmt.Sprintf("%s for source %s", strings.Join(out, ", "), src))
				}
			}
			if len(parts) == 0 {
				continue
			}
			where := ""
			if set.Key != "" {
				where = fmt.Sprintf(" (sinks.%s.config.%s)", sink, set.Key)
			}
			errs = append(errs, &config.FieldError{Path: fmt.Sprintf("routes[%d].subject", p.Route),
				Msg: fmt.Sprintf("%q gives subjects %s, outside %s's subjects [%s]%s; change the subject or add the subjects to the stream",
					p.Template, strings.Join(parts, "; "), set.Of, strings.Join(set.Filters, ", "), where)})
		}
	}
	return errors.Join(errs...)
}

// sortedKeys returns the sources of data and control, sorted.
func sortedKeys(data map[string][]string, control map[string]map[string]string) []string {
	var out []string
	for k := range data {
		out = append(out, k)
	}
	for k := range control {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}
