package checker

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// history builds a committed history and its faithful stream: writers
// 0..2, each committing transactions of 1..3 rows, interleaved in commit
// order.
func history() ([]Want, []Got) {
	var want []Want
	var got []Got
	lsn := cdc.LSN(0x1000)
	seq := map[int]int64{}
	for i := 0; i < 12; i++ {
		w := i % 3
		seq[w]++
		parts := 1 + i%3
		lsn += 0x100
		for p := 0; p < parts; p++ {
			k := fmt.Sprintf("w%d/%d/%d", w, seq[w], p)
			want = append(want, Want{Key: k, Writer: w, Seq: seq[w]})
			got = append(got, Got{StreamSeq: uint64(len(got) + 1), Key: k, Writer: w, Seq: seq[w],
				Producer: "b.s.E1", Pos: cdc.Pos{LSN: lsn, Seq: uint32(p)}, TxSize: uint32(parts)})
		}
	}
	return want, got
}

// TestCompareFaithfulStream: a correct stream passes, with or without an
// announced epoch change.
func TestCompareFaithfulStream(t *testing.T) {
	want, got := history()
	r := Compare(want, got)
	require.True(t, r.OK(), r.String())

	// A resync: the control message announces the new producer.
	ctl := Got{StreamSeq: 100, Control: true, Producer: "b.s.E2", ControlProducer: "b.s.E2", TxSize: 1}
	tail := got[len(got)-3:]
	moved := slices.Clone(got[:len(got)-3])
	moved = append(moved, ctl)
	for _, g := range tail {
		g.Producer = "b.s.E2"
		moved = append(moved, g)
	}
	r = Compare(want, moved)
	require.True(t, r.OK(), r.String())
}

// TestCompareCatchesEachFault feeds the checker streams broken the ways a
// broken bridge would break them and asserts it reports each.
func TestCompareCatchesEachFault(t *testing.T) {
	want, good := history()
	cases := []struct {
		name   string
		mutate func([]Got) []Got
		check  func(t *testing.T, r *Report)
	}{
		{"dropped change", func(g []Got) []Got { return slices.Delete(g, 4, 5) }, func(t *testing.T, r *Report) {
			require.Len(t, r.Missing, 1)
			require.NotEmpty(t, r.Incomplete, "the dropped change's transaction is partial")
		}},
		{"dropped whole transaction", func(g []Got) []Got { return slices.Delete(g, 0, 1) }, func(t *testing.T, r *Report) {
			require.Len(t, r.Missing, 1)
			require.Empty(t, r.Incomplete)
		}},
		{"duplicated change (same id)", func(g []Got) []Got { return slices.Insert(g, 6, g[5]) }, func(t *testing.T, r *Report) {
			require.NotEmpty(t, r.Duplicates)
			require.Empty(t, r.Missing)
		}},
		{"replayed under a new id", func(g []Got) []Got {
			d := g[2]
			d.Producer, d.StreamSeq = "b.s.E1", 999
			d.Pos.LSN += 0x100000
			return append(g, d)
		}, func(t *testing.T, r *Report) {
			require.NotEmpty(t, r.Duplicates)
		}},
		{"reordered transactions", func(g []Got) []Got {
			g = slices.Clone(g)
			g[0], g[1] = g[1], g[0] // tx 0 (one row) after the first row of tx 1
			return g
		}, func(t *testing.T, r *Report) {
			require.NotEmpty(t, r.OutOfOrder)
		}},
		{"partial transaction at the tail", func(g []Got) []Got { return g[:len(g)-1] }, func(t *testing.T, r *Report) {
			require.Len(t, r.Incomplete, 1)
			require.Len(t, r.Missing, 1)
		}},
		{"phantom change", func(g []Got) []Got {
			return append(g, Got{StreamSeq: 500, Key: "w9/1/0", Writer: 9, Seq: 1, Producer: "b.s.E1", Pos: cdc.Pos{LSN: 0xFFFFF}, TxSize: 1})
		}, func(t *testing.T, r *Report) {
			require.Len(t, r.Unexpected, 1)
		}},
		{"epoch change without resync", func(g []Got) []Got {
			g = slices.Clone(g)
			for i := len(g) - 3; i < len(g); i++ {
				g[i].Producer = "b.s.E2"
			}
			return g
		}, func(t *testing.T, r *Report) {
			require.NotEmpty(t, r.OutOfOrder)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := Compare(want, c.mutate(slices.Clone(good)))
			require.False(t, r.OK(), "the checker missed it")
			c.check(t, r)
			t.Log(r.String())
		})
	}
}
