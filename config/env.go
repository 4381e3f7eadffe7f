package config

import (
	"math/bits"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// configType is the type bridge.yaml decodes into.
var configType = reflect.TypeFor[Config]()

// maxHintUnderscores bounds the single underscores underscoreHint tries to
// turn into level separators (2^n candidates).
const maxHintUnderscores = 12

// envKey is the env provider's TransformFunc: BRIDGE_A__B_C=v becomes the
// key "a.b_c" with v read as a YAML scalar. A variable whose first level is
// no top-level key is ignored (and listed in l.ignored) unless it looks like
// a typo of a key: a single underscore where levels need two, or a first
// level one edit away from a top-level key; those, and names with an empty
// level, are reported and skipped.
func (l *loader) envKey(name, value string) (string, any) {
	rest := strings.TrimPrefix(name, EnvPrefix)
	if rest == "" {
		return "", nil
	}
	lower := strings.ToLower(rest)
	parts := strings.Split(lower, "__")
	fields, top := structFields(configType)
	if _, ok := fields[parts[0]]; !ok {
		switch near := nearKey(parts[0], top); {
		case underscoreHint(lower) != "":
			l.errs.add(name, "names no key of bridge.yaml; did you mean %s? (a double underscore separates levels)", underscoreHint(lower))
		case near != "":
			parts[0] = near
			l.errs.add(name, "names no key of bridge.yaml; did you mean %s?", envVarName(parts))
		default:
			l.ignored = append(l.ignored, name)
		}
		return "", nil
	}
	if slices.Contains(parts, "") {
		l.errs.add(name, "empty path segment in variable name (separate names with a double underscore: %sSINKS__MAIN__TYPE)", EnvPrefix)
		return "", nil
	}
	if !settable(configType, parts) {
		if hint := underscoreHint(lower); hint != "" {
			l.hints[name] = hint
		}
	}
	key := strings.Join(parts, ".")
	l.fromEnv[key] = name
	return key, l.typed(key, value)
}

// envVarName is the BRIDGE_* variable of the key whose levels are parts.
func envVarName(parts []string) string {
	return EnvPrefix + strings.ToUpper(strings.Join(parts, "__"))
}

// underscoreHint returns the variable that sets a key when some of the
// single underscores of lower (a variable's name after the prefix, lower
// case) are made double, fewest first; "" when none does.
func underscoreHint(lower string) string {
	parts := strings.Split(lower, "__")
	type at struct{ part, i int }
	var ats []at
	for p, s := range parts {
		for i := 1; i < len(s)-1; i++ {
			if s[i] == '_' && s[i-1] != '_' && s[i+1] != '_' {
				ats = append(ats, at{p, i})
			}
		}
	}
	n := len(ats)
	if n == 0 || n > maxHintUnderscores {
		return ""
	}
	for k := 1; k <= n; k++ {
		for mask := uint(1); mask < 1<<n; mask++ {
			if bits.OnesCount(mask) != k {
				continue
			}
			var levels []string
			for p, s := range parts {
				start := 0
				for j, a := range ats {
					if a.part == p && mask&(1<<j) != 0 {
						levels = append(levels, s[start:a.i])
						start = a.i + 1
					}
				}
				levels = append(levels, s[start:])
			}
			if settable(configType, levels) {
				return envVarName(levels)
			}
		}
	}
	return ""
}

// settable reports whether one BRIDGE_* variable can set the key below t
// whose levels are parts: a scalar, a duration, a list of scalars
// (comma-separated), or any key inside a mapping of free keys (a plugin's
// `config:` block, serve.where), whose plugin checks it later.
func settable(t reflect.Type, parts []string) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if len(parts) == 0 {
		return fromOneValue(t)
	}
	switch {
	case t == durationType || isText(t):
		return false
	case t.Kind() == reflect.Struct:
		fields, _ := structFields(t)
		idx, ok := fields[parts[0]]
		if !ok {
			return false
		}
		return settable(fieldType(t, idx), parts[1:])
	case t.Kind() == reflect.Map && t.Key().Kind() == reflect.String:
		if t.Elem().Kind() == reflect.Interface {
			return true
		}
		return parts[0] != "" && settable(t.Elem(), parts[1:])
	}
	return false
}

// fromOneValue reports whether a value of type t can come from one
// variable's text.
func fromOneValue(t reflect.Type) bool {
	switch {
	case t == durationType || isText(t):
		return true
	case t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		return scalarElem(t.Elem())
	}
	return scalarElem(t)
}

// scalarElem reports whether t holds a scalar (not a mapping or a list).
func scalarElem(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == durationType || isText(t) {
		return true
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map, reflect.Slice, reflect.Array:
		return false
	}
	return true
}

// fieldType is the type of the field at index (as structFields returns it)
// of struct type t, through embedded pointers.
func fieldType(t reflect.Type, index []int) reflect.Type {
	for _, i := range index {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		t = t.Field(i).Type
	}
	return t
}

// nearKey returns the key of keys one edit (an insertion, a deletion, a
// substitution or two letters swapped) away from s, or "".
func nearKey(s string, keys []string) string {
	if len(s) < 3 {
		return ""
	}
	for _, k := range keys {
		if oneEdit(s, k) {
			return k
		}
	}
	return ""
}

// oneEdit reports whether a and b differ by exactly one edit.
func oneEdit(a, b string) bool {
	if a == b {
		return false
	}
	if len(a) > len(b) {
		a, b = b, a
	}
	switch len(b) - len(a) {
	case 0:
		i := 0
		for i < len(a) && a[i] == b[i] {
			i++
		}
		if a[i+1:] == b[i+1:] {
			return true // substitution
		}
		return i+1 < len(a) && a[i] == b[i+1] && a[i+1] == b[i] && a[i+2:] == b[i+2:] // swap
	case 1:
		i := 0
		for i < len(a) && a[i] == b[i] {
			i++
		}
		return a[i:] == b[i+1:]
	}
	return false
}

// envList reads the text s of one BRIDGE_* variable set for a list of
// scalars: comma-separated items, each trimmed and read as a YAML scalar, or
// a YAML flow list ([a, "b,c"]) when an item must hold a comma. An empty
// text is an empty list. texts receives the original text of the items
// read as numbers or booleans, by path (see Config.texts).
func envList(path, s string, texts map[string]string) ([]any, string) {
	s = strings.TrimSpace(s)
	if s == "" {
		return []any{}, ""
	}
	var items []any
	if strings.HasPrefix(s, "[") {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(s), &doc); err != nil || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.SequenceNode {
			return nil, `starts with "[" but is not a YAML flow list such as [public.a, "x,y"]`
		}
		for i, n := range doc.Content[0].Content {
			if n.Kind != yaml.ScalarNode {
				return nil, "item " + strconv.Itoa(i+1) + " is not a plain value: only lists of plain values can be set from the environment"
			}
			if n.Style != 0 { // quoted: a string as written
				items = append(items, n.Value)
				continue
			}
			items = append(items, envItem(indexPath(path, i), n.Value, texts))
		}
		return items, ""
	}
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, "item " + strconv.Itoa(i+1) + " is empty (a stray comma?)"
		}
		items = append(items, envItem(indexPath(path, i), item, texts))
	}
	return items, ""
}

// envItem reads one item of a list from the environment as a YAML scalar,
// keeping the text of a number or boolean in texts.
func envItem(path, s string, texts map[string]string) any {
	v := scalar(s)
	if _, ok := v.(string); !ok {
		texts[path] = s
	}
	return v
}
