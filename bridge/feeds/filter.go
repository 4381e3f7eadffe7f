package feeds

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// Filter selects the changes a feed receives. The zero Filter matches every
// row change (insert, update, delete, read) of every table.
type Filter struct {
	// Tables are "schema.table" names; empty means every table.
	Tables []string `json:"tables,omitempty"`
	// Ops are the operations of the change as it happened (insert, update,
	// delete, read); empty means all four. A row moving into or out of
	// Where through an update is matched as an update.
	Ops []cdc.Op `json:"ops,omitempty"`
	// Where is a condition over column values; nil matches every row.
	Where *Cond `json:"where,omitempty"`
	// Columns is the projection of before and after; empty means all
	// columns. The key is always sent whole.
	Columns []string `json:"columns,omitempty"`
}

// Kind is the kind of a Cond.
type Kind string

// The condition kinds.
const (
	KindEq       Kind = "eq"       // column = value
	KindNe       Kind = "ne"       // column <> value (and not null)
	KindIn       Kind = "in"       // column is one of values
	KindContains Kind = "contains" // array column holds every one of values (Postgres @>)
	KindLt       Kind = "lt"
	KindLte      Kind = "lte"
	KindGt       Kind = "gt"
	KindGte      Kind = "gte"
	KindNull     Kind = "null"    // column is null
	KindNotNull  Kind = "notnull" // column is not null
	KindAnd      Kind = "and"
	KindOr       Kind = "or"
	KindNot      Kind = "not"
)

// Cond is a condition over the values of a row. Build it with Eq, In,
// Contains, Lt, Lte, Gt, Gte, IsNull, NotNull, And, Or and Not, or decode
// it from the JSON form documented on UnmarshalJSON.
//
// Values compare as JSON values: numbers numerically (a numeric column
// encoded as a string compares as a number in ranges), strings bytewise
// (ISO timestamps order correctly), booleans and null by equality. A
// column missing from the row being tested (a before image that carries
// only the key) makes the condition unknown, and unknown never matches.
type Cond struct {
	Kind Kind
	Col  string
	Vals []any  // eq, ne, lt, lte, gt, gte: one value; in, contains: the set
	Subs []Cond // and, or: the operands; not: one
}

// Eq is column = v.
func Eq(col string, v any) Cond { return Cond{Kind: KindEq, Col: col, Vals: []any{v}} }

// Ne is column <> v; null never matches.
func Ne(col string, v any) Cond { return Cond{Kind: KindNe, Col: col, Vals: []any{v}} }

// In is column IN (vs...).
func In(col string, vs ...any) Cond { return Cond{Kind: KindIn, Col: col, Vals: vs} }

// Contains is array column @> vs: the array holds every one of vs.
func Contains(col string, vs ...any) Cond { return Cond{Kind: KindContains, Col: col, Vals: vs} }

// Lt is column < v.
func Lt(col string, v any) Cond { return Cond{Kind: KindLt, Col: col, Vals: []any{v}} }

// Lte is column <= v.
func Lte(col string, v any) Cond { return Cond{Kind: KindLte, Col: col, Vals: []any{v}} }

// Gt is column > v.
func Gt(col string, v any) Cond { return Cond{Kind: KindGt, Col: col, Vals: []any{v}} }

// Gte is column >= v.
func Gte(col string, v any) Cond { return Cond{Kind: KindGte, Col: col, Vals: []any{v}} }

// IsNull is column IS NULL.
func IsNull(col string) Cond { return Cond{Kind: KindNull, Col: col} }

// NotNull is column IS NOT NULL.
func NotNull(col string) Cond { return Cond{Kind: KindNotNull, Col: col} }

// And holds when every one of cs holds.
func And(cs ...Cond) Cond { return Cond{Kind: KindAnd, Subs: cs} }

// Or holds when one of cs holds.
func Or(cs ...Cond) Cond { return Cond{Kind: KindOr, Subs: cs} }

