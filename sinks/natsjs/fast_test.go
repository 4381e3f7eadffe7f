package natsjs

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sinks"
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
		require.Equal(t, string(batch[i].Op), m.Header.Get(HeaderOp))
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
	createStream(t, srv.URL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc.>"}})
	s := connected(t, srv, map[string]any{"fast_batch": true, "expect_last_sequence": false, "create_stream": false})
	require.False(t, s.fastOK())
	batch := txs(producer, 0x1000, 100, 2)
	require.NoError(t, s.Write(t.Context(), batch))
	require.Equal(t, ids(batch), storedIDs(t, srv.URL(), "CDC"))
}

// TestFastBatchFenced: with expect_last_sequence on, a Write's first change
// goes alone, awaited, and the rest as one fast batch whose every message
// carries its Nats-Expected-Last-Sequence. A replay goes message by message
// (unfenced after its first, as without fast_batch); a zombie's Write is
// refused at its first change; a fast batch stops where a message does not
// follow the stream's last one, nothing after it stored.
func TestFastBatchFenced(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	// How each message reaches the server: a fast batch's replies end in
	// ".$FI" (orbit.go's control subject), a plain publish's do not.
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	defer nc.Close()
	var mu sync.Mutex
	type seen struct {
		fast bool
		exp  string
	}
	how := map[string]seen{} // by Nats-Msg-Id, the last publish of it
	_, err = nc.Subscribe("cdc.>", func(m *nats.Msg) {
		mu.Lock()
		how[m.Header.Get(jetstream.MsgIDHeader)] = seen{strings.HasSuffix(m.Reply, ".$FI"), m.Header.Get(jetstream.ExpectedLastSeqHeader)}
		mu.Unlock()
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	// check waits until every change of part has been seen, then compares
	// how it went with fast and its expectations with want+i ("" for none).
	check := func(part []cdc.Change, fast bool, want int) {
		t.Helper()
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			for i := range part {
				if _, ok := how[part[i].ID()]; !ok {
					return false
				}
			}
			return true
		}, 5*time.Second, 10*time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		for i := range part {
			exp := ""
			if want >= 0 {
				exp = strconv.Itoa(want + i)
			}
			require.Equal(t, seen{fast, exp}, how[part[i].ID()], "change #%d of the part, %s", i, part[i].ID())
		}
	}
	published := func(c cdc.Change) bool {
		mu.Lock()
		defer mu.Unlock()
		_, ok := how[c.ID()]
		return ok
	}

	opts := map[string]any{"fast_batch": true, "ack_timeout": "2s"}
	all := txs(producer, 0x1000, 100, 5) // 500 changes
	zombie := connected(t, srv, opts)
	require.True(t, zombie.fastOK())

	require.NoError(t, zombie.Write(t.Context(), all[:100]))
	check(all[:1], false, 0)
	check(all[1:100], true, 1)
	require.NoError(t, zombie.Write(t.Context(), all[50:150]))
	check(all[100:150], false, -1) // a replay: message by message, unfenced after its first
	require.Equal(t, ids(all[:150]), storedIDs(t, srv.URL(), "CDC"))
	require.NoError(t, zombie.Write(t.Context(), all[150:250]))
	check(all[150:151], false, 150)
	check(all[151:250], true, 151)
	require.Equal(t, ids(all[:250]), storedIDs(t, srv.URL(), "CDC"))

	owner := connected(t, srv, opts)
	_, err = owner.Delivered(t.Context(), producer, zombie.Cursor())
	require.NoError(t, err)
	require.NoError(t, owner.Write(t.Context(), all[250:300]))

	err = zombie.Write(t.Context(), all[300:400]) // its chain stands at 250
	require.ErrorIs(t, err, ErrFenced)
	check(all[300:301], false, 250)
	require.False(t, published(all[301]), "nothing after a refused first change is published")
	require.Equal(t, ids(all[:300]), storedIDs(t, srv.URL(), "CDC"), "nothing of the zombie's stored")

	// The owner's fast batch meets a change stored out of turn (its
	// duplicate is dropped, so the next message's expectation fails): it
	// stops there, the rest not stored; the next run publishes the rest.
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = owner.Delivered(t.Context(), producer, owner.Cursor())
	require.NoError(t, err)
	_, err = js.Publish(t.Context(), all[350].Subject, all[350].Payload, jetstream.WithMsgID(all[350].ID()))
	require.NoError(t, err)
	require.NoError(t, owner.Connect(t.Context())) // a new run, whose read starts the chain after it
	_, err = owner.Delivered(t.Context(), producer, owner.Cursor())
	require.NoError(t, err)
	err = owner.Write(t.Context(), all[300:400])
	require.ErrorIs(t, err, ErrFenced)
	want := append(append(ids(all[:300]), all[350].ID()), ids(all[300:350])...)
	require.Equal(t, want, storedIDs(t, srv.URL(), "CDC"), "stored up to the out-of-turn change, nothing after it")
	writeRest(t, owner, all[:500])
	require.Equal(t, append(want, ids(all[351:500])...), storedIDs(t, srv.URL(), "CDC"))
}

// TestFastBatchEndsEarly: when the server refuses a message in the middle
// of a fast batch (here the stream is full, discard new), it ends the batch
// there and acks the commit without an error, only a smaller count: the
// Write reports that change and everything after it failed, none delivered.
func TestFastBatchEndsEarly(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	createStream(t, srv.URL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc.>"},
		MaxMsgs: 150, Discard: jetstream.DiscardNew, AllowBatchPublish: true})
	s := connected(t, srv, map[string]any{"fast_batch": true, "expect_last_sequence": false, "create_stream": false})
	require.True(t, s.fastOK())

	batch := txs(producer, 0x1000, 40, 5) // 200 changes, 150 fit
	err := s.Write(t.Context(), batch)
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	idx := be.Indexes()
	require.NotEmpty(t, idx)
	require.LessOrEqual(t, idx[0], 150, "the first change not stored is reported failed")
	for i := idx[0]; i < len(batch); i++ {
		_, failed := be.Failed[i]
		require.True(t, failed, "change #%d is not stored and must not count as delivered", i)
	}
	require.Equal(t, ids(batch[:150]), storedIDs(t, srv.URL(), "CDC"))
}
