package schema

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// Tracker follows the shapes of a source's tables in commit order. It is
// used by one goroutine (the pipeline's reader) during one run.
type Tracker struct {
	reg    *Registry
	source string
	tables map[tableKey]*tableState

	// checkpoint is the run's checkpoint LSN and end the end of what an
	// earlier run may have published (the checkpoint, or past it what a
	// sink holds): changes up to end are replayed (Resume). endPos is
	// end with the ordinal of the last change published there.
	checkpoint, end cdc.LSN
	endPos          cdc.Pos
	announced       map[*Version]bool // announced in this run

	// Registered, when set, is told of every version the tracker writes
	// to the registry (not of the ones it finds there).
	Registered func(*Version)
	// Log, when set, is told of a replayed change that the source
	// describes otherwise than the run that registered its version did.
	Log *slog.Logger
}

type tableKey struct{ schema, table string }

type tableState struct {
	vers   []*Version // loaded versions, ascending: the one in effect when loaded and every later one
	max    int        // the latest version number
	rel    *cdc.Relation
	relVer *Version // the version of rel
	// relUntil is the first loaded version past the change at which rel
	// took relVer (an earlier run registered it, and a replay reaches it):
	// rel's changes take relVer only before it. nil: none.
	relUntil *Version
}

// NewTracker returns a tracker of source's tables over reg.
func NewTracker(reg *Registry, source string) *Tracker {
	return &Tracker{reg: reg, source: source, tables: map[tableKey]*tableState{}, announced: map[*Version]bool{}}
}

// Resume tells the tracker where the run starts: the checkpoint's LSN, and
// end, at or past it, the end of what an earlier run may have published.
// Up to end, what the source read from the catalog (cdc.Relation.Inferred)
// registers no version: it may differ from what the earlier run read, and
// the registry has what that run published.
func (t *Tracker) Resume(checkpoint, end cdc.LSN) {
	t.ResumeAt(checkpoint, cdc.Pos{LSN: end, Seq: math.MaxUint32})
}

// ResumeAt is Resume with the position of the last change an earlier run
// may have published (a transaction may have been published in part):
// every change up to it went through an earlier run's tracker, whose
// decisions are in the registry.
func (t *Tracker) ResumeAt(checkpoint cdc.LSN, end cdc.Pos) {
	if end.LSN <= checkpoint {
		end = cdc.Pos{LSN: checkpoint, Seq: math.MaxUint32} // the checkpoint covers whole transactions
	}
	t.checkpoint, t.end, t.endPos = checkpoint, end.LSN, cdc.Pos{LSN: end.LSN, Seq: end.Seq}
}

// decided reports whether an earlier run went past c: it may have
// published c (Resume's end), or it registered a version of c's table
// after c. That run chose c's version, and the registry holds its choice.
func (t *Tracker) decided(st *tableState, c *cdc.Change) bool {
	if !t.endPos.Less(c.Pos()) {
		return true
	}
	return len(st.vers) > 0 && !st.vers[len(st.vers)-1].before(c)
}

// Replays reports whether an earlier run may have published c (Resume's
// end): decisions about it are in the registry, not to be made again.
func (t *Tracker) Replays(c *cdc.Change) bool { return c.CommitLSN <= t.end }

// Registry returns the registry the tracker writes.
func (t *Tracker) Registry() *Registry { return t.reg }

// Tracks reports whether the tracker looks at c: row changes and snapshot
// reads with a relation.
func Tracks(c *cdc.Change) bool {
	switch c.Op {
	case cdc.OpInsert, cdc.OpUpdate, cdc.OpDelete, cdc.OpRead:
		return c.Rel != nil
	}
	return false
}

// carriesRow reports whether c carries a value of every column of its
// relation: an insert, a read, an update without unchanged TOAST values.
func carriesRow(c *cdc.Change) bool {
	switch c.Op {
	case cdc.OpInsert, cdc.OpRead:
		return true
	case cdc.OpUpdate:
		for _, v := range c.After {
			if _, ok := v.(cdc.UnchangedToast); ok {
				return false
			}
		}
		return true
	}
	return false
}

// carried returns the indexes of the columns of c's relation whose value
// c carries: not unchanged TOAST in its new row; for a delete, not absent
// from its old row.
func carried(c *cdc.Change) []int {
	var out []int
	row := c.After
	if row == nil {
		row = c.Before
	}
	for i := range c.Rel.Columns {
		if i >= len(row) {
			break
		}
		switch row[i].(type) {
		case cdc.UnchangedToast, cdc.AbsentValue:
			continue
		}
		out = append(out, i)
	}
	return out
}

