package route

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
)

func TestRouterMatchesAndRendersSubjects(t *testing.T) {
	cfg := &config.Config{Unrouted: "drop", Routes: []config.Route{
		{Match: config.Match{Tables: []string{"public.orders"}, Ops: []string{"delete"}}, Sinks: []string{"b"}, Subject: "del.{{.Table}}"},
		{Match: config.Match{Tables: []string{"public.order*"}}, Sinks: []string{"a", "b"}, Subject: "cdc.{{.Source}}.{{.Col.tenant}}.{{.Table}}.{{.Key.id}}"},
		{Match: config.Match{Ops: []string{"message"}}, Sinks: []string{"a"}, Subject: "msg.{{.Table}}"},
	}}
	r, err := New(cfg, map[string]int{"a": 0, "b": 1}, "")
	require.NoError(t, err)
	rel := &cdc.Relation{Schema: "public", Table: "orders", Columns: []cdc.Column{{Name: "id", Key: true}, {Name: "tenant"}}}
	ins := cdc.Change{Source: "shop", Schema: "public", Table: "orders", Op: cdc.OpInsert, Rel: rel, After: []any{int64(7), "acme.eu *x"}}
	sinks, ok, err := r.Route(&ins)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []int{0, 1}, sinks)
	require.Equal(t, "cdc.shop.acme_eu__x.orders.7", ins.Subject, "column values are made subject-safe")
	require.NotEmpty(t, ins.Payload)

	del := cdc.Change{Source: "shop", Schema: "public", Table: "orders", Op: cdc.OpDelete, Rel: rel, Before: []any{int64(7), cdc.Absent}}
	sinks, ok, err = r.Route(&del)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []int{1}, sinks)
	require.Equal(t, "del.orders", del.Subject)

	msg := cdc.Change{Source: "shop", Op: cdc.OpMessage, Prefix: "audit.log"}
	_, ok, err = r.Route(&msg)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "msg.audit_log", msg.Subject)

	other := cdc.Change{Source: "shop", Schema: "public", Table: "users", Op: cdc.OpInsert, Rel: rel, After: []any{int64(1), nil}}
	_, ok, err = r.Route(&other)
	require.NoError(t, err)
	require.False(t, ok, "unrouted changes are dropped")

	cfg.Unrouted = "error"
	r, err = New(cfg, map[string]int{"a": 0, "b": 1}, "")
	require.NoError(t, err)
	_, _, err = r.Route(&other)
	require.ErrorContains(t, err, "no route matches insert public.users")

	// A NULL column renders "_"; a column the table lacks is an error naming the route.
	nul := cdc.Change{Source: "shop", Schema: "public", Table: "orders", Op: cdc.OpInsert, Rel: rel, After: []any{int64(8), nil}}
	_, _, err = r.Route(&nul)
	require.NoError(t, err)
	require.Equal(t, "cdc.shop._.orders.8", nul.Subject)
	rel2 := &cdc.Relation{Schema: "public", Table: "orderlines", Columns: []cdc.Column{{Name: "id", Key: true}}}
	bad := cdc.Change{Source: "shop", Schema: "public", Table: "orderlines", Op: cdc.OpInsert, Rel: rel2, After: []any{int64(1)}}
	_, _, err = r.Route(&bad)
	require.ErrorContains(t, err, `routes[1].subject for public.orderlines (insert at commit LSN 0/0, change 1 of the transaction): column "tenant" ({{.Col.tenant}}) is not a column of public.orderlines (its columns: id)`)

	// {{.Key.x}} of a column outside the key names the key.
	rel3 := &cdc.Relation{Schema: "public", Table: "orders", Columns: []cdc.Column{{Name: "no", Key: true}, {Name: "id"}, {Name: "tenant"}}}
	nokey := cdc.Change{Source: "shop", Schema: "public", Table: "orders", Op: cdc.OpInsert, Rel: rel3, After: []any{int64(1), int64(2), "a"}}
	_, _, err = r.Route(&nokey)
	require.ErrorContains(t, err, `column "id" ({{.Key.id}}) is not part of the key of public.orders (its key: no); write {{.Col.id}}`)

	// A change without a row renders the columns as "_".
	trunc := cdc.Change{Source: "shop", Schema: "public", Table: "orders", Op: cdc.OpTruncate, Rel: rel}
	_, ok, err = r.Route(&trunc)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "cdc.shop._.orders._", trunc.Subject)
}

func TestRowRefs(t *testing.T) {
	cols, keys := RowRefs("a.{{.Col.tenant}}.{{.Key.id}}.{{.Col.tenant}}.{{ .Col.region }}")
	require.Equal(t, []string{"tenant", "region"}, cols)
	require.Equal(t, []string{"id"}, keys)
}

func TestRouterRejectsBadTemplates(t *testing.T) {
	for name, subj := range map[string]string{
		"unknown field": "cdc.{{.Tabel}}",
		"unclosed":      "cdc.{{.Table",
		"wildcard":      "cdc.*.{{.Table}}",
	} {
		t.Run(name, func(t *testing.T) {
			cfg := &config.Config{Routes: []config.Route{{Sinks: []string{"a"}, Subject: subj}}}
			_, err := New(cfg, map[string]int{"a": 0}, "")
			require.ErrorContains(t, err, "routes[0].subject")
		})
	}
}

// TestRouterConsumesContext: a trace context message is consumed,
// even with unrouted: error, unless the first route matching it lists
// message in match.ops.
func TestRouterConsumesContext(t *testing.T) {
	ctxMsg := func() *cdc.Change {
		return &cdc.Change{Source: "shop", Op: cdc.OpMessage, Prefix: "traceparent", Content: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}
	}
	for _, c := range []struct {
		name   string
		routes []config.Route
		routed bool
	}{
		{"catch-all route", []config.Route{{Sinks: []string{"a"}}}, false},
		{"tables only, unrouted error", []config.Route{{Match: config.Match{Tables: []string{"public.*"}}, Sinks: []string{"a"}}}, false},
		{"a route asks for messages", []config.Route{
			{Match: config.Match{Tables: []string{"public.*"}}, Sinks: []string{"a"}},
			{Match: config.Match{Ops: []string{"message"}}, Sinks: []string{"a"}},
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := New(&config.Config{Unrouted: "error", Routes: c.routes}, map[string]int{"a": 0}, "traceparent")
			require.NoError(t, err)
			_, ok, err := r.Route(ctxMsg())
			require.NoError(t, err)
			require.Equal(t, c.routed, ok)
			// With tracing off the message is an ordinary one.
			r, err = New(&config.Config{Unrouted: "error", Routes: c.routes}, map[string]int{"a": 0}, "")
			require.NoError(t, err)
			_, ok, err = r.Route(ctxMsg())
			if c.name == "tables only, unrouted error" {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
				require.True(t, ok)
			}
		})
	}
}
