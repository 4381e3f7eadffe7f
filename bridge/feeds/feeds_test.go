package feeds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/syncbuf"
)

// TestRoutesMatchesOnly: each feed receives the changes its filter matches
// and nothing else, in commit order, with a token after them.
func TestRoutesMatchesOnly(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{})
	t42, err := fs.Register(Filter{Tables: []string{"public.orders"}, Where: Eq("tenant", 42).Ptr()}, Token{})
	require.NoError(t, err)
	tags, err := fs.Register(Filter{Where: Contains("tags", "vip").Ptr()}, Token{})
	require.NoError(t, err)
	items, err := fs.Register(Filter{Tables: []string{"public.items"}}, Token{})
	require.NoError(t, err)

	e.write(
		e.gen.tx(ins(order{ID: 1, Tenant: 42, Status: "open"})),
		e.gen.tx(ins(order{ID: 2, Tenant: 7, Status: "open", Tags: []string{"vip"}})),
		e.gen.tx(ins(order{ID: 3, Tenant: 42, Status: "open", Tags: []string{"x", "vip"}})),
	)
	got, tok := collect(t, t42, 2, 20*time.Second)
	require.Equal(t, []uint64{1, 3}, seqs(got))
	require.Equal(t, uint64(3), tok.Seq)
	got, _ = collect(t, tags, 2, 20*time.Second)
	require.Equal(t, []uint64{2, 3}, seqs(got))
	var m map[string]any
	require.NoError(t, json.Unmarshal(got[0].JSON, &m))
	require.Equal(t, "insert", m["op"])
	require.Equal(t, "public.orders", m["table"])
	require.Equal(t, map[string]any{"id": float64(2)}, m["key"])

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	b, err := items.Next(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Empty(t, b.Changes)
	require.True(t, b.UpToDate)
	require.Equal(t, uint64(3), b.Token.Seq, "a feed with no match still advances to the head")
}

// TestSerialiseOnce: feeds sharing a projection share one encoding.
func TestSerialiseOnce(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{})
	var all, narrow []*Feed
	for range 20 {
		f, err := fs.Register(Filter{Where: Eq("tenant", 1).Ptr()}, Token{})
		require.NoError(t, err)
		all = append(all, f)
		f, err = fs.Register(Filter{Where: In("status", "open", "paid").Ptr(), Columns: []string{"status", "id"}}, Token{})
		require.NoError(t, err)
		narrow = append(narrow, f)
	}
	e.write(e.gen.tx(ins(order{ID: 1, Tenant: 1, Status: "open", Note: strp("n")})))
	var first []byte
	for _, f := range all {
		got, _ := collect(t, f, 1, 20*time.Second)
		require.Len(t, got, 1)
		if first == nil {
			first = got[0].JSON
		}
		require.Same(t, &first[0], &got[0].JSON[0], "the same bytes, not a copy")
	}
	for _, f := range narrow {
		got, _ := collect(t, f, 1, 20*time.Second)
		require.Len(t, got, 1)
		var m map[string]any
		require.NoError(t, json.Unmarshal(got[0].JSON, &m))
		require.Equal(t, map[string]any{"id": float64(1), "status": "open"}, m["after"])
	}
	require.Equal(t, int64(2), fs.Stats().Serialisations)
}

// TestLongPollTimeoutAbortAndNoRedelivery covers the long-poll cycle: a
// poll times out empty, a change between two polls comes with the next
// one, a delivered change never comes again, a cancelled poll returns.
func TestLongPollTimeoutAbortAndNoRedelivery(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{})
	f, err := fs.Register(Filter{Where: Eq("tenant", 5).Ptr()}, Token{})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	b, err := f.Next(ctx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, b.UpToDate)
	require.Empty(t, b.Changes)

	// Between polls.
	e.write(e.gen.tx(ins(order{ID: 1, Tenant: 5})), e.gen.tx(ins(order{ID: 2, Tenant: 6})))
	require.Eventually(t, func() bool { return fs.Position().Seq == 2 }, 20*time.Second, 10*time.Millisecond)
	got, tok := collect(t, f, 1, 20*time.Second)
	require.Equal(t, []uint64{1}, seqs(got))

	// No redelivery.
	ctx, cancel = context.WithTimeout(t.Context(), 200*time.Millisecond)
	b, err = f.Next(ctx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Empty(t, b.Changes)
	require.GreaterOrEqual(t, b.Token.Seq, tok.Seq)

	// Abort: a cancelled poll returns at once with the token.
	ctx, cancel = context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := f.Next(ctx)
		done <- err
	}()
	require.Eventually(t, func() bool { return fs.Stats().Waiting == 1 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled Next did not return")
	}
	require.Equal(t, 0, fs.Stats().Waiting)

	// A waiting poll is woken by a match.
	go func() {
		b, err := f.Next(t.Context())
		if err == nil && len(b.Changes) == 0 {
			err = errors.New("woken with nothing")
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return fs.Stats().Waiting == 1 }, 10*time.Second, 5*time.Millisecond)
	e.write(e.gen.tx(ins(order{ID: 3, Tenant: 5})))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("a waiting Next was not woken by a matching change")
	}
}

