package feeds

import (
	"encoding/json"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// headersOf is the headers the natsjs sink sets on c, as far as the
// consumer reads them.
func headersOf(c cdc.Change) nats.Header {
	h := nats.Header{}
	h.Set(headerMsgID, c.ID())
	if c.TxSize > 0 {
		h.Set(headerTxSize, strconv.Itoa(int(c.TxSize)))
	}
	if c.Table != "" {
		h.Set(headerTable, c.Schema+"."+c.Table)
	}
	h.Set(headerOp, string(c.Op))
	return h
}

// decoded turns a generated change into what the consumer decodes from
// the stream, with the headers the natsjs sink sets.
func decoded(t testing.TB, c cdc.Change, seq uint64) *change {
	t.Helper()
	return decodedWith(t, c, seq, nil)
}

// decodedWith is decoded with the consumer's names table.
func decodedWith(t testing.TB, c cdc.Change, seq uint64, nm *names) *change {
	t.Helper()
	h := headersOf(c)
	d, err := decode(seq, h, c.Payload, nm)
	require.NoError(t, err)
	return d
}

func strp(s string) *string { return &s }

func TestFilterKinds(t *testing.T) {
	g := newGen("b.src.e1")
	o := order{ID: 7, Tenant: 42, Status: "open", Tags: []string{"a", "b", "c"}, Amount: 100, Note: nil}
	insert := decoded(t, g.tx(ins(o))[0], 1)
	cases := []struct {
		name  string
		where Cond
		want  bool
	}{
		{"eq int", Eq("tenant", 42), true},
		{"eq int float form", Eq("tenant", 42.0), true},
		{"eq miss", Eq("tenant", 43), false},
		{"eq string", Eq("status", "open"), true},
		{"ne", Ne("status", "paid"), true},
		{"ne null never", Ne("note", "x"), false},
		{"in", In("status", "paid", "open"), true},
		{"in miss", In("status", "paid", "void"), false},
		{"contains", Contains("tags", "a", "c"), true},
		{"contains miss", Contains("tags", "a", "z"), false},
		{"contains on scalar", Contains("status", "open"), false},
		{"lt numeric string vs number", Lt("amount", 101), true},
		{"lte", Lte("amount", 100.5), true},
		{"gt", Gt("amount", 100.5), false},
		{"gte", Gte("id", 7), true},
		{"range on strings", Gte("status", "o"), true},
		{"is null", IsNull("note"), true},
		{"not null", NotNull("note"), false},
		{"not null status", NotNull("status"), true},
		{"missing column is unknown", Eq("nope", 1), false},
		{"and", And(Eq("tenant", 42), In("status", "open")), true},
		{"and miss", And(Eq("tenant", 42), In("status", "paid")), false},
		{"or", Or(Eq("tenant", 1), Eq("status", "open")), true},
		{"or miss", Or(Eq("tenant", 1), Eq("status", "x")), false},
		{"not", Not(Eq("tenant", 1)), true},
		{"not of unknown is unknown", Not(Eq("nope", 1)), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cf, err := compile(Filter{Where: tc.where.Ptr()})
			require.NoError(t, err)
			_, ok := cf.match(insert)
			require.Equal(t, tc.want, ok)
			// The JSON form round-trips to the same verdict.
			b, err := json.Marshal(tc.where)
			require.NoError(t, err)
			back, err := ParseCond(b)
			require.NoError(t, err, string(b))
			cf2, err := compile(Filter{Where: &back})
			require.NoError(t, err)
			_, ok2 := cf2.match(insert)
			require.Equal(t, tc.want, ok2, string(b))
		})
	}
}

func TestFilterTablesAndOps(t *testing.T) {
	g := newGen("b.src.e1")
	o := order{ID: 1, Tenant: 1, Status: "open"}
	c := decoded(t, g.tx(ins(o))[0], 1)
	for _, tc := range []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{Tables: []string{"public.orders"}}, true},
		{Filter{Tables: []string{"public.items"}}, false},
		{Filter{Ops: []cdc.Op{cdc.OpInsert}}, true},
		{Filter{Ops: []cdc.Op{cdc.OpDelete, cdc.OpUpdate}}, false},
	} {
		cf, err := compile(tc.f)
		require.NoError(t, err)
		_, ok := cf.match(c)
		require.Equal(t, tc.want, ok, "%+v", tc.f)
	}
	_, err := compile(Filter{Ops: []cdc.Op{cdc.OpTruncate}})
	require.ErrorContains(t, err, "filter.ops")
	_, err = compile(Filter{Tables: []string{"orders"}})
	require.ErrorContains(t, err, "schema.table")
}