// Not holds when c does not (and c is not unknown).
func Not(c Cond) Cond { return Cond{Kind: KindNot, Subs: []Cond{c}} }

// Ptr returns a pointer to c, for Filter.Where.
func (c Cond) Ptr() *Cond { return &c }

// MarshalJSON writes the compact form UnmarshalJSON reads.
func (c Cond) MarshalJSON() ([]byte, error) {
	var v any
	switch c.Kind {
	case KindEq, KindNe, KindLt, KindLte, KindGt, KindGte:
		var x any
		if len(c.Vals) > 0 {
			x = c.Vals[0]
		}
		v = []any{c.Col, x}
	case KindIn, KindContains:
		v = []any{c.Col, c.Vals}
	case KindNull, KindNotNull:
		v = c.Col
	case KindAnd, KindOr:
		v = c.Subs
	case KindNot:
		if len(c.Subs) != 1 {
			return nil, errors.New("feeds: not needs exactly one operand")
		}
		v = c.Subs[0]
	default:
		return nil, fmt.Errorf("feeds: unknown condition kind %q", c.Kind)
	}
	return json.Marshal(map[string]any{string(c.Kind): v})
}

// UnmarshalJSON reads a condition: an object with one key, the kind.
//
//	{"eq": ["tenant_id", 42]}            also ne, lt, lte, gt, gte
//	{"in": ["status", ["open", "paid"]]}
//	{"contains": ["tags", ["a", "b"]]}   the array column holds a and b
//	{"null": "deleted_at"}               also notnull
//	{"and": [cond, ...]}                 also or
//	{"not": cond}
func (c *Cond) UnmarshalJSON(b []byte) error {
	x, err := parseCond(b, "where")
	if err != nil {
		return err
	}
	*c = x
	return nil
}

// ParseCond parses the JSON form of a condition (see Cond.UnmarshalJSON);
// errors name the offending path, e.g. `where.and[1].eq: ...`.
func ParseCond(b []byte) (Cond, error) { return parseCond(b, "where") }

func parseCond(b []byte, path string) (Cond, error) {
	var m map[string]json.RawMessage
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		return Cond{}, fmt.Errorf("%s: want an object with one key such as {\"eq\": [\"col\", 1]}: %w", path, err)
	}
	if len(m) != 1 {
		return Cond{}, fmt.Errorf("%s: want exactly one key (eq, ne, in, contains, lt, lte, gt, gte, null, notnull, and, or, not), got %d", path, len(m))
	}
	for k, raw := range m {
		kind := Kind(k)
		p := path + "." + k
		switch kind {
		case KindEq, KindNe, KindLt, KindLte, KindGt, KindGte, KindIn, KindContains:
			var pair []json.RawMessage
			if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
				return Cond{}, fmt.Errorf("%s: want [\"column\", value]", p)
			}
			var col string
			if err := json.Unmarshal(pair[0], &col); err != nil || col == "" {
				return Cond{}, fmt.Errorf("%s[0]: want a column name", p)
			}
			if kind == KindIn || kind == KindContains {
				var vs []any
				if err := decodeNumbers(pair[1], &vs); err != nil || len(vs) == 0 {
					return Cond{}, fmt.Errorf("%s[1]: want a non-empty array of values", p)
				}
				for i := range vs {
					vs[i] = normalize(vs[i])
				}
				return Cond{Kind: kind, Col: col, Vals: vs}, nil
			}
			var v any
			if err := decodeNumbers(pair[1], &v); err != nil {
				return Cond{}, fmt.Errorf("%s[1]: %w", p, err)
			}
			return Cond{Kind: kind, Col: col, Vals: []any{normalize(v)}}, nil
		case KindNull, KindNotNull:
			var col string
			if err := json.Unmarshal(raw, &col); err != nil || col == "" {
				return Cond{}, fmt.Errorf("%s: want a column name", p)
			}
			return Cond{Kind: kind, Col: col}, nil
		case KindAnd, KindOr:
			var subs []json.RawMessage
			if err := json.Unmarshal(raw, &subs); err != nil || len(subs) == 0 {
				return Cond{}, fmt.Errorf("%s: want a non-empty array of conditions", p)
			}
			c := Cond{Kind: kind, Subs: make([]Cond, len(subs))}
			for i, s := range subs {
				sc, err := parseCond(s, fmt.Sprintf("%s[%d]", p, i))
				if err != nil {
					return Cond{}, err
				}
				c.Subs[i] = sc
			}
			return c, nil
		case KindNot:
			sc, err := parseCond(raw, p)
			if err != nil {
				return Cond{}, err
			}
			return Cond{Kind: KindNot, Subs: []Cond{sc}}, nil
		default:
			return Cond{}, fmt.Errorf("%s: unknown condition %q (eq, ne, in, contains, lt, lte, gt, gte, null, notnull, and, or, not)", path, k)
		}
	}
	panic("unreachable")
}

