package config

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// unsetError reports a ${NAME} reference to an unset variable without a
// default.
type unsetError struct{ name string }

func (e *unsetError) Error() string {
	return fmt.Sprintf("environment variable %s is not set (use ${%s:-default} for a default)", e.name, e.name)
}

// expand interpolates s:
//
//   - ${NAME} becomes the value of the variable NAME (which may be empty); it
//     is an error if NAME is not set;
//   - ${NAME:-default} becomes the value of NAME, or default when NAME is
//     unset or empty; default may itself contain references, which are
//     resolved only when the default is used;
//   - $$ becomes a literal $;
//   - any other $ is an error, so that a forgotten brace ($NAME) is not
//     silently kept.
//
// NAME is a letter or underscore followed by letters, digits and underscores.
// lookup reports a variable's value and whether it is set. substituted
// reports whether s held at least one reference. Errors never quote s, which
// may hold a secret.
func expand(s string, lookup func(string) (string, bool)) (out string, substituted bool, err error) {
	out, _, substituted, unset, err := expandFrom(s, 0, false, lookup)
	if err != nil {
		return "", false, err
	}
	if unset != nil {
		return "", false, unset
	}
	return out, substituted, nil
}

// expandFrom expands s from offset i. In a default (inDefault) it stops at the
// closing brace and returns its offset. Syntax errors come back in err; the
// first reference to an unset variable in unset, so that a caller can ignore
// it when the default holding it is not used.
func expandFrom(s string, i int, inDefault bool, lookup func(string) (string, bool)) (out string, end int, substituted bool, unset *unsetError, err error) {
	var b strings.Builder
	for i < len(s) {
		c := s[i]
		if c == '}' && inDefault {
			return b.String(), i, substituted, unset, nil
		}
		if c != '$' {
			b.WriteByte(c)
			i++
			continue
		}
		if i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i += 2
			continue
		}
		if i+1 >= len(s) || s[i+1] != '{' {
			return "", 0, false, nil, fmt.Errorf("bare $ at offset %d (write $$ for a literal $, or ${NAME} to expand a variable)", i)
		}
		start := i
		j := i + 2
		for j < len(s) && isNameByte(s[j], j == i+2) {
			j++
		}
		name := s[i+2 : j]
		switch {
		case name == "":
			return "", 0, false, nil, fmt.Errorf("invalid reference at offset %d: ${ must be followed by a variable name", start)
		case j >= len(s):
			return "", 0, false, nil, fmt.Errorf("unterminated ${%s at offset %d", name, start)
		case s[j] == '}':
			v, ok := lookup(name)
			if !ok && unset == nil {
				unset = &unsetError{name: name}
			}
			b.WriteString(v)
			i = j + 1
		case strings.HasPrefix(s[j:], ":-"):
			def, k, _, defUnset, err := expandFrom(s, j+2, true, lookup)
			if err != nil {
				return "", 0, false, nil, err
			}
			if k >= len(s) {
				return "", 0, false, nil, fmt.Errorf("unterminated ${%s:- at offset %d", name, start)
			}
			v, ok := lookup(name)
			if !ok || v == "" {
				v = def
				if unset == nil {
					unset = defUnset
				}
			}
			b.WriteString(v)
			i = k + 1
		default:
			return "", 0, false, nil, fmt.Errorf("invalid reference ${%s at offset %d: only ${NAME} and ${NAME:-default} are supported", name, start)
		}
		substituted = true
	}
	if inDefault {
		return "", len(s), false, nil, nil // the caller reports the missing brace
	}
	return b.String(), i, substituted, unset, nil
}

// isNameByte reports whether c may appear in a variable name; digits may not
// start one.
func isNameByte(c byte, first bool) bool {
	return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || !first && isDigit(c)
}

// scalar reads s as a plain YAML scalar, as a value in bridge.yaml would be
// read: an int, float or bool when s is exactly one ("500", "1.5", "true"),
// otherwise s itself. It never yields null, a list or a mapping, and never
// drops part of s (a comment, surrounding spaces or quotes keep s a string).
func scalar(s string) any {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(s), &doc); err != nil || len(doc.Content) != 1 {
		return s
	}
	n := doc.Content[0]
	if n.Kind != yaml.ScalarNode || n.Style != 0 || n.Value != s {
		return s
	}
	switch n.ShortTag() {
	case "!!int", "!!float", "!!bool":
		var v any
		if err := n.Decode(&v); err == nil {
			return v
		}
	}
	return s
}
