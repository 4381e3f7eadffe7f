package sources

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

// Cond is one condition of a snapshot's where (SnapshotTable.Where): the
// rows whose Column compares to the literal Values by Op. A source turns
// it into a query with the column quoted as an identifier and each value
// bound as a parameter of the column's type: a where is never SQL text.
type Cond struct {
	// Column is a column of the table, as named in the catalog.
	Column string
	// Op is one of =, <>, <, <=, >, >=, "in", "is null", "is not null".
	Op string
	// Values are the literals, as text in the column type's input form:
	// one for a comparison, one or more for in, none for is (not) null.
	Values []string
}

// WhereChecker is implemented by Snapshotters that can read a snapshot of
// only the rows matching a where (ReadChunk honours SnapshotTable.Where).
type WhereChecker interface {
	// CheckWhere checks t.Where against table t as it is now: every column
	// exists and every literal converts to its column's type. The error
	// names the table, the column and the value.
	CheckWhere(ctx context.Context, t SnapshotTable) error
}

// ParseWhere parses a snapshot's where: conditions joined with AND (any
// case), each
//
//	column op literal       op: = <> != < <= > >=
//	column IN (literal, ...)
//	column IS NULL | column IS NOT NULL
//
// where a column is an identifier ([A-Za-z_][A-Za-z0-9_$]*, matched as
// lowercase as Postgres does) or a "quoted" name, and a literal is a
// 'quoted string' (a quote doubled inside), a number, true or false. Nothing else
// is accepted (no OR, no parentheses but IN's, no functions, no
// subqueries, no comments), so a where can only ever select rows of the
// table it is given for. An empty string is no condition.
func ParseWhere(s string) ([]Cond, error) {
	p := &whereParser{s: s}
	var out []Cond
	p.skip()
	if p.eof() {
		return nil, nil
	}
	for {
		c, err := p.cond()
		if err != nil {
			return nil, fmt.Errorf("where %q: %w", s, err)
		}
		out = append(out, c)
		p.skip()
		if p.eof() {
			return out, nil
		}
		if !p.keyword("and") {
			return nil, fmt.Errorf("where %q: at %q: conditions are joined with AND (OR and parentheses are not accepted)", s, p.rest())
		}
	}
}

// FormatWhere writes conds back in ParseWhere's syntax.
func FormatWhere(conds []Cond) string {
	parts := make([]string, len(conds))
	for i, c := range conds {
		col := c.Column
		if !plainIdent(col) {
			col = `"` + strings.ReplaceAll(col, `"`, `""`) + `"`
		}
		switch c.Op {
		case "is null", "is not null":
			parts[i] = col + " " + strings.ToUpper(c.Op)
		case "in":
			vs := make([]string, len(c.Values))
			for j, v := range c.Values {
				vs[j] = quoteLiteral(v)
			}
			parts[i] = col + " IN (" + strings.Join(vs, ", ") + ")"
		default:
			parts[i] = col + " " + c.Op + " " + quoteLiteral(c.Values[0])
		}
	}
	return strings.Join(parts, " AND ")
}

// quoteLiteral writes v as a literal: bare when it reads back the same (a
// plain number, true, false), else quoted.
func quoteLiteral(v string) string {
	if v == "true" || v == "false" || plainNumber.MatchString(v) {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

var plainNumber = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)

func plainIdent(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r == '_' || (r >= 'a' && r <= 'z') || (i > 0 && (r >= '0' && r <= '9' || r == '$'))) {
			return false
		}
	}
	return true
}

type whereParser struct {
	s   string
	pos int
}

func (p *whereParser) eof() bool { return p.pos >= len(p.s) }

func (p *whereParser) rest() string {
	r := p.s[p.pos:]
	if len(r) > 20 {
		r = r[:20] + "…"
	}
	return r
}

func (p *whereParser) skip() {
	for p.pos < len(p.s) && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t' || p.s[p.pos] == '\n' || p.s[p.pos] == '\r') {
		p.pos++
	}
}

// keyword consumes the word kw (any case) when it comes next as a whole
// word.
func (p *whereParser) keyword(kw string) bool {
	p.skip()
	end := p.pos + len(kw)
	if end > len(p.s) || !strings.EqualFold(p.s[p.pos:end], kw) {
		return false
	}
	if end < len(p.s) {
		c := p.s[end]
		if c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80 {
			return false // a longer word
		}
	}
	p.pos = end
	return true
}

