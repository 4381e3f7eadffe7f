package feeds

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// Small value domains so that random conditions and rows meet often.
var (
	propInts = []any{int64(-1), int64(0), int64(1), int64(2), int64(3), int64(1 << 60)}
	propStrs = []any{"a", "b", "c", "1", "2.5", "NaN"}
	propNums = []any{int64(0), int64(2), 1.5, 2.5, int64(1<<53 + 1), int64(1 << 53)}
)

func propValue(r *rand.Rand) any {
	switch r.IntN(8) {
	case 0, 1:
		return propInts[r.IntN(len(propInts))]
	case 2, 3:
		return propStrs[r.IntN(len(propStrs))]
	case 4, 5:
		return propNums[r.IntN(len(propNums))]
	case 6:
		return r.IntN(2) == 0
	}
	return nil
}

var propCols = []string{"a", "b", "c", "d"}

// propCond is a random condition of depth up to d over columns a–d (c
// usually holds an array).
func propCond(r *rand.Rand, d int) Cond {
	col := propCols[r.IntN(len(propCols))]
	k := r.IntN(12)
	if d <= 0 && k >= 9 {
		k = r.IntN(9)
	}
	switch k {
	case 0:
		return Eq(col, propValue(r))
	case 1:
		return Ne(col, propValue(r))
	case 2:
		n := 1 + r.IntN(3)
		vs := make([]any, n)
		for i := range vs {
			vs[i] = propValue(r)
		}
		return In(col, vs...)
	case 3:
		vs := []any{propValue(r)}
		if r.IntN(3) == 0 {
			vs = append(vs, propValue(r))
		}
		return Contains("c", vs...)
	case 4:
		return Lt(col, propValue(r))
	case 5:
		return Lte(col, propValue(r))
	case 6:
		return Gt(col, propValue(r))
	case 7:
		return Gte(col, propValue(r))
	case 8:
		if r.IntN(2) == 0 {
			return IsNull(col)
		}
		return NotNull(col)
	case 9:
		return And(propCond(r, d-1), propCond(r, d-1))
	case 10:
		return Or(propCond(r, d-1), propCond(r, d-1), propCond(r, d-1))
	}
	return Not(propCond(r, d-1))
}

// propRow is a random row as the consumer decodes it (with nm, its names
// table, or none), some columns missing (a before image with only the key
// carries fewer), so that consecutive rows share or change their layout.
func propRow(t testing.TB, r *rand.Rand, nm *names) *row {
	var parts []string
	for _, col := range propCols {
		if r.IntN(6) == 0 {
			continue
		}
		var v any
		if col == "c" && r.IntN(4) != 0 {
			arr := make([]any, r.IntN(4))
			for i := range arr {
				arr[i] = propValue(r)
			}
			v = arr
		} else {
			v = propValue(r)
		}
		parts = append(parts, fmt.Sprintf("%q:%s", col, jsonOf(t, v)))
	}
	rw, err := parseRow([]byte("{"+strings.Join(parts, ",")+"}"), nm, 1, nil)
	require.NoError(t, err)
	return rw
}

func jsonOf(t testing.TB, v any) string {
	switch x := v.(type) {
	case []any:
		s := make([]string, len(x))
		for i := range x {
			s[i] = jsonOf(t, x[i])
		}
		return "[" + strings.Join(s, ",") + "]"
	case float64:
		return fmt.Sprintf("%g", x)
	case string:
		return fmt.Sprintf("%q", x)
	case nil:
		return "null"
	}
	return fmt.Sprint(v)
}

// TestNodeAgreesWithCond holds the compiled evaluator to Cond.eval, the
// reference, over random conditions and rows.
func TestNodeAgreesWithCond(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for i := range 20_000 {
		c := propCond(r, 3)
		require.NoError(t, c.validate("where"))
		n := compileCond(&c, nil)
		rw := propRow(t, r, nil)
		if got, want := n.eval(rw), c.eval(rw); got != want {
			t.Fatalf("case %d: %s on %v: compiled %d, reference %d", i, mustJSON(t, c), rw.vals, got, want)
		}
	}
}