// TestWholeTransactions: the matching changes of one transaction come in
// one batch.
func TestWholeTransactions(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{MaxBatch: 1})
	f, err := fs.Register(Filter{Where: Eq("tenant", 1).Ptr()}, Token{})
	require.NoError(t, err)
	var ops []op
	for i := range 50 {
		tenant := int64(2)
		if i == 3 || i == 20 || i == 49 {
			tenant = 1
		}
		ops = append(ops, ins(order{ID: int64(i), Tenant: tenant}))
	}
	e.write(e.gen.tx(ops...), e.gen.tx(ins(order{ID: 100, Tenant: 1})))
	require.Eventually(t, func() bool { return fs.Position().Seq == 51 }, 20*time.Second, 10*time.Millisecond)
	b, err := f.Next(t.Context())
	require.NoError(t, err)
	require.Equal(t, []uint64{4, 21, 50}, seqs(b.Changes), "the whole transaction, even past MaxBatch")
	require.Equal(t, uint64(50), b.Token.Seq)
	require.False(t, b.UpToDate)
	b, err = f.Next(t.Context())
	require.NoError(t, err)
	require.Equal(t, []uint64{51}, seqs(b.Changes))
	require.True(t, b.UpToDate)
}

// TestWholeTransactionSizeKnownLast: a transaction the bridge published
// before its end carries Bridge-Tx-Size on its last change only; the
// feed still delivers it whole, once that change has arrived.
func TestWholeTransactionSizeKnownLast(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{MaxBatch: 1})
	f, err := fs.Register(Filter{Where: Eq("tenant", 1).Ptr()}, Token{})
	require.NoError(t, err)
	var ops []op
	for i := range 30 {
		ops = append(ops, ins(order{ID: int64(i), Tenant: 1 + int64(i%2)}))
	}
	big := e.gen.tx(ops...)
	for i := range big[:len(big)-1] {
		big[i].TxSize = 0
	}
	e.write(big[:20])
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	b, err := f.Next(ctx)
	cancel()
	require.Empty(t, b.Changes, "nothing of the transaction before its last change: %v", err)
	e.write(big[20:])
	b, err = f.Next(t.Context())
	require.NoError(t, err)
	require.Len(t, b.Changes, 15, "the whole transaction")
	require.Equal(t, uint64(29), b.Changes[len(b.Changes)-1].Seq)
}

// TestResumeAnywhere: a token from one process resumes on another, from
// its window or, beyond it, from the stream, with nothing missed or
// repeated.
func TestResumeAnywhere(t *testing.T) {
	e := newEnv(t, nil)
	a := e.feeds(Config{WindowTxns: 5, Prewarm: 3})
	fa, err := a.Register(Filter{Where: In("tenant", 1, 3).Ptr()}, Token{})
	require.NoError(t, err)
	var want []uint64
	write := func(from, to int) {
		for i := from; i < to; i++ {
			tenant := int64(i % 4)
			e.write(e.gen.tx(ins(order{ID: int64(i), Tenant: tenant})))
			if tenant == 1 || tenant == 3 {
				want = append(want, uint64(i+1))
			}
		}
	}
	write(0, 20)
	got, tok := collect(t, fa, 10, 20*time.Second)
	require.Equal(t, want, seqs(got))
	fa.Close()

	// Far behind the windows of both processes.
	write(20, 60)
	b := e.feeds(Config{WindowTxns: 5, Prewarm: 3, MaxBatch: 4})
	fb, err := b.Register(Filter{Where: In("tenant", 1, 3).Ptr()}, tok)
	require.NoError(t, err)
	more, tok2 := collect(t, fb, 20, 30*time.Second)
	require.Equal(t, want[10:], seqs(more))
	require.Equal(t, uint64(60), tok2.Seq)
	require.Positive(t, b.Stats().CatchUps, "served from the stream")

	// Inside the window of a third process.
	write(60, 64)
	c := e.feeds(Config{Prewarm: 100})
	fc, err := c.Register(Filter{Where: In("tenant", 1, 3).Ptr()}, tok2)
	require.NoError(t, err)
	last, _ := collect(t, fc, 2, 20*time.Second)
	require.Equal(t, want[30:], seqs(last))
	require.Zero(t, c.Stats().CatchUps, "served from the window")
}

