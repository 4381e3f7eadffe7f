package pipeline

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/config"
)

// sliceIter is a cdc.ChangeIter over a slice, handing out at most max
// changes per Next (a spill file's reader hands out what dst holds).
type sliceIter struct {
	cs  []cdc.Change
	max int
}

func (it *sliceIter) Next(dst []cdc.Change) (int, error) {
	n := copy(dst[:min(len(dst), it.max)], it.cs)
	it.cs = it.cs[n:]
	if len(it.cs) == 0 {
		return n, io.EOF
	}
	return n, nil
}
func (it *sliceIter) Close() error { return nil }

// TestRouteHandsOverParts checks that a transaction goes to the writer in
// parts of about chunk changes, whether its changes are held in memory or
// read back from disk: what the pipeline queues must not grow with the
// transaction. Every routed change arrives once, in order, and only the
// last part is marked last. A part held in memory whose changes are all
// routed is handed over in place (no copy); a part with changes filtered
// out is copied and then cleared from the Txn once sent, so the memory of
// what is written can be freed while the rest is routed.
func TestRouteHandsOverParts(t *testing.T) {
	r, err := route.New(&config.Config{Unrouted: "drop", Routes: []config.Route{{Match: config.Match{Tables: []string{"public.t"}}, Sinks: []string{"a"}}}},
		map[string]int{"a": 0}, "")
	require.NoError(t, err)
	p := New(Config{Source: "app", Router: r})
	rel := &cdc.Relation{Schema: "public", Table: "t", Columns: []cdc.Column{{Name: "id", Key: true}}}
	other := &cdc.Relation{Schema: "public", Table: "u", Columns: []cdc.Column{{Name: "id", Key: true}}}
	// mk makes changes from..from+n of a transaction of size changes; with
	// skip > 0, every skip-th one is of table u, which no route takes.
	mk := func(from, n, size, skip int) []cdc.Change {
		cs := make([]cdc.Change, n)
		for i := range cs {
			cs[i] = cdc.Change{Source: "app", Schema: "public", Table: "t", Op: cdc.OpInsert, Rel: rel,
				After: []any{int64(from + i)}, CommitLSN: 99, Seq: uint32(from + i), TxSize: uint32(size)}
			if skip > 0 && (from+i)%skip == 0 {
				cs[i].Table, cs[i].Rel = "u", other
			}
		}
		return cs
	}
	routed := func(size, skip int) int {
		if skip == 0 {
			return size
		}
		return size - (size+skip-1)/skip
	}
	for _, tc := range []struct {
		name            string
		mem, rest, skip int
	}{
		{"small", 10, 0, 0},
		{"exactly a chunk", chunk, 0, 0},
		{"in memory", 4*chunk + 500, 0, 0},
		{"in memory, filtered", 4*chunk + 500, 0, 3},
		{"spilled", 2048, 3*chunk + 7, 0},
		{"spilled, filtered", 2048, 3*chunk + 7, 5},
		{"spilled at a chunk", chunk, chunk, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size := tc.mem + tc.rest
			txn := &cdc.Txn{CommitLSN: 99, Changes: mk(0, tc.mem, size, tc.skip)}
			if tc.rest > 0 {
				txn.Rest = &sliceIter{cs: mk(tc.mem, tc.rest, size, tc.skip), max: chunk}
			}
			held := txn.Changes
			var parts []*txnItem
			require.NoError(t, p.route(t.Context(), p.cur.Load(), txn, "prod", func(it *txnItem) error {
				parts = append(parts, it)
				return nil
			}))
			next, n := 0, 0
			for i, it := range parts {
				require.LessOrEqual(t, len(it.changes), 2*chunk, "part %d", i)
				require.Equal(t, i == len(parts)-1, it.last, "part %d of %d", i, len(parts))
				require.Len(t, it.dests, len(it.changes))
				for _, c := range it.changes {
					require.Equal(t, "t", c.Table, "only routed changes")
					require.Greater(t, int(c.Seq)+1, next, "in order")
					next = int(c.Seq) + 1
					n++
				}
			}
			require.Equal(t, routed(size, tc.skip), n, "every routed change once")
			if tc.mem > chunk {
				require.Greater(t, len(parts), tc.mem/chunk, "the changes in memory go in parts")
				for i := range tc.mem / chunk {
					first := &parts[i].changes[0]
					if tc.skip == 0 {
						require.Same(t, &held[i*chunk], first, "part %d is handed over in place", i)
						continue
					}
					for k := i * chunk; k < (i+1)*chunk; k++ {
						if held[k].Rel != nil {
							require.Failf(t, "a sent change is still held by the Txn", "change %d", k)
						}
					}
				}
			}
		})
	}
}
