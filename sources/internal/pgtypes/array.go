package pgtypes

import "fmt"

// maxDims is PostgreSQL's limit on array dimensions (MAXDIM).
const maxDims = 6

// parseArray parses an array literal as array_out writes it and array_in
// reads it:
//
//	{1,2,NULL}                  elements separated by delim; unquoted NULL is nil
//	{"a b","NULL","x\"y"}       double quotes, with backslash escaping any byte
//	{{1,2},{3,4}}               nested braces for more dimensions
//	[0:1]={1,2}                 dimension decorations, dropped
//
// Whitespace around elements and braces is ignored, as array_in does; inside
// an unquoted element it is kept, and a backslash escapes the next byte. Each
// element's bytes, unescaped, go to elem, which must not keep them. The
// result is []any, with nested []any for each further dimension; "{}" gives
// an empty, non-nil slice.
func parseArray(b []byte, delim byte, elem func([]byte) (any, error)) ([]any, error) {
	p := arrayParser{b: b, delim: delim, elem: elem}
	p.skipSpace()
	if p.i < len(b) && b[p.i] == '[' {
		if err := p.dims(); err != nil {
			return nil, err
		}
	}
	if p.i >= len(b) || b[p.i] != '{' {
		return nil, p.errorf("expected '{'")
	}
	v, err := p.level(1)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.i != len(b) {
		return nil, p.errorf("junk after closing '}'")
	}
	return v, nil
}

type arrayParser struct {
	b       []byte
	i       int
	delim   byte
	elem    func([]byte) (any, error)
	scratch []byte
}

func (p *arrayParser) errorf(format string, args ...any) error {
	return fmt.Errorf("malformed array literal at byte %d: %s", p.i, fmt.Sprintf(format, args...))
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

func (p *arrayParser) skipSpace() {
	for p.i < len(p.b) && isSpace(p.b[p.i]) {
		p.i++
	}
}

// dims skips "[lb:ub]..." or "[ub]..." up to and including '='. Bounds are
// checked for form only: the result does not keep them.
func (p *arrayParser) dims() error {
	n := 0
	for p.i < len(p.b) && p.b[p.i] == '[' {
		if n++; n > maxDims {
			return p.errorf("more than %d dimensions", maxDims)
		}
		p.i++
		if !p.bound() {
			return p.errorf("invalid dimension bound")
		}
		if p.i < len(p.b) && p.b[p.i] == ':' {
			p.i++
			if !p.bound() {
				return p.errorf("invalid dimension bound")
			}
		}
		if p.i >= len(p.b) || p.b[p.i] != ']' {
			return p.errorf("expected ']'")
		}
		p.i++
	}
	p.skipSpace()
	if p.i >= len(p.b) || p.b[p.i] != '=' {
		return p.errorf("expected '=' after dimensions")
	}
	p.i++
	p.skipSpace()
	return nil
}

func (p *arrayParser) bound() bool {
	if p.i < len(p.b) && (p.b[p.i] == '-' || p.b[p.i] == '+') {
		p.i++
	}
	start := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	return p.i > start
}

// level parses one brace-enclosed level starting at '{'.
func (p *arrayParser) level(depth int) ([]any, error) {
	if depth > maxDims {
		return nil, p.errorf("more than %d dimensions", maxDims)
	}
	p.i++ // '{'
	out := []any{}
	p.skipSpace()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return out, nil
	}
	nested := false
	for {
		p.skipSpace()
		if p.i >= len(p.b) {
			return nil, p.errorf("unexpected end")
		}
		var v any
		var err error
		if p.b[p.i] == '{' {
			if len(out) > 0 && !nested {
				return nil, p.errorf("mixed elements and sub-arrays")
			}
			nested = true
			v, err = p.level(depth + 1)
		} else {
			if nested {
				return nil, p.errorf("mixed elements and sub-arrays")
			}
			v, err = p.element()
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		p.skipSpace()
		if p.i >= len(p.b) {
			return nil, p.errorf("unexpected end")
		}
		switch p.b[p.i] {
		case p.delim:
			p.i++
		case '}':
			p.i++
			return out, nil
		default:
			return nil, p.errorf("unexpected %q", p.b[p.i])
		}
	}
}

// element parses one quoted or unquoted element and decodes it.
func (p *arrayParser) element() (any, error) {
	if p.b[p.i] == '"' {
		p.i++
		buf := p.scratch[:0]
		for {
			if p.i >= len(p.b) {
				return nil, p.errorf("unterminated quoted element")
			}
			c := p.b[p.i]
			if c == '"' {
				p.i++
				break
			}
			if c == '\\' {
				p.i++
				if p.i >= len(p.b) {
					return nil, p.errorf("unterminated quoted element")
				}
				c = p.b[p.i]
			}
			buf = append(buf, c)
			p.i++
		}
		p.scratch = buf
		return p.elem(buf)
	}
	// Unquoted: up to delim or '}', trailing unescaped whitespace trimmed.
	start := p.i
	escaped := false
	keep := 0 // length of buf up to the last byte that is not trailing space
	buf := p.scratch[:0]
	for p.i < len(p.b) {
		c := p.b[p.i]
		if c == p.delim || c == '}' {
			break
		}
		switch c {
		case '{', '"':
			return nil, p.errorf("unexpected %q in unquoted element", c)
		case '\\':
			escaped = true
			p.i++
			if p.i >= len(p.b) {
				return nil, p.errorf("unexpected end after '\\'")
			}
			buf = append(buf, p.b[p.i])
			keep = len(buf)
			p.i++
			continue
		}
		buf = append(buf, c)
		if !isSpace(c) {
			keep = len(buf)
		}
		p.i++
	}
	buf = buf[:keep]
	p.scratch = buf
	if len(buf) == 0 {
		p.i = start
		return nil, p.errorf("empty unquoted element")
	}
	if !escaped && len(buf) == 4 && (buf[0]|0x20) == 'n' && (buf[1]|0x20) == 'u' && (buf[2]|0x20) == 'l' && (buf[3]|0x20) == 'l' {
		return nil, nil
	}
	return p.elem(buf)
}
