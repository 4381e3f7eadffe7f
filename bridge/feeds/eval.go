package feeds

// node is a Cond compiled for evaluation: an opcode instead of the kind's
// string, and constants kept typed where they are integers or strings, so
// testing a row compares machine values instead of interfaces. Cond.eval
// remains the reference; TestNodeAgreesWithCond holds them equal.
type node struct {
	op   opcode
	vk   valKind // of val, for eq and ne; of both values for in2
	subs []node
	col  string
	i    int64  // val when vk is vkInt
	s    string // val when vk is vkStr
	i2   int64  // in2: the second value (the first again for one)
	s2   string
	in   *inSet // in, in2
	val  any
	leaf *Cond // for the kinds evaluated by Cond.test
}

// inSet is the values of an in condition, typed when they all are
// integers or all strings.
type inSet struct {
	strs []string
	ints []int64
	vals []any
}

type opcode uint8

const (
	opEq opcode = iota
	opNe
	opIn
	opIn2  // in of one or two integers or strings, held in the node
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

// compileCond builds the node of a validated condition. The nodes below
// it sit in one allocation, in the order evaluation visits them: inl when
// it is large enough (a group passes its own array, so that a small
// condition is in the group's memory), else a new one.
func compileCond(c *Cond, inl []node) node {
	k := countNodes(c) - 1
	if k > len(inl) {
		inl = make([]node, k)
	}
	n, _ := build(c, inl[:k])
	return n
}

func countNodes(c *Cond) int {
	n := 1
	for i := range c.Subs {
		n += countNodes(&c.Subs[i])
	}
	return n
}

// build compiles c, taking the nodes of its operands from slab; it returns
// what is left of slab.
func build(c *Cond, slab []node) (node, []node) {
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
		set := &inSet{vals: c.Vals}
		n.op, n.in = opIn, set
		allInts, allStrs := true, true
		for _, v := range c.Vals {
			switch x := v.(type) {
			case int64:
				set.ints = append(set.ints, x)
				allStrs = false
			case string:
				set.strs = append(set.strs, x)
				allInts = false
			default:
				allInts, allStrs = false, false
			}
		}
		if !allInts {
			set.ints = nil
		}
		if !allStrs {
			set.strs = nil
		}
		switch {
		case len(c.Vals) <= 2 && len(set.ints) == len(c.Vals):
			n.op, n.vk, n.i, n.i2 = opIn2, vkInt, set.ints[0], set.ints[len(set.ints)-1]
		case len(c.Vals) <= 2 && len(set.strs) == len(c.Vals):
			n.op, n.vk, n.s, n.s2 = opIn2, vkStr, set.strs[0], set.strs[len(set.strs)-1]
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
		k := len(c.Subs)
		n.subs, slab = slab[:k:k], slab[k:]
		for i := range c.Subs {
			n.subs[i], slab = build(&c.Subs[i], slab)
		}
	default:
		n.op, n.leaf = opLeaf, c
	}
	return n, slab
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
	case opIn2:
		switch x := v.(type) {
		case int64:
			if n.vk == vkInt {
				return truth(x == n.i || x == n.i2)
			}
		case string:
			return truth(n.vk == vkStr && (x == n.s || x == n.s2)) // a string equals only a string
		}
		fallthrough
	case opIn:
		if v == nil {
			return no
		}
		set := n.in
		switch x := v.(type) {
		case int64:
			if set.ints != nil {
				for _, y := range set.ints {
					if x == y {
						return yes
					}
				}
				return no
			}
		case string:
			if set.strs != nil {
				for _, y := range set.strs {
					if x == y {
						return yes
					}
				}
				return no
			}
		}
		for _, y := range set.vals {
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
