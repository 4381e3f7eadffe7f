package natsjs

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sinks"
)

// TestFence: a sink instance that is no longer the stream's writer (a
// zombie: another instance of the same producer took over and published)
// gets every publish refused, atomic or not, and stores nothing; after
// Delivered, which a new run calls, it may publish again.
func TestFence(t *testing.T) {
	for _, atomic := range []bool{false, true} {
		name := map[bool]string{false: "per_message", true: "atomic"}[atomic]
		t.Run(name, func(t *testing.T) {
			srv := natsembed.StartT(t, natsembed.Options{})
			opts := map[string]any{"atomic_transactions": atomic}
			all := txs(producer, 0x1000, 9, 3)
			zombie := connected(t, srv, opts)
			require.NoError(t, zombie.Write(t.Context(), all[:9]))

			owner := connected(t, srv, opts)
			_, err := owner.Delivered(t.Context(), producer, zombie.Cursor())
			require.NoError(t, err)
			require.NoError(t, owner.Write(t.Context(), all[9:18]))

			err = zombie.Write(t.Context(), all[18:27])
			require.ErrorIs(t, err, ErrFenced)
			require.Equal(t, ids(all[:18]), storedIDs(t, srv.URL(), "CDC"), "nothing of the zombie's stored")

			// A new run of the former zombie reads the tail, then continues.
			got, err := zombie.Delivered(t.Context(), producer, zombie.Cursor())
			require.NoError(t, err)
			require.Equal(t, positions(all[9:18]), got)
			require.NoError(t, zombie.Write(t.Context(), all[18:27]))
			require.Equal(t, ids(all), storedIDs(t, srv.URL(), "CDC"))
		})
	}
}

// TestFenceLateDuplicate: changes another instance stored after this
// sink's chain was synced (a killed or paused bridge whose publishes the
// server applied late) meet this sink's first publish. An R1 stream checks
// a plain publish's expected sequence first and refuses it; an atomic batch
// is checked for duplicates first and comes back as one. Neither is a
// replay of its own: the Write stops with ErrFenced instead of publishing
// the rest unfenced, and stores nothing; after the next Delivered it
// continues, every change stored once.
func TestFenceLateDuplicate(t *testing.T) {
	for _, atomic := range []bool{false, true} {
		name := map[bool]string{false: "per_message", true: "atomic"}[atomic]
		t.Run(name, func(t *testing.T) {
			srv := natsembed.StartT(t, natsembed.Options{})
			opts := map[string]any{"atomic_transactions": atomic}
			all := txs(producer, 0x1000, 9, 3)
			zombie := connected(t, srv, opts)
			require.NoError(t, zombie.Write(t.Context(), all[:9]))

			owner := connected(t, srv, opts)
			held, err := owner.Delivered(t.Context(), producer, "")
			require.NoError(t, err)
			require.Len(t, held, 9)
			// The zombie's next publishes land after the owner read the tail.
			require.NoError(t, zombie.Write(t.Context(), all[9:18]))

			err = owner.Write(t.Context(), all[9:27])
			require.ErrorIs(t, err, ErrFenced)
			require.Equal(t, ids(all[:18]), storedIDs(t, srv.URL(), "CDC"), "nothing stored past the late duplicates")

			got, err := owner.Delivered(t.Context(), producer, "")
			require.NoError(t, err)
			require.Len(t, got, 18)
			require.NoError(t, owner.Write(t.Context(), all[18:27]))
			require.Equal(t, ids(all), storedIDs(t, srv.URL(), "CDC"))

			// A replay of its own is still a replay: the same batch again.
			require.NoError(t, owner.Write(t.Context(), all[18:27]))
			require.Equal(t, ids(all), storedIDs(t, srv.URL(), "CDC"))
		})
	}
}