func mustJSON(t testing.TB, c Cond) string {
	b, err := c.MarshalJSON()
	require.NoError(t, err)
	return string(b)
}

// TestIndexFindsEveryMatch registers random filters (every kind, ranges,
// ors, shared filters, several tables) and checks, for random changes of
// every operation, that the index's candidates include every feed whose
// filter matches by brute force: the index may only narrow what is
// tested, never lose a match. It also checks that the index narrows: the
// candidates of a change are far fewer than the feeds.
func TestIndexFindsEveryMatch(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 11))
	fs := bareFeeds()
	tables := []string{"public.t1", "public.t2"}
	var all []*Feed
	var specs []Filter
	for i := range 3000 {
		f := Filter{}
		switch r.IntN(4) {
		case 0:
		case 1:
			f.Tables = []string{tables[0]}
		default:
			f.Tables = []string{tables[r.IntN(2)]}
		}
		if r.IntN(10) == 0 {
			f.Ops = []cdc.Op{[]cdc.Op{cdc.OpInsert, cdc.OpUpdate, cdc.OpDelete}[r.IntN(3)]}
		}
		if i%5 != 0 { // a fifth share the previous filter
			w := propCond(r, 2)
			f.Where = &w
		} else if i > 0 {
			f = specs[i-1]
		}
		feed, err := fs.Register(f, Token{})
		require.NoError(t, err)
		specs = append(specs, f)
		all = append(all, feed)
	}
	require.Less(t, len(fs.idx.groups), len(all), "feeds with the same filter share a group")
	var stamp uint64
	var scratch []*group
	nm := newNames() // rows share names slices, as the consumer's do
	totalCands, totalMatch := 0, 0
	ops := []cdc.Op{cdc.OpInsert, cdc.OpUpdate, cdc.OpDelete, cdc.OpRead}
	for i := range 3000 {
		c := &change{op: ops[r.IntN(len(ops))], table: tables[r.IntN(2)], after: propRow(t, r, nm)}
		c.old = propRow(t, r, nm)
		switch c.op {
		case cdc.OpInsert, cdc.OpRead:
			c.old = nil
		case cdc.OpDelete:
			c.after = nil
		}
		stamp++
		scratch = fs.idx.candidates(c, stamp, scratch[:0])
		cand := map[*group]bool{}
		for _, g := range scratch {
			require.False(t, cand[g], "change %d: group visited twice", i)
			cand[g] = true
		}
		totalCands += len(scratch)
		for fi, f := range all {
			_, want := f.filter.match(c)
			if want {
				totalMatch++
				if !cand[f.group] {
					t.Fatalf("change %d (%s %s after %v old %v): feed of %v %v %s matches but is no candidate",
						i, c.op, c.table, vals(c.after), vals(c.old), specs[fi].Tables, specs[fi].Ops, whereJSON(t, specs[fi].Where))
				}
			}
			if cand[f.group] && f.filter.hasTable(c.table) {
				require.Equal(t, want, f.group.matches(c), "change %d: group verdict differs from the feed's", i)
			}
		}
	}
	require.Positive(t, totalMatch)
	require.Less(t, totalCands, 3000*len(fs.idx.groups)/2, "the index narrows the groups tested")
}

func whereJSON(t testing.TB, w *Cond) string {
	if w == nil {
		return "(all rows)"
	}
	return mustJSON(t, *w)
}

func vals(r *row) []any {
	if r == nil {
		return nil
	}
	return r.vals
}

