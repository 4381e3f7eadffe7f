package route

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/wasmtest"
)

func wasmOf(t testing.TB, path, fn string) config.WASM {
	return config.WASM{Module: path, SHA256: wasmtest.SHA256(t, path), Function: fn, Timeout: time.Minute}
}

func guestModule(t testing.TB) string {
	return wasmtest.GoModule(t, filepath.Join("..", "wasm", "testdata", "guest"))
}

// TestWASMSeesThePublishedRow: a module gets the change as the route
// publishes it, in the native format: a column the route leaves out is
// absent, a masked one masked, and listed as masked.
func TestWASMSeesThePublishedRow(t *testing.T) {
	t.Parallel()
	r := newRouter(t, "drop", config.Route{
		Columns:       []config.Columns{{Exclude: []string{"email"}}},
		Mask:          []config.Mask{{Redact: []string{"note"}}},
		WASMTransform: wasmOf(t, guestModule(t), "echo"), // returns its input
	})
	c := change(cdc.OpUpdate, orders, nil, orderRow(7, "paid", "150.25"))
	_, ok, err := r.Route(c)
	require.NoError(t, err)
	require.True(t, ok)
	m := payload(t, c)
	after := m["after"].(map[string]any)
	require.NotContains(t, after, "email")
	require.Nil(t, after["note"])
	require.Equal(t, "paid", after["status"])
	require.Equal(t, map[string]any{"note": "redact"}, m["masked"])
	require.NotContains(t, string(c.Payload), "ann@example.com")
}

// TestWASMFilterFallsThrough: the AssemblyScript example takes paid
// orders; a change it rejects goes on to the next route as committed
// (the first route's shaping undone), as a CEL filter's does, and is no
// unrouted error.
func TestWASMFilterFallsThrough(t *testing.T) {
	t.Parallel()
	r := newRouter(t, "error",
		config.Route{Sinks: []string{"a"}, Columns: []config.Columns{{Exclude: []string{"email"}}}, WASMFilter: wasmOf(t, wasmtest.ASFilter(t), "")},
		config.Route{Sinks: []string{"b"}, Match: config.Match{Ops: []string{"update"}}},
	)
	paid := change(cdc.OpUpdate, orders, nil, orderRow(7, "paid", "150.25"))
	sinks, ok, err := r.Route(paid)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []int{0}, sinks)
	require.NotContains(t, payload(t, paid)["after"], "email")

	open := change(cdc.OpUpdate, orders, nil, orderRow(8, "open", "150.25"))
	sinks, ok, err = r.Route(open)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []int{1}, sinks)
	require.Equal(t, "ann@example.com", payload(t, open)["after"].(map[string]any)["email"], "the second route publishes the row as committed")

	del := change(cdc.OpDelete, orders, orderRow(9, "paid", "1"), nil)
	_, ok, err = r.Route(del)
	require.NoError(t, err, "rejected by the filter, taken by no route: dropped, not an unrouted error")
	require.False(t, ok)
}

// TestWASMTransform: the Go example's body replaces the payload, its keys
// fill {{.Out.x}}, a draft is dropped (with continue, the next route still
// takes it), and a module's error names the route, the table and the LSN.
func TestWASMTransform(t *testing.T) {
	t.Parallel()
	gt := wasmtest.GoTransform(t)
	r := newRouter(t, "error", config.Route{
		WASMTransform: wasmOf(t, gt, ""),
		Subject:       "events.{{.Out.event}}.{{.Key.id}}",
	})
	c := change(cdc.OpUpdate, orders, nil, orderRow(7, "paid", "150.25"))
	_, ok, err := r.Route(c)
	require.NoError(t, err)
	require.True(t, ok)
	require.JSONEq(t, `{"event":"order.update","order_id":7,"status":"paid","total_cents":15025}`, string(c.Payload))
	require.Equal(t, "events.order_update.7", c.Subject)

	draft := change(cdc.OpUpdate, orders, nil, orderRow(8, "draft", "1"))
	_, ok, err = r.Route(draft)
	require.NoError(t, err, "a drop is deliberate: no unrouted error")
	require.False(t, ok)

	fan := newRouter(t, "drop",
		config.Route{Name: "events", Continue: true, WASMTransform: wasmOf(t, gt, "")},
		config.Route{Name: "mirror", Sinks: []string{"b"}},
	)
	var dests []string
	n, err := fan.Each(change(cdc.OpUpdate, orders, nil, orderRow(8, "draft", "1")), func(d *cdc.Change, sinks []int) error {
		dests = append(dests, d.Dest)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"mirror"}, dests)

	bad := newRouter(t, "drop", config.Route{WASMTransform: wasmOf(t, guestModule(t), "refuse")})
	_, _, err = bad.Route(change(cdc.OpInsert, orders, nil, orderRow(9, "paid", "1")))
	require.ErrorContains(t, err, "routes[0].wasm_transform on public.orders (insert at commit LSN 0/16B37A0, change 3 of the transaction): wasm module ")
	require.ErrorContains(t, err, "refuse failed the change (returned -1): refused: the order has no customer")

	trap := newRouter(t, "drop", config.Route{WASMFilter: wasmOf(t, guestModule(t), "boom")})
	_, _, err = trap.Route(change(cdc.OpInsert, orders, nil, orderRow(9, "paid", "1")))
	require.ErrorContains(t, err, "routes[0].wasm_filter on public.orders (insert at commit LSN 0/16B37A0, change 3 of the transaction): wasm module ")
	require.ErrorContains(t, err, "boom trapped: wasm error: unreachable: panic: boom")
}

