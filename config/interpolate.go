package config

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxFileRef is the largest file a ${file:PATH} reference reads: secrets are
// small, and a reference to the wrong file (a log, a device) must not fill
// the memory.
const maxFileRef = 1 << 20

// resolver resolves the references expand finds.
type resolver struct {
	// env reports a variable's value and whether it is set.
	env func(name string) (string, bool)
	// file returns the content of the file at path, or an error naming the
	// file and never the content.
	file func(path string) (string, error)
	// refuse, when set, is asked about every reference before it is
	// resolved, used or not (in a default that is not taken, say): the
	// variable name, or file true for a ${file:...}. An error refuses it,
	// and is expand's error. A document from NATS uses it (loader.docResolver).
	refuse func(name string, file bool) error
}

// unsetError reports a ${NAME} reference to an unset variable without a
// default.
type unsetError struct{ name string }

func (e *unsetError) Error() string {
	return fmt.Sprintf("environment variable %s is not set (use ${%s:-default} for a default)", e.name, e.name)
}

// readFileRef reads the file of a ${file:PATH} reference: its content with
// trailing newlines removed (a secret file written by echo, Docker or
// Kubernetes often ends with one). Errors name the file and say what to do;
// they never hold the content.
func readFileRef(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fileRefError(path, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		return "", fmt.Errorf("file %s (${file:...}) is a directory: name the file inside it", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFileRef+1))
	if err != nil {
		return "", fileRefError(path, err)
	}
	if len(b) > maxFileRef {
		return "", fmt.Errorf("file %s (${file:...}) is larger than 1 MiB: ${file:...} reads secrets, check the path", path)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// fileRefError explains why the file of a ${file:PATH} reference could not
// be read.
func fileRefError(path string, err error) error {
	// The *PathError repeats the path; keep only its cause.
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("file %s (${file:...}) does not exist: mount the secret there, or correct the path", path)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("file %s (${file:...}) cannot be read by the bridge (uid %d): %v; make it readable (in Kubernetes: the volume's defaultMode or the pod's fsGroup)", path, os.Getuid(), err)
	default:
		return fmt.Errorf("file %s (${file:...}) cannot be read: %v", path, err)
	}
}

// expand interpolates s:
//
//   - ${NAME} becomes the value of the variable NAME (which may be empty); it
//     is an error if NAME is not set;
//   - ${NAME:-default} becomes the value of NAME, or default when NAME is
//     unset or empty; default may itself contain references, which are
//     resolved only when the default is used;
//   - ${file:PATH} becomes the content of the file at PATH, trailing
//     newlines removed; it is an error if the file cannot be read. PATH runs
//     to the closing brace and may itself contain references (
//     ${file:${SECRETS:-/run/secrets}/pw}); a file's content is used as it
//     is, never expanded;
//   - $$ becomes a literal $;
//   - any other $ is an error, so that a forgotten brace ($NAME) is not
//     silently kept.
//
// NAME is a letter or underscore followed by letters, digits and underscores
// (a variable named file is still read by ${file} and ${file:-default}).
// substituted reports whether s held at least one reference. Errors never
// quote s, a variable's value or a file's content, which may hold a secret.
func expand(s string, r resolver) (out string, substituted bool, err error) {
	out, _, substituted, missing, err := expandFrom(s, 0, false, r)
	if err != nil {
		return "", false, err
	}
	if missing != nil {
		return "", false, missing
	}
	return out, substituted, nil
}

// expandFrom expands s from offset i. In a default or a file's path
// (inner) it stops at the closing brace and returns its offset. Syntax
// errors come back in err; the first reference that cannot be resolved (an
// unset variable, a file that cannot be read) in missing, so that a caller
// can ignore it when the default holding it is not used. A file is read only
// when its reference is used.
func expandFrom(s string, i int, inner bool, r resolver) (out string, end int, substituted bool, missing error, err error) {
	var b strings.Builder
	for i < len(s) {
		c := s[i]
		if c == '}' && inner {
			return b.String(), i, substituted, missing, nil
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
			if err := r.check(name, false); err != nil {
				return "", 0, false, nil, err
			}
			v, ok := r.env(name)
			if !ok && missing == nil {
				missing = &unsetError{name: name}
			}
			b.WriteString(v)
			i = j + 1
		case strings.HasPrefix(s[j:], ":-"):
			if err := r.check(name, false); err != nil {
				return "", 0, false, nil, err
			}
			v, ok := r.env(name)
			use := !ok || v == ""
			dr := r
			if !use { // parse the default for its syntax, but read no file
				dr.file = func(string) (string, error) { return "", nil }
			}
			def, k, _, defMissing, err := expandFrom(s, j+2, true, dr)
			if err != nil {
				return "", 0, false, nil, err
			}
			if k >= len(s) {
				return "", 0, false, nil, fmt.Errorf("unterminated ${%s:- at offset %d", name, start)
			}
			if use {
				v = def
				if missing == nil {
					missing = defMissing
				}
			}
			b.WriteString(v)
			i = k + 1
		case name == "file" && s[j] == ':':
			if err := r.check("", true); err != nil {
				return "", 0, false, nil, err
			}
			path, k, _, pathMissing, err := expandFrom(s, j+1, true, r)
			if err != nil {
				return "", 0, false, nil, err
			}
			if k >= len(s) {
				return "", 0, false, nil, fmt.Errorf("unterminated ${file: at offset %d", start)
			}
			switch {
			case pathMissing != nil:
				if missing == nil {
					missing = pathMissing
				}
			case path == "":
				return "", 0, false, nil, fmt.Errorf("invalid reference ${file:} at offset %d: name the file, e.g. ${file:/run/secrets/pg_password}", start)
			default:
				v, err := r.file(path)
				if err != nil && missing == nil {
					missing = err
				}
				b.WriteString(v)
			}
			i = k + 1
		default:
			return "", 0, false, nil, fmt.Errorf("invalid reference ${%s at offset %d: only ${NAME}, ${NAME:-default} and ${file:PATH} are supported", name, start)
		}
		substituted = true
	}
	if inner {
		return "", len(s), false, nil, nil // the caller reports the missing brace
	}
	return b.String(), i, substituted, missing, nil
}

// check returns r.refuse's verdict on a reference, nil without refuse.
func (r resolver) check(name string, file bool) error {
	if r.refuse == nil {
		return nil
	}
	return r.refuse(name, file)
}

// isVarName reports whether s is a variable name as ${NAME} reads it.
func isVarName(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isNameByte(s[i], i == 0) {
			return false
		}
	}
	return s != ""
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
