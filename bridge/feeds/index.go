package feeds

import (
	"encoding/json"
	"math"
	"slices"
	"sort"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// group is the feeds sharing one filter (tables, operations and condition;
// their projections may differ). The index holds groups, so a change is
// tested once per distinct filter however many feeds share it, as a
// thousand browser tabs following one tenant do.
type group struct {
	ops     opMask
	stamp   uint64    // visit mark of candidates
	all     bool      // no condition
	root    node      // the condition, compiled
	inl     [2]node   // the nodes below root when they are two or fewer
	key     string    // canonical filter, the index's groups key
	filter  *compiled // the first feed's; only tables, ops and where are read
	feeds   []*Feed   // Feed.gi is the position here
	nwait   int       // feeds of the group parked in Next
	entries []ientry  // where the group is in the index, to remove it
}

// index is the inverted index from changes to the groups of feeds they
// may match: by table ("" holds filters of every table), then by one of:
//
//   - the value of an equality (eq, in) condition the filter requires,
//   - one element of an array-membership (contains) condition,
//   - the bound of a numeric range (lt, lte, gt, gte) condition, sorted,
//     so a value finds the bounds it passes by binary search,
//
// or, with an or of such conditions, every one of them. A filter with none
// (ne, null, not, ...) is residual and tested on every change of its table.
// A candidate is then tested with its whole filter. The cost per change
// grows with the candidates, which are the matching filters plus the
// residual ones, not with the number of feeds.
type index struct {
	tables map[string]*tindex
	groups map[string]*group
	all    *tindex // tables[""]: filters of every table

	// The table of the last change and its index: a stream carries runs of
	// one table's changes. Valid until tables changes.
	lastTable string
	lastTi    *tindex
	lastOK    bool
}

type tindex struct {
	eq  []colIndex[vindex] // equality, by column
	ct  []colIndex[vindex] // membership, by column
	rg  []colIndex[rindex] // ranges, by column
	res []*group
}

func (ti *tindex) empty() bool {
	return len(ti.eq) == 0 && len(ti.ct) == 0 && len(ti.rg) == 0 && len(ti.res) == 0
}

// ientry records one place of a group in the index.
type ientry struct {
	table string
	pick
}

// pick is one index entry a filter's condition allows: mode 'e' (any of
// keys equals the column), 'c' (the array column holds keys[0]), 'l' (the
// column is above bound x), 'u' (below x), 'r' residual.
type pick struct {
	mode byte
	col  string
	keys []any
	x    float64
}

func newIndex() *index { return &index{tables: map[string]*tindex{}, groups: map[string]*group{}} }

// groupKey is the canonical form of a filter's matching part.
func groupKey(f *compiled) string {
	tables := slices.Clone(f.tables)
	sort.Strings(tables)
	b, err := json.Marshal(struct {
		T []string `json:"t,omitempty"`
		O opMask   `json:"o"`
		W *Cond    `json:"w,omitempty"`
	}{tables, f.ops, f.where})
	if err != nil { // a validated condition always marshals; keep the filter apart
		return "\x00" + err.Error()
	}
	return string(b)
}

// matches reports whether c reaches the group's feeds in any kind, for a
// candidate of the index (whose table is known to match): match's rules
// reduce to "the image the operation is judged on matches", and for an
// update "either image matches". It reads the group's own compiled
// condition, reached without another load.
func (g *group) matches(c *change) bool {
	if g.ops&opBit(c.op) == 0 {
		return false
	}
	if g.all {
		return true
	}
	switch c.op {
	case cdc.OpInsert, cdc.OpRead:
		return g.root.eval(c.after) == yes
	case cdc.OpDelete:
		return g.root.eval(c.old) == yes
	case cdc.OpUpdate:
		return g.root.eval(c.after) == yes || g.root.eval(c.old) == yes
	}
	return false
}

// plan chooses the index entries of a condition; nil means residual.
func plan(w *Cond) []pick {
	if w == nil {
		return nil
	}
	switch w.Kind {
	case KindEq, KindIn:
		keys := make([]any, 0, len(w.Vals))
		for _, v := range w.Vals {
			if _, ok := v.([]any); ok {
				return nil
			}
			if v != nil { // null equals nothing
				keys = append(keys, v)
			}
		}
		return []pick{{mode: 'e', col: w.Col, keys: keys}}
	case KindContains:
		for _, v := range w.Vals {
			if _, ok := v.([]any); !ok && v != nil {
				return []pick{{mode: 'c', col: w.Col, keys: []any{v}}}
			}
		}
	case KindGt, KindGte, KindLt, KindLte:
		x, ok := number(w.Vals[0])
		if !ok || math.IsNaN(x) {
			return nil
		}
		mode := byte('l')
		if w.Kind == KindLt || w.Kind == KindLte {
			mode = 'u'
		}
		return []pick{{mode: mode, col: w.Col, x: x}}
	case KindAnd:
		var best []pick
		for i := range w.Subs {
			if p := plan(&w.Subs[i]); p != nil && better(p, best) {
				best = p
			}
		}
		return best
	case KindOr:
		var all []pick
		for i := range w.Subs {
			p := plan(&w.Subs[i])
			if p == nil {
				return nil
			}
			all = append(all, p...)
		}
		return all
	}
	return nil
}

// better prefers equality to membership to ranges (fewer candidates are
// expected), then fewer entries.
func better(p, q []pick) bool {
	if q == nil {
		return true
	}
	if a, b := score(p), score(q); a != b {
		return a > b
	}
	return len(p) < len(q)
}

func score(ps []pick) int {
	s := 3
	for _, p := range ps {
		switch p.mode {
		case 'c':
			s = min(s, 2)
		case 'l', 'u':
			s = min(s, 1)
		}
	}
	return s
}

// add puts f in the group of its filter, making the group (and its index
// entries) when f is the first.
func (x *index) add(f *Feed) {
	key := groupKey(f.filter)
	g := x.groups[key]
	if g == nil {
		g = &group{key: key, filter: f.filter, ops: f.filter.ops, all: f.filter.where == nil}
		if !g.all {
			g.root = compileCond(f.filter.where, g.inl[:])
		}
		x.groups[key] = g
		x.addGroup(g)
	}
	if g.filter != f.filter { // share the group's condition; the feed's copy becomes garbage
		f.filter.tables, f.filter.where = g.filter.tables, g.filter.where
	}
	if !g.all {
		f.filter.prog = &g.root
	}
	f.group, f.gi = g, len(g.feeds)
	g.feeds = append(g.feeds, f)
	if f.waiting {
		g.nwait++
	}
}

func (x *index) addGroup(g *group) {
	picks := plan(g.filter.where)
	if picks == nil {
		picks = []pick{{mode: 'r'}}
	}
	tables := []string{""}
	if g.filter.tables != nil {
		tables = g.filter.tables
	}
	for _, t := range tables {
		ti := x.tables[t]
		if ti == nil {
			ti = &tindex{}
			x.tables[t] = ti
			x.tablesChanged()
		}
		for _, p := range picks {
			switch p.mode {
			case 'e', 'c':
				l := &ti.eq
				if p.mode == 'c' {
					l = &ti.ct
				}
				vi := find(*l, p.col)
				if vi == nil {
					vi = &vindex{}
					*l = append(*l, colIndex[vindex]{col: p.col, ix: vi})
				}
				for _, k := range p.keys {
					vi.add(k, g)
				}
			case 'l', 'u':
				ri := find(ti.rg, p.col)
				if ri == nil {
					ri = &rindex{}
					ti.rg = append(ti.rg, colIndex[rindex]{col: p.col, ix: ri})
				}
				ri.add(p.mode, p.x, g)
			default:
				ti.res = append(ti.res, g)
			}
			g.entries = append(g.entries, ientry{table: t, pick: p})
		}
	}
}

// remove takes f out of its group, and the group out of the index when f
// was its last feed.
func (x *index) remove(f *Feed) {
	g := f.group
	if g == nil {
		return
	}
	if f.waiting {
		g.nwait--
	}
	last := len(g.feeds) - 1
	g.feeds[f.gi] = g.feeds[last]
	g.feeds[f.gi].gi = f.gi
	g.feeds[last] = nil
	g.feeds = g.feeds[:last]
	f.group = nil
	if len(g.feeds) > 0 {
		return
	}
	delete(x.groups, g.key)
	for _, e := range g.entries {
		ti := x.tables[e.table]
		if ti == nil {
			continue
		}
		switch e.mode {
		case 'e', 'c':
			l := &ti.eq
			if e.mode == 'c' {
				l = &ti.ct
			}
			if vi := find(*l, e.col); vi != nil {
				for _, k := range e.keys {
					vi.del(k, g)
				}
				if vi.n == 0 {
					*l = drop(*l, e.col)
				}
			}
		case 'l', 'u':
			if ri := find(ti.rg, e.col); ri != nil {
				ri.del(e.mode, e.x, g)
				if len(ri.lo)+len(ri.hi) == 0 {
					ti.rg = drop(ti.rg, e.col)
				}
			}
		default:
			ti.res = without(ti.res, g)
		}
		if ti.empty() {
			delete(x.tables, e.table)
			x.tablesChanged()
		}
	}
	g.entries = nil
}

func (x *index) tablesChanged() {
	x.all = x.tables[""]
	x.lastOK, x.lastTable, x.lastTi = false, "", nil
}

func deleteString(l []string, s string) []string {
	if i := slices.Index(l, s); i >= 0 {
		return slices.Delete(l, i, i+1)
	}
	return l
}

func without(l []*group, g *group) []*group {
	for i, h := range l {
		if h == g {
			l[i] = l[len(l)-1]
			l[len(l)-1] = nil
			return l[:len(l)-1]
		}
	}
	return l
}

// candidates appends to dst each group c may match, once; stamp, unique
// per call, marks groups already visited. Not safe for concurrent use (it
// also remembers the last table).
func (x *index) candidates(c *change, stamp uint64, dst []*group) []*group {
	if c.table == "" {
		return dst
	}
	ti := x.lastTi
	if !x.lastOK || c.table != x.lastTable {
		ti = x.tables[c.table]
		x.lastTable, x.lastTi, x.lastOK = c.table, ti, true
	}
	if ti != nil {
		dst = ti.candidates(c, stamp, dst)
	}
	if x.all != nil {
		dst = x.all.candidates(c, stamp, dst)
	}
	return dst
}

func (ti *tindex) candidates(c *change, stamp uint64, dst []*group) []*group {
	old := c.old
	if c.op != "update" && c.op != "delete" {
		old = nil
	}
	for i := range ti.eq {
		e := &ti.eq[i]
		a, aok := e.at(c.after)
		if aok {
			dst = e.ix.list(a).visit(dst, stamp)
		}
		if b, ok := e.at(old); ok && (!aok || !sameKey(a, b)) { // an unchanged value is looked up once
			dst = e.ix.list(b).visit(dst, stamp)
		}
	}
	for i := range ti.ct {
		e := &ti.ct[i]
		a, _ := e.at(c.after)
		arr, _ := a.([]any)
		for _, v := range arr {
			dst = e.ix.list(v).visit(dst, stamp)
		}
		b, _ := e.at(old)
		if brr, _ := b.([]any); !sameArray(arr, brr) {
			for _, v := range brr {
				dst = e.ix.list(v).visit(dst, stamp)
			}
		}
	}
	for i := range ti.rg {
		e := &ti.rg[i]
		a, aok := e.at(c.after)
		if aok {
			dst = e.ix.visit(dst, a, stamp)
		}
		if b, ok := e.at(old); ok && (!aok || !sameKey(a, b)) {
			dst = e.ix.visit(dst, b, stamp)
		}
	}
	return visit(dst, ti.res, stamp)
}

// sameArray reports whether two arrays hold the same scalars in order.
func sameArray(a, b []any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !sameKey(a[i], b[i]) {
			return false
		}
	}
	return true
}

// sameKey reports whether two normalised values are the same scalar, to
// skip a second lookup; false for arrays.
func sameKey(a, b any) bool {
	switch x := a.(type) {
	case int64:
		y, ok := b.(int64)
		return ok && x == y
	case string:
		y, ok := b.(string)
		return ok && x == y
	}
	return false
}