// TestWASMLoadErrors: a module is checked when the routes compile, each
// problem at its YAML path.
func TestWASMLoadErrors(t *testing.T) {
	t.Parallel()
	g := guestModule(t)
	w := wasmOf(t, g, "")
	w.SHA256 = strings.Repeat("a", 64)
	_, err := New(&config.Config{Routes: []config.Route{
		{Sinks: []string{"a"}},
		{Sinks: []string{"a"}, WASMFilter: w, WASMTransform: wasmOf(t, g, "")},
	}}, map[string]int{"a": 0}, "")
	require.ErrorContains(t, err, "routes[1].wasm_filter.sha256: "+g+" has sha256 "+wasmtest.SHA256(t, g)+`, not the pinned "aaaa`)
	require.ErrorContains(t, err, `routes[1].wasm_transform.module: `+g+` does not export "transform" (exports: `)
}

// benchRoute routes one ten-column update through r per iteration.
func benchRoute(b *testing.B, r *Router, wantOK bool) {
	rows := orderRow(7, "paid", "150.25")
	b.ReportAllocs()
	for b.Loop() {
		c := change(cdc.OpUpdate, orders, nil, rows)
		_, ok, err := r.Route(c)
		if err != nil || ok != wantOK {
			b.Fatal(ok, err)
		}
	}
}

func benchRouter(b *testing.B, rc config.Route) *Router {
	rc.Sinks = []string{"a"}
	r, err := New(&config.Config{Unrouted: "drop", Routes: []config.Route{rc}}, map[string]int{"a": 0}, "")
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// BenchmarkRouteFilter routes and encodes (native) one change through a
// route that filters it: the filter `after.status == "paid"` in CEL, and
// the same in the AssemblyScript example. The difference to
// BenchmarkRouteFilter/none is the filter's cost per change.
func BenchmarkRouteFilter(b *testing.B) {
	b.Run("none", func(b *testing.B) { benchRoute(b, benchRouter(b, config.Route{}), true) })
	b.Run("cel", func(b *testing.B) {
		benchRoute(b, benchRouter(b, config.Route{Filter: `after.status == "paid"`}), true)
	})
	b.Run("wasm-assemblyscript", func(b *testing.B) {
		benchRoute(b, benchRouter(b, config.Route{WASMFilter: wasmOf(b, wasmtest.ASFilter(b), "")}), true)
	})
}

// BenchmarkRouteTransform: the Go example's event built in CEL and by the
// Go module.
func BenchmarkRouteTransform(b *testing.B) {
	b.Run("cel", func(b *testing.B) {
		benchRoute(b, benchRouter(b, config.Route{Match: config.Match{Ops: []string{"insert", "update"}}, Transform: `{"event": "order." + op, "order_id": key.id, "status": after.status, "total_cents": int(after.total * 100.0)}`}), true)
	})
	b.Run("wasm-go", func(b *testing.B) {
		benchRoute(b, benchRouter(b, config.Route{WASMTransform: wasmOf(b, wasmtest.GoTransform(b), "")}), true)
	})
}
