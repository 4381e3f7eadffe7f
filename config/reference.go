package config

import (
	"bytes"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/v2"
)

// RefPlugin describes a registered plugin for Reference. The config package
// cannot import the registries (they import it), so callers pass them in:
// one RefPlugin per entry of sources.Default and sinks.Default.
type RefPlugin struct {
	// Kind is "source" or "sink".
	Kind string
	// Type is the registered type name, e.g. "pgoutput".
	Type string
	// Doc is the plugin's one-line description.
	Doc string
	// Config is the plugin's Config value with its defaults filled in (the
	// registry's Plugin.Config).
	Config any
}

// CommentFunc returns the doc comment of field (a Go field name) of the
// struct type t, or of t itself when field is "". "" means none.
type CommentFunc func(t reflect.Type, field string) string

// Reference renders the configuration reference, docs/configuration.md:
// every key of bridge.yaml and of each plugin's config block, found by
// walking Config and the plugins' Config values by reflection, with its
// YAML path, its type, its default (from the defaults Load applies, and the
// plugins' Config values), the BRIDGE_* variable that sets it, and its doc
// comment from comments (nil: no comments). The output is deterministic.
func Reference(plugins []RefPlugin, comments CommentFunc) []byte {
	if comments == nil {
		comments = func(reflect.Type, string) string { return "" }
	}
	r := &refWriter{comments: comments}
	r.header(plugins)

	def := referenceDefaults()
	v := reflect.ValueOf(def).Elem()
	t := v.Type()
	var top []refRow
	type section struct {
		key string
		f   reflect.StructField
		v   reflect.Value
	}
	var sections []section
	for _, fi := range refFields(t) {
		f := t.FieldByIndex(fi.index)
		fv := v.FieldByIndex(fi.index)
		if isSection(f.Type) {
			sections = append(sections, section{fi.key, f, fv})
			continue
		}
		top = append(top, r.row(fi.decl, f, fi.key, fv))
	}
	r.printf("## Top level\n\n")
	r.table(top)
	for _, s := range sections {
		r.printf("## `%s`\n\n", s.key)
		fieldDoc := oneLine(comments(t, s.f.Name))
		if fieldDoc != "" {
			r.printf("%s\n\n", fieldDoc)
		}
		elem, path, ev := s.f.Type, s.key, s.v
		switch elem.Kind() {
		case reflect.Map:
			elem, path = elem.Elem(), path+".<name>"
			ev = ev.MapIndex(reflect.ValueOf(refName))
		case reflect.Slice:
			elem, path = elem.Elem(), path+"[]"
			ev = ev.Index(0)
		}
		if doc := oneLine(comments(elem, "")); doc != "" && doc != fieldDoc {
			r.printf("%s\n\n", doc)
		}
		var rows []refRow
		r.walk(&rows, path, ev)
		r.table(rows)
	}

	for _, kind := range []string{"source", "sink"} {
		var ps []RefPlugin
		for _, p := range plugins {
			if p.Kind == kind {
				ps = append(ps, p)
			}
		}
		sort.Slice(ps, func(i, j int) bool { return ps[i].Type < ps[j].Type })
		if len(ps) == 0 {
			continue
		}
		title := map[string]string{"source": "Source types", "sink": "Sink types"}[kind]
		r.printf("## %s\n\n", title)
		r.printf("The `config:` block of each %s, by `type`. `bridge plugins` lists the types a binary has compiled in.\n\n", kind)
		for _, p := range ps {
			r.printf("### `%s`\n\n", p.Type)
			if p.Doc != "" {
				r.printf("%s.\n\n", strings.TrimSuffix(p.Doc, "."))
			}
			pv := reflect.ValueOf(p.Config)
			for pv.Kind() == reflect.Pointer && !pv.IsNil() {
				pv = pv.Elem()
			}
			if pv.Kind() != reflect.Struct {
				r.printf("No keys.\n\n")
				continue
			}
			if doc := comments(pv.Type(), ""); doc != "" {
				r.printf("%s\n\n", oneLine(doc))
			}
			var rows []refRow
			r.walk(&rows, kind+"s."+refName+".config", pv)
			r.table(rows)
		}
	}
	return bytes.TrimRight(r.buf.Bytes(), "\n")
}

// refName stands for the name of a source or sink in paths.
const refName = "<name>"

// defaultNotes describe defaults that are not a plain value.
var defaultNotes = map[string]string{
	"nats.embedded.store_dir":   "`<data_dir>/nats`",
	"telemetry.tracing.enabled": "on when an OTLP endpoint is configured",
}