// TestGroupsShareAndRemove checks that feeds with one filter share a group
// (tables in any order), that closing feeds keeps the group while one is
// left, and that closing every feed leaves the index empty.
func TestGroupsShareAndRemove(t *testing.T) {
	fs := bareFeeds()
	where := And(Eq("tenant", 1), Or(Gt("amount", 10), Contains("tags", "x"), In("status", "a", "b"))).Ptr()
	f1, err := fs.Register(Filter{Tables: []string{"public.a", "public.b"}, Where: where}, Token{})
	require.NoError(t, err)
	f2, err := fs.Register(Filter{Tables: []string{"public.b", "public.a"}, Where: where, Columns: []string{"id"}}, Token{})
	require.NoError(t, err)
	f3, err := fs.Register(Filter{Tables: []string{"public.a"}, Where: where}, Token{})
	require.NoError(t, err)
	f4, err := fs.Register(Filter{Where: Or(Gt("amount", 10), Lte("amount", 3)).Ptr()}, Token{})
	require.NoError(t, err)
	f5, err := fs.Register(Filter{Where: Ne("status", "x").Ptr()}, Token{})
	require.NoError(t, err)
	require.Same(t, f1.group, f2.group, "the projection does not split a group")
	require.NotSame(t, f1.group, f3.group)
	require.Len(t, fs.idx.groups, 4)
	f1.Close()
	require.Len(t, fs.idx.groups, 4)
	require.Equal(t, []*Feed{f2}, f2.group.feeds)
	for _, f := range []*Feed{f2, f3, f4, f5} {
		f.Close()
	}
	require.Empty(t, fs.idx.groups)
	require.Empty(t, fs.idx.tables, "every index entry is removed with its last feed")
}

// TestRangeIndex checks the bound search at and around each bound, for
// strict and inclusive ranges on both sides, integers beyond 2^53, and
// numbers sent as strings.
func TestRangeIndex(t *testing.T) {
	fs := bareFeeds()
	conds := []Cond{Gt("x", 5), Gte("x", 5), Lt("x", 5), Lte("x", 5), Gt("x", int64(1<<53)), Lt("x", -2.5), Gte("x", 7.25)}
	var feeds []*Feed
	for _, c := range conds {
		f, err := fs.Register(Filter{Where: c.Ptr()}, Token{})
		require.NoError(t, err)
		feeds = append(feeds, f)
	}
	var stamp uint64
	for _, v := range []string{"4", "5", "6", "-2.5", "-3", "7.25", "7.2", `"5.5"`, `"abc"`, "9007199254740993", "null", "true"} {
		rw, err := parseRow([]byte(`{"x":`+v+`}`), nil, 1, nil)
		require.NoError(t, err)
		c := &change{op: cdc.OpInsert, table: "public.t", after: rw}
		stamp++
		cand := map[*group]bool{}
		for _, g := range fs.idx.candidates(c, stamp, nil) {
			cand[g] = true
		}
		for i, f := range feeds {
			_, want := f.filter.match(c)
			if want && !cand[f.group] {
				t.Fatalf("x=%s: %s matches but is no candidate", v, mustJSON(t, conds[i]))
			}
		}
	}
}

// TestIndexSeesNewTables: the index remembers the last change's table;
// registering the first feed of that table, or closing its last one, must
// not leave a stale answer.
func TestIndexSeesNewTables(t *testing.T) {
	fs := bareFeeds()
	rw, err := parseRow([]byte(`{"id":1}`), nil, 1, nil)
	require.NoError(t, err)
	c := &change{op: cdc.OpInsert, table: "public.x", after: rw}
	var stamp uint64
	route := func() []*group { stamp++; return fs.idx.candidates(c, stamp, nil) }
	require.Empty(t, route())
	f, err := fs.Register(Filter{Tables: []string{"public.x"}, Where: Eq("id", 1).Ptr()}, Token{})
	require.NoError(t, err)
	require.Equal(t, []*group{f.group}, route())
	all, err := fs.Register(Filter{Where: Eq("id", 1).Ptr()}, Token{})
	require.NoError(t, err)
	require.ElementsMatch(t, []*group{f.group, all.group}, route())
	f.Close()
	require.Equal(t, []*group{all.group}, route())
	all.Close()
	require.Empty(t, route())
}