// TestFenceSharedStream: two producers in one stream refuse each other's
// chains until Delivered sees the other writer; then the fence is off for
// good and both publish.
func TestFenceSharedStream(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	a := connected(t, srv, nil)
	b := connected(t, srv, nil)
	as := txs("shop.a.e1", 0x1000, 4, 2)
	bs := txs("shop.b.e1", 0x1000, 4, 2)
	require.NoError(t, a.Write(t.Context(), as[:2]))
	_, err := b.Delivered(t.Context(), "shop.b.e1", "")
	require.NoError(t, err)
	require.True(t, b.fence.isShared(), "a's message is another writer's")
	require.NoError(t, b.Write(t.Context(), bs[:2]))
	require.ErrorIs(t, a.Write(t.Context(), as[2:4]), ErrFenced, "b wrote after a's last message")
	_, err = a.Delivered(t.Context(), "shop.a.e1", a.Cursor())
	require.NoError(t, err)
	require.NoError(t, a.Write(t.Context(), as[2:4]))
	require.NoError(t, b.Write(t.Context(), bs[2:4]))
	require.NoError(t, a.Write(t.Context(), as[4:]))
	require.Len(t, storedIDs(t, srv.URL(), "CDC"), 12)

	// Switched off: no header at all.
	off := connected(t, srv, map[string]any{"expect_last_sequence": false})
	require.NoError(t, off.Write(t.Context(), txs("shop.c.e1", 0x1000, 1, 1)))
	msgs := stored(t, srv.URL(), "CDC")
	require.Equal(t, "0", msgs[0].Header.Get("Nats-Expected-Last-Sequence"), "the first message expected an empty stream")
	require.Empty(t, msgs[len(msgs)-1].Header.Get("Nats-Expected-Last-Sequence"))
}

// TestConnectDropsAbandonedAcks: a Write that failed with publishes still
// waiting for their acks (a server that stopped answering) leaves them to
// the client until ack_timeout. Connect, which the pipeline calls before
// the next run, gives them up at once, so the next run's publishes do not
// wait behind them; after Delivered the stream holds every change once.
func TestConnectDropsAbandonedAcks(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	p := newProxy(t, srv.NATS().Addr().String())
	s := connected(t, srv, map[string]any{"url": p.URL(), "atomic_transactions": false, "ack_timeout": "5m"})
	all := txs(producer, 0x1000, 10, 10)
	require.NoError(t, s.Write(t.Context(), all[:20]))

	p.freeze()
	wctx, wcancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer wcancel()
	require.Error(t, s.Write(wctx, all[20:60]))
	require.Positive(t, s.acks.pending())
	cctx, ccancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer ccancel()
	_ = s.Connect(cctx) // the frozen server cannot answer the stream check
	require.Zero(t, s.acks.pending(), "the abandoned Write's acks are given up")

	p.thaw()
	writeRest(t, s, all[20:])
	require.Equal(t, ids(all), storedIDs(t, srv.URL(), "CDC"))
}

// TestFenceOwnEarlierEpoch: messages of an earlier epoch of the same
// bridge and source ("shop.main.e0" for producer "shop.main.e1", as after
// the checkpoint was deleted), and its snapshot reads, are this sink's own
// history, not another writer's: the fence stays on. A snapshot's Delivered
// (producer "<producer>.snap-<run>") counts the producer's own changes as
// its own too. Another source's messages ("shop.other.e1"), or a producer
// that only looks alike ("shop.main.x.e1", "shop.mainly.e1"), turn it off.
func TestFenceOwnEarlierEpoch(t *testing.T) {
	old := txs("shop.main.e0", 0x1000, 2, 2)
	snap := txs("shop.main.e0", 0x2000, 1, 1)
	snap[0].MsgID = "shop.main.e0.snap-r1:0000000000002000:0"
	for _, tc := range []struct {
		name, other string // other: a producer whose message is in the stream too
		delivered   string // the producer Delivered is asked about
		shared      bool
	}{
		{"earlier epoch", "", "shop.main.e1", false},
		{"snapshot of the running epoch", "shop.main.e1", "shop.main.e1.snap-r2", false},
		{"another source", "shop.other.e1", "shop.main.e1", true},
		{"a source named like an epoch", "shop.main.x.e1", "shop.main.e1", true},
		{"a longer source name", "shop.mainly.e1", "shop.main.e1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := natsembed.StartT(t, natsembed.Options{})
			prev := connected(t, srv, nil)
			require.NoError(t, prev.Write(t.Context(), old))
			require.NoError(t, prev.Write(t.Context(), snap))
			if tc.other != "" {
				require.NoError(t, prev.Write(t.Context(), txs(tc.other, 0x3000, 1, 1)))
			}
			s := connected(t, srv, nil)
			_, err := s.Delivered(t.Context(), tc.delivered, "")
			require.NoError(t, err)
			require.Equal(t, tc.shared, s.fence.isShared())
			// The fence's header goes out exactly when it is on.
			mine := txs("shop.main.e1", 0x9000, 1, 1)
			require.NoError(t, s.Write(t.Context(), mine))
			msgs := stored(t, srv.URL(), "CDC")
			last := msgs[len(msgs)-1]
			if tc.shared {
				require.Empty(t, last.Header.Get("Nats-Expected-Last-Sequence"))
			} else {
				require.Equal(t, strconv.FormatUint(last.Sequence-1, 10), last.Header.Get("Nats-Expected-Last-Sequence"))
			}
		})
	}
}