// referenceDefaults is the Config that Load yields from nothing but its
// defaults, with one source, one sink and one route (all named refName or
// at index 0) so that the per-entry defaults show.
func referenceDefaults() *Config {
	k := koanf.New(".")
	_ = k.Load(confmap.Provider(defaults(), "."), nil)
	raw := k.Raw()
	raw["sources"] = map[string]any{refName: map[string]any{}}
	raw["sinks"] = map[string]any{refName: map[string]any{}}
	raw["routes"] = []any{map[string]any{}}
	setEntryDefaults(raw, nil)
	cfg := &Config{}
	d := decoder{}
	d.decode("", raw, reflect.ValueOf(cfg).Elem())
	return cfg
}

type refRow struct {
	key, typ, def, env, doc string
}

type refWriter struct {
	buf      bytes.Buffer
	comments CommentFunc
}

func (r *refWriter) printf(format string, a ...any) { fmt.Fprintf(&r.buf, format, a...) }

func (r *refWriter) header(plugins []RefPlugin) {
	// § stands for a backtick, which a raw string cannot hold.
	r.printf("%s", strings.ReplaceAll(`# Configuration reference

<!-- Generated from the config structs and their doc comments by
     go test ./config -run TestReference -update
     Do not edit by hand: a test fails when this file and the code disagree. -->

Every key of §bridge.yaml§, with its type, its default and the environment variable that
sets it. How the layers combine (defaults < file < the §config.kv§ entry, if any < §BRIDGE_*§ variables < flags),
§${VAR}§ and §${file:PATH}§ interpolation and the error messages are described in the
[README](../README.md#configuration); [§bridge.yaml§](../bridge.yaml) is an annotated example.

- Paths are YAML paths: §<name>§ is the name you give a source or sink, §[]§ an element of a list.
- Durations are Go durations: §500ms§, §2s§, §1m30s§.
- A variable's name is §BRIDGE_§ and the path in upper case with §__§ between levels. A list of
  plain values takes its items comma-separated (§BRIDGE_SERVE__TABLES=public.a,public.b§), or as
  a YAML flow list when an item holds a comma (§[a, "b,c"]§). Lists of mappings and the keys
  inside them (marked —) cannot be set from the environment; set them in the file.
- Unknown keys are errors, in plugin blocks too. A §BRIDGE_*§ variable whose first level is no
  top-level key is ignored, unless it looks like a typo of one.

Contents: [top level](#top-level)`, "§", "`"))
	for _, fi := range refFields(reflect.TypeFor[Config]()) {
		f := reflect.TypeFor[Config]().FieldByIndex(fi.index)
		if isSection(f.Type) {
			r.printf(", [`%s`](#%s)", fi.key, anchor(fi.key))
		}
	}
	types := map[string][]string{}
	for _, p := range plugins {
		types[p.Kind] = append(types[p.Kind], p.Type)
	}
	for _, kind := range []string{"source", "sink"} {
		sort.Strings(types[kind])
		var links []string
		for _, typ := range types[kind] {
			links = append(links, fmt.Sprintf("[`%s`](#%s)", typ, anchor(typ)))
		}
		if len(links) > 0 {
			r.printf("; %s types: %s", kind, strings.Join(links, ", "))
		}
	}
	r.printf(".\n\n")
}

// anchor is GitHub's heading anchor for a heading holding s in backticks.
func anchor(s string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteRune(c)
		case c == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

func (r *refWriter) table(rows []refRow) {
	if len(rows) == 0 {
		r.printf("No keys.\n\n")
		return
	}
	r.printf("| key | type | default | environment | description |\n| --- | --- | --- | --- | --- |\n")
	for _, x := range rows {
		r.printf("| `%s` | %s | %s | %s | %s |\n", x.key, x.typ, orDash(x.def), orDash(x.env), cell(x.doc))
	}
	r.printf("\n")
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// cell makes s safe inside a Markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(oneLine(s), "|", `\|`)
}

// oneLine joins a doc comment's lines into Markdown prose: "<data_dir>"
// must not read as an HTML tag.
func oneLine(s string) string {
	return strings.ReplaceAll(strings.Join(strings.Fields(s), " "), "<", "&lt;")
}

// walk appends a row for every key under the struct value v found at path,
// descending into nested structs, maps of structs and lists of structs.
func (r *refWriter) walk(rows *[]refRow, path string, v reflect.Value) {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			v = reflect.New(v.Type().Elem())
		}
		v = v.Elem()
	}
	t := v.Type()
	for _, fi := range refFields(t) {
		f := t.FieldByIndex(fi.index)
		fv := v.FieldByIndex(fi.index)
		key := path + "." + fi.key
		ft := f.Type
		switch {
		case ft.Kind() == reflect.Struct && ft != reflect.TypeFor[time.Duration]() && !isText(ft):
			r.walk(rows, key, fv)
		case ft.Kind() == reflect.Map && isStruct(ft.Elem()):
			*rows = append(*rows, r.row(fi.decl, f, key, fv))
			r.walk(rows, key+".<key>", reflect.New(ft.Elem()).Elem())
		case ft.Kind() == reflect.Slice && isStruct(ft.Elem()):
			*rows = append(*rows, r.row(fi.decl, f, key, fv))
			r.walk(rows, key+"[]", reflect.New(ft.Elem()).Elem())
		default:
			*rows = append(*rows, r.row(fi.decl, f, key, fv))
		}
	}
}

