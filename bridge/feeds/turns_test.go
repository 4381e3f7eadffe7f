package feeds

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFarRiderHoldsNoOneBack has a feed read the stream from sequence 0
// (a client resuming from the stream's start, or a forged token) while a
// feed a little behind the window asks for its changes: the near feed is
// served within a few passes, taking turns with the far one, instead of
// waiting until the far one's passes, MaxScan messages each, have read
// the whole history up to it.
func TestFarRiderHoldsNoOneBack(t *testing.T) {
	e := newEnv(t, nil)
	const n = 400
	for i := range n {
		e.write(e.gen.tx(ins(order{ID: int64(i), Tenant: 1, Status: "open"})))
	}
	fs := e.feeds(Config{WindowTxns: 20, Prewarm: 20, MaxScan: 20})
	st := fs.Stats()
	require.Greater(t, st.WindowFrom, uint64(n-30), "the window holds the last 20 transactions")

	far, err := fs.Register(Filter{Tables: []string{"public.none"}}, Token{Stream: fs.Position().Stream, Seq: 0})
	require.NoError(t, err)
	defer far.Close()
	fctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for fctx.Err() == nil {
			_, _ = far.Next(fctx) // matches nothing: reads history pass after pass
		}
	}()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool { return fs.Stats().Replays >= 2 }, 30*time.Second, 5*time.Millisecond)

	near, err := fs.Register(Filter{Tables: []string{"public.orders"}}, Token{Stream: fs.Position().Stream, Seq: st.WindowFrom - 10})
	require.NoError(t, err)
	defer near.Close()
	before := fs.Stats().Replays
	ctx, cancel2 := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel2()
	b, err := near.Next(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, b.Changes)
	passes := fs.Stats().Replays - before
	require.LessOrEqual(t, passes, int64(4), "the near feed waited %d passes of the far one's (%d messages behind it)", passes, st.WindowFrom)
}
