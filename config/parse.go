package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// SyntaxError is a problem in the text of the config file, found before any
// key is read: YAML that does not parse, a key written twice, a file that is
// not a mapping. Load returns every one it finds, joined (errors.As reaches
// each); no Config comes with them.
type SyntaxError struct {
	// File is the path of the config file, as given to Load.
	File string
	// Line is the 1-based line of the problem; 0 when the parser does not
	// say.
	Line int
	// Msg says what is wrong and, where the cause is known, what to do.
	Msg string
}

// Error returns "file:line: msg", or "file: msg" without a line.
func (e *SyntaxError) Error() string {
	if e.Line == 0 {
		return e.File + ": " + e.Msg
	}
	return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
}

// parseFile parses the YAML text b of the config file at file into a tree
// of maps, lists and scalars, as yaml.Unmarshal into a map[string]any does,
// and maps the YAML path of every key and list item to its line. An empty
// file yields an empty map. Problems come back as *SyntaxError, joined.
func parseFile(file string, b []byte) (map[string]any, map[string]int, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return map[string]any{}, map[string]int{}, nil
		}
		return nil, nil, syntaxErrors(file, b, err)
	}
	var more yaml.Node
	switch err := dec.Decode(&more); {
	case err == nil && !emptyDocument(&more):
		return nil, nil, &SyntaxError{File: file, Line: documentLine(b, &more),
			Msg: "a second YAML document (after ---): the bridge reads one document per file; remove the --- and merge the two"}
	case err != nil && !errors.Is(err, io.EOF):
		return nil, nil, syntaxErrors(file, b, err)
	}
	if emptyDocument(&doc) {
		return map[string]any{}, map[string]int{}, nil // only comments, or ~
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, nil, &SyntaxError{File: file, Line: root.Line,
			Msg: fmt.Sprintf("the file must be a mapping of keys (name:, sources:, sinks:, ...), not %s", nodeKind(root))}
	}
	w := lineWalker{file: file, lines: map[string]int{}}
	w.walk("", root)
	if len(w.errs) > 0 {
		return nil, nil, errors.Join(w.errs...)
	}
	var m map[string]any
	if err := root.Decode(&m); err != nil {
		return nil, nil, syntaxErrors(file, b, err)
	}
	if m == nil {
		m = map[string]any{}
	}
	return m, w.lines, nil
}

// emptyDocument reports whether the document node doc holds nothing but
// comments, or a null.
func emptyDocument(doc *yaml.Node) bool {
	if len(doc.Content) == 0 {
		return true
	}
	n := doc.Content[0]
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// lineWalker records the line of every key and list item of a document,
// and the keys written twice in one mapping and the keys that are not
// scalars, which a map cannot hold.
type lineWalker struct {
	file  string
	lines map[string]int
	errs  []error
}

func (w *lineWalker) walk(path string, n *yaml.Node) {
	switch n.Kind {
	case yaml.MappingNode:
		first := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				w.errs = append(w.errs, &SyntaxError{File: w.file, Line: k.Line,
					Msg: fmt.Sprintf("a key must be a name, not %s (under %s)", nodeKind(k), pathOrTop(path))})
				continue
			}
			if k.Tag == "!!merge" { // <<: *anchor merges the anchor's keys here
				continue
			}
			name := k.Value
			if k.ShortTag() == "!!null" && k.Style == 0 {
				name = "null"
			}
			p := joinPath(path, name)
			if line, dup := first[name]; dup {
				w.errs = append(w.errs, &SyntaxError{File: w.file, Line: k.Line,
					Msg: fmt.Sprintf("key %q appears twice (first at line %d)", p, line)})
				continue
			}
			first[name] = k.Line
			w.lines[p] = k.Line
			w.walk(p, v)
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			p := indexPath(path, i)
			w.lines[p] = item.Line
			w.walk(p, item)
		}
	}
}

func pathOrTop(path string) string {
	if path == "" {
		return "the top level"
	}
	return path
}

