package config

import (
	"fmt"
	"strings"
)

// FieldError is one configuration problem at a YAML path such as
// "sinks.main.batch.max_wait" or "routes[0].match.tables[1]". Match it with
// errors.As; it never wraps another error.
type FieldError struct {
	// Path is the dotted YAML path of the offending key, with list indexes in
	// brackets. A plugin's Validate uses paths relative to its own block; the
	// Decoder prefixes them with the block's path.
	Path string
	// Msg says what is wrong. It never contains a secret value.
	Msg string

	// cause is the path of the problem this one follows from, if any (a
	// route naming a sink when the sinks could not be decoded): Problems
	// prints it right after that one.
	cause string
}

// Error returns "path: msg", or just msg when Path is empty.
func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Field returns a *FieldError for path, relative to the block being
// validated, with the message fmt.Sprintf(format, args...). Plugins call it
// from Validate, and errors.Join several of them; the Decoder turns each into
// a full YAML path:
//
//	return errors.Join(config.Field("stream", "must be set"),
//		config.Field("ack_wait", "must be > 0, got %s", c.AckWait))
func Field(path, format string, args ...any) error {
	return &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)}
}

// Errors is every problem found in a configuration. Load, the Decoder of a
// loaded Config and Config.Problems return it in the order of the file (see
// Config.Problems); built without a file, it is sorted by path (list indexes
// in numeric order). Error prints one problem per line, and errors.As
// reaches each *FieldError through Unwrap.
type Errors []*FieldError

// Error returns the problems in their order, one per line.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns each problem, for errors.As and errors.Is.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// err returns es, or nil when es is empty (never a nil Errors inside a
// non-nil error interface).
func (es Errors) err() error {
	if len(es) == 0 {
		return nil
	}
	return es
}

// add appends a *FieldError for path.
func (es *Errors) add(path, format string, args ...any) {
	*es = append(*es, &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// covers reports whether a problem is already recorded at path or at one of
// its ancestors, so that a later check does not report the same key twice
// (a bad duration is not also "must be > 0").
func (es Errors) covers(path string) bool {
	for _, e := range es {
		if e.Path == path || strings.HasPrefix(path, e.Path+".") || strings.HasPrefix(path, e.Path+"[") {
			return true
		}
	}
	return false
}

// prefixed flattens err into FieldErrors whose paths are joined onto base:
// a *FieldError gets base prepended to its relative path, errors with
// Unwrap() []error (errors.Join, Errors) are flattened, and any other error
// becomes a FieldError at base carrying its message.
func prefixed(base string, err error) Errors {
	switch e := err.(type) {
	case nil:
		return nil
	case *FieldError:
		if e == nil {
			return nil
		}
		return Errors{{Path: joinPath(base, e.Path), Msg: e.Msg, cause: e.cause}}
	case interface{ Unwrap() []error }:
		var out Errors
		for _, sub := range e.Unwrap() {
			out = append(out, prefixed(base, sub)...)
		}
		return out
	default:
		return Errors{{Path: base, Msg: err.Error()}}
	}
}

// joinPath appends rel (a key, "[i]", or a dotted path) to the YAML path base.
func joinPath(base, rel string) string {
	switch {
	case base == "":
		return rel
	case rel == "":
		return base
	case strings.HasPrefix(rel, "["):
		return base + rel
	default:
		return base + "." + rel
	}
}

// indexPath returns base with the list index i appended: "routes[2]".
func indexPath(base string, i int) string {
	return fmt.Sprintf("%s[%d]", base, i)
}

// comparePaths orders YAML paths bytewise, except that runs of digits compare
// as numbers, so "routes[2]" sorts before "routes[10]".
func comparePaths(a, b string) int {
	for a != "" && b != "" {
		if isDigit(a[0]) && isDigit(b[0]) {
			da, db := digitRun(a), digitRun(b)
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if c := len(na) - len(nb); c != 0 {
				return c
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return int(a[0]) - int(b[0])
		}
		a, b = a[1:], b[1:]
	}
	return len(a) - len(b)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func digitRun(s string) int {
	n := 0
	for n < len(s) && isDigit(s[n]) {
		n++
	}
	return n
}