// TestHistoryGone: a token whose history the stream no longer holds, or of
// a recreated stream, gives must-refetch, never a silent jump.
func TestHistoryGone(t *testing.T) {
	e := newEnv(t, &jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc.>"}, MaxMsgs: 10, Duplicates: time.Minute})
	fs := e.feeds(Config{WindowTxns: 2, Prewarm: 2})
	f, err := fs.Register(Filter{}, Token{})
	require.NoError(t, err)
	tok := f.Token()
	for i := range 30 {
		e.write(e.gen.tx(ins(order{ID: int64(i), Tenant: 1})))
	}
	require.Eventually(t, func() bool { return fs.Position().Seq == 30 }, 20*time.Second, 10*time.Millisecond)
	_, err = f.Next(t.Context())
	var re *RefetchError
	require.ErrorAs(t, err, &re)
	require.Equal(t, ReasonGone, re.Reason)
	_, err = f.Next(t.Context())
	require.ErrorIs(t, err, ErrMustRefetch, "the feed stays failed")

	// On another process, from the old token.
	other := e.feeds(Config{})
	g, err := other.Register(Filter{}, tok)
	require.NoError(t, err)
	_, err = g.Next(t.Context())
	require.ErrorIs(t, err, ErrMustRefetch)

	// A recreated stream: old tokens are refused, live feeds refetch.
	live, err := fs.Register(Filter{}, Token{})
	require.NoError(t, err)
	old := fs.Position()
	require.NoError(t, e.js.DeleteStream(t.Context(), "CDC"))
	_, err = e.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc.>"}, Duplicates: time.Minute})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = live.Next(ctx)
	require.ErrorAs(t, err, &re)
	require.Equal(t, ReasonStream, re.Reason)
	_, err = fs.Register(Filter{}, old)
	require.ErrorIs(t, err, ErrMustRefetch)
	// New feeds work on the new stream.
	nf, err := fs.Register(Filter{}, Token{})
	require.NoError(t, err)
	e.write(e.gen.tx(ins(order{ID: 1, Tenant: 1})))
	got, _ := collect(t, nf, 1, 20*time.Second)
	require.Equal(t, []uint64{1}, seqs(got))
}

// TestResyncReachesEveryFeedOnce: a resync control message gives every
// feed, waiting or between polls, exactly one must-refetch, after the
// changes before it and before any change after it.
func TestResyncReachesEveryFeedOnce(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{})
	const n = 100
	feeds := make([]*Feed, n)
	for i := range feeds {
		var err error
		feeds[i], err = fs.Register(Filter{Where: Eq("tenant", int64(i%10)).Ptr()}, Token{})
		require.NoError(t, err)
	}
	type result struct {
		before   int
		refetch  int
		after    int
		otherErr error
	}
	results := make(chan result, n)
	for i, f := range feeds {
		go func() {
			var r result
			if i%2 == 0 { // half of them between polls
				time.Sleep(300 * time.Millisecond)
			}
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				b, err := f.Next(ctx)
				cancel()
				switch {
				case errors.Is(err, ErrMustRefetch):
					r.refetch++
					if _, err2 := f.Next(context.Background()); !errors.Is(err2, ErrMustRefetch) {
						r.otherErr = fmt.Errorf("a failed feed's next Next: %v", err2)
					}
					results <- r
					return
				case err != nil:
					r.otherErr = err
					results <- r
					return
				}
				for _, c := range b.Changes {
					if c.Seq <= 10 {
						r.before++
					} else {
						r.after++
					}
				}
			}
		}()
	}
	var txs [][]cdc.Change
	for i := range 10 {
		txs = append(txs, e.gen.tx(ins(order{ID: int64(i), Tenant: int64(i)})))
	}
	e.write(txs...)
	e.write(e.gen.resync("b.src.e2"))
	e.write(e.gen.tx(ins(order{ID: 100, Tenant: 1})))
	for range n {
		select {
		case r := <-results:
			require.NoError(t, r.otherErr)
			require.Equal(t, 1, r.before, "the change before the resync")
			require.Equal(t, 1, r.refetch)
			require.Zero(t, r.after, "nothing after the resync")
		case <-time.After(60 * time.Second):
			t.Fatal("a feed never got the resync")
		}
	}
	// A feed opened after the resync reads on.
	nf, err := fs.Register(Filter{}, Token{})
	require.NoError(t, err)
	e.write(e.gen.tx(ins(order{ID: 101, Tenant: 1})))
	got, _ := collect(t, nf, 1, 20*time.Second)
	require.Len(t, got, 1)
}