func (p *whereParser) cond() (Cond, error) {
	col, err := p.ident()
	if err != nil {
		return Cond{}, err
	}
	c := Cond{Column: col}
	p.skip()
	switch {
	case p.keyword("is"):
		if p.keyword("not") {
			c.Op = "is not null"
		} else {
			c.Op = "is null"
		}
		if !p.keyword("null") {
			return Cond{}, fmt.Errorf("at %q: IS takes NULL or NOT NULL", p.rest())
		}
		return c, nil
	case p.keyword("in"):
		c.Op = "in"
		p.skip()
		if p.eof() || p.s[p.pos] != '(' {
			return Cond{}, fmt.Errorf("at %q: IN takes a list of literals in parentheses", p.rest())
		}
		p.pos++
		for {
			v, err := p.literal()
			if err != nil {
				return Cond{}, err
			}
			c.Values = append(c.Values, v)
			p.skip()
			if p.eof() {
				return Cond{}, errors.New("IN's list is not closed with )")
			}
			if p.s[p.pos] == ')' {
				p.pos++
				return c, nil
			}
			if p.s[p.pos] != ',' {
				return Cond{}, fmt.Errorf("at %q: IN's literals are separated by commas", p.rest())
			}
			p.pos++
		}
	}
	for _, op := range []string{"<=", ">=", "<>", "!=", "=", "<", ">"} {
		if strings.HasPrefix(p.s[p.pos:], op) {
			p.pos += len(op)
			if op == "!=" {
				op = "<>"
			}
			c.Op = op
			v, err := p.literal()
			if err != nil {
				return Cond{}, err
			}
			c.Values = []string{v}
			return c, nil
		}
	}
	return Cond{}, fmt.Errorf("at %q: after column %s comes =, <>, !=, <, <=, >, >=, IN or IS", p.rest(), col)
}

func (p *whereParser) ident() (string, error) {
	p.skip()
	if p.eof() {
		return "", errors.New("a condition is missing at the end")
	}
	if p.s[p.pos] == '"' {
		var b strings.Builder
		for i := p.pos + 1; i < len(p.s); i++ {
			if p.s[i] == '"' {
				if i+1 < len(p.s) && p.s[i+1] == '"' {
					b.WriteByte('"')
					i++
					continue
				}
				p.pos = i + 1
				if b.Len() == 0 {
					return "", errors.New(`an empty "" column name`)
				}
				return b.String(), nil
			}
			b.WriteByte(p.s[i])
		}
		return "", errors.New(`a "quoted" column name is not closed`)
	}
	start := p.pos
	for p.pos < len(p.s) {
		r := rune(p.s[p.pos])
		if r == '_' || unicode.IsLetter(r) && r < unicode.MaxASCII || p.pos > start && (unicode.IsDigit(r) || r == '$') {
			p.pos++
			continue
		}
		break
	}
	if p.pos == start {
		return "", fmt.Errorf("at %q: a column name (or \"quoted name\") was expected", p.rest())
	}
	word := strings.ToLower(p.s[start:p.pos])
	switch word {
	case "and", "or", "not", "in", "is", "null", "true", "false", "select":
		return "", fmt.Errorf("at %q: %s is not a column name (quote a column named so: \"%s\")", p.s[start:], word, word)
	}
	return word, nil
}

func (p *whereParser) literal() (string, error) {
	p.skip()
	if p.eof() {
		return "", errors.New("a literal is missing at the end")
	}
	switch c := p.s[p.pos]; {
	case c == '\'':
		var b strings.Builder
		for i := p.pos + 1; i < len(p.s); i++ {
			if p.s[i] == '\'' {
				if i+1 < len(p.s) && p.s[i+1] == '\'' {
					b.WriteByte('\'')
					i++
					continue
				}
				p.pos = i + 1
				return b.String(), nil
			}
			b.WriteByte(p.s[i])
		}
		return "", errors.New("a 'quoted' literal is not closed")
	case c == '-' || c == '+' || c == '.' || (c >= '0' && c <= '9'):
		start := p.pos
		p.pos++
		digits := c >= '0' && c <= '9'
		for p.pos < len(p.s) {
			d := p.s[p.pos]
			if d >= '0' && d <= '9' {
				digits = true
			} else if d != '.' && d != 'e' && d != 'E' && !((d == '-' || d == '+') && (p.s[p.pos-1] == 'e' || p.s[p.pos-1] == 'E')) {
				break
			}
			p.pos++
		}
		if !digits {
			return "", fmt.Errorf("at %q: not a number", p.s[start:])
		}
		return p.s[start:p.pos], nil
	}
	for _, w := range []string{"true", "false"} {
		if p.keyword(w) {
			return w, nil
		}
	}
	return "", fmt.Errorf("at %q: a literal ('text', a number, true or false) was expected", p.rest())
}