// TestNamesShared: rows decoded with the consumer's names table share one
// names slice while their columns are the same, get their own when they
// differ, and read the right values either way.
func TestNamesShared(t *testing.T) {
	nm := newNames()
	parse := func(s string) *row {
		r, err := parseRow([]byte(s), nm, 1, nil)
		require.NoError(t, err)
		return r
	}
	a := parse(`{"id":1,"tenant":2,"status":"x"}`)
	b := parse(`{"id":3,"tenant":4,"status":"y"}`)
	require.Same(t, &a.names[0], &b.names[0], "same columns: one names slice")
	c := parse(`{"id":5,"tenant":6}`)
	require.Equal(t, []string{"id", "tenant"}, c.names)
	require.NotSame(t, &a.names[0], &c.names[0])
	d := parse(`{"id":7,"status":"z","tenant":8}`)
	require.Equal(t, []string{"id", "status", "tenant"}, d.names)
	e := parse(`{"id":7,"status":"z","tenant":8,"extra":true}`)
	require.Equal(t, []string{"id", "status", "tenant", "extra"}, e.names)
	require.Equal(t, []string{"id", "tenant", "status"}, a.names, "a shared slice is never written")
	k, err := parseRow([]byte(`{"id":9}`), nm, 0, nil)
	require.NoError(t, err)
	f := parse(`{"id":7,"status":"z","tenant":8,"extra":false}`)
	require.Same(t, &e.names[0], &f.names[0], "a key between two images does not break their sharing")
	require.Equal(t, []string{"id"}, k.names)

	// The index's remembered positions follow the layouts.
	fs := bareFeeds()
	feed, err := fs.Register(Filter{Where: Eq("tenant", 8).Ptr()}, Token{})
	require.NoError(t, err)
	var stamp uint64
	for i, rw := range []*row{a, b, c, d, e, f, a, d} {
		stamp++
		got := fs.idx.candidates(&change{op: cdc.OpInsert, table: "public.t", after: rw}, stamp, nil)
		want := rw.vals[slices.Index(rw.names, "tenant")] == int64(8)
		require.Equal(t, want, len(got) == 1 && got[0] == feed.group, "row %d %v", i, rw.vals)
	}
}

// TestBeforeSharesUnchangedValues: decoding an update, the before image
// takes the after image's value for a column with the same JSON text (one
// parse, one copy in memory) and its own for a changed one.
func TestBeforeSharesUnchangedValues(t *testing.T) {
	g := newGen("b.src.e1")
	o := order{ID: 1000, Tenant: 2000, Status: "open", Tags: []string{"a", "b"}, Amount: 10}
	o2 := o
	o2.Status, o2.Tags = "paid", []string{"a"}
	c := decodedWith(t, g.tx(upd(o, o2))[0], 1, newNames())
	at := func(r *row, col string) any { v, _ := r.get(col); return v }
	require.Equal(t, "open", at(c.before, "status"))
	require.Equal(t, "paid", at(c.after, "status"))
	require.Equal(t, []any{"a", "b"}, at(c.before, "tags"))
	require.Equal(t, []any{"a"}, at(c.after, "tags"))
	require.Equal(t, int64(2000), at(c.before, "tenant"))
	i := slices.Index(c.after.names, "tenant")
	require.Same(t, &c.after.names[0], &c.before.names[0], "one layout, one names slice")
	require.True(t, c.after.vals[i] == c.before.vals[i])
	type iface struct{ typ, data unsafe.Pointer }
	require.Equal(t, (*iface)(unsafe.Pointer(&c.after.vals[i])).data, (*iface)(unsafe.Pointer(&c.before.vals[i])).data,
		"the unchanged tenant is one value, not a copy")
	j := slices.Index(c.after.names, "tags")
	require.NotEqual(t, (*iface)(unsafe.Pointer(&c.after.vals[j])).data, (*iface)(unsafe.Pointer(&c.before.vals[j])).data)
}