// TestTruncateRefetchesItsTablesOnly.
func TestTruncateRefetchesItsTablesOnly(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{})
	orders, err := fs.Register(Filter{Tables: []string{"public.orders"}}, Token{})
	require.NoError(t, err)
	items, err := fs.Register(Filter{Tables: []string{"public.items"}}, Token{})
	require.NoError(t, err)
	e.write(e.gen.tx(ins(order{ID: 1})), e.gen.tx(trunc(ordersRel)),
		e.gen.tx(op{op: cdc.OpInsert, rel: itemsRel, after: []any{int64(1), int64(1), "x"}}))
	got, _ := collect(t, orders, 1, 20*time.Second)
	require.Len(t, got, 1)
	_, err = orders.Next(t.Context())
	var re *RefetchError
	require.ErrorAs(t, err, &re)
	require.Equal(t, ReasonTruncate, re.Reason)
	got, _ = collect(t, items, 1, 20*time.Second)
	require.Equal(t, []uint64{3}, seqs(got))
}

// TestEpochChangeWithoutResync: a producer whose epoch changes without a
// resync message still breaks continuity for the feeds.
func TestEpochChangeWithoutResync(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{})
	f, err := fs.Register(Filter{}, Token{})
	require.NoError(t, err)
	e.write(e.gen.tx(ins(order{ID: 1})))
	e.gen.producer = "b.src.e9"
	e.write(e.gen.tx(ins(order{ID: 2})))
	got, _ := collect(t, f, 1, 20*time.Second)
	require.Len(t, got, 1)
	_, err = f.Next(t.Context())
	var re *RefetchError
	require.ErrorAs(t, err, &re)
	require.Equal(t, ReasonEpoch, re.Reason)
}

// TestSharedFilterWakesEachWaiter: feeds with one filter share a group;
// a matching change wakes every one of them parked in Next, a feed that
// was not waiting gets the change on its next call, and closing a parked
// feed leaves the others waiting and woken as before.
func TestSharedFilterWakesEachWaiter(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{})
	filter := Filter{Tables: []string{"public.orders"}, Where: And(Eq("tenant", 5), In("status", "open")).Ptr()}
	var parked []*Feed
	for range 5 {
		f, err := fs.Register(filter, Token{})
		require.NoError(t, err)
		parked = append(parked, f)
	}
	idle, err := fs.Register(filter, Token{})
	require.NoError(t, err)
	require.Same(t, parked[0].group, idle.group)

	type res struct {
		i   int
		b   Batch
		err error
	}
	out := make(chan res, len(parked))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	closedCtx, closeOne := context.WithCancel(t.Context())
	for i, f := range parked {
		c := ctx
		if i == 0 {
			c = closedCtx
		}
		go func() { b, err := f.Next(c); out <- res{i, b, err} }()
	}
	require.Eventually(t, func() bool { return fs.Stats().Waiting == len(parked) }, 10*time.Second, 5*time.Millisecond)
	closeOne()
	r := <-out
	require.Equal(t, 0, r.i)
	require.Empty(t, r.b.Changes)
	parked[0].Close()
	fs.mu.RLock()
	require.Equal(t, len(parked)-1, idle.group.nwait, "waiting count of the group after one left")
	fs.mu.RUnlock()

	e.write(
		e.gen.tx(ins(order{ID: 1, Tenant: 5, Status: "paid"})), // no match: nobody wakes for it
		e.gen.tx(ins(order{ID: 2, Tenant: 5, Status: "open"})),
	)
	for range len(parked) - 1 {
		select {
		case r := <-out:
			require.NoError(t, r.err)
			require.Equal(t, []uint64{2}, seqs(r.b.Changes), "feed %d", r.i)
		case <-time.After(20 * time.Second):
			t.Fatal("a parked feed of the group was not woken")
		}
	}
	got, _ := collect(t, idle, 1, 20*time.Second)
	require.Equal(t, []uint64{2}, seqs(got))
	fs.mu.RLock()
	require.Zero(t, idle.group.nwait)
	fs.mu.RUnlock()
}