// TestFenceForeignWriterMidWrite: another writer's message lands in the
// stream while a fenced Write has publishes in flight (published on the
// sink's own connection right after change #1, so the server takes it
// between #1 and #2). The stream must refuse every change of the Write
// after it, not just the one whose slot it took: a change stored behind a
// refused one would leave a gap that the next run fills out of order. The
// next run (Delivered, then the rest) puts the rest behind it, in order.
func TestFenceForeignWriterMidWrite(t *testing.T) {
	for _, atomic := range []bool{false, true} {
		name := map[bool]string{false: "per_message", true: "atomic"}[atomic]
		t.Run(name, func(t *testing.T) {
			srv := natsembed.StartT(t, natsembed.Options{})
			s := connected(t, srv, map[string]any{"atomic_transactions": atomic})
			all := txs(producer, 0x1000, 40, 1)
			if atomic { // single changes and whole transactions, both after the foreign message
				all = append(all, txs(producer, 0x9000, 10, 3)...)
			}
			require.NoError(t, s.Write(t.Context(), all[:5]))
			foreign := 0
			s.afterPublish = func(i int) {
				if i == 1 && foreign == 0 {
					foreign++
					m := nats.NewMsg("cdc.main.public.orders")
					m.Header.Set("Nats-Msg-Id", "someone-else:1")
					m.Data = []byte(`{"foreign":true}`)
					require.NoError(t, s.nc.PublishMsg(m))
				}
			}
			err := s.Write(t.Context(), all[5:])
			s.afterPublish = nil
			require.ErrorIs(t, err, ErrFenced)
			got := storedIDs(t, srv.URL(), "CDC")
			want := append(ids(all[:7]), "someone-else:1")
			require.Equal(t, want, got, "nothing of the Write stored after the foreign message")

			// The next run reads the tail (another writer: the fence goes
			// off) and publishes the rest behind it, in order.
			writeRest(t, s, all)
			require.Equal(t, append(want, ids(all[7:])...), storedIDs(t, srv.URL(), "CDC"))
		})
	}
}

// TestFenceDuplicateMidWriteStopsAtomic: with atomic transactions, an
// atomic batch can carry only Nats-Expected-Last-Sequence, counted from
// what the Write published before it. When one of those publishes comes
// back as a duplicate (another instance stored that change since the
// chain's start: the message id chain lets it through, the duplicate check
// coming first), the count no longer says where the stream ends: the batch
// is not published, and the Write ends fenced. The next run continues.
func TestFenceDuplicateMidWriteStopsAtomic(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := connected(t, srv, map[string]any{"atomic_transactions": true})
	all := append(txs(producer, 0x1000, 8, 1), txs(producer, 0x9000, 2, 3)...)
	require.NoError(t, s.Write(t.Context(), all[:3]))
	other := false
	s.afterPublish = func(i int) {
		if i == 0 && !other { // another instance stores change #1 first
			other = true
			m := s.toMsg(&all[4])
			require.NoError(t, s.nc.PublishMsg(m))
		}
	}
	err := s.Write(t.Context(), all[3:])
	s.afterPublish = nil
	require.ErrorIs(t, err, ErrFenced)
	var berr *sinks.BatchError
	require.ErrorAs(t, err, &berr)
	require.Equal(t, len(all[3:])-6, berr.Indexes()[0], "the singles stored, the first transaction not published")
	require.Equal(t, ids(all[:8]), storedIDs(t, srv.URL(), "CDC"))

	writeRest(t, s, all)
	require.Equal(t, ids(all), storedIDs(t, srv.URL(), "CDC"))
}

