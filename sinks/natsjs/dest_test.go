package natsjs

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

// TestTwoDestinationsOneStream: the copies of one change that two routes
// publish into the same stream (cdc.Change.Dest) are two messages whose
// ids name the route; a replay stores each once, fenced and atomic; and
// Delivered tells the destinations apart, so a resume that skips what one
// destination holds still sends the other's.
func TestTwoDestinationsOneStream(t *testing.T) {
	for _, atomic := range []bool{false, true} {
		t.Run(map[bool]string{false: "async", true: "atomic"}[atomic], func(t *testing.T) {
			srv := natsembed.StartT(t, natsembed.Options{})
			s := connected(t, srv, map[string]any{"atomic_transactions": atomic})
			// The pipeline hands over each transaction's copies grouped
			// per destination.
			var batch []cdc.Change
			for tx := range 4 {
				for _, dest := range []string{"masked", "full"} {
					for _, c := range txs(producer, 0x1000+cdc.LSN(tx)*0x100, 1, 3) {
						c.Dest, c.Subject = dest, "cdc."+dest+".orders"
						batch = append(batch, c)
					}
				}
			}
			require.NoError(t, s.Write(t.Context(), batch[:6]))
			checkpoint := s.Cursor()
			require.NoError(t, s.Write(t.Context(), batch[6:9])) // crash: tx 1 went only to "masked"

			got, err := s.Delivered(t.Context(), producer, checkpoint)
			require.NoError(t, err)
			require.Equal(t, positions(batch[6:9]), got, "what masked holds of tx 1, not full's")
			for p := range got {
				require.Equal(t, "masked", p.Dest)
			}
			all, err := s.Delivered(t.Context(), producer, "")
			require.NoError(t, err)
			require.Equal(t, positions(batch[:9]), all)
			require.False(t, s.fence.isShared(), "both destinations are this producer's: the fence stays on")

			// The run after the crash replays from the checkpoint what
			// Delivered did not list, as the pipeline does.
			var replay []cdc.Change
			for _, c := range batch[6:] {
				if _, held := got[c.Pos()]; !held {
					replay = append(replay, c)
				}
			}
			require.Len(t, replay, len(batch)-9)
			require.NoError(t, s.Write(t.Context(), replay))
			// Replaying everything again (within the duplicate window) stores nothing.
			require.NoError(t, s.Write(t.Context(), batch))
			msgs := stored(t, srv.URL(), "CDC")
			require.Len(t, msgs, len(batch), "each change once per destination")
			seen := map[string]bool{}
			for i, m := range msgs {
				id := m.Header.Get(jetstream.MsgIDHeader)
				require.Equal(t, batch[i].ID(), id, "message %d in order", i)
				require.Equal(t, batch[i].Subject, m.Subject)
				require.False(t, seen[id])
				seen[id] = true
				_, pos, err := cdc.ParseID(id)
				require.NoError(t, err)
				require.Equal(t, batch[i].Pos(), pos)
				if atomic {
					require.NotEmpty(t, m.Header.Get("Nats-Batch-Id"), "message %d: a destination's transaction goes as one atomic batch", i)
				}
			}
			require.Regexp(t, `^shop\.main\.e1:0000000000001000:0@masked$`, msgs[0].Header.Get(jetstream.MsgIDHeader))
		})
	}
}