// TestSnapshotReads: a snapshot's reads, whose ids hold a hash of the row
// instead of an ordinal, reach the feeds that read them, from the window
// and from the stream, and a second snapshot run is no new epoch.
func TestSnapshotReads(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{})
	all, err := fs.Register(Filter{}, Token{})
	require.NoError(t, err)
	reads, err := fs.Register(Filter{Ops: []cdc.Op{cdc.OpRead}}, Token{})
	require.NoError(t, err)
	e.write(e.gen.tx(ins(order{ID: 1, Tenant: 1})))
	e.write(e.gen.snap("r1", order{ID: 1, Tenant: 1}, order{ID: 2, Tenant: 2}, order{ID: 3, Tenant: 1}))
	e.write(e.gen.snap("r2", order{ID: 2, Tenant: 2}))
	e.write(e.gen.tx(ins(order{ID: 4, Tenant: 1})))

	got, _ := collect(t, all, 6, 20*time.Second)
	require.Equal(t, []uint64{1, 2, 3, 4, 5, 6}, seqs(got), "every change, with no must-refetch at the second run")
	got, _ = collect(t, reads, 4, 20*time.Second)
	require.Equal(t, []uint64{2, 3, 4, 5}, seqs(got))
	for _, c := range got {
		require.Equal(t, cdc.OpRead, c.Op)
		// The id holds a hash, not an LSN: commit_lsn is the payload's.
		var w struct {
			CommitLSN string `json:"commit_lsn"`
		}
		require.NoError(t, json.Unmarshal(c.JSON, &w))
		require.Regexp(t, `^0/[0-9A-F]+00$`, w.CommitLSN, "seq %d: %s", c.Seq, c.JSON)
	}

	// From the stream: a feed that starts behind another process's window.
	other := e.feeds(Config{WindowTxns: 1})
	require.Eventually(t, func() bool { return other.Position().Seq == 6 }, 20*time.Second, 10*time.Millisecond)
	behind, err := other.Register(Filter{Ops: []cdc.Op{cdc.OpRead}, Where: Eq("tenant", 1).Ptr()}, Token{Stream: other.Position().Stream, Seq: 1})
	require.NoError(t, err)
	got, _ = collect(t, behind, 2, 20*time.Second)
	require.Equal(t, []uint64{2, 4}, seqs(got))
	require.Positive(t, other.Stats().CatchUps, "served from the stream")
}

// TestDeadLettersMatchNothing: a change set aside on a dead-letter subject
// (a held table's, on_schema_change: dead_letter; or one the sink's server
// would refuse), with Bridge-Dead-Letter-Reason, is not what the route's
// consumers see: no feed gets it, while its transaction (whose size counts
// it, even when it is the change that carries the size) is delivered whole
// without it.
func TestDeadLettersMatchNothing(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{})
	f, err := fs.Register(Filter{}, Token{})
	require.NoError(t, err)
	aside := func(c *cdc.Change) {
		c.Headers = map[string]string{"Bridge-Dead-Letter-Reason": "routes[0].on_schema_change: dead_letter: public.orders version 3 held",
			"Bridge-Original-Subject": c.Subject}
		c.Subject = "cdc._dead_letter.src.public.orders"
	}
	tx1 := e.gen.tx(ins(order{ID: 1, Tenant: 1}), ins(order{ID: 2, Tenant: 1}), ins(order{ID: 3, Tenant: 1}))
	aside(&tx1[1])
	tx2 := e.gen.tx(ins(order{ID: 4, Tenant: 1}), ins(order{ID: 5, Tenant: 1}))
	tx2[0].TxSize = 0 // the size on the last change only, which is set aside
	aside(&tx2[1])
	e.write(tx1, tx2, e.gen.tx(ins(order{ID: 6, Tenant: 1})))
	got, tok := collect(t, f, 4, 20*time.Second)
	require.Equal(t, []uint64{1, 3, 4, 6}, seqs(got))
	require.Equal(t, uint64(6), tok.Seq)
}

