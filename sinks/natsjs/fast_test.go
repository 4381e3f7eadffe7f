package natsjs

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/natsembed"
)

// TestFastBatch publishes through fast-ingest batches: in order, with the
// bridge's headers, the cursor at the last stored sequence, replays and
// overlapping batches deduplicated, and small batches still published.
func TestFastBatch(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := connected(t, srv, map[string]any{"fast_batch": true, "expect_last_sequence": false})
	require.True(t, s.fastOK(), "the sink sets allow_batched on the stream it creates")

	batch := txs(producer, 0x1000, 100, 5) // 500 changes
	require.NoError(t, s.Write(t.Context(), batch))
	got := stored(t, srv.URL(), "CDC")
	require.Len(t, got, len(batch))
	for i, m := range got {
		require.Equal(t, batch[i].ID(), m.Header.Get(jetstream.MsgIDHeader))
		require.Equal(t, batch[i].CommitLSN.String(), m.Header.Get(HeaderCommitLSN))
		require.Equal(t, string(batch[i].Payload), string(m.Data))
	}
	require.Equal(t, strconv.FormatUint(got[len(got)-1].Sequence, 10), s.Cursor())
	cur := s.Cursor()

	// A replay: every message a duplicate, nothing stored, cursor kept.
	require.NoError(t, s.Write(t.Context(), batch))
	require.Equal(t, ids(batch), storedIDs(t, srv.URL(), "CDC"))
	require.Equal(t, cur, s.Cursor())

	// Overlapping: the first half stored already.
	more := txs(producer, 0x100000, 100, 5)
	over := append(append(batch[250:], more...)[:0:0], append(batch[250:], more...)...)
	require.NoError(t, s.Write(t.Context(), over))
	want := append(ids(batch), ids(more)...)
	require.Equal(t, want, storedIDs(t, srv.URL(), "CDC"))
	all := stored(t, srv.URL(), "CDC")
	require.Equal(t, strconv.FormatUint(all[len(all)-1].Sequence, 10), s.Cursor())

	// Below fastMin: message by message.
	small := txs(producer, 0x200000, 3, 2)
	require.NoError(t, s.Write(t.Context(), small))
	require.Equal(t, append(want, ids(small)...), storedIDs(t, srv.URL(), "CDC"))
}

// TestFastBatchStreamWithoutIt falls back to per-message publishing when
// the stream does not allow fast batches (created by someone else).
func TestFastBatchStreamWithoutIt(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc.>"}})
	require.NoError(t, err)
	s := connected(t, srv, map[string]any{"fast_batch": true, "expect_last_sequence": false, "create_stream": false})
	require.False(t, s.fastOK())
	batch := txs(producer, 0x1000, 100, 2)
	require.NoError(t, s.Write(t.Context(), batch))
	require.Equal(t, ids(batch), storedIDs(t, srv.URL(), "CDC"))
}
