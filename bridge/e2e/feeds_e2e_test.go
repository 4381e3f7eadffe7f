package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/feeds"
)

// TestFeedsSlotRecreated runs the whole chain: Postgres, the bridge under
// on_slot_lost: recreate, the stream, and filtered feeds. The slot is
// dropped under the streaming bridge; the bridge publishes a resync under
// a new epoch, and every feed, whether waiting in Next or between two
// polls, gets exactly one must-refetch (reason resync), never a change of
// the new epoch before it. A token taken before the resync, resumed on
// another process, meets the same must-refetch; a feed registered again
// receives the new epoch's changes with no further refetch.
func TestFeedsSlotRecreated(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE r (id int PRIMARY KEY, g int NOT NULL)`)
	r := e.start(e.config("feedsync", "      tables: [public.r]\n      on_slot_lost: recreate"))
	waitReady(t, r)

	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	open := func() *feeds.Feeds {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		fs, err := feeds.New(ctx, js, feeds.Config{Stream: "CDC_feedsync", CheckInterval: 200 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(fs.Close)
		require.Eventually(t, fs.Ready, 30*time.Second, 10*time.Millisecond)
		return fs
	}
	fs := open()

	const groups, perGroup, nFeeds = 5, 4, 50
	fl := make([]*feeds.Feed, nFeeds)
	for i := range fl {
		fl[i], err = fs.Register(feeds.Filter{Tables: []string{"public.r"}, Where: feeds.Eq("g", int64(i%groups)).Ptr()}, feeds.Token{})
		require.NoError(t, err)
	}
	for id := range groups * perGroup {
		e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO r VALUES (%d, %d)`, id, id%groups))
	}
	// Every feed reads its group's rows, and keeps its token.
	tokens := make([]feeds.Token, nFeeds)
	for i, f := range fl {
		got := 0
		for got < perGroup {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			b, err := f.Next(ctx)
			cancel()
			require.NoError(t, err, "feed %d", i)
			for _, c := range b.Changes {
				require.Equal(t, "public.r", c.Table)
				got++
			}
			tokens[i] = b.Token
		}
		require.Equal(t, perGroup, got, "feed %d", i)
	}

	// Half the feeds wait in Next while the slot is dropped; the others
	// poll only afterwards.
	type result struct {
		refetch int
		reason  string
		changes int
		err     error
	}
	results := make(chan result, nFeeds)
	poll := func(f *feeds.Feed) {
		var res result
		for {
			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			b, err := f.Next(ctx)
			cancel()
			var rf *feeds.RefetchError
			switch {
			case errors.As(err, &rf):
				res.refetch++
				res.reason = rf.Reason
				// Sticky: the feed stays failed; the client re-registers.
				if _, err2 := f.Next(t.Context()); !errors.Is(err2, feeds.ErrMustRefetch) {
					res.err = fmt.Errorf("the failed feed's next Next: %v", err2)
				}
				results <- res
				return
			case err != nil:
				res.err = err
				results <- res
				return
			}
			res.changes += len(b.Changes)
		}
	}
	for i := 0; i < nFeeds; i += 2 {
		go poll(fl[i])
	}
	conn := e.pg.Conn(t, "")
	require.Eventually(t, func() bool {
		_, _ = conn.Exec(t.Context(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'slot_feedsync' AND active_pid IS NOT NULL`)
		_, err := conn.Exec(t.Context(), `SELECT pg_drop_replication_slot('slot_feedsync')`)
		return err == nil
	}, 60*time.Second, time.Millisecond, "could not drop the slot")
	waitSlotActive(t, e, "slot_feedsync")
	// Changes of the new epoch follow the resync.
	for id := 1000; id < 1000+groups*perGroup; id++ {
		e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO r VALUES (%d, %d)`, id, id%groups))
	}
	e.waitCount("CDC_feedsync", groups*perGroup+1+groups*perGroup, 60*time.Second)
	for i := 1; i < nFeeds; i += 2 {
		go poll(fl[i])
	}
	for range nFeeds {
		select {
		case res := <-results:
			require.NoError(t, res.err)
			require.Equal(t, 1, res.refetch)
			require.Equal(t, feeds.ReasonResync, res.reason)
			require.Zero(t, res.changes, "no change of the new epoch before the must-refetch")
		case <-time.After(120 * time.Second):
			t.Fatal("a feed never got its must-refetch")
		}
	}

	// Another process resuming a token from before the resync: the same.
	other := open()
	f, err := other.Register(feeds.Filter{Where: feeds.Eq("g", int64(0)).Ptr()}, tokens[0])
	if err == nil {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		_, err = f.Next(ctx)
		cancel()
	}
	var rf *feeds.RefetchError
	require.ErrorAs(t, err, &rf)
	require.Equal(t, feeds.ReasonResync, rf.Reason)

	// Registered again after the resync: the new epoch's changes, once.
	again, err := fs.Register(feeds.Filter{Where: feeds.Eq("g", int64(1)).Ptr()}, feeds.Token{})
	require.NoError(t, err)
	e.pg.ExecT(t, `INSERT INTO r VALUES (5001, 1)`)
	seen := map[string]int{}
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		b, err := again.Next(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			require.NoError(t, err)
		}
		for _, c := range b.Changes {
			seen[c.ID]++
		}
		return len(seen) > 0
	}, 60*time.Second, 10*time.Millisecond)
	require.Len(t, seen, 1, "only the row written after registering")
	for id, n := range seen {
		require.Equal(t, 1, n, id)
	}
}
