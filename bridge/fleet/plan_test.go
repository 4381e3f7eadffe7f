package fleet

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return out
}

func counts(plan map[string]string) map[string]int {
	c := map[string]int{}
	for _, m := range plan {
		c[m]++
	}
	return c
}

func moved(before, after map[string]string) int {
	n := 0
	for s, m := range after {
		if before[s] != "" && before[s] != m {
			n++
		}
	}
	return n
}

func TestPlanIsEvenAndMovesOnlyWhatItMust(t *testing.T) {
	srcs := names("src", 12)
	// From nothing: 4 each.
	p3 := Plan(srcs, []string{"a", "b", "c"}, nil)
	require.Len(t, p3, 12)
	require.Equal(t, map[string]int{"a": 4, "b": 4, "c": 4}, counts(p3))
	// The same view gives the same plan, whatever the order.
	require.Equal(t, p3, Plan([]string{srcs[5], srcs[1], srcs[0], srcs[2], srcs[3], srcs[4], srcs[6], srcs[7], srcs[8], srcs[9], srcs[10], srcs[11]}, []string{"c", "a", "b"}, nil))

	// A fourth member joins: it takes 3, one from each, and nothing else moves.
	p4 := Plan(srcs, []string{"a", "b", "c", "d"}, p3)
	require.Equal(t, map[string]int{"a": 3, "b": 3, "c": 3, "d": 3}, counts(p4))
	require.Equal(t, 3, moved(p3, p4), "only the sources the newcomer takes move")

	// b leaves: its 3 go to the others, nothing else moves.
	owners := map[string]string{}
	for s, m := range p4 {
		if m != "b" {
			owners[s] = m
		}
	}
	p3b := Plan(srcs, []string{"a", "c", "d"}, owners)
	require.Equal(t, map[string]int{"a": 4, "c": 4, "d": 4}, counts(p3b))
	require.Equal(t, 0, moved(owners, p3b), "no source of a live member moves when one leaves")

	// Uneven counts: 13 sources over 4 members is 4,3,3,3; the member
	// that owns the most keeps its 4.
	srcs13 := names("src", 13)
	own := map[string]string{}
	for i, s := range srcs13 {
		own[s] = []string{"a", "a", "a", "a", "a", "b", "b", "b", "b", "c", "c", "c", "c"}[i]
	}
	p := Plan(srcs13, []string{"a", "b", "c", "d"}, own)
	require.Equal(t, map[string]int{"a": 4, "b": 3, "c": 3, "d": 3}, counts(p))
	require.Equal(t, 3, moved(own, p))

	// An owner that is not a live member owns nothing.
	p = Plan(srcs, []string{"a"}, map[string]string{srcs[0]: "gone"})
	require.Equal(t, map[string]int{"a": 12}, counts(p))

	// More members than sources: one each at most.
	p = Plan(names("s", 2), []string{"a", "b", "c"}, nil)
	require.Len(t, p, 2)
	for _, n := range counts(p) {
		require.Equal(t, 1, n)
	}
}
