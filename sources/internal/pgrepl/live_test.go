package pgrepl

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// liveRig is a streaming buffer with a receive loop's hooks.
type liveRig struct {
	b      *TxnBuffer
	done   chan struct{}
	stalls atomic.Int64
	cancel context.CancelFunc
}

func newLiveRig(t *testing.T, maxChanges int) *liveRig {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r := &liveRig{b: NewTxnBuffer(t.TempDir(), maxChanges, 1<<30), done: make(chan struct{}), cancel: cancel}
	r.b.Stream(ctx, r.done, 5*time.Millisecond, func() error { r.stalls.Add(1); return nil })
	return r
}

func row(i int) cdc.Change {
	return cdc.Change{Op: cdc.OpInsert, Rel: relA, Schema: "public", Table: "a", LSN: cdc.LSN(0x100 + i), After: []any{int64(i)}}
}

// feed adds n changes to a transaction whose commit record starts at final,
// from another goroutine (Add waits while the reader is behind), and
// commits it with end. It returns the hand-over (or the whole transaction)
// and a channel that yields Finish's result.
func feed(t *testing.T, b *TxnBuffer, final, end cdc.LSN, n int) (*cdc.Txn, <-chan error) {
	t.Helper()
	handed := make(chan *cdc.Txn, 1)
	fin := make(chan error, 1)
	go func() {
		head := &cdc.Txn{Xid: 77, CommitTime: time.Unix(1700000000, 0).UTC()}
		b.Begin(head, final)
		var got *cdc.Txn
		for i := range n {
			lt, err := b.Add(row(i), 100)
			if err != nil {
				fin <- err
				handed <- nil
				return
			}
			if lt != nil {
				if got != nil {
					fin <- errors.New("handed over twice")
					return
				}
				got = lt
				handed <- lt
			}
		}
		head.CommitLSN = end
		whole, err := b.Finish(head)
		if got == nil {
			handed <- whole
		} else if whole != nil {
			err = errors.New("Finish returned a transaction already handed over")
		}
		fin <- err
	}()
	select {
	case lt := <-handed:
		return lt, fin
	case <-time.After(10 * time.Second):
		t.Fatal("no transaction handed over")
		return nil, nil
	}
}

// drain reads t whole, with Next and NextPart in turn when Rest has both.
func drain(t *testing.T, txn *cdc.Txn) []cdc.Change {
	t.Helper()
	out := append([]cdc.Change(nil), txn.Changes...)
	if txn.Rest == nil {
		return out
	}
	defer txn.Rest.Close()
	buf := make([]cdc.Change, 100)
	pi, parts := txn.Rest.(cdc.PartIter)
	for i := 0; ; i++ {
		var got []cdc.Change
		var err error
		if parts && i%2 == 1 {
			got, err = pi.NextPart()
			if err == nil {
				require.NotEmpty(t, got, "NextPart returns at least one change")
			}
		} else {
			var n int
			n, err = txn.Rest.Next(buf)
			got = buf[:n]
		}
		out = append(out, got...)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
	}
}

// TestLiveHandOver: a transaction of more than StreamAfter changes is
// handed over at its (StreamAfter+1)-th change, before its commit, with
// the identity start of commit record + 1; its changes follow in order,
// and only the last carries the size.
func TestLiveHandOver(t *testing.T) {
	for _, tc := range []struct {
		name       string
		maxChanges int // in memory before spilling
	}{{"in memory", 100000}, {"spilled before the hand-over", 10}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newLiveRig(t, tc.maxChanges)
			const n = 3*StreamAfter + 17
			const final, end = cdc.LSN(0x5000), cdc.LSN(0x5038)
			txn, fin := feed(t, r.b, final, end, n)
			require.NotNil(t, txn.Rest, "handed over while it arrives")
			assert.Equal(t, final+1, txn.CommitLSN)
			assert.Equal(t, uint32(77), txn.Xid)
			if tc.maxChanges > StreamAfter {
				assert.Len(t, txn.Changes, StreamAfter)
			}
			got := drain(t, txn)
			require.NoError(t, <-fin)
			require.Len(t, got, n)
			for i, c := range got {
				require.Equal(t, uint32(i), c.Seq, "change %d", i)
				require.Equal(t, final+1, c.CommitLSN, "change %d", i)
				require.Equal(t, int64(i), c.After[0], "change %d", i)
				require.Equal(t, uint32(77), c.Xid)
				want := uint32(0)
				if i == n-1 {
					want = n
				}
				require.Equal(t, want, c.TxSize, "change %d: only the last knows the size", i)
			}
			// The buffer is ready for the next transaction, handed over whole.
			small, fin2 := feed(t, r.b, 0x6000, 0x6040, 3)
			require.NoError(t, <-fin2)
			assert.Equal(t, cdc.LSN(0x6040), small.CommitLSN)
			assert.Len(t, drain(t, small), 3)
		})
	}
}

