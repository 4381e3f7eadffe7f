package route

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
)

// TestControlDests: without a control route every sink of the source's
// routes gets one copy on its first route's subject (row values as "_");
// a route listing ops: [control] decides alone; routes of other sources
// are left out; the payload is the Control JSON whatever the format.
func TestControlDests(t *testing.T) {
	routes := []config.Route{
		{Match: config.Match{Sources: []string{"other"}}, Sinks: []string{"c"}, Subject: "x.{{.Table}}"},
		{Match: config.Match{Tables: []string{"public.orders"}}, Sinks: []string{"a"}, Subject: "cdc.{{.Source}}.{{.Col.tenant}}.{{.Schema}}.{{.Table}}", Format: "debezium"},
		{Match: config.Match{Tables: []string{"public.*"}}, Sinks: []string{"a", "b"}, Subject: "all.{{.Schema}}.{{.Table}}"},
	}
	r, err := New(&config.Config{Routes: routes}, map[string]int{"a": 0, "b": 1, "c": 2}, "")
	require.NoError(t, err)
	got, err := r.ControlDests("shop", cdc.ControlResync)
	require.NoError(t, err)
	require.Equal(t, []ControlDest{{Sink: 0, Subject: "cdc.shop._._control.resync"}, {Sink: 1, Subject: "all._control.resync"}}, got)

	withCtl := append([]config.Route{{Match: config.Match{Ops: []string{"control"}}, Sinks: []string{"b"}, Subject: "ctl.{{.Source}}.{{.Table}}"}}, routes...)
	r, err = New(&config.Config{Routes: withCtl}, map[string]int{"a": 0, "b": 1, "c": 2}, "")
	require.NoError(t, err)
	got, err = r.ControlDests("shop", cdc.ControlResync)
	require.NoError(t, err)
	require.Equal(t, []ControlDest{{Sink: 1, Subject: "ctl.shop.resync"}}, got)
	// The control route never takes ordinary changes.
	ins := cdc.Change{Source: "shop", Schema: "public", Table: "t", Op: cdc.OpInsert, Rel: &cdc.Relation{}}
	sinks, ok, err := r.Route(&ins)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []int{0, 1}, sinks)
	require.Equal(t, "all.public.t", ins.Subject)

	ctl := cdc.Control{Kind: cdc.ControlResync, Reason: "slot_missing", Source: "shop", OldProducer: "b.shop.e1", Producer: "b.shop.e2", Time: time.Unix(0, 0).UTC()}
	c, err := ctl.Change(ctl.Producer, "shop", "db")
	require.NoError(t, err)
	require.Equal(t, "b.shop.e2:0000000000000000:0", c.ID())
	require.Equal(t, uint32(1), c.TxSize)
	var back cdc.Control
	require.NoError(t, json.Unmarshal(c.Payload, &back))
	require.Equal(t, ctl, back)
}
