package pipeline

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/snapshot"
	"github.com/bridgecdc/bridge/config"
)

// batchSink is a sinks.Sink that records the size of every batch.
type batchSink struct {
	mu    sync.Mutex
	sizes []int
	at    []time.Duration // when each Write began, since start
	start time.Time
}

func (s *batchSink) Connect(context.Context) error { return nil }
func (s *batchSink) Close(context.Context) error   { return nil }
func (s *batchSink) Write(_ context.Context, batch []cdc.Change) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sizes = append(s.sizes, len(batch))
	s.at = append(s.at, time.Since(s.start))
	return nil
}

func (s *batchSink) batches() ([]int, []time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.sizes...), append([]time.Duration(nil), s.at...)
}

// runWriter runs Pipeline.write over items with one batchSink configured
// with b, and returns when items is closed and drained.
func runWriter(t *testing.T, b config.Batch, feed func(items chan<- []*txnItem)) (*batchSink, []cdc.LSN) {
	sk := &batchSink{start: time.Now()}
	p := New(Config{Source: "app", Shutdown: time.Second, Sinks: []Sink{{Name: "s", Sink: sk, Batch: b}}})
	items := make(chan []*txnItem)
	var marks []cdc.LSN
	done := make(chan error, 1)
	go func() {
		done <- p.write(t.Context(), t.Context(), items, make([]map[cdc.Pos]struct{}, 1), make([]snapshot.Held, 1),
			func(m mark) { marks = append(marks, m.lsn) }, mark{}, nil)
	}()
	feed(items)
	close(items)
	require.NoError(t, <-done)
	return sk, marks
}

// oneChange is a committed single-change transaction at commit lsn.
func oneChange(lsn cdc.LSN) []*txnItem {
	return []*txnItem{{commit: lsn, last: true, changes: []cdc.Change{{CommitLSN: lsn, TxSize: 1, Op: cdc.OpInsert}}, dests: [][]int{{0}}}}
}

// part is one change of a large transaction at commit lsn, handed over on
// its own as the reader hands over a large transaction's parts: more of it
// follows.
func part(lsn cdc.LSN, seq uint32, last bool) []*txnItem {
	return []*txnItem{{commit: lsn, last: last, changes: []cdc.Change{{CommitLSN: lsn, Seq: seq, Op: cdc.OpInsert}}, dests: [][]int{{0}}}}
}

// TestWriterMaxWaitIsAnAge checks that max_wait bounds how long the first
// change of a batch waits, not the gap between changes: with one change
// every millisecond (always less than max_wait apart) and more always
// coming (the parts of a large transaction), a batch is still written
// every max_wait. The clock is synctest's, so the figures are exact.
func TestWriterMaxWaitIsAnAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sk, marks := runWriter(t, config.Batch{MaxChanges: 100000, MaxWait: 10 * time.Millisecond}, func(items chan<- []*txnItem) {
			for i := 0; i < 100; i++ {
				items <- part(7, uint32(i), i == 99)
				time.Sleep(time.Millisecond)
			}
		})
		sizes, at := sk.batches()
		require.NotEmpty(t, sizes)
		// The first change arrives at 0 and waits 10 ms: changes 0..9 ms
		// make the first batch.
		assert.Equal(t, 10, sizes[0], "first batch: sizes %v at %v", sizes, at)
		assert.Equal(t, 10*time.Millisecond, at[0])
		total := 0
		for i, n := range sizes {
			assert.LessOrEqual(t, n, 11, "batch %d waited past max_wait: sizes %v", i, sizes)
			total += n
		}
		assert.Equal(t, 100, total)
		assert.Equal(t, []cdc.LSN{7}, marks, "one mark, at the transaction's end")
	})
}

// TestWriterLoneChange checks that a transaction arriving alone (the
// source had nothing more at hand) is written at once, not held for
// company: it would wait max_wait for nothing, a live stream's latency.
func TestWriterLoneChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sk, _ := runWriter(t, config.Batch{MaxChanges: 1000, MaxWait: time.Hour}, func(items chan<- []*txnItem) {
			items <- oneChange(1)
			time.Sleep(time.Second)
			items <- oneChange(2)
			time.Sleep(time.Second)
		})
		sizes, at := sk.batches()
		assert.Equal(t, []int{1, 1}, sizes)
		assert.Equal(t, []time.Duration{0, time.Second}, at)
	})
}

// TestWriterLastPartNotHeld: the last part of a large transaction ends a
// burst like a lone transaction: written at once, while its earlier parts
// waited for company.
func TestWriterLastPartNotHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sk, marks := runWriter(t, config.Batch{MaxChanges: 1000, MaxWait: time.Hour}, func(items chan<- []*txnItem) {
			items <- part(9, 0, false)
			time.Sleep(time.Second)
			items <- part(9, 1, true)
			time.Sleep(time.Second)
		})
		sizes, at := sk.batches()
		assert.Equal(t, []int{2}, sizes)
		assert.Equal(t, []time.Duration{time.Second}, at)
		assert.Equal(t, []cdc.LSN{9}, marks)
	})
}

// TestWriterMaxChangesAbove1000 checks that max_changes above 1000 is
// honoured: a backlog arriving all at once goes out in batches of exactly
// max_changes.
func TestWriterMaxChangesAbove1000(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sk, _ := runWriter(t, config.Batch{MaxChanges: 2500, MaxWait: time.Hour}, func(items chan<- []*txnItem) {
			for i := 0; i < 5; i++ { // runs of chunk transactions, as the reader hands a backlog over
				run := make([]*txnItem, 0, chunk)
				for j := 1; j <= chunk; j++ {
					run = append(run, oneChange(cdc.LSN(i*chunk + j))[0])
				}
				items <- run
			}
		})
		sizes, _ := sk.batches()
		assert.Equal(t, []int{2500, 2500}, sizes)
	})
}