// TestMoves: an update is matched on both images; with a before image
// that lacks the filter's column (default replica identity) only the new
// row can be judged.
func TestMoves(t *testing.T) {
	g := newGen("b.src.e1")
	a := order{ID: 1, Tenant: 1, Status: "open"}
	b := a
	b.Tenant = 2
	cf, err := compile(Filter{Where: Eq("tenant", 2).Ptr()})
	require.NoError(t, err)
	cfOld, err := compile(Filter{Where: Eq("tenant", 1).Ptr()})
	require.NoError(t, err)

	moveIn := decoded(t, g.tx(upd(a, b))[0], 1)
	k, ok := cf.match(moveIn)
	require.True(t, ok)
	require.Equal(t, kindIn, k)
	k, ok = cfOld.match(moveIn)
	require.True(t, ok)
	require.Equal(t, kindOut, k)

	stay := decoded(t, g.tx(upd(b, b))[0], 2)
	k, ok = cf.match(stay)
	require.True(t, ok)
	require.Equal(t, kindAsIs, k)
	_, ok = cfOld.match(stay)
	require.False(t, ok)

	// The moved-out change carries the old row under the old key, no after.
	js, _ := moveIn.serialise(cfOld.proj0(), kindOut, new(atomic.Int64))
	var m map[string]any
	require.NoError(t, json.Unmarshal(js, &m))
	require.Equal(t, "delete", m["op"])
	require.Equal(t, "out", m["moved"])
	require.Nil(t, m["after"])
	require.Equal(t, float64(1), m["before"].(map[string]any)["tenant"])

	// Default replica identity: the update carries no before image. The
	// key did not change, so key filters are judged on both sides; other
	// columns only on the new row.
	itemUpd := g.tx(op{op: cdc.OpUpdate, rel: itemsRel, after: []any{int64(5), int64(9), "x"}})[0]
	iu := decoded(t, itemUpd, 3)
	for _, tc := range []struct {
		where Cond
		ok    bool
		k     kind
	}{
		{Eq("tenant", 9), true, kindAsIs},
		{Eq("tenant", 8), false, 0}, // a move out of tenant 8 cannot be seen
		{Eq("id", 5), true, kindAsIs},
		{Eq("id", 6), false, 0},
	} {
		cf, err := compile(Filter{Where: tc.where.Ptr()})
		require.NoError(t, err)
		k, ok := cf.match(iu)
		require.Equal(t, tc.ok, ok, "%+v", tc.where)
		require.Equal(t, tc.k, k)
	}
	// A delete under the default identity carries the key only.
	id := decoded(t, g.tx(op{op: cdc.OpDelete, rel: itemsRel, before: []any{int64(5), cdc.Absent, cdc.Absent}})[0], 4)
	for _, tc := range []struct {
		where Cond
		ok    bool
	}{{Eq("id", 5), true}, {Eq("tenant", 9), false}} {
		cf, err := compile(Filter{Where: tc.where.Ptr()})
		require.NoError(t, err)
		_, ok := cf.match(id)
		require.Equal(t, tc.ok, ok, "%+v", tc.where)
	}
}

func (f *compiled) proj0() *projection { return &projection{id: 99} }

func TestParseCondErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"eq": ["a"]}`, "where.eq"},
		{`{"and": [{"eq": ["a", 1]}, {"bogus": 1}]}`, "where.and[1]"},
		{`{"in": ["a", []]}`, "where.in[1]"},
		{`{"eq": ["a", 1], "ne": ["a", 2]}`, "exactly one key"},
		{`[1]`, "want an object"},
	} {
		_, err := ParseCond([]byte(tc.in))
		require.ErrorContains(t, err, tc.want, tc.in)
	}
}

func TestParseRow(t *testing.T) {
	r, err := parseRow([]byte(` {"a" : 1, "b":"x\"y", "c":[1,"z",[2]], "d":{"k":[1,{"x":"}"}]}, "e":null, "f":true, "g":1.5e3} `), nil, 1, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c", "d", "e", "f", "g"}, r.names)
	require.Equal(t, int64(1), r.vals[0])
	require.Equal(t, `x"y`, r.vals[1])
	require.Equal(t, []any{int64(1), "z", []any{int64(2)}}, r.vals[2])
	require.Equal(t, `{"k":[1,{"x":"}"}]}`, r.vals[3])
	require.Nil(t, r.vals[4])
	require.Equal(t, true, r.vals[5])
	require.Equal(t, int64(1500), r.vals[6])
	_, err = parseRow([]byte(`{"a":`), nil, 1, nil)
	require.Error(t, err)
}

// TestValidNumber: the decoder accepts exactly JSON's numbers.
func TestValidNumber(t *testing.T) {
	for s, want := range map[string]bool{
		"0": true, "-1": true, "1.5": true, "1e3": true, "1.5E-3": true, "-0.0e+0": true,
		"-": false, "1.": false, ".5": false, "1e": false, "1e+": false, "12a": false, "": false, "+1": false,
	} {
		require.Equal(t, want, validNumber([]byte(s)), "%q", s)
	}
}
