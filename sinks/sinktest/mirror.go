package sinktest

import (
	"fmt"
	"maps"
	"slices"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// The checks of a Mirror destination (Harness.Mirror): it holds one entry
// per row key, the last change written to the row, so each case's
// expectation of the messages becomes one of the rows, by folding the
// changes written per key in order.

// exactly returns the check that the changes of want, written in order,
// are all there is of this case: messages once each and in order, or, for
// a mirror, every key holding its last change of want.
func (r *runner) exactly(want []cdc.Change) func([]Received) error {
	if r.h.Mirror == nil {
		return exactly(want)
	}
	return func(got []Received) error {
		byKey, err := r.byKey(got)
		if err != nil {
			return err
		}
		last := map[string]*cdc.Change{}
		for i := range want {
			if k, ok := r.h.Mirror(&want[i]); ok {
				last[k] = &want[i]
			}
		}
		for _, k := range slices.Sorted(maps.Keys(last)) {
			c := last[k]
			m, ok := byKey[k]
			switch {
			case !ok && c.Op == cdc.OpDelete:
			case !ok:
				return fmt.Errorf("key %q holds nothing of this case; want %s (%s), the last change written to it", k, c.ID(), c.Op)
			case m.ID != c.ID():
				return fmt.Errorf("key %q holds %s; want %s (%s), the last change written to it", k, m.ID, c.ID(), c.Op)
			case m.Deleted != (c.Op == cdc.OpDelete):
				return fmt.Errorf("key %q holds %s with Deleted %t, but it is a %s", k, m.ID, m.Deleted, c.Op)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(byKey)) {
			if _, ok := last[k]; !ok {
				return fmt.Errorf("key %q holds %s, but this case wrote nothing there", k, byKey[k].ID)
			}
		}
		return nil
	}
}

// has returns the check that every change of need (parts of all, which
// was written in order) arrived: for a mirror, that every key holds its
// last change of need or a later one of all, and is absent only where
// that change or a later one is a delete.
func (r *runner) has(all []cdc.Change, need ...[]cdc.Change) func([]Received) error {
	if r.h.Mirror == nil {
		return has(need...)
	}
	return func(got []Received) error {
		byKey, err := r.byKey(got)
		if err != nil {
			return err
		}
		index := make(map[string]int, len(all))
		keys := make([]string, len(all))
		for i := range all {
			index[all[i].ID()] = i
			keys[i], _ = r.h.Mirror(&all[i])
		}
		last := map[string]int{}
		for _, b := range need {
			for i := range b {
				if k, ok := r.h.Mirror(&b[i]); ok {
					last[k] = index[b[i].ID()]
				}
			}
		}
		for _, k := range slices.Sorted(maps.Keys(last)) {
			i := last[k]
			m, ok := byKey[k]
			if !ok {
				deleted := false
				for j := i; j < len(all) && !deleted; j++ {
					deleted = keys[j] == k && all[j].Op == cdc.OpDelete
				}
				if !deleted {
					return fmt.Errorf("key %q holds nothing of this case; want %s (%s) or a later change of it", k, all[i].ID(), all[i].Op)
				}
				continue
			}
			j, known := index[m.ID]
			if !known {
				return fmt.Errorf("key %q holds %s, which was never written", k, m.ID)
			}
			if j < i {
				return fmt.Errorf("key %q holds %s, older than %s (%s), which was delivered: an earlier change won", k, m.ID, all[i].ID(), all[i].Op)
			}
		}
		return nil
	}
}

// byKey indexes a mirror's entries by key; a key held twice is an error.
func (r *runner) byKey(got []Received) (map[string]Received, error) {
	out := make(map[string]Received, len(got))
	for _, m := range got {
		if prev, dup := out[m.Key]; dup {
			return nil, fmt.Errorf("key %q is held twice, by %s and %s: a mirror holds one entry per key", m.Key, prev.ID, m.ID)
		}
		out[m.Key] = m
	}
	return out, nil
}

// checkEntries checks every entry of a mirror against the change it claims
// to be: written, filed under its key, with its payload and headers.
func (r *runner) checkEntries(got []Received, all []cdc.Change) {
	r.t.Helper()
	pos := make(map[string]int, len(all))
	for i := range all {
		pos[all[i].ID()] = i
	}
	_, err := r.byKey(got)
	require.NoError(r.t, err)
	for _, m := range got {
		i, ok := pos[m.ID]
		require.True(r.t, ok, "key %q holds %q, which was never written", m.Key, m.ID)
		c := &all[i]
		k, held := r.h.Mirror(c)
		require.True(r.t, held, "key %q holds %s, a change Harness.Mirror says the destination does not hold", m.Key, m.ID)
		require.Equal(r.t, k, m.Key, "key of %s", m.ID)
		if !m.Deleted || m.Payload != nil {
			require.Equal(r.t, string(c.Payload), string(m.Payload), "payload of %s at key %q", m.ID, m.Key)
		}
		if m.Headers != nil {
			for hk, v := range c.Headers {
				require.Equal(r.t, v, m.Headers[hk], "header %q of %s at key %q", hk, m.ID, m.Key)
			}
		}
	}
}
