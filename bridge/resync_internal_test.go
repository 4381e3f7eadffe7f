package bridge

import (
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
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
	r, err := NewRouter(&config.Config{Routes: routes}, map[string]int{"a": 0, "b": 1, "c": 2})
	require.NoError(t, err)
	got, err := r.controlDests("shop", cdc.ControlResync)
	require.NoError(t, err)
	require.Equal(t, []controlDest{{sink: 0, subject: "cdc.shop._._control.resync"}, {sink: 1, subject: "all._control.resync"}}, got)

	withCtl := append([]config.Route{{Match: config.Match{Ops: []string{"control"}}, Sinks: []string{"b"}, Subject: "ctl.{{.Source}}.{{.Table}}"}}, routes...)
	r, err = NewRouter(&config.Config{Routes: withCtl}, map[string]int{"a": 0, "b": 1, "c": 2})
	require.NoError(t, err)
	got, err = r.controlDests("shop", cdc.ControlResync)
	require.NoError(t, err)
	require.Equal(t, []controlDest{{sink: 1, subject: "ctl.shop.resync"}}, got)
	// The control route never takes ordinary changes.
	ins := cdc.Change{Source: "shop", Schema: "public", Table: "t", Op: cdc.OpInsert, Rel: &cdc.Relation{}}
	sinks, ok, err := r.Route(&ins)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []int{0, 1}, sinks)
	require.Equal(t, "all.public.t", ins.Subject)

	ctl := cdc.Control{Kind: cdc.ControlResync, Reason: "slot_missing", Source: "shop", OldProducer: "b.shop.e1", Producer: "b.shop.e2", Time: time.Unix(0, 0).UTC()}
	c, err := controlChange(ctl.Producer, "shop", "db", ctl)
	require.NoError(t, err)
	require.Equal(t, "b.shop.e2:0000000000000000:0", c.ID())
	require.Equal(t, uint32(1), c.TxSize)
	var back cdc.Control
	require.NoError(t, json.Unmarshal(c.Payload, &back))
	require.Equal(t, ctl, back)
}

// TestSaveCheckpointAfterLostReply: a Save that landed although its reply
// was lost leaves the pipeline one revision behind; the next save finds
// this process's own write and goes on, while a write by another process
// (another run id) or a newer position still fences.
func TestSaveCheckpointAfterLostReply(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{Host: "127.0.0.1"})
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	store, err := checkpoint.Open(t.Context(), js, "ckpt_test", 1)
	require.NoError(t, err)
	p := &Pipeline{store: store, key: "b.s", run: "runA", log: slog.New(slog.DiscardHandler)}

	rev, err := store.Save(t.Context(), p.key, checkpoint.State{Epoch: "e1", LSN: 100, Run: "runA"}, 0)
	require.NoError(t, err)
	// This save lands, but its reply is "lost": the pipeline keeps rev.
	_, err = store.Save(t.Context(), p.key, checkpoint.State{Epoch: "e1", LSN: 200, Run: "runA"}, rev)
	require.NoError(t, err)
	nrev, err := p.saveCheckpoint(t.Context(), checkpoint.State{Epoch: "e1", LSN: 300, Run: "runA"}, rev)
	require.NoError(t, err, "our own earlier write is no fence")
	st, _, err := store.Load(t.Context(), p.key)
	require.NoError(t, err)
	require.Equal(t, cdc.LSN(300), st.LSN)

	// Another process wrote: fenced.
	_, err = store.Save(t.Context(), p.key, checkpoint.State{Epoch: "e1", LSN: 400, Run: "runB"}, nrev)
	require.NoError(t, err)
	_, err = p.saveCheckpoint(t.Context(), checkpoint.State{Epoch: "e1", LSN: 500, Run: "runA"}, nrev)
	require.ErrorIs(t, err, checkpoint.ErrFenced)
}
