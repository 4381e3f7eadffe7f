package feeds

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// resumer is a client that keeps only a token, as an SSE client keeps its
// last event ID: after every empty answer (a keep-alive's id, a timed-out
// long-poll) and at random after changes, it drops its feed and opens a
// new one from the token, on whichever Feeds (process) is current.
type resumer struct {
	got   []string
	err   error
	opens int
}

// opened is told once the client's first feed is open (or failed to).
func resume(cur *atomic.Pointer[Feeds], sp spec, r *rand.Rand, final *atomic.Uint64, opened func()) *resumer {
	p := &resumer{}
	var tok Token
	var f *Feed
	open := func() bool {
		for {
			fs := cur.Load()
			var err error
			if f, err = fs.Register(sp.filter, tok); err == nil {
				p.opens++
				return true
			} else if !errors.Is(err, ErrClosed) {
				p.err = err
				return false
			}
			time.Sleep(time.Millisecond) // the next process is starting
		}
	}
	ok := open()
	opened()
	if !ok {
		return p
	}
	tok = f.Token()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(5+r.IntN(60))*time.Millisecond)
		var b Batch
		var err error
		if r.IntN(2) == 0 {
			b, err = f.Next(ctx)
		} else {
			b, err = f.Poll(ctx)
		}
		cancel()
		switch {
		case errors.Is(err, ErrClosed):
			// The process stopped: its last word is the feed's token.
			tok = f.Token()
			if !open() {
				return p
			}
			continue
		case err != nil && ctx.Err() == nil:
			p.err = err
			return p
		}
		for _, c := range b.Changes {
			p.got = append(p.got, fmt.Sprintf("%d:%s", c.Seq, c.Op))
		}
		if !b.Token.IsZero() {
			if b.Token.Seq < tok.Seq {
				p.err = fmt.Errorf("token went back from %d to %d", tok.Seq, b.Token.Seq)
				return p
			}
			tok = b.Token
		}
		if fin := final.Load(); fin != 0 && tok.Seq >= fin {
			f.Close()
			return p
		}
		if len(b.Changes) == 0 || r.IntN(4) == 0 {
			f.Close()
			if !open() {
				return p
			}
			if len(b.Changes) == 0 {
				time.Sleep(time.Duration(r.IntN(10)) * time.Millisecond)
			}
		}
	}
}

// TestResumeFromWaitTokensAgainstOracle: random filters over a random
// workload; each client keeps only the token of its last answer, empty
// ones included (the position a keep-alive's id carries), and reopens its
// feed from it again and again, across a restart of Feeds (a new
// process) in the middle of the writes, with a window small enough that
// reopened feeds are served by replays and reads from the stream. Every
// client gets exactly the oracle's changes: a waiting token never skips a
// match, and never makes one arrive twice.
func TestResumeFromWaitTokensAgainstOracle(t *testing.T) {
	e := newEnv(t, nil)
	cfg := Config{WindowTxns: 40, MaxBatch: 20, replayGap: 16}
	var cur atomic.Pointer[Feeds]
	cur.Store(e.feeds(cfg))
	const nFeeds, nTx = 150, 500
	r := rand.New(rand.NewPCG(5, 6))
	specs := make([]spec, nFeeds)
	for i := range specs {
		specs[i] = randomSpec(r)
	}
	var final atomic.Uint64
	results := make([]*resumer, nFeeds)
	var wg, opened sync.WaitGroup
	for i := range specs {
		wg.Add(1)
		opened.Add(1)
		go func() {
			defer wg.Done()
			results[i] = resume(&cur, specs[i], rand.New(rand.NewPCG(uint64(i), 11)), &final, opened.Done)
		}()
	}
	// Every client's first feed starts at the empty stream's head (a zero
	// token means the current position), as the oracle counts from there.
	opened.Wait()
	w := &workload{r: rand.New(rand.NewPCG(7, 8)), g: e.gen, live: map[int64]order{}}
	var restarted *Feeds
	for i := 0; i < nTx; {
		var batch [][]cdc.Change
		for j := 0; j < 5 && i < nTx; j++ {
			batch = append(batch, w.tx())
			i++
		}
		e.write(batch...)
		if i == nTx/2 {
			old := cur.Load()
			restarted = e.feeds(cfg)
			cur.Store(restarted)
			old.Close()
		}
	}
	msgs := readStream(t, e.js)
	final.Store(msgs[len(msgs)-1].seq)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("clients did not reach the end of the stream (%d): %+v", final.Load(), cur.Load().Stats())
	}
	opens := 0
	for i, p := range results {
		require.NoError(t, p.err, "client %d (%s)", i, specs[i].name)
		want := expected(msgs, specs[i].pred)
		if !equalStrings(want, p.got) {
			t.Fatalf("client %d (%s): got %d changes, want %d\n got: %s\nwant: %s", i, specs[i].name, len(p.got), len(want),
				strings.Join(head(p.got), " "), strings.Join(head(want), " "))
		}
		opens += p.opens
	}
	st := restarted.Stats()
	t.Logf("%d clients, %d opens, %d messages; after the restart: %+v", nFeeds, opens, len(msgs), st)
	require.Greater(t, opens, 10*nFeeds, "clients reopened their feeds often")
	require.Positive(t, st.Replays, "reopened feeds rode replays")
}

// TestStormReadsHistoryOnce: many feeds reopened at once from the same old
// position, behind a new process's window, each with a selective filter
// (a reconnect storm after a restart): every feed gets its changes, and
// the stream is read a few times for all of them, not once per feed.
func TestStormReadsHistoryOnce(t *testing.T) {
	e := newEnv(t, nil)
	e.write(e.gen.tx(ins(order{ID: 0, Tenant: -1})))
	a := e.feeds(Config{})
	require.Eventually(t, func() bool { return a.Position().Seq >= 1 }, 20*time.Second, 10*time.Millisecond)
	from := a.Position()
	a.Close()

	const nFeeds, perFeed = 200, 2
	const history = nFeeds * perFeed
	want := make([][]uint64, nFeeds)
	var batch [][]cdc.Change
	for i := range history {
		tenant := int64(i % nFeeds)
		batch = append(batch, e.gen.tx(ins(order{ID: int64(i + 1), Tenant: tenant})))
		want[tenant] = append(want[tenant], uint64(i+2))
		if len(batch) == 100 {
			e.write(batch...)
			batch = nil
		}
	}
	e.write(batch...)

	b := e.feeds(Config{WindowTxns: 20, Prewarm: 10})
	require.Eventually(t, func() bool { return b.Position().Seq >= history+1 }, 20*time.Second, 10*time.Millisecond)
	require.Greater(t, b.Stats().WindowFrom, from.Seq+1, "the old position is behind the new window")
	got := make([][]uint64, nFeeds)
	var wg sync.WaitGroup
	for i := range nFeeds {
		f, err := b.Register(Filter{Where: Eq("tenant", int64(i)).Ptr()}, from)
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs, _ := collect(t, f, perFeed, 60*time.Second)
			got[i] = seqs(cs)
		}()
	}
	wg.Wait()
	for i := range nFeeds {
		require.Equal(t, want[i], got[i], "feed %d", i)
	}
	st := b.Stats()
	t.Logf("%d feeds reopened %d messages back: %+v", nFeeds, history, st)
	require.Positive(t, st.Replays)
	// One read per feed would be nFeeds × history (80,000) messages.
	require.LessOrEqual(t, st.CatchUpMessages, int64(5*(history+1)), "reads of the stream shared by the feeds")
}