// nodeKind names the YAML kind of n for messages.
func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	if n.ShortTag() == "!!str" {
		return "a string"
	}
	return "a " + strings.TrimPrefix(n.ShortTag(), "!!") + " value"
}

// documentLine returns the line of the --- that starts document n, or n's
// own line.
func documentLine(b []byte, n *yaml.Node) int {
	line := n.Line
	if len(n.Content) > 0 {
		line = n.Content[0].Line
	}
	lines := strings.Split(string(b), "\n")
	for i := min(line, len(lines)) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "---") {
			return i + 1
		}
	}
	return line
}

// yamlLineRE splits a yaml.v3 message into its line and its problem.
var yamlLineRE = regexp.MustCompile(`^(?:yaml: )?(?:line (\d+): )?(.*)$`)

// maxScanLines bounds the files whose parse errors are located by parsing
// their first lines (see problemLine).
const maxScanLines = 2000

// syntaxErrors turns an error of yaml.v3 into *SyntaxErrors at the line of
// the problem, with a message that says what is wrong in the terms of the
// file.
func syntaxErrors(file string, b []byte, err error) error {
	var te *yaml.TypeError
	var problems []string
	if errors.As(err, &te) {
		problems = te.Errors
	} else {
		problems = []string{err.Error()}
	}
	text := strings.Split(string(b), "\n")
	var out []error
	for _, p := range problems {
		m := yamlLineRE.FindStringSubmatch(strings.TrimSpace(p))
		line, _ := strconv.Atoi(m[1])
		msg := m[2]
		if te == nil {
			if l := problemLine(b, msg); l > 0 {
				line = l
			}
		}
		var src string
		if line > 0 && line <= len(text) {
			src = text[line-1]
		}
		out = append(out, &SyntaxError{File: file, Line: line, Msg: explainYAML(msg, src)})
	}
	return errors.Join(out...)
}

// problemLine returns the first line n such that the file's first n lines
// fail to parse with the same problem msg, or 0. yaml.v3 often reports the
// line where the enclosing mapping starts, not the line at fault.
func problemLine(b []byte, msg string) int {
	lines := strings.SplitAfter(string(b), "\n")
	if len(lines) > maxScanLines {
		return 0
	}
	var prefix strings.Builder
	for i, l := range lines {
		prefix.WriteString(l)
		var n yaml.Node
		err := yaml.Unmarshal([]byte(prefix.String()), &n)
		if err == nil {
			continue
		}
		if m := yamlLineRE.FindStringSubmatch(err.Error()); m[2] == msg {
			return i + 1
		}
	}
	return 0
}

// explainYAML rewrites a yaml.v3 problem found on the line src into what to
// change in the file.
func explainYAML(msg, src string) string {
	indent := src[:len(src)-len(strings.TrimLeft(src, " \t"))]
	switch {
	case strings.Contains(indent, "\t") || strings.Contains(msg, "tab character"):
		return "a tab character: YAML indents with spaces only"
	case msg == "found character that cannot start any token":
		return "a value starts with a character YAML reserves (such as @ or `): put the value in quotes"
	case msg == "mapping values are not allowed in this context":
		return `unexpected ":" here: put a value that contains ": " in quotes, or indent this key like the keys beside it`
	case msg == "did not find expected key":
		return "this line does not fit the mapping it is in: indent it like the keys beside it, and check that quotes are closed"
	case msg == "did not find expected '-' indicator":
		return "this line does not fit the list it is in: indent every item's - like the first one's"
	case msg == "could not find expected ':'":
		return `a key without ":" (or a value running on past its line): write "key: value", and quote values that span lines`
	case msg == "found unexpected end of stream":
		return "the file ends inside a quoted value or a [...] or {...}: close it"
	case strings.HasPrefix(msg, "did not find expected ',' or"):
		return msg + ": a [...] or {...} is not closed, or an item in it needs quotes"
	}
	return msg
}