// TestNotUnderstoodLoggedOnce: messages whose payload is not the native
// format (a route of another format) match no feed and are logged once a
// minute with their count, not once each; the native changes around them
// are served.
func TestNotUnderstoodLoggedOnce(t *testing.T) {
	e := newEnv(t, nil)
	var logged syncbuf.Buffer
	fs := e.feeds(Config{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	f, err := fs.Register(Filter{}, Token{})
	require.NoError(t, err)
	e.write(e.gen.tx(ins(order{ID: 1, Tenant: 1})))
	for i := range 20 {
		m := nats.NewMsg("cdc.src.public.orders")
		m.Header.Set("Nats-Msg-Id", fmt.Sprintf("other.src.e1:%016X:0", 0x9000+i))
		m.Header.Set("Bridge-Op", "insert")
		m.Header.Set("Bridge-Table", "public.orders")
		m.Header.Set("Bridge-Tx-Size", "1")
		m.Data = []byte(`Struct{after=Struct{id=1}}`)
		_, err := e.js.PublishMsg(t.Context(), m)
		require.NoError(t, err)
	}
	e.write(e.gen.tx(ins(order{ID: 2, Tenant: 1})))
	got, _ := collect(t, f, 2, 20*time.Second)
	require.Equal(t, []uint64{1, 22}, seqs(got))
	out := logged.String()
	require.Equal(t, 1, strings.Count(out, "message not understood"), out)
	require.Contains(t, out, "the feeds read the bridge's native format")
	require.Contains(t, out, "not_understood_since_last_warning=1")
}

// TestPayloadFromObjectStore: a change whose payload was too large for one
// message (the sink's large_payload_bucket: no data, Bridge-Payload-Object
// names the object) is served with the object's payload; one whose object
// is gone, or names another change's object, or is larger than half the
// feeds' window, matches no feed, with a warning saying so.
func TestPayloadFromObjectStore(t *testing.T) {
	e := newEnv(t, nil)
	var logged syncbuf.Buffer
	fs := e.feeds(Config{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	f, err := fs.Register(Filter{Where: Eq("tenant", 7).Ptr()}, Token{})
	require.NoError(t, err)
	obs, err := e.js.CreateObjectStore(t.Context(), jetstream.ObjectStoreConfig{Bucket: "cdc_payloads"})
	require.NoError(t, err)
	big := e.gen.tx(ins(order{ID: 1, Tenant: 7, Status: strings.Repeat("x", 200_000)}))[0]
	gone := e.gen.tx(ins(order{ID: 2, Tenant: 7}))[0]
	forged := e.gen.tx(ins(order{ID: 4, Tenant: 7}))[0]
	_, err = obs.PutBytes(t.Context(), big.ID(), big.Payload)
	require.NoError(t, err)
	for _, c := range []cdc.Change{big, gone, forged} {
		m := nats.NewMsg(c.Subject)
		m.Header.Set("Nats-Msg-Id", c.ID())
		m.Header.Set("Bridge-Op", string(c.Op))
		m.Header.Set("Bridge-Table", "public.orders")
		m.Header.Set("Bridge-Tx-Size", "1")
		ref := "cdc_payloads/" + c.ID()
		if c.ID() == forged.ID() {
			ref = "cdc_payloads/" + big.ID() // another change's object: not served as this one
		}
		m.Header.Set("Bridge-Payload-Object", ref)
		m.Header.Set("Bridge-Payload-Bytes", fmt.Sprint(len(c.Payload)))
		_, err := e.js.PublishMsg(t.Context(), m)
		require.NoError(t, err)
	}
	e.write(e.gen.tx(ins(order{ID: 3, Tenant: 7})))
	got, _ := collect(t, f, 2, 20*time.Second)
	require.Equal(t, []uint64{1, 4}, seqs(got))
	var p struct {
		After map[string]any `json:"after"`
	}
	require.NoError(t, json.Unmarshal(got[0].JSON, &p))
	require.Len(t, p.After["status"], 200_000, "the payload from the object store")
	require.Contains(t, logged.String(), "its object is no longer in the object store")

	// A payload larger than half the window is not read.
	small := e.feeds(Config{WindowBytes: 256 << 10})
	from := small.Position()
	from.Seq = 0
	sf, err := small.Register(Filter{Where: Eq("tenant", 7).Ptr()}, from)
	require.NoError(t, err)
	got, _ = collect(t, sf, 1, 20*time.Second)
	require.Equal(t, []uint64{4}, seqs(got), "the 200 kB payload is not served by a 256 KiB window")
}