func isStruct(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind() == reflect.Struct && !isText(t)
}

func isText(t reflect.Type) bool {
	return t.Kind() != reflect.Pointer && reflect.PointerTo(t).Implements(textUnmarshalerType)
}

// isSection reports whether a top-level field gets a section of its own.
func isSection(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Struct:
		return t != reflect.TypeFor[time.Duration]() && !isText(t)
	case reflect.Map, reflect.Slice:
		return isStruct(t.Elem())
	}
	return false
}

func (r *refWriter) row(decl reflect.Type, f reflect.StructField, key string, v reflect.Value) refRow {
	x := refRow{key: key, typ: typeName(f.Type), env: envName(key, f.Type), doc: r.comments(decl, f.Name)}
	if note, ok := defaultNotes[key]; ok {
		x.def = note
	} else {
		x.def = defaultText(v)
	}
	return x
}

// typeName is the type as a reader of the YAML needs it.
func typeName(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return "duration"
	case isText(t):
		return "string"
	case t.Kind() == reflect.Pointer:
		return typeName(t.Elem())
	case t.Kind() == reflect.Map && t.Elem().Kind() == reflect.Interface:
		return "mapping"
	case t.Kind() == reflect.Map:
		return "map of " + typeName(t.Elem()) + "s"
	case t.Kind() == reflect.Slice && isStruct(t.Elem()):
		return "list"
	case t.Kind() == reflect.Slice:
		return "list of " + typeName(t.Elem()) + "s"
	case t.Kind() == reflect.Struct:
		return "mapping"
	}
	return t.Kind().String()
}

// envName is the BRIDGE_* variable that sets the key at path, or "" when
// the environment cannot (lists of mappings, and keys inside lists).
func envName(path string, t reflect.Type) string {
	if strings.Contains(path, "[]") || (t.Kind() == reflect.Slice && !scalarElem(t.Elem())) {
		return ""
	}
	parts := strings.Split(path, ".")
	for i, p := range parts {
		parts[i] = strings.ToUpper(p)
	}
	name := "`" + EnvPrefix + strings.Join(parts, "__")
	if t.Kind() == reflect.Map {
		name += "__<KEY>"
	}
	return name + "`"
}

// defaultText renders a default value; "" for none.
func defaultText(v reflect.Value) string {
	if !v.IsValid() {
		return ""
	}
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	switch x := v.Interface().(type) {
	case time.Duration:
		if x == 0 {
			return ""
		}
		return "`" + shortDuration(x) + "`"
	case bool:
		return "`" + strconv.FormatBool(x) + "`"
	}
	if v.IsZero() {
		return ""
	}
	switch v.Kind() {
	case reflect.String:
		return "`" + strconv.Quote(v.String()) + "`"
	case reflect.Slice:
		if v.Len() == 0 {
			return ""
		}
		var items []string
		for i := range v.Len() {
			items = append(items, strconv.Quote(fmt.Sprint(v.Index(i).Interface())))
		}
		return "`[" + strings.Join(items, ", ") + "]`"
	case reflect.Map, reflect.Struct:
		return ""
	}
	return "`" + fmt.Sprint(v.Interface()) + "`"
}

// shortDuration prints d as it would be written: 2m, not 2m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// refField is one key of a struct type, in declaration order.
type refField struct {
	key   string
	index []int
	decl  reflect.Type // the struct type that declares the field
}

// refFields lists the keys of struct type t in declaration order, by the
// rules of structFields (koanf tags, lowercased names, squashed embedded
// structs, "-" skipped), keeping only the fields structFields keeps.
func refFields(t reflect.Type) []refField {
	keep, _ := structFields(t)
	var out []refField
	var walk func(t reflect.Type, index []int)
	walk = func(t reflect.Type, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			idx := append(append([]int(nil), index...), i)
			name, opts, _ := strings.Cut(f.Tag.Get("koanf"), ",")
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if name != "-" && f.Anonymous && ft.Kind() == reflect.Struct && (name == "" || strings.Contains(","+opts+",", ",squash,")) {
				if f.Type.Kind() == reflect.Pointer {
					continue // keep the walk on values; no such field in the configs
				}
				walk(ft, idx)
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			if k, ok := keep[name]; ok && fmt.Sprint(k) == fmt.Sprint(idx) {
				out = append(out, refField{key: name, index: idx, decl: t})
			}
		}
	}
	walk(t, nil)
	return out
}
