package pipeline

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/snapshot"
	"github.com/bridgecdc/bridge/config"
)

// failFrom is a sinks.Sink that accepts batches until one holds a change
// at or after commit LSN from, and fails that one.
type failFrom struct{ from cdc.LSN }

func (s *failFrom) Connect(context.Context) error { return nil }
func (s *failFrom) Close(context.Context) error   { return nil }
func (s *failFrom) Write(_ context.Context, batch []cdc.Change) error {
	for _, c := range batch {
		if s.from != 0 && c.CommitLSN >= s.from {
			return errors.New("destination down")
		}
	}
	return nil
}

// TestSinkWrittenShowsTheSinkHoldingTheSlot: when one sink fails, the
// checkpoint stops at what every sink holds, and SinkWritten
// (bridge_sink_written_lsn) shows which sink is behind; a sink that is
// given nothing of a transaction counts as holding it.
func TestSinkWrittenShowsTheSinkHoldingTheSlot(t *testing.T) {
	p := New(Config{Source: "app", Shutdown: time.Second, Sinks: []Sink{
		{Name: "stream", Sink: &failFrom{}, Batch: config.Batch{MaxChanges: 1, MaxWait: time.Millisecond}},
		{Name: "mirror", Sink: &failFrom{from: 30}, Batch: config.Batch{MaxChanges: 1, MaxWait: time.Millisecond}},
		{Name: "idle", Sink: &failFrom{}, Batch: config.Batch{MaxChanges: 1, MaxWait: time.Millisecond}},
	}})
	items := make(chan []*txnItem, 8)
	for _, lsn := range []cdc.LSN{10, 20, 30, 40} {
		c := cdc.Change{CommitLSN: lsn, TxSize: 1, Op: cdc.OpInsert}
		items <- []*txnItem{{commit: lsn, last: true, changes: []cdc.Change{c}, dests: [][]int{{0, 1}}}}
	}
	close(items)
	var marks []cdc.LSN
	err := p.write(t.Context(), t.Context(), items, make([]map[cdc.Pos]struct{}, 3), make([]snapshot.Held, 3),
		func(m mark) { marks = append(marks, m.lsn) }, mark{}, nil)
	require.ErrorContains(t, err, `sink "mirror"`)
	require.Equal(t, []cdc.LSN{10, 20}, marks, "nothing past what the failing sink holds is checkpointed")
	require.Equal(t, map[string]cdc.LSN{"stream": 30, "mirror": 20, "idle": 30}, p.SinkWritten(),
		"the failing sink is the lowest of those given the change")
}