func decodeNumbers(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return d.Decode(v)
}

// validate checks c's shape and normalises its values in place.
func (c *Cond) validate(path string) error {
	switch c.Kind {
	case KindEq, KindNe, KindLt, KindLte, KindGt, KindGte:
		if c.Col == "" || len(c.Vals) != 1 {
			return fmt.Errorf("%s.%s: needs a column and one value", path, c.Kind)
		}
	case KindIn, KindContains:
		if c.Col == "" || len(c.Vals) == 0 {
			return fmt.Errorf("%s.%s: needs a column and at least one value", path, c.Kind)
		}
	case KindNull, KindNotNull:
		if c.Col == "" {
			return fmt.Errorf("%s.%s: needs a column", path, c.Kind)
		}
	case KindAnd, KindOr:
		if len(c.Subs) == 0 {
			return fmt.Errorf("%s.%s: needs at least one operand", path, c.Kind)
		}
	case KindNot:
		if len(c.Subs) != 1 {
			return fmt.Errorf("%s.not: needs exactly one operand", path)
		}
	default:
		return fmt.Errorf("%s: unknown condition kind %q", path, c.Kind)
	}
	for i := range c.Vals {
		c.Vals[i] = normalize(c.Vals[i])
	}
	for i := range c.Subs {
		if err := c.Subs[i].validate(fmt.Sprintf("%s.%s[%d]", path, c.Kind, i)); err != nil {
			return err
		}
	}
	return nil
}

// clone deep-copies c so that validate's normalisation never touches the
// caller's slices.
func (c Cond) clone() Cond {
	c.Vals = append([]any(nil), c.Vals...)
	subs := make([]Cond, len(c.Subs))
	for i := range c.Subs {
		subs[i] = c.Subs[i].clone()
	}
	c.Subs = subs
	return c
}

// tri is a three-valued truth: a condition over a column the row does not
// carry is unknown.
type tri int8

const (
	no tri = iota
	yes
	unknown
)

func (c *Cond) eval(r *row) tri {
	switch c.Kind {
	case KindAnd:
		out := yes
		for i := range c.Subs {
			switch c.Subs[i].eval(r) {
			case no:
				return no
			case unknown:
				out = unknown
			}
		}
		return out
	case KindOr:
		out := no
		for i := range c.Subs {
			switch c.Subs[i].eval(r) {
			case yes:
				return yes
			case unknown:
				out = unknown
			}
		}
		return out
	case KindNot:
		switch c.Subs[0].eval(r) {
		case yes:
			return no
		case no:
			return yes
		}
		return unknown
	}
	v, ok := r.get(c.Col)
	if !ok {
		return unknown
	}
	return truth(c.test(v))
}

func truth(b bool) tri {
	if b {
		return yes
	}
	return no
}