// carriedShape returns the shape of what c carries (carried): its columns
// with values, as c's relation describes them.
func carriedShape(c *cdc.Change) Version {
	rel := *c.Rel
	rel.Columns = nil
	for _, i := range carried(c) {
		rel.Columns = append(rel.Columns, c.Rel.Columns[i])
	}
	return FromRelation(&rel)
}

// carriedDiffer reports whether a column c carries differs from v's column
// of that name (missing, another type or modifier): what a change that
// does not carry every column says for sure.
func carriedDiffer(v *Version, c *cdc.Change) bool {
	for _, i := range carried(c) {
		col := c.Rel.Columns[i]
		j := slices.IndexFunc(v.Columns, func(x Column) bool { return x.Name == col.Name })
		if j < 0 || v.Columns[j].Type != col.Type || v.Columns[j].Declared != col.Declared {
			return true
		}
	}
	return false
}

// snapshotOf returns the id of the snapshot that read c (a read change's
// MsgID is "<producer>.snap-<id>:…"); "" for a change from the WAL.
func snapshotOf(c *cdc.Change) string {
	if c.Op != cdc.OpRead {
		return ""
	}
	rest, ok := strings.CutPrefix(c.MsgID, c.Producer+".snap-")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, ":")
	return id
}

// EventMsgID returns the message id of the event of a version first seen
// by a snapshot read: in that snapshot's id space, as its reads' are,
// "<producer>.snap-<snapshot>:<16 hex of the table>:<version>", so an event
// announced again (a chunk read again after a crash) is a duplicate the
// sinks drop. "" for a version first seen in the WAL: its event has the
// id of its change with the destination "~schema".
func (v *Version) EventMsgID() string {
	if v.Since.Snapshot == "" {
		return ""
	}
	h := sha256.Sum256([]byte(v.Schema + "\x00" + v.Table + "\x00schema"))
	return v.Since.Producer + ".snap-" + v.Since.Snapshot + ":" + cdc.LSN(binary.BigEndian.Uint64(h[:8])).Hex() + ":" + strconv.Itoa(v.Version)
}

