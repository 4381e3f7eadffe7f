package feeds

// index is the inverted index from changes to the feeds they may match:
// by table ("" holds feeds of every table), then by the value of one
// equality (eq, in) or array-membership (contains) condition the feed's
// filter requires; feeds with no such condition are residual and are
// tested on every change of their table. A candidate is then tested with
// its whole filter. The cost per change grows with the candidates, not
// with the number of feeds.
type index struct {
	tables map[string]*tindex
}

type tindex struct {
	eqCols []string
	eq     map[string]map[any][]*Feed
	ctCols []string
	ct     map[string]map[any][]*Feed
	res    []*Feed
}

// ientry records where a feed is in the index, to remove it.
type ientry struct {
	table string
	mode  byte // 'e' equality, 'c' contains, 'r' residual
	col   string
	keys  []any
}

func newIndex() *index { return &index{tables: map[string]*tindex{}} }

// plan chooses how to index a filter's condition.
func plan(w *Cond) (mode byte, col string, keys []any) {
	if w == nil {
		return 'r', "", nil
	}
	switch w.Kind {
	case KindEq, KindIn:
		for _, v := range w.Vals {
			if _, ok := hashable(v); !ok || v == nil {
				return 'r', "", nil
			}
		}
		return 'e', w.Col, w.Vals
	case KindContains:
		if _, ok := hashable(w.Vals[0]); ok && w.Vals[0] != nil {
			return 'c', w.Col, w.Vals[:1]
		}
	case KindAnd:
		for i := range w.Subs {
			if m, c, k := plan(&w.Subs[i]); m == 'e' {
				return m, c, k
			}
		}
		for i := range w.Subs {
			if m, c, k := plan(&w.Subs[i]); m == 'c' {
				return m, c, k
			}
		}
	}
	return 'r', "", nil
}

func (x *index) add(f *Feed) {
	mode, col, keys := plan(f.filter.where)
	tables := []string{""}
	if f.filter.tables != nil {
		tables = f.filter.tables
	}
	for _, t := range tables {
		ti := x.tables[t]
		if ti == nil {
			ti = &tindex{eq: map[string]map[any][]*Feed{}, ct: map[string]map[any][]*Feed{}}
			x.tables[t] = ti
		}
		switch mode {
		case 'e':
			ti.eqCols = addCol(ti.eqCols, ti.eq, col)
			for _, k := range keys {
				ti.eq[col][k] = append(ti.eq[col][k], f)
			}
		case 'c':
			ti.ctCols = addCol(ti.ctCols, ti.ct, col)
			ti.ct[col][keys[0]] = append(ti.ct[col][keys[0]], f)
		default:
			ti.res = append(ti.res, f)
		}
		f.entries = append(f.entries, ientry{table: t, mode: mode, col: col, keys: keys})
	}
}

func addCol(cols []string, m map[string]map[any][]*Feed, col string) []string {
	if _, ok := m[col]; !ok {
		m[col] = map[any][]*Feed{}
		cols = append(cols, col)
	}
	return cols
}

func (x *index) remove(f *Feed) {
	for _, e := range f.entries {
		ti := x.tables[e.table]
		if ti == nil {
			continue
		}
		switch e.mode {
		case 'e', 'c':
			m, cols := ti.eq, &ti.eqCols
			if e.mode == 'c' {
				m, cols = ti.ct, &ti.ctCols
			}
			for _, k := range e.keys {
				l := without(m[e.col][k], f)
				if len(l) == 0 {
					delete(m[e.col], k)
				} else {
					m[e.col][k] = l
				}
			}
			if len(m[e.col]) == 0 {
				delete(m, e.col)
				for i, c := range *cols {
					if c == e.col {
						*cols = append((*cols)[:i], (*cols)[i+1:]...)
						break
					}
				}
			}
		default:
			ti.res = without(ti.res, f)
		}
		if len(ti.eq) == 0 && len(ti.ct) == 0 && len(ti.res) == 0 {
			delete(x.tables, e.table)
		}
	}
	f.entries = nil
}

func without(l []*Feed, f *Feed) []*Feed {
	for i, g := range l {
		if g == f {
			l[i] = l[len(l)-1]
			l[len(l)-1] = nil
			return l[:len(l)-1]
		}
	}
	return l
}

// candidates appends to dst each feed c may match, once; stamp, unique
// per call, marks feeds already visited. Not safe for concurrent use.
func (x *index) candidates(c *change, stamp uint64, dst []*Feed) []*Feed {
	if c.table == "" {
		return dst
	}
	if ti := x.tables[c.table]; ti != nil {
		dst = ti.candidates(c, stamp, dst)
	}
	if ti := x.tables[""]; ti != nil {
		dst = ti.candidates(c, stamp, dst)
	}
	return dst
}

func visit(dst, l []*Feed, stamp uint64) []*Feed {
	for _, f := range l {
		if f.stamp != stamp {
			f.stamp = stamp
			dst = append(dst, f)
		}
	}
	return dst
}

func (ti *tindex) candidates(c *change, stamp uint64, dst []*Feed) []*Feed {
	old := c.old
	if c.op != "update" && c.op != "delete" {
		old = nil
	}
	for _, col := range ti.eqCols {
		m := ti.eq[col]
		var seen any
		for _, r := range [2]*row{c.after, old} {
			if v, ok := r.get(col); ok && v != nil {
				if k, ok := hashable(v); ok && k != seen { // an unchanged value is looked up once
					dst = visit(dst, m[k], stamp)
					seen = k
				}
			}
		}
	}
	for _, col := range ti.ctCols {
		m := ti.ct[col]
		for _, r := range [2]*row{c.after, old} {
			v, _ := r.get(col)
			arr, _ := v.([]any)
			for _, e := range arr {
				if k, ok := hashable(e); ok {
					dst = visit(dst, m[k], stamp)
				}
			}
		}
	}
	return visit(dst, ti.res, stamp)
}