// test applies a leaf condition to a present value.
func (c *Cond) test(v any) bool {
	switch c.Kind {
	case KindNull:
		return v == nil
	case KindNotNull:
		return v != nil
	case KindEq:
		return v != nil && equal(v, c.Vals[0])
	case KindNe:
		return v != nil && c.Vals[0] != nil && !equal(v, c.Vals[0])
	case KindIn:
		if v == nil {
			return false
		}
		for _, x := range c.Vals {
			if equal(v, x) {
				return true
			}
		}
		return false
	case KindContains:
		arr, ok := v.([]any)
		if !ok {
			return false
		}
		for _, x := range c.Vals {
			found := false
			for _, e := range arr {
				if equal(e, x) {
					found = true
					break
				}
			}
			if !found {
				return false
			}
		}
		return true
	case KindLt, KindLte, KindGt, KindGte:
		n, ok := compare(v, c.Vals[0])
		if !ok {
			return false
		}
		switch c.Kind {
		case KindLt:
			return n < 0
		case KindLte:
			return n <= 0
		case KindGt:
			return n > 0
		default:
			return n >= 0
		}
	}
	return false
}

// normalize turns a decoded or caller-given value into the canonical form
// rows use: nil, bool, int64 (every integral number that fits), float64,
// string or []any of those.
func normalize(v any) any {
	switch x := v.(type) {
	case nil, bool, string, int64:
		return v
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return i
		}
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil {
			return string(x)
		}
		return normFloat(f)
	case float64:
		return normFloat(x)
	case float32:
		return normFloat(float64(x))
	case int:
		return int64(x)
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint:
		if uint64(x) <= math.MaxInt64 {
			return int64(x)
		}
		return float64(x)
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x)
		}
		return float64(x)
	case cdc.Numeric:
		return normalize(json.Number(x))
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = normalize(x[i])
		}
		return out
	case []string:
		out := make([]any, len(x))
		for i := range x {
			out[i] = x[i]
		}
		return out
	case fmt.Stringer:
		return x.String()
	}
	return fmt.Sprint(v)
}

func normFloat(f float64) any {
	if f == math.Trunc(f) && f >= -(1<<63) && f < (1<<63) {
		return int64(f)
	}
	return f
}

// equal compares two normalised scalars.
func equal(a, b any) bool {
	switch x := a.(type) {
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equal(x[i], y[i]) {
				return false
			}
		}
		return true
	case int64:
		if f, ok := b.(float64); ok {
			return float64(x) == f
		}
	case float64:
		if i, ok := b.(int64); ok {
			return x == float64(i)
		}
	}
	if _, ok := b.([]any); ok {
		return false
	}
	return a == b
}

// compare orders two normalised values: numbers numerically (a string that
// parses as a number counts as one when the other side is a number),
// strings bytewise. ok is false when they do not order.
func compare(a, b any) (int, bool) {
	af, aNum := number(a)
	bf, bNum := number(b)
	if aNum || bNum {
		if !aNum {
			af, aNum = numString(a)
		}
		if !bNum {
			bf, bNum = numString(b)
		}
		if !aNum || !bNum {
			return 0, false
		}
		// Exact for int64 pairs beyond 2^53.
		if ai, ok := a.(int64); ok {
			if bi, ok := b.(int64); ok {
				return cmp3(ai, bi), true
			}
		}
		return cmpF(af, bf), true
	}
	as, ok1 := a.(string)
	bs, ok2 := b.(string)
	if ok1 && ok2 {
		return strings.Compare(as, bs), true
	}
	return 0, false
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

func numString(v any) (float64, bool) {
	s, ok := v.(string)
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	return f, err == nil
}

func cmp3(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// hashable returns v as a map key of the equality index, or false for
// values that cannot be one (arrays).
func hashable(v any) (any, bool) {
	switch v.(type) {
	case []any:
		return nil, false
	}
	return v, true
}
