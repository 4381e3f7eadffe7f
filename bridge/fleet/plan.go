package fleet

import (
	"hash/fnv"
	"sort"
)

// Plan returns which member should own each source: every source gets
// one of members, each member between ⌊S/M⌋ and ⌈S/M⌉ of them, and a source
// keeps its current owner (owners: source → live member, absent when free)
// whenever the quotas allow, so a member joining or leaving moves only as
// many sources as evenness needs. The members given the larger quota are
// those that own the most already (ties by id). Among the members with
// room, a free source goes to the one with the highest rendezvous score
// (a hash of member and source), and an owner over its quota keeps its
// sources with the highest scores. Plan is a pure function: members that
// see the same sources, members and owners compute the same plan.
func Plan(sources, members []string, owners map[string]string) map[string]string {
	out := make(map[string]string, len(sources))
	if len(members) == 0 || len(sources) == 0 {
		return out
	}
	ms := append([]string{}, members...)
	sort.Strings(ms)
	srcs := append([]string{}, sources...)
	sort.Strings(srcs)
	live := make(map[string]bool, len(ms))
	for _, m := range ms {
		live[m] = true
	}
	owned := map[string][]string{}
	for _, s := range srcs {
		if o := owners[s]; live[o] {
			owned[o] = append(owned[o], s)
		}
	}
	// Quotas: the first S%M members, by sources owned (most first), get
	// one more.
	byOwned := append([]string{}, ms...)
	sort.SliceStable(byOwned, func(i, j int) bool { return len(owned[byOwned[i]]) > len(owned[byOwned[j]]) })
	base, extra := len(srcs)/len(ms), len(srcs)%len(ms)
	quota := make(map[string]int, len(ms))
	for i, m := range byOwned {
		quota[m] = base
		if i < extra {
			quota[m]++
		}
	}
	kept := map[string]int{}
	for _, m := range ms {
		mine := owned[m]
		sort.SliceStable(mine, func(i, j int) bool { return score(m, mine[i]) > score(m, mine[j]) })
		for _, s := range mine {
			if kept[m] < quota[m] {
				out[s] = m
				kept[m]++
			}
		}
	}
	for _, s := range srcs {
		if _, ok := out[s]; ok {
			continue
		}
		best, bestScore := "", uint64(0)
		for _, m := range ms {
			if kept[m] >= quota[m] {
				continue
			}
			if sc := score(m, s); best == "" || sc > bestScore {
				best, bestScore = m, sc
			}
		}
		out[s] = best
		kept[best]++
	}
	return out
}

// score is the rendezvous hash of member and source.
func score(member, source string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(member))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(source))
	return h.Sum64()
}
