package config

import (
	"fmt"
	"slices"
	"strings"
)

// origin records where the values of a loaded Config came from, so that
// problems found later (by a plugin's Decoder, by the runtime) can be
// reported in the order of the file and name the variable that set a key.
type origin struct {
	// lines maps the YAML path of each key (and list item) written in the
	// file to its line.
	lines map[string]int
	// env maps the path each BRIDGE_* variable set to the variable.
	env map[string]string
	// overridden holds the paths WithOverrides set (command-line flags).
	overridden map[string]bool
	// hints maps a variable to the name it probably meant (a `__` where it
	// has `_`), for keys that exist under that name only.
	hints map[string]string
	// ignored lists the BRIDGE_* variables that name no key and were
	// ignored (see Load), sorted.
	ignored []string
}

// IgnoredEnv returns the names of the BRIDGE_* variables Load ignored
// because they name no key of bridge.yaml and are not one typo away from
// one (such as the BRIDGE_SERVICE_HOST and BRIDGE_PORT_8080_TCP variables
// Kubernetes sets for a Service named bridge), sorted. Never their values,
// which may be secrets. Nil for a Config not made by Load.
func (c *Config) IgnoredEnv() []string {
	if c == nil || c.origin == nil {
		return nil
	}
	return slices.Clone(c.origin.ignored)
}

// Problems merges the problems of a configuration into one Errors, in the
// order a reader of the file needs them, and returns nil when there are
// none. errs are, typically, what Load returned and then what the runtime's
// checks of the same Config returned (plugin blocks decoded through
// Config.Decoder, routes, formats).
//
//   - Each error is flattened: an Errors or errors.Join yields its parts, a
//     *FieldError is kept (copied), and any other error becomes one
//     problem per line of its text, without a path.
//   - A problem of a later argument at a YAML path that a problem of an
//     earlier argument already names is dropped, as is a line printed
//     already: the runtime often finds again what Load reported.
//   - A problem at a key a BRIDGE_* variable set names the variable.
//   - The order is the file's: by the line of the key (or of its nearest
//     ancestor written in the file); then the problems at keys that come
//     from BRIDGE_* variables, from overrides (flags) or from no layer at
//     all (a required key left out), by path. A problem that follows from another (a route naming a
//     sink when sinks could not be decoded) comes right after it.
//
// c may be nil (no file was read): the order is then by path.
func (c *Config) Problems(errs ...error) error {
	var o *origin
	if c != nil {
		o = c.origin
	}
	var out Errors
	paths, lines := map[string]bool{}, map[string]bool{}
	for _, err := range errs {
		var group Errors
		for _, e := range flatten(err) {
			if (e.Path != "" && paths[e.Path]) || lines[e.Error()] {
				continue
			}
			group = append(group, e)
		}
		for _, e := range group {
			paths[e.Path], lines[e.Error()] = true, true
		}
		out = append(out, group...)
	}
	o.blame(out)
	o.order(out)
	if len(out) == 0 {
		return nil
	}
	return out
}

// flatten returns err's problems as copies (see Config.Problems): those of
// prefixed, with a multi-line problem without a path split into one per line.
func flatten(err error) Errors {
	var out Errors
	for _, e := range prefixed("", err) {
		if e.Path != "" || !strings.Contains(e.Msg, "\n") {
			out = append(out, e)
			continue
		}
		for _, line := range strings.Split(e.Msg, "\n") {
			if line = strings.TrimSpace(line); line != "" {
				out = append(out, &FieldError{Msg: line})
			}
		}
	}
	return out
}

// envMarker starts the note blame adds to a message.
const envMarker = " (set by environment variable"

