package schema

import (
	"context"
	"fmt"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// Tracker follows the shapes of a source's tables in commit order. It is
// used by one goroutine (the pipeline's reader) during one run.
type Tracker struct {
	reg    *Registry
	source string
	tables map[tableKey]*tableState
}

type tableKey struct{ schema, table string }

type tableState struct {
	vers   []*Version // loaded versions, ascending: the one in effect when loaded and every later one
	max    int        // the latest version number
	rel    *cdc.Relation
	relVer *Version // the version of rel
}

// NewTracker returns a tracker of source's tables over reg.
func NewTracker(reg *Registry, source string) *Tracker {
	return &Tracker{reg: reg, source: source, tables: map[tableKey]*tableState{}}
}

// Registry returns the registry the tracker writes.
func (t *Tracker) Registry() *Registry { return t.reg }

// Tracks reports whether the tracker looks at c: row changes with a
// relation.
func Tracks(c *cdc.Change) bool {
	switch c.Op {
	case cdc.OpInsert, cdc.OpUpdate, cdc.OpDelete:
		return c.Rel != nil
	}
	return false
}

// Observe returns the version c was written under and, when c is the first
// change under it, ev: that version, to announce before c (with prev, the
// version before it; nil for a table's first). A new version is in the
// registry when Observe returns. c must be a row change (Tracks) with its
// Producer set, and changes must come in commit order. A replay from an
// earlier position returns the same versions and events again.
func (t *Tracker) Observe(ctx context.Context, c *cdc.Change) (v, ev, prev *Version, err error) {
	k := tableKey{c.Schema, c.Table}
	st := t.tables[k]
	if st != nil && st.rel == c.Rel {
		return st.relVer, nil, nil, nil
	}
	if st == nil {
		if st, err = t.load(ctx, c); err != nil {
			return nil, nil, nil, err
		}
		t.tables[k] = st
	}
	shape := FromRelation(c.Rel)
	var cur *Version
	for _, x := range st.vers {
		if x.at(c) { // registered at this very change by an earlier run: announce it again
			if x.Fingerprint != shape.Fingerprint {
				return nil, nil, nil, fmt.Errorf("%w: schema registry %q holds %s first seen at %s:%d, with another shape than the change there (%s of %s.%s at %s); the registry was written by another bridge, or the bucket was changed by hand",
					ErrConflict, t.reg.bucket, x.Ref(), x.Since.CommitLSN, x.Since.Seq, c.Op, c.Schema, c.Table, c.CommitLSN)
			}
			pv, err := t.prevOf(ctx, st, x)
			if err != nil {
				return nil, nil, nil, err
			}
			st.rel, st.relVer = c.Rel, x
			return x, x, pv, nil
		}
		if x.before(c) {
			cur = x
		}
	}
	if cur != nil && cur.Fingerprint == shape.Fingerprint {
		st.rel, st.relVer = c.Rel, cur
		return cur, nil, nil, nil
	}
	nv := shape
	nv.Source, nv.Version = t.source, st.max+1
	if cur != nil {
		nv.Previous = cur.Version
	}
	nv.Since = Since{Producer: c.Producer, CommitLSN: c.CommitLSN.String(), Seq: c.Seq}
	if err := t.reg.Put(ctx, &nv); err != nil {
		return nil, nil, nil, fmt.Errorf("registering the new shape of %s.%s at %s (%s, seq %d): %w", c.Schema, c.Table, c.CommitLSN, c.Op, c.Seq, err)
	}
	st.vers = append(st.vers, &nv)
	st.max = nv.Version
	st.rel, st.relVer = c.Rel, &nv
	return &nv, &nv, cur, nil
}

// prevOf returns the version before x, reading it when not loaded.
func (t *Tracker) prevOf(ctx context.Context, st *tableState, x *Version) (*Version, error) {
	if x.Previous == 0 {
		return nil, nil
	}
	for _, y := range st.vers {
		if y.Version == x.Previous {
			return y, nil
		}
	}
	p, err := t.reg.Get(ctx, t.source, x.Schema, x.Table, x.Previous)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, fmt.Errorf("schema registry %q lacks %s.%s version %d, the one before version %d", t.reg.bucket, x.Schema, x.Table, x.Previous, x.Version)
	}
	return p, nil
}

// load reads the table's latest version and the ones before it back to
// the one in effect at c.
func (t *Tracker) load(ctx context.Context, c *cdc.Change) (*tableState, error) {
	n, _, err := t.reg.Latest(ctx, t.source, c.Schema, c.Table)
	if err != nil {
		return nil, err
	}
	st := &tableState{max: n}
	for i := n; i >= 1; i-- {
		v, err := t.reg.Get(ctx, t.source, c.Schema, c.Table, i)
		if err != nil {
			return nil, err
		}
		if v == nil {
			return nil, fmt.Errorf("schema registry %q points to %s.%s version %d as the latest but lacks version %d", t.reg.bucket, c.Schema, c.Table, n, i)
		}
		st.vers = append([]*Version{v}, st.vers...)
		if v.before(c) && !v.at(c) {
			break
		}
	}
	return st, nil
}