// TestLiveThreshold: up to StreamAfter changes, or without a known commit
// start, or without Stream, a transaction is handed over whole at its
// commit, identified by its commit end.
func TestLiveThreshold(t *testing.T) {
	r := newLiveRig(t, 100000)
	txn, fin := feed(t, r.b, 0x5000, 0x5038, StreamAfter)
	require.NoError(t, <-fin)
	assert.Nil(t, txn.Rest)
	assert.Equal(t, cdc.LSN(0x5038), txn.CommitLSN)
	assert.Equal(t, uint32(StreamAfter), txn.Changes[StreamAfter-1].TxSize)

	txn, fin = feed(t, r.b, 0, 0x7038, StreamAfter+5)
	require.NoError(t, <-fin)
	assert.Equal(t, cdc.LSN(0x7038), txn.CommitLSN, "commit start not known: whole")

	plain := NewTxnBuffer(t.TempDir(), 100000, 1<<30)
	txn, fin = feed(t, plain, 0x8000, 0x8038, StreamAfter+5)
	require.NoError(t, <-fin)
	assert.Equal(t, cdc.LSN(0x8038), txn.CommitLSN, "without Stream: whole")
	assert.Len(t, drain(t, txn), StreamAfter+5)
}

// TestLiveBackpressure: while the reader is behind, Add waits and reports
// (stall); a reader that closes the transaction releases the writer.
func TestLiveBackpressure(t *testing.T) {
	r := newLiveRig(t, 100000)
	txn, fin := feed(t, r.b, 0x5000, 0x5038, StreamAfter+livePart*(liveParts+4))
	require.Eventually(t, func() bool { return r.stalls.Load() >= 3 }, 10*time.Second, time.Millisecond,
		"the writer reports to the server while it waits")
	select {
	case err := <-fin:
		t.Fatalf("the writer went on without the reader: %v", err)
	default:
	}
	require.NoError(t, txn.Rest.Close())
	select {
	case err := <-fin:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the writer still waits after the reader closed")
	}
}

// TestLiveInterrupted: a reader waiting for changes returns an error when
// the receive loop stops, when the transaction is cut, or when another
// goroutine closes it.
func TestLiveInterrupted(t *testing.T) {
	start := func(t *testing.T) (*liveRig, *cdc.Txn) {
		r := newLiveRig(t, 100000)
		r.b.Begin(&cdc.Txn{Xid: 1}, 0x5000)
		var txn *cdc.Txn
		for i := range StreamAfter + 1 {
			lt, err := r.b.Add(row(i), 10)
			require.NoError(t, err)
			if lt != nil {
				txn = lt
			}
		}
		require.NotNil(t, txn)
		return r, txn
	}
	next := func(txn *cdc.Txn) <-chan error {
		errc := make(chan error, 1)
		go func() {
			buf := make([]cdc.Change, 10)
			for {
				if _, err := txn.Rest.Next(buf); err != nil {
					errc <- err
					return
				}
			}
		}()
		return errc
	}
	wait := func(t *testing.T, errc <-chan error) error {
		select {
		case err := <-errc:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Next still waits")
			return nil
		}
	}
	t.Run("receive loop stops", func(t *testing.T) {
		r, txn := start(t)
		errc := next(txn)
		close(r.done)
		assert.ErrorIs(t, wait(t, errc), errSourceStopped)
	})
	t.Run("transaction cut", func(t *testing.T) {
		r, txn := start(t)
		errc := next(txn)
		r.b.Begin(&cdc.Txn{Xid: 2}, 0x6000) // a begin without the commit
		assert.ErrorIs(t, wait(t, errc), errTxnCut)
	})
	t.Run("closed by another goroutine", func(t *testing.T) {
		_, txn := start(t)
		errc := next(txn)
		time.Sleep(10 * time.Millisecond)
		require.NoError(t, txn.Rest.Close())
		assert.ErrorIs(t, wait(t, errc), errIterClosed)
	})
}
