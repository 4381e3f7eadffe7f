// A column's index: colIndex finds the column in a row, and holds either a
// vindex (the values of equality and membership conditions) or an rindex
// (the bounds of range conditions), each of which lists the groups a value
// reaches.

package feeds

import (
	"math"
	"slices"
	"sort"
)

// colIndex is one column's index; a table has a few, so a slice scanned
// by name beats a map. It remembers where the column was in the last names
// slice it read: rows decoded by the consumer share one names slice per
// column layout (see names), so most rows find it without a scan. The
// slice is held, so its memory cannot be reused by another while cached.
type colIndex[T any] struct {
	col   string
	ix    *T
	names []string // the names slice pos refers to
	pos   int      // col's position in names, or -1
}

// at is r.get(col), by way of the remembered position.
func (e *colIndex[T]) at(r *row) (any, bool) {
	if r == nil || len(r.names) == 0 {
		return nil, false
	}
	if len(e.names) != len(r.names) || &e.names[0] != &r.names[0] {
		e.names, e.pos = r.names, -1
		for i, n := range r.names {
			if len(n) == len(e.col) && n == e.col {
				e.pos = i
				break
			}
		}
	}
	if e.pos < 0 {
		return nil, false
	}
	return r.vals[e.pos], true
}

func find[T any](l []colIndex[T], col string) *T {
	for _, c := range l {
		if c.col == col {
			return c.ix
		}
	}
	return nil
}

func drop[T any](l []colIndex[T], col string) []colIndex[T] {
	return slices.DeleteFunc(l, func(c colIndex[T]) bool { return c.col == col })
}

// vindex maps a column's values to groups, with typed maps for integers
// and strings (the common keys) so lookups hash no interface. Values are
// normalised (see normalize): an integral number is always an int64, so a
// value has one map it can be in.
type vindex struct {
	ints  map[int64]glist
	strs  map[string]glist
	other map[any]glist // float64, bool
	n     int           // keys held
}

// glist is the groups of one key. Most keys have one, held inline so that
// a lookup reaches it without loading a slice.
type glist struct {
	one  *group
	more []*group
}

func (l glist) visit(dst []*group, stamp uint64) []*group {
	if l.one != nil {
		dst = visitOne(dst, l.one, stamp)
	}
	return visit(dst, l.more, stamp)
}

func (v *vindex) list(k any) glist {
	switch x := k.(type) {
	case int64:
		return v.ints[x]
	case string:
		return v.strs[x]
	case nil, []any:
		return glist{}
	}
	return v.other[k]
}

func (v *vindex) add(k any, g *group) {
	switch x := k.(type) {
	case int64:
		v.ints = addKey(v, v.ints, x, g)
	case string:
		v.strs = addKey(v, v.strs, x, g)
	default:
		v.other = addKey(v, v.other, k, g)
	}
}

func (v *vindex) del(k any, g *group) {
	switch x := k.(type) {
	case int64:
		delKey(v, v.ints, x, g)
	case string:
		delKey(v, v.strs, x, g)
	default:
		delKey(v, v.other, k, g)
	}
}

func addKey[K comparable](v *vindex, m map[K]glist, k K, g *group) map[K]glist {
	if m == nil {
		m = map[K]glist{}
	}
	l, ok := m[k]
	if !ok {
		v.n++
	}
	if l.one == nil {
		l.one = g
	} else {
		l.more = append(l.more, g)
	}
	m[k] = l
	return m
}

func delKey[K comparable](v *vindex, m map[K]glist, k K, g *group) {
	l, ok := m[k]
	if !ok {
		return
	}
	if l.one == g {
		l.one = nil
		if n := len(l.more); n > 0 {
			l.one, l.more[n-1] = l.more[n-1], nil
			l.more = l.more[:n-1]
		}
	} else {
		l.more = without(l.more, g)
	}
	if l.one == nil {
		delete(m, k)
		v.n--
		return
	}
	m[k] = l
}

// rindex holds a column's numeric range conditions sorted by bound: lower
// bounds (gt, gte) and upper bounds (lt, lte). A value passes the lower
// bounds at or below it, a prefix, and the upper bounds at or above it, a
// suffix, found by binary search, so the cost is the conditions a value
// passes, not all of them. Strictness is left to the filter's own test: the
// index returns a superset (float64 conversion keeps order, so an int64
// beyond 2^53 still finds its bounds).
type rindex struct {
	lo, hi []bound
}

type bound struct {
	x float64
	g *group
}

func (ri *rindex) side(mode byte) *[]bound {
	if mode == 'l' {
		return &ri.lo
	}
	return &ri.hi
}

func (ri *rindex) add(mode byte, x float64, g *group) {
	s := ri.side(mode)
	i := sort.Search(len(*s), func(i int) bool { return (*s)[i].x > x })
	*s = slices.Insert(*s, i, bound{x: x, g: g})
}

func (ri *rindex) del(mode byte, x float64, g *group) {
	s := ri.side(mode)
	for i := sort.Search(len(*s), func(i int) bool { return (*s)[i].x >= x }); i < len(*s) && (*s)[i].x == x; i++ {
		if (*s)[i].g == g {
			*s = slices.Delete(*s, i, i+1)
			return
		}
	}
}

// visit appends the groups whose bounds v may pass.
func (ri *rindex) visit(dst []*group, v any, stamp uint64) []*group {
	x, ok := number(v)
	if !ok {
		if x, ok = numString(v); !ok {
			return dst
		}
	}
	if math.IsNaN(x) { // compares equal to every bound: a candidate of all
		for _, b := range ri.lo {
			dst = visitOne(dst, b.g, stamp)
		}
		for _, b := range ri.hi {
			dst = visitOne(dst, b.g, stamp)
		}
		return dst
	}
	lo := ri.lo
	for i, n := 0, sort.Search(len(lo), func(i int) bool { return lo[i].x > x }); i < n; i++ {
		dst = visitOne(dst, lo[i].g, stamp)
	}
	hi := ri.hi
	for i := sort.Search(len(hi), func(i int) bool { return hi[i].x >= x }); i < len(hi); i++ {
		dst = visitOne(dst, hi[i].g, stamp)
	}
	return dst
}

func visitOne(dst []*group, g *group, stamp uint64) []*group {
	if g.stamp != stamp {
		g.stamp = stamp
		dst = append(dst, g)
	}
	return dst
}

func visit(dst, l []*group, stamp uint64) []*group {
	for _, g := range l {
		if g.stamp != stamp {
			g.stamp = stamp
			dst = append(dst, g)
		}
	}
	return dst
}
