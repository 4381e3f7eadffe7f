package feeds

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProjectionsBounded registers feeds with many column sets: a set is
// shared by its feeds whatever the order or repetition of its columns,
// dropped once no feed has used it for ProjectionIdle, never held beyond
// MaxProjections (a new one is refused with ErrTooManyProjections only
// while every one is in use), and no wider than MaxColumns. Before, every
// distinct set ever asked for was kept.
func TestProjectionsBounded(t *testing.T) {
	e := newEnv(t, nil)
	e.write(e.gen.tx(ins(order{ID: 1, Tenant: 1, Status: "open"})))
	fs := e.feeds(Config{MaxProjections: 3, MaxColumns: 4, ProjectionIdle: 100 * time.Millisecond, CheckInterval: 20 * time.Millisecond})

	cols := func(i int) []string { return []string{"id", fmt.Sprintf("c%d", i)} }
	// Many requests, each its own column set, one after the other (a
	// client cycling through them): never more than the cap held.
	for i := range 50 {
		f, err := fs.Register(Filter{Columns: cols(i)}, Token{})
		require.NoError(t, err, "set %d", i)
		f.Close()
		require.LessOrEqual(t, fs.Stats().Projections, 3, "after set %d", i)
	}

	// One set, however written, is one projection.
	var open []*Feed
	for _, c := range [][]string{{"id", "status"}, {"status", "id"}, {"id", "status", "status", "id"}} {
		f, err := fs.Register(Filter{Columns: c}, Token{})
		require.NoError(t, err)
		open = append(open, f)
	}
	a, err := fs.Register(Filter{Columns: cols(100)}, Token{})
	require.NoError(t, err)
	b, err := fs.Register(Filter{Columns: cols(101)}, Token{})
	require.NoError(t, err)
	require.Equal(t, 3, fs.Stats().Projections)

	// Every set in use: a fourth is refused, all columns are still served.
	_, err = fs.Register(Filter{Columns: cols(102)}, Token{})
	require.ErrorIs(t, err, ErrTooManyProjections)
	require.Contains(t, err.Error(), "3 column sets are in use, the limit (MaxProjections)")
	all, err := fs.Register(Filter{}, Token{})
	require.NoError(t, err)
	all.Close()

	// One falls idle: the next new set takes its place at once.
	a.Close()
	c, err := fs.Register(Filter{Columns: cols(102)}, Token{})
	require.NoError(t, err)
	require.Equal(t, 3, fs.Stats().Projections)

	_, err = fs.Register(Filter{Columns: []string{"a", "b", "c", "d", "e"}}, Token{})
	require.EqualError(t, err, "filter.columns: 5 columns, more than the limit of 4 (MaxColumns)")
	_, err = fs.Register(Filter{Columns: []string{"a", "a", "a", "a", "a", "b"}}, Token{})
	require.ErrorIs(t, err, ErrTooManyProjections, "two distinct columns are within MaxColumns; the sets are all in use")

	// All closed: every set expires after ProjectionIdle.
	for _, f := range append(open, b, c) {
		f.Close()
	}
	require.Eventually(t, func() bool { return fs.Stats().Projections <= 1 }, 10*time.Second, 10*time.Millisecond, "idle projections expire: %d held", fs.Stats().Projections)
}

// TestEncodingsCountInWindow has many feeds, each with its own column set,
// read every change of the window: their encodings count in WindowBytes,
// so the window evicts its oldest transactions to stay within it rather
// than holding an encoding per projection beyond it. Before, encodings
// were outside the bound and the window kept every transaction.
func TestEncodingsCountInWindow(t *testing.T) {
	e := newEnv(t, nil)
	const window = 64 << 10
	fs := e.feeds(Config{WindowBytes: window})
	from := fs.Position()
	for i := range 40 {
		e.write(e.gen.tx(ins(order{ID: int64(i), Tenant: 1, Status: strings.Repeat("x", 200)})))
	}
	require.Eventually(t, func() bool { return fs.Stats().Head >= from.Seq+40 }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, 40, fs.Stats().WindowTxns, "the changes alone fit in the window")

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for i := range 60 {
		f, err := fs.Register(Filter{Columns: []string{"id", "status", fmt.Sprintf("c%d", i)}}, from)
		require.NoError(t, err)
		n := 0
		for n < 40 {
			b, err := f.Poll(ctx)
			require.NoError(t, err)
			n += len(b.Changes)
			if len(b.Changes) == 0 && b.UpToDate {
				break
			}
		}
		require.Equal(t, 40, n, "feed %d reads every change (from the stream once evicted)", i)
		f.Close()
		st := fs.Stats()
		require.LessOrEqual(t, st.EncodedBytes, int64(window), "feed %d", i)
	}
	st := fs.Stats()
	require.Greater(t, st.EncodedBytes, int64(0))
	require.Less(t, st.WindowTxns, 40, "encodings pushed the oldest transactions out of the window")
}
