package feeds

// node is a Cond compiled for evaluation: an opcode instead of the kind's
// string, and constants kept typed where they are integers or strings, so
// testing a row compares machine values instead of interfaces. Cond.eval
// remains the reference; TestNodeAgreesWithCond holds them equal.
type node struct {
	op   opcode
	vk   valKind // of val, for eq and ne
	col  string
	i    int64  // val when vk is vkInt
	s    string // val when vk is vkStr
	val  any
	ints []int64  // in: every value an integer
	strs []string // in: every value a string
	vals []any    // in, contains; ranges: vals[0]
	subs []node
	leaf *Cond // for the kinds evaluated by Cond.test
}

type opcode uint8

const (
	opEq opcode = iota
	opNe
	opIn
	opLeaf // contains, ranges, null, notnull: Cond.test
	opAnd
	opOr
	opNot
)

type valKind uint8

const (
	vkOther valKind = iota
	vkInt
	vkStr
)

// compileCond builds the node of a validated condition.
func compileCond(c *Cond) node {
	n := node{col: c.Col}
	switch c.Kind {
	case KindEq, KindNe:
		n.op = opEq
		if c.Kind == KindNe {
			n.op = opNe
		}
		n.val = c.Vals[0]
		switch x := n.val.(type) {
		case int64:
			n.vk, n.i = vkInt, x
		case string:
			n.vk, n.s = vkStr, x
		}
	case KindIn:
		n.op, n.vals = opIn, c.Vals
		allInts, allStrs := true, true
		for _, v := range c.Vals {
			switch x := v.(type) {
			case int64:
				n.ints = append(n.ints, x)
				allStrs = false
			case string:
				n.strs = append(n.strs, x)
				allInts = false
			default:
				allInts, allStrs = false, false
			}
		}
		if !allInts {
			n.ints = nil
		}
		if !allStrs {
			n.strs = nil
		}
	case KindAnd, KindOr, KindNot:
		switch c.Kind {
		case KindAnd:
			n.op = opAnd
		case KindOr:
			n.op = opOr
		default:
			n.op = opNot
		}
		n.subs = make([]node, len(c.Subs))
		for i := range c.Subs {
			n.subs[i] = compileCond(&c.Subs[i])
		}
	default:
		n.op, n.leaf = opLeaf, c
	}
	return n
}

// eval is Cond.eval over the compiled form.
func (n *node) eval(r *row) tri {
	switch n.op {
	case opAnd:
		out := yes
		for i := range n.subs {
			switch n.subs[i].eval(r) {
			case no:
				return no
			case unknown:
				out = unknown
			}
		}
		return out
	case opOr:
		out := no
		for i := range n.subs {
			switch n.subs[i].eval(r) {
			case yes:
				return yes
			case unknown:
				out = unknown
			}
		}
		return out
	case opNot:
		switch n.subs[0].eval(r) {
		case yes:
			return no
		case no:
			return yes
		}
		return unknown
	}
	v, ok := r.get(n.col)
	if !ok {
		return unknown
	}
	switch n.op {
	case opEq:
		return truth(v != nil && n.equal(v))
	case opNe:
		return truth(v != nil && n.val != nil && !n.equal(v))
	case opIn:
		if v == nil {
			return no
		}
		switch x := v.(type) {
		case int64:
			if n.ints != nil {
				for _, y := range n.ints {
					if x == y {
						return yes
					}
				}
				return no
			}
		case string:
			if n.strs != nil {
				for _, y := range n.strs {
					if x == y {
						return yes
					}
				}
				return no
			}
		}
		for _, y := range n.vals {
			if equal(v, y) {
				return yes
			}
		}
		return no
	}
	return truth(n.leaf.test(v))
}

// equal is equal(v, n.val) with the typed constant when there is one.
func (n *node) equal(v any) bool {
	switch n.vk {
	case vkInt:
		if x, ok := v.(int64); ok {
			return x == n.i
		}
	case vkStr:
		if x, ok := v.(string); ok {
			return x == n.s
		}
		return false // equal compares a string with nothing else
	}
	return equal(v, n.val)
}