// TestFenceRedoAfterDuplicateWindow: an atomic batch that meets changes
// another instance stored comes back as "contains duplicates" without their
// sequences, and the Write republishes it message by message (the redo).
// When the writer is paused between that reply and the redo for longer
// than the duplicate window (a zombie under SIGSTOP), dedupe no longer
// knows those changes: the redo must still be fenced, or it stores the
// transaction a second time behind what the other instance stored
// meanwhile. The Write ends fenced and nothing of it is stored.
func TestFenceRedoAfterDuplicateWindow(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	const window = 200 * time.Millisecond
	opts := map[string]any{"atomic_transactions": true, "duplicate_window": window.String()}
	all := txs(producer, 0x1000, 12, 3)
	zombie := connected(t, srv, opts)
	require.NoError(t, zombie.Write(t.Context(), all[:9]))

	owner := connected(t, srv, opts)
	_, err := owner.Delivered(t.Context(), producer, zombie.Cursor())
	require.NoError(t, err)
	require.NoError(t, owner.Write(t.Context(), all[9:18]))

	paused := false
	zombie.beforeRedo = func() {
		paused = true
		time.Sleep(3 * window) // the owner's dedupe entries expire
		require.NoError(t, owner.Write(t.Context(), all[18:27]))
		time.Sleep(3 * window)
	}
	err = zombie.Write(t.Context(), all[9:36])
	zombie.beforeRedo = nil
	require.True(t, paused, "the zombie's first atomic batch came back as containing duplicates")
	require.ErrorIs(t, err, ErrFenced)
	require.Equal(t, ids(all[:27]), storedIDs(t, srv.URL(), "CDC"), "nothing of the zombie's stored")

	// The owner goes on; every change is stored once, in order.
	require.NoError(t, owner.Write(t.Context(), all[27:]))
	require.Equal(t, ids(all), storedIDs(t, srv.URL(), "CDC"))
}

// TestFenceSecondReadOfARun: a run reads what the stream holds twice
// before it writes (its stream's producer, then a running snapshot's).
// Changes another instance stored between the two reads (a killed
// bridge's publishes the server applied late) are in neither result: the
// second read must not move the chain past them, so the run's first
// publish is refused (ErrFenced) instead of storing them again once the
// duplicate window has passed. The next run reads again and continues.
func TestFenceSecondReadOfARun(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	const window = 200 * time.Millisecond
	opts := map[string]any{"duplicate_window": window.String()}
	all := txs(producer, 0x1000, 9, 3)
	killed := connected(t, srv, opts)
	require.NoError(t, killed.Write(t.Context(), all[:9]))

	next := connected(t, srv, opts)
	held, err := next.Delivered(t.Context(), producer, "")
	require.NoError(t, err)
	require.Len(t, held, 9)
	require.NoError(t, killed.Write(t.Context(), all[9:18])) // applied late
	_, err = next.Delivered(t.Context(), producer+".snap-i1", "")
	require.NoError(t, err)
	time.Sleep(3 * window) // past the duplicate window

	err = next.Write(t.Context(), all[9:27])
	require.ErrorIs(t, err, ErrFenced, "the late changes are in neither read: the first publish must be refused")
	require.Equal(t, ids(all[:18]), storedIDs(t, srv.URL(), "CDC"), "nothing stored twice")

	// The next run connects, reads both, and continues after the late ones.
	require.NoError(t, next.Connect(t.Context()))
	held, err = next.Delivered(t.Context(), producer, "")
	require.NoError(t, err)
	require.Len(t, held, 18)
	_, err = next.Delivered(t.Context(), producer+".snap-i1", "")
	require.NoError(t, err)
	require.NoError(t, next.Write(t.Context(), all[18:27]))
	require.Equal(t, ids(all), storedIDs(t, srv.URL(), "CDC"))
}
