package route

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
)

type dest struct {
	c     cdc.Change
	sinks []int
}

func each(t *testing.T, r *Router, c *cdc.Change) []dest {
	t.Helper()
	var out []dest
	n, err := r.Each(c, func(d *cdc.Change, sinks []int) error {
		out = append(out, dest{*d, sinks})
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, len(out), n)
	return out
}

// TestEachFansOut: a route with continue publishes a change and lets the
// routes after it take it too, each with its own shaping, subject, format
// and sinks, from the change as committed; the first route without
// continue ends it; each destination's id names its route.
func TestEachFansOut(t *testing.T) {
	r := newRouter(t, "error",
		config.Route{Name: "masked", Continue: true, Subject: "masked.{{.Table}}", Sinks: []string{"a"},
			Mask: []config.Mask{{Redact: []string{"email"}}}},
		config.Route{Name: "paid", Continue: true, Subject: "paid.{{.Table}}", Sinks: []string{"a"}, Filter: `after.status == "paid"`,
			Columns: []config.Columns{{Include: []string{"status"}}}},
		config.Route{Name: "mirror", Subject: "full.{{.Table}}", Sinks: []string{"b"}, Format: "debezium"},
		config.Route{Name: "never", Subject: "never.{{.Table}}", Sinks: []string{"a"}},
	)
	require.True(t, r.Fanout())
	c := change(cdc.OpInsert, orders, nil, orderRow(7, "paid", "10"))
	committed := *c
	ds := each(t, r, c)
	require.Len(t, ds, 3, "masked, paid and mirror take it; never comes after a route without continue")
	require.Equal(t, committed, *c, "Each leaves the change as committed")

	require.Equal(t, "masked.orders", ds[0].c.Subject)
	require.Equal(t, []int{0}, ds[0].sinks)
	require.Nil(t, payload(t, &ds[0].c)["after"].(map[string]any)["email"], "masked route redacts email")
	require.Equal(t, "b.shop.e1:00000000016B37A0:2@masked", ds[0].c.ID())

	require.Equal(t, "paid.orders", ds[1].c.Subject)
	require.Len(t, ds[1].c.After, 2, "paid route publishes id and status only")
	require.Equal(t, "b.shop.e1:00000000016B37A0:2@paid", ds[1].c.ID())

	require.Equal(t, "full.orders", ds[2].c.Subject)
	require.Equal(t, []int{1}, ds[2].sinks)
	require.Equal(t, "ann@example.com", ds[2].c.After[3], "the mirror gets the row as committed, after the masking route")
	require.Contains(t, string(ds[2].c.Payload), `"payload"`, "debezium envelope")
	require.Equal(t, "b.shop.e1:00000000016B37A0:2@mirror", ds[2].c.ID())

	ids := map[string]bool{}
	pos := map[cdc.Pos]bool{}
	for _, d := range ds {
		ids[d.c.ID()], pos[d.c.Pos()] = true, true
	}
	require.Len(t, ids, 3, "one id per destination")
	require.Len(t, pos, 3, "one position per destination")

	// A change the paid filter rejects skips that route and goes on.
	open := change(cdc.OpInsert, orders, nil, orderRow(8, "open", "10"))
	ds = each(t, r, open)
	require.Len(t, ds, 2)
	require.Equal(t, "masked", ds[0].c.Dest)
	require.Equal(t, "mirror", ds[1].c.Dest)

	// Unrouted: error still holds when no route takes a change.
	other := &cdc.Change{Source: "shop", Schema: "public", Table: "users", Op: cdc.OpInsert}
	r2 := newRouter(t, "error", config.Route{Name: "x", Continue: true, Match: config.Match{Tables: []string{"public.orders"}}})
	_, err := r2.Each(other, func(*cdc.Change, []int) error { return nil })
	require.ErrorContains(t, err, "no route matches insert public.users")
}

// TestFirstMatchStaysDefault: without continue a change has one
// destination, the first route that takes it, whether routed with Route
// or Each, and an unnamed route's id keeps its form.
func TestFirstMatchStaysDefault(t *testing.T) {
	r := newRouter(t, "drop",
		config.Route{Subject: "one.{{.Table}}", Sinks: []string{"a"}},
		config.Route{Subject: "two.{{.Table}}", Sinks: []string{"b"}},
	)
	require.False(t, r.Fanout())
	c := change(cdc.OpInsert, orders, nil, orderRow(7, "paid", "10"))
	ds := each(t, r, c)
	require.Len(t, ds, 1)
	require.Equal(t, "one.orders", ds[0].c.Subject)
	require.Equal(t, "b.shop.e1:00000000016B37A0:2", ds[0].c.ID())
	sinks, ok, err := r.Route(c)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []int{0}, sinks)
	require.Equal(t, "", c.Dest)
}