// Observe returns the version c was written under and, when c is the first
// change under it, ev: that version, to announce before c (with prev, the
// version before it; nil for a table's first). A new version is in the
// registry when Observe returns. c must be a row change or a snapshot read
// (Tracks) with its Producer set, and changes must come in commit order. A
// replay from an earlier position returns the same versions and events
// again.
//
// What the source read from the catalog rather than the WAL
// (cdc.Relation.Inferred) never contradicts the registry: a difference in
// it alone registers no version in a transaction an earlier run may have
// published (Resume's end); a change that does not carry every column (a
// wal2json delete) registers none when the table has one. Nor does any
// change an earlier run went past (up to the last change it may have
// published, or before the table's latest version): it keeps the version
// the registry has in effect at it, as that run published it; at the very
// change where an earlier run registered a version, that version stands
// even when the source now describes the change otherwise (with a
// warning): wal2json has been seen to describe the same change two ways.
//
// A version first seen by a snapshot read is announced again before its
// first change in a run that starts before it: a chunk read again after a
// crash is put into the stream at another position, and its event (with
// the snapshot's id, EventMsgID) may not be in every sink.
func (t *Tracker) Observe(ctx context.Context, c *cdc.Change) (v, ev, prev *Version, err error) {
	k := tableKey{c.Schema, c.Table}
	st := t.tables[k]
	if st != nil && st.rel == c.Rel && (st.relUntil == nil || st.relUntil.after(c)) {
		return st.relVer, nil, nil, nil
	}
	if st == nil {
		if st, err = t.load(ctx, c); err != nil {
			return nil, nil, nil, err
		}
		t.tables[k] = st
	}
	shape := FromRelation(c.Rel)
	// A change that does not carry every column (a wal2json delete, an
	// update with unchanged TOAST values) says for sure only what it
	// carries; the rest of its description comes from the catalog or an
	// earlier change.
	partial := c.Rel.Inferred&cdc.InferredColumns != 0 && !carriesRow(c)
	mask := c.Rel.Inferred &^ cdc.InferredColumns
	if partial {
		mask |= cdc.InferredColumns
	}
	use := func(x *Version) {
		if x.Fingerprint == shape.Fingerprint {
			// The same shape: the relation's next changes take x at once,
			// up to the first version an earlier run registered past c (the
			// source may describe that change with this relation too; vers
			// ascend, a producer's in commit order).
			st.rel, st.relVer, st.relUntil = c.Rel, x, nil
			for _, y := range st.vers {
				if y != x && y.after(c) {
					st.relUntil = y
					break
				}
			}
		} else {
			st.rel, st.relVer, st.relUntil = nil, nil, nil // x despite what the source inferred: look at each change
		}
	}
	var cur *Version
	for _, x := range st.vers {
		if x.at(c) { // registered at this very change by an earlier run: announce it again
			if d := difference(x, &shape, mask|x.inferredMask()); d != "" && t.Log != nil {
				// The run that registered x published c under it: x stands.
				t.Log.Warn("a replayed change is described otherwise than when its version was registered; it keeps the registry's version, under which it was published",
					"version", x.Ref(), "commit_lsn", c.CommitLSN.String(), "seq", c.Seq, "op", string(c.Op), "difference", d)
			}
			pv, err := t.prevOf(ctx, st, x)
			if err != nil {
				return nil, nil, nil, err
			}
			use(x)
			t.announced[x] = true
			return x, x, pv, nil
		}
		if x.before(c) {
			cur = x
		}
	}
	if cur != nil {
		keep := cur.Fingerprint == shape.Fingerprint || partial && !carriedDiffer(cur, c)
		if !keep && !differs(cur, &shape, mask|cur.inferredMask()) {
			// Only what the source inferred differs: a new version only
			// past what an earlier run may have published.
			keep = c.CommitLSN <= t.end
		}
		if !keep && t.decided(st, c) {
			// An earlier run chose cur for c, and consumers may have c
			// under it: a replay describes c as that run did, whatever
			// this run's decoding says (wal2json has been seen to describe
			// a replayed change with the shape of the change after it),
			// and never registers a version behind a later one.
			keep = true
		}
		if keep {
			use(cur)
			if cur.Since.Snapshot != "" && cur.Since.Producer == c.Producer && !t.announced[cur] {
				t.announced[cur] = true
				if l, _ := cur.Since.pos(); l > t.checkpoint {
					pv, err := t.prevOf(ctx, st, cur)
					if err != nil {
						return nil, nil, nil, err
					}
					return cur, cur, pv, nil
				}
			}
			return cur, nil, nil, nil
		}
	}
	nv := shape
	if partial && cur == nil {
		// A table first seen by a change that does not carry every
		// column: its version has what the change carries (a delete's
		// key), the next full row adds the rest.
		nv = carriedShape(c)
	}
	nv.Source, nv.Version = t.source, st.max+1
	if cur != nil {
		nv.Previous = cur.Version
	}
	nv.Since = Since{Producer: c.Producer, CommitLSN: c.CommitLSN.String(), Seq: c.Seq, Snapshot: snapshotOf(c)}
	if err := t.reg.Put(ctx, &nv); err != nil {
		return nil, nil, nil, fmt.Errorf("registering the new shape of %s.%s at %s (%s, seq %d): %w", c.Schema, c.Table, c.CommitLSN, c.Op, c.Seq, err)
	}
	if t.Registered != nil {
		t.Registered(&nv)
	}
	st.vers = append(st.vers, &nv)
	st.max = nv.Version
	use(&nv)
	t.announced[&nv] = true
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
// the one in effect at c. Versions stored past the latest pointer (a run
// that stopped between writing a version and moving the pointer, Put's two
// writes) count too, and the pointer is moved to them: the change that
// registered such a version is replayed, and must find it (at) rather than
// register its shape again from a catalog that may have changed since.
func (t *Tracker) load(ctx context.Context, c *cdc.Change) (*tableState, error) {
	n, _, err := t.reg.Latest(ctx, t.source, c.Schema, c.Table)
	if err != nil {
		return nil, err
	}
	for {
		v, err := t.reg.Get(ctx, t.source, c.Schema, c.Table, n+1)
		if err != nil {
			return nil, err
		}
		if v == nil {
			break
		}
		n++
	}
	if err := t.reg.moveLatest(ctx, t.source, c.Schema, c.Table, n); err != nil {
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

// Previous returns the version before v (nil for a table's first).
func (t *Tracker) Previous(ctx context.Context, v *Version) (*Version, error) {
	st := t.tables[tableKey{v.Schema, v.Table}]
	if st == nil {
		st = &tableState{}
	}
	return t.prevOf(ctx, st, v)
}
