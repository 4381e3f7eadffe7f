package feeds

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// TestRouteServesOneRoute: in a stream two routes write (each change
// twice, ids ending with @masked and @full), Config.Route serves one
// route's messages only, read live and read back from the stream.
func TestRouteServesOneRoute(t *testing.T) {
	e := newEnv(t, nil)
	twice := func(tx []cdc.Change) [][]cdc.Change {
		var out [][]cdc.Change
		for _, dest := range []string{"masked", "full"} {
			cp := append([]cdc.Change(nil), tx...)
			for i := range cp {
				cp[i].Dest = dest
				cp[i].Subject = "cdc." + dest + "." + cp[i].Table
			}
			out = append(out, cp)
		}
		return out
	}
	fa := e.feeds(Config{Route: "full"})
	f, err := fa.Register(Filter{Tables: []string{"public.orders"}}, Token{})
	require.NoError(t, err)
	e.write(twice(e.gen.tx(ins(order{ID: 1, Tenant: 42}), ins(order{ID: 2, Tenant: 42})))...)
	e.write(twice(e.gen.tx(ins(order{ID: 3, Tenant: 42})))...)
	got, tok := collect(t, f, 3, 20*time.Second)
	require.Equal(t, []uint64{3, 4, 6}, seqs(got), "live: the full route's messages only")
	f.Close()

	// Read back from the stream by a process whose window holds little.
	for i := range 6 {
		e.write(twice(e.gen.tx(ins(order{ID: int64(10 + i), Tenant: 42})))...)
	}
	fb := e.feeds(Config{Route: "full", WindowTxns: 1, Prewarm: 1})
	g, err := fb.Register(Filter{Tables: []string{"public.orders"}}, tok)
	require.NoError(t, err)
	got, _ = collect(t, g, 6, 30*time.Second)
	require.Equal(t, []uint64{8, 10, 12, 14, 16, 18}, seqs(got), "read back: the full route's messages only")
	require.Positive(t, fb.Stats().CatchUps, "served from the stream")
}
