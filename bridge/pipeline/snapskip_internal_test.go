package pipeline

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/snapshot"
	"github.com/bridgecdc/bridge/config"
)

// idSink is a sinks.Sink that records the ids it is given.
type idSink struct {
	mu  sync.Mutex
	ids []string
}

func (s *idSink) Connect(context.Context) error { return nil }
func (s *idSink) Close(context.Context) error   { return nil }
func (s *idSink) Write(_ context.Context, batch []cdc.Change) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range batch {
		s.ids = append(s.ids, batch[i].ID())
	}
	return nil
}

// TestWriterLeavesOutHeldReadsPerSink: the reads of a running snapshot a
// sink holds already are left out for that sink only, per destination of
// a fan-out route, and a streamed change at the same position as a read is
// not taken for one.
func TestWriterLeavesOutHeldReadsPerSink(t *testing.T) {
	a, b := &idSink{}, &idSink{}
	p := New(Config{Source: "app", Shutdown: time.Second, Sinks: []Sink{
		{Name: "a", Sink: a, Batch: config.Batch{MaxChanges: 100, MaxWait: time.Millisecond}},
		{Name: "b", Sink: b, Batch: config.Batch{MaxChanges: 100, MaxWait: time.Millisecond}},
	}})
	const snapProducer = "br.app.e1.snap-i1"
	read := func(seq uint32, hash string, dest string) cdc.Change {
		return cdc.Change{Producer: "br.app.e1", CommitLSN: 0x500, Seq: seq, TxSize: 4, Op: cdc.OpRead,
			MsgID: snapProducer + ":" + hash + ":7", Dest: dest}
	}
	chunk := []cdc.Change{
		read(0, "00000000000000A1", "masked"), read(1, "00000000000000A1", "full"),
		read(2, "00000000000000B2", "masked"), read(3, "00000000000000B2", "full"),
	}
	streamed := cdc.Change{Producer: "br.app.e1", CommitLSN: 0x600, Seq: 0, TxSize: 1, Op: cdc.OpInsert}
	items := make(chan []*txnItem, 2)
	items <- []*txnItem{{commit: 0x500, last: true, changes: chunk, dests: [][]int{{0, 1}, {0, 1}, {0, 1}, {0, 1}}}}
	items <- []*txnItem{{commit: 0x600, last: true, changes: []cdc.Change{streamed}, dests: [][]int{{0, 1}}}}
	close(items)

	held := make([]snapshot.Held, 2)
	held[0] = snapshot.Held{
		{LSN: 0xA1, Seq: 7, Dest: "masked"}: {},
		{LSN: 0xB2, Seq: 7, Dest: "masked"}: {},
		{LSN: 0xB2, Seq: 7, Dest: "full"}:   {},
	}
	// Sink b holds the streamed change only, by its position.
	skip := []map[cdc.Pos]struct{}{nil, {{LSN: 0x600, Seq: 0}: {}, {LSN: 0x500, Seq: 0, Dest: "masked"}: {}}}
	require.NoError(t, p.write(t.Context(), t.Context(), items, skip, held, func(mark) {}, mark{}, nil))

	require.Equal(t, []string{snapProducer + ":00000000000000A1:7@full", "br.app.e1:0000000000000600:0"}, a.ids,
		"sink a holds three of the four reads: it is given the fourth and the streamed change")
	require.Equal(t, []string{
		snapProducer + ":00000000000000A1:7@masked", snapProducer + ":00000000000000A1:7@full",
		snapProducer + ":00000000000000B2:7@masked", snapProducer + ":00000000000000B2:7@full",
	}, b.ids, "sink b holds no read (a streamed position equal to a read's is not the read): it is given all four, and not the streamed change it holds")
}
