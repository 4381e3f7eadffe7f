package pipeline

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/config"
)

// TestRouteFansOut checks that with continue routes every change goes to
// the writer once per destination, held in memory or read back from disk,
// each copy with its route's subject and id, and that within each part a
// destination's copies are contiguous and in commit order (so a sink
// publishing transactions atomically gets each route's copy whole).
func TestRouteFansOut(t *testing.T) {
	r, err := route.New(&config.Config{Unrouted: "drop", Routes: []config.Route{
		{Name: "masked", Continue: true, Subject: "masked.{{.Table}}", Sinks: []string{"a"}, Mask: []config.Mask{{Redact: []string{"email"}}}},
		{Name: "full", Continue: true, Subject: "full.{{.Table}}", Sinks: []string{"a"}},
		{Subject: "kv.{{.Table}}", Sinks: []string{"b"}},
	}}, map[string]int{"a": 0, "b": 1}, "")
	require.NoError(t, err)
	p := New(Config{Source: "app", Router: r})
	rel := &cdc.Relation{Schema: "public", Table: "t", Columns: []cdc.Column{{Name: "id", Key: true}, {Name: "email"}}}
	mk := func(from, n, size int) []cdc.Change {
		cs := make([]cdc.Change, n)
		for i := range cs {
			cs[i] = cdc.Change{Source: "app", Schema: "public", Table: "t", Op: cdc.OpInsert, Rel: rel,
				After: []any{int64(from + i), "x@example.com"}, CommitLSN: 99, Seq: uint32(from + i), TxSize: uint32(size)}
		}
		return cs
	}
	dests := map[string]struct {
		subject string
		sinks   []int
	}{"masked": {"masked.t", []int{0}}, "full": {"full.t", []int{0}}, "": {"kv.t", []int{1}}}
	for _, tc := range []struct {
		name      string
		mem, rest int
	}{
		{"small", 3, 0},
		{"in memory", 2*chunk + 10, 0},
		{"spilled", 500, chunk + 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size := tc.mem + tc.rest
			txn := &cdc.Txn{CommitLSN: 99, Changes: mk(0, tc.mem, size)}
			if tc.rest > 0 {
				txn.Rest = &sliceIter{cs: mk(tc.mem, tc.rest, size), max: chunk}
			}
			var parts []*txnItem
			require.NoError(t, p.route(t.Context(), p.cur.Load(), txn, "prod", func(it *txnItem) error {
				parts = append(parts, it)
				return nil
			}))
			next := map[string]int{}
			ids := map[string]bool{}
			for i, it := range parts {
				require.Equal(t, i == len(parts)-1, it.last, "part %d of %d", i, len(parts))
				require.Len(t, it.dests, len(it.changes))
				done := map[string]bool{} // destinations whose run in this part ended
				prev := ""
				for j, c := range it.changes {
					want, ok := dests[c.Dest]
					require.True(t, ok, "unknown destination %q", c.Dest)
					require.Equal(t, want.subject, c.Subject)
					require.Equal(t, want.sinks, it.dests[j])
					if j > 0 && c.Dest != prev {
						done[prev] = true
					}
					require.False(t, done[c.Dest], "part %d: destination %q's changes are not contiguous", i, c.Dest)
					prev = c.Dest
					require.Equal(t, next[c.Dest], int(c.Seq), "destination %q in commit order, each change once", c.Dest)
					next[c.Dest]++
					if c.Dest == "masked" {
						require.Nil(t, c.After[1], "masked copy")
					} else {
						require.Equal(t, "x@example.com", c.After[1], "the %q copy is the row as committed", c.Dest)
					}
					require.False(t, ids[c.ID()], "id %s twice", c.ID())
					ids[c.ID()] = true
				}
			}
			for d := range dests {
				require.Equal(t, size, next[d], "destination %q has every change", d)
			}
		})
	}
}