// blame adds to each problem at a key set by a BRIDGE_* variable (the key
// itself, a key above it, or keys below it) the variable's name, and the
// name it probably meant when it has one, unless the message names one
// already. o may be nil.
func (o *origin) blame(es Errors) {
	if o == nil || len(o.env) == 0 {
		return
	}
	for _, e := range es {
		if strings.Contains(e.Msg, envMarker) {
			continue
		}
		vars := o.varsAt(e.Path)
		if len(vars) == 0 {
			continue
		}
		note := envMarker + " " + vars[0]
		if len(vars) > 1 {
			note = envMarker + "s " + strings.Join(vars, ", ")
		}
		for _, v := range vars {
			if h := o.hints[v]; h != "" {
				note += fmt.Sprintf("; did you mean %s?", h)
			}
		}
		e.Msg += note + ")"
	}
}

// varsAt returns the variable that set path or a key above it, or else the
// variables that set keys below path, sorted; none for the root.
func (o *origin) varsAt(path string) []string {
	if path == "" {
		return nil
	}
	for p := path; p != ""; p = parentPath(p) {
		if v, ok := o.env[p]; ok {
			return []string{v}
		}
	}
	var vars []string
	for key, v := range o.env {
		if strings.HasPrefix(key, path+".") || strings.HasPrefix(key, path+"[") {
			vars = append(vars, v)
		}
	}
	slices.Sort(vars)
	return slices.Compact(vars)
}

// notFromFile reports whether a BRIDGE_* variable or an override set path
// or a key above it.
func (o *origin) notFromFile(path string) bool {
	if o == nil {
		return false
	}
	for p := path; p != ""; p = parentPath(p) {
		if _, ok := o.env[p]; ok || o.overridden[p] {
			return true
		}
	}
	return false
}

// line returns the line of the key at path in the file, or of its nearest
// ancestor written there; false when neither is (the key comes from another
// layer, or from none).
func (o *origin) line(path string) (int, bool) {
	if o == nil {
		return 0, false
	}
	for p := path; p != ""; p = parentPath(p) {
		if n, ok := o.lines[p]; ok {
			return n, true
		}
	}
	return 0, false
}

// order sorts es in the order of Config.Problems, stably. o may be nil: the
// order is then by path, as Errors.sort.
func (o *origin) order(es Errors) {
	type key struct {
		late bool // not from the file: after the file's problems
		line int
	}
	keyOf := func(e *FieldError) key {
		if o.notFromFile(e.Path) {
			return key{late: true}
		}
		if n, ok := o.line(e.Path); ok {
			return key{line: n}
		}
		return key{late: true}
	}
	slices.SortStableFunc(es, func(a, b *FieldError) int {
		ka, kb := keyOf(a), keyOf(b)
		switch {
		case ka.late != kb.late:
			if ka.late {
				return 1
			}
			return -1
		case ka.line != kb.line:
			return ka.line - kb.line
		}
		return comparePaths(a.Path, b.Path)
	})
	// Consequences go right after the last problem at or below their cause.
	var rest, follow Errors
	for _, e := range es {
		if e.cause != "" && slices.ContainsFunc(es, func(c *FieldError) bool { return c.cause == "" && under(c.Path, e.cause) }) {
			follow = append(follow, e)
		} else {
			rest = append(rest, e)
		}
	}
	for _, e := range follow {
		at := 0
		for i, c := range rest {
			if under(c.Path, e.cause) || c.cause == e.cause {
				at = i + 1
			}
		}
		rest = slices.Insert(rest, at, e)
	}
	copy(es, rest)
}

// under reports whether path is root or a path below it.
func under(path, root string) bool {
	return path == root || strings.HasPrefix(path, root+".") || strings.HasPrefix(path, root+"[")
}

// parentPath returns the path one level up from p: "routes[0]" for
// "routes[0].sinks", "routes" for "routes[0]", "" for "routes".
func parentPath(p string) string {
	if strings.HasSuffix(p, "]") {
		if i := strings.LastIndexByte(p, '['); i >= 0 {
			return p[:i]
		}
	}
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[:i]
	}
	return ""
}
