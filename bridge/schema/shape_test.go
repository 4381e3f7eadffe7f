package schema_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/schema"
)

// TestCompareModifiersAndNullability: a column keeping its type but not
// its modifier or NOT NULL is "changed", naming what changed; NOT NULL
// dropped and a modifier that widens are breaking, the opposite not.
func TestCompareModifiersAndNullability(t *testing.T) {
	code := cdc.Column{Name: "code", Type: "varchar", OID: 1043, Declared: "character varying(20)"}
	price := cdc.Column{Name: "price", Type: "numeric", OID: 1700, Declared: "numeric(10,2)", NotNull: true}
	v1 := schema.FromRelation(rel(id, code, price))
	with := func(c cdc.Column, f func(*cdc.Column)) cdc.Column { f(&c); return c }
	for _, tc := range []struct {
		name     string
		cols     []cdc.Column
		changed  []schema.Changed
		breaking bool
	}{
		{"longer varchar", []cdc.Column{id, with(code, func(c *cdc.Column) { c.Declared = "character varying(40)" }), price},
			[]schema.Changed{{Name: "code", What: "modifier", From: "character varying(20)", To: "character varying(40)", Breaking: true}}, true},
		{"shorter varchar", []cdc.Column{id, with(code, func(c *cdc.Column) { c.Declared = "character varying(10)" }), price},
			[]schema.Changed{{Name: "code", What: "modifier", From: "character varying(20)", To: "character varying(10)"}}, false},
		{"unbounded varchar", []cdc.Column{id, with(code, func(c *cdc.Column) { c.Declared = "" }), price},
			[]schema.Changed{{Name: "code", What: "modifier", From: "character varying(20)", To: "", Breaking: true}}, true},
		{"larger scale", []cdc.Column{id, code, with(price, func(c *cdc.Column) { c.Declared = "numeric(10,4)" })},
			[]schema.Changed{{Name: "price", What: "modifier", From: "numeric(10,2)", To: "numeric(10,4)", Breaking: true}}, true},
		{"NOT NULL dropped", []cdc.Column{id, code, with(price, func(c *cdc.Column) { c.NotNull = false })},
			[]schema.Changed{{Name: "price", What: "not_null", From: "not null", To: "null", Breaking: true}}, true},
		{"NOT NULL set", []cdc.Column{id, with(code, func(c *cdc.Column) { c.NotNull = true }), price},
			[]schema.Changed{{Name: "code", What: "not_null", From: "null", To: "not null"}}, false},
		{"interval fields", []cdc.Column{id, with(code, func(c *cdc.Column) { c.Declared = "character varying(20) x" }), price},
			[]schema.Changed{{Name: "code", What: "modifier", From: "character varying(20)", To: "character varying(20) x", Breaking: true}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v2 := schema.FromRelation(rel(tc.cols...))
			require.NotEqual(t, v1.Fingerprint, v2.Fingerprint, "a new version")
			d := schema.Compare(&v1, &v2)
			require.Equal(t, tc.changed, d.Changed)
			require.Empty(t, d.Retyped)
			require.Equal(t, tc.breaking, d.Breaking)
		})
	}
	// A new type is retyped, not changed.
	d := schema.Compare(&v1, new(schema.FromRelation(rel(id, with(code, func(c *cdc.Column) { c.Type, c.OID, c.Declared = "text", 25, "" }), price))))
	require.Equal(t, []schema.Retype{{Name: "code", From: "varchar", To: "text"}}, d.Retyped)
	require.Empty(t, d.Changed)
}

// TestRowSchemaNullsAndLengths: NOT NULL as the WAL says it forbids null
// (not for floats and numerics: a lost NaN); NOT NULL read from the
// catalog (pgoutput) does not; a character varying(n) value has at most n
// characters.
func TestRowSchemaNullsAndLengths(t *testing.T) {
	cols := []cdc.Column{id, {Name: "code", Type: "varchar", OID: 1043, Declared: "character varying(3)", NotNull: true},
		{Name: "f", Type: "float8", OID: 701, NotNull: true}, {Name: "tags", Type: "_bpchar", OID: 1014, Declared: "character(2)[]"}}
	compile := func(r *cdc.Relation) *jsonschema.Schema {
		v := schema.FromRelation(r)
		v.Source, v.Version = "shop", 1
		var doc any
		require.NoError(t, json.Unmarshal(schema.RowSchema(&v, "native"), &doc))
		c := jsonschema.NewCompiler()
		require.NoError(t, c.AddResource("row.json", doc))
		s, err := c.Compile("row.json")
		require.NoError(t, err)
		return s
	}
	valid := func(s *jsonschema.Schema, row string) error {
		inst, err := jsonschema.UnmarshalJSON(stringsReader(row))
		require.NoError(t, err)
		return s.Validate(inst)
	}
	wal := compile(rel(cols...))
	require.NoError(t, valid(wal, `{"id":1,"code":"abc","f":null,"tags":["ab",null]}`))
	require.Error(t, valid(wal, `{"id":1,"code":null}`), "NOT NULL")
	require.Error(t, valid(wal, `{"id":1,"code":"abcd"}`), "character varying(3)")
	require.Error(t, valid(wal, `{"id":1,"tags":["abc"]}`), "character(2)[]")
	inferred := rel(cols...)
	inferred.Inferred = cdc.InferredNotNull
	require.NoError(t, valid(compile(inferred), `{"id":1,"code":null}`), "NOT NULL from the catalog may be newer than the row")
}

// TestTrackerInferred: what the source read from the catalog
// (cdc.Relation.Inferred) registers a version only past what an earlier
// run may have published and after the table's latest version; a replay
// finds the version registered there whatever the catalog says now; a
// change that does not carry every column (a wal2json delete) registers
// none when the table has a version.
func TestTrackerInferred(t *testing.T) {
	ctx := t.Context()
	reg, _ := regT(t)
	const prod = "b.shop.e1"
	trk := schema.NewTracker(reg, "shop")
	require.Equal(t, [2]int{1, 1}, observe(t, trk, change(prod, 0x100, 0, withTotal(false))))
	// NOT NULL set: a new version, past the run's start.
	require.Equal(t, [2]int{2, 2}, observe(t, trk, change(prod, 0x200, 0, withTotal(true))))
	v2, err := reg.Get(ctx, "shop", "public", "orders", 2)
	require.NoError(t, err)
	require.Equal(t, []string{"not_null"}, v2.Inferred)

	// A replay from 0/100 whose catalog says nullable again (dropped
	// since): up to what was published (0/200), the registry decides.
	trk = schema.NewTracker(reg, "shop")
	trk.Resume(0x80, 0x200)
	require.Equal(t, [2]int{1, 1}, observe(t, trk, change(prod, 0x100, 0, withTotal(true))), "version 1 announced again at its change, whatever the catalog says")
	require.Equal(t, [2]int{1, 0}, observe(t, trk, change(prod, 0x100, 1, withTotal(true))), "no version from the catalog at a replayed change")
	require.Equal(t, [2]int{2, 2}, observe(t, trk, change(prod, 0x200, 0, withTotal(false))), "the version registered here, whatever the catalog says")
	require.Equal(t, [2]int{2, 0}, observe(t, trk, change(prod, 0x200, 1, withTotal(false))))
	// Past what was published, the catalog's word counts.
	require.Equal(t, [2]int{3, 3}, observe(t, trk, change(prod, 0x300, 0, withTotal(false))))

	// A replay that published nothing past 0/100, but registered up to
	// version 3 at 0/300: no version from the catalog before it.
	trk = schema.NewTracker(reg, "shop")
	trk.Resume(0x80, 0x80)
	require.Equal(t, [2]int{1, 0}, observe(t, trk, change(prod, 0x180, 0, withTotal(true))))

	// A change that does not carry every column, described partly from
	// the catalog, registers nothing when the table has a version.
	partial := rel(id)
	partial.Inferred = cdc.InferredColumns | cdc.InferredIdentity
	del := change(prod, 0x400, 0, partial)
	del.Op = cdc.OpDelete
	trk = schema.NewTracker(reg, "shop")
	require.Equal(t, [2]int{3, 0}, observe(t, trk, del))
	ins := change(prod, 0x400, 1, partial)
	require.Equal(t, [2]int{4, 4}, observe(t, trk, ins), "an insert carries every column: its shape counts")

	// At a registered position the registry's version stands, whatever
	// the source says of the change now (what it inferred, or even the
	// columns), with a warning naming the difference: the run that
	// registered it published the change under it.
	trk = schema.NewTracker(reg, "shop")
	_, _, _, err = trk.Observe(ctx, change(prod, 0x200, 0, withTotal(false)))
	require.NoError(t, err)
	var logged bytes.Buffer
	trk = schema.NewTracker(reg, "shop")
	trk.Log = slog.New(slog.NewTextHandler(&logged, nil))
	require.Equal(t, [2]int{2, 2}, observe(t, trk, change(prod, 0x200, 0, rel(id, note))))
	require.Contains(t, logged.String(), "column 2 is note, not total")
	require.Contains(t, logged.String(), "public.orders version 2")
}

// observe runs c past trk and returns the version it was written under and
// the version announced before it (0: none).
func observe(t *testing.T, trk *schema.Tracker, c *cdc.Change) [2]int {
	t.Helper()
	v, ev, _, err := trk.Observe(t.Context(), c)
	require.NoError(t, err)
	if ev == nil {
		return [2]int{v.Version, 0}
	}
	return [2]int{v.Version, ev.Version}
}

// withTotal is orders(id, total) as pgoutput describes it: total's NOT
// NULL read from the catalog (cdc.InferredNotNull).
func withTotal(notNull bool) *cdc.Relation {
	n := total
	n.NotNull = notNull
	r := rel(id, n)
	r.Inferred = cdc.InferredNotNull
	return r
}

// TestTrackerSnapshot: a snapshot read of a table the registry lacks
// registers its version, first seen by that snapshot, with an event in
// the snapshot's id space; a run starting before it announces it again
// (the same id) before its first change, once; a run starting after it
// does not.
func TestTrackerSnapshot(t *testing.T) {
	ctx := t.Context()
	reg, _ := regT(t)
	const prod = "b.shop.e1"
	read := func(lsn cdc.LSN, seq uint32) *cdc.Change {
		c := change(prod, lsn, seq, rel(id, total))
		c.Op, c.MsgID = cdc.OpRead, prod+".snap-s1:00000000000000AA:7"
		return c
	}
	v, ev, prev, err := schema.NewTracker(reg, "shop").Observe(ctx, read(0x500, 0))
	require.NoError(t, err)
	require.Same(t, v, ev)
	require.Nil(t, prev)
	require.Equal(t, schema.Since{Producer: prod, CommitLSN: "0/500", Seq: 0, Snapshot: "s1"}, v.Since)
	eid := v.EventMsgID()
	require.Regexp(t, `^b\.shop\.e1\.snap-s1:[0-9A-F]{16}:1$`, eid)
	_, pos, err := cdc.ParseID(eid)
	require.NoError(t, err)
	require.NotZero(t, pos.LSN)

	// The chunk read again after a crash, at another position: no new
	// version, the event announced again before the first change of the
	// run, once.
	trk := schema.NewTracker(reg, "shop")
	trk.Resume(0x400, 0x400)
	wal := change(prod, 0x600, 0, rel(id, total))
	v, ev, _, err = trk.Observe(ctx, wal)
	require.NoError(t, err)
	require.Equal(t, 1, v.Version)
	require.NotNil(t, ev, "announced again")
	require.Equal(t, eid, ev.EventMsgID())
	v, ev, _, err = trk.Observe(ctx, read(0x700, 0))
	require.NoError(t, err)
	require.Equal(t, 1, v.Version)
	require.Nil(t, ev, "once per run")
	// A run whose checkpoint is past it: everything holds the event.
	trk = schema.NewTracker(reg, "shop")
	trk.Resume(0x500, 0x500)
	_, ev, _, err = trk.Observe(ctx, read(0x700, 0))
	require.NoError(t, err)
	require.Nil(t, ev)
	// Without a snapshot, a version's event has no id of its own.
	w := schema.FromRelation(rel(id))
	require.Empty(t, w.EventMsgID())
}

// TestTrackerCrashBeforeLatest: a run stopped between Put's two writes
// (the version's key written, the latest pointer not yet moved) left
// version 2 past the pointer. The replay of the change that registered it
// comes with a catalog that changed since (NOT NULL, which pgoutput
// infers from the catalog): it must find version 2 and announce it again,
// not register its shape as a new version 2 and stop on the conflict (as
// TestSchemaEventsKill9 saw), and the pointer moves to it.
func TestTrackerCrashBeforeLatest(t *testing.T) {
	ctx := t.Context()
	reg, js := regT(t)
	const prod = "b.shop.e1"
	plain := rel(id)
	plain.Inferred = cdc.InferredNotNull
	trk := schema.NewTracker(reg, "shop")
	v, ev, _, err := trk.Observe(ctx, change(prod, 0x100, 0, plain))
	require.NoError(t, err)
	require.Equal(t, 1, v.Version)
	require.NotNil(t, ev)
	v, ev, _, err = trk.Observe(ctx, change(prod, 0x200, 0, withTotal(true)))
	require.NoError(t, err)
	require.Equal(t, 2, v.Version)
	require.NotNil(t, ev)
	// The crash: the pointer still at version 1.
	kv, err := js.KeyValue(ctx, "bridge_schemas")
	require.NoError(t, err)
	_, err = kv.Put(ctx, schema.LatestKey("shop", "public", "orders"), []byte("1"))
	require.NoError(t, err)

	trk = schema.NewTracker(reg, "shop")
	trk.Resume(0x180, 0x180)
	v, ev, prev, err := trk.Observe(ctx, change(prod, 0x200, 0, withTotal(false)))
	require.NoError(t, err, "the replayed change finds the version it registered")
	require.Equal(t, 2, v.Version)
	require.NotNil(t, ev, "announced again: nothing may have published its event")
	require.Equal(t, 1, prev.Version)
	n, _, err := reg.Latest(ctx, "shop", "public", "orders")
	require.NoError(t, err)
	require.Equal(t, 2, n, "the latest pointer moved to the version past it")
	v, ev, _, err = trk.Observe(ctx, change(prod, 0x300, 0, rel(id, total, note)))
	require.NoError(t, err)
	require.Equal(t, 3, v.Version, "the next shape is the next version")
	require.NotNil(t, ev)
}

// TestTrackerReplayKeepsDecisions: wal2json described a replayed change
// (an update, the first change of its transaction) with the shape of the
// change after it, which had registered the next version; the replay
// registered that shape again as a version behind it, and its event went
// out of order (TestSchemaEventsKill9). A change an earlier run went past
// keeps the version the registry has in effect at it; a change past what
// was published, even in a transaction published in part, registers its
// shape.
func TestTrackerReplayKeepsDecisions(t *testing.T) {
	ctx := t.Context()
	reg, _ := regT(t)
	const prod = "b.shop.e1"
	strict := total
	strict.NotNull = true // as wal2json says it ("optional": false), not inferred
	trk := schema.NewTracker(reg, "shop")
	require.Equal(t, [2]int{1, 1}, observe(t, trk, change(prod, 0x100, 0, rel(id, strict))))
	require.Equal(t, [2]int{1, 0}, observe(t, trk, change(prod, 0x200, 0, rel(id, strict))))
	require.Equal(t, [2]int{2, 2}, observe(t, trk, change(prod, 0x200, 1, rel(id, total))), "DROP NOT NULL")
	require.Equal(t, [2]int{2, 0}, observe(t, trk, change(prod, 0x300, 0, rel(id, total))))

	// Killed before anything past 0/150 was published, after version 2
	// was registered: 0/200:0 comes back described as 0/200:1 is.
	trk = schema.NewTracker(reg, "shop")
	trk.Resume(0x150, 0x150)
	require.Equal(t, [2]int{1, 0}, observe(t, trk, change(prod, 0x200, 0, rel(id, total))), "the registry's version 1, not a version 3 behind version 2")
	require.Equal(t, [2]int{2, 2}, observe(t, trk, change(prod, 0x200, 1, rel(id, total))), "version 2 announced again at its change")
	n, _, err := reg.Latest(ctx, "shop", "public", "orders")
	require.NoError(t, err)
	require.Equal(t, 2, n)

	// Published up to 0/400:0, a transaction that changes the table's
	// shape in its middle: 0/400:1 was never seen, its shape counts.
	trk = schema.NewTracker(reg, "shop")
	trk.ResumeAt(0x300, cdc.Pos{LSN: 0x400, Seq: 0})
	require.Equal(t, [2]int{2, 0}, observe(t, trk, change(prod, 0x400, 0, rel(id, total))))
	require.Equal(t, [2]int{3, 3}, observe(t, trk, change(prod, 0x400, 1, rel(id, total, note))), "past the last change published, in the same transaction")
	// And a replay of the whole: 0/400:0 described with note keeps 2.
	trk = schema.NewTracker(reg, "shop")
	trk.Resume(0x300, 0x400)
	require.Equal(t, [2]int{2, 0}, observe(t, trk, change(prod, 0x400, 0, rel(id, total, note))))
	require.Equal(t, [2]int{3, 3}, observe(t, trk, change(prod, 0x400, 1, rel(id, total, note))))
}

// TestTrackerSameRelationPastARegisteredVersion: a source describes
// consecutive changes with one relation (pgoutput sends a Relation message
// only when the table changes), and the tracker takes a relation's version
// once for all of them. On a replay, an earlier run registered a version
// at a change this run's source describes with the relation of the changes
// before it (NOT NULL read from a catalog that changed back since): that
// version is announced again at its change, and the changes after it are
// not written under the version before it (TestSchemaEventsKill9 saw a row
// under version 45 after version 46's event).
func TestTrackerSameRelationPastARegisteredVersion(t *testing.T) {
	reg, _ := regT(t)
	const prod = "b.shop.e1"
	trk := schema.NewTracker(reg, "shop")
	require.Equal(t, [2]int{1, 1}, observe(t, trk, change(prod, 0x100, 0, withTotal(false))))
	require.Equal(t, [2]int{2, 2}, observe(t, trk, change(prod, 0x200, 0, withTotal(true))), "SET NOT NULL")

	// Killed having published up to 0/200; the catalog says nullable
	// again, and every replayed change comes with one relation.
	r := withTotal(false)
	trk = schema.NewTracker(reg, "shop")
	trk.Resume(0x80, 0x200)
	require.Equal(t, [2]int{1, 1}, observe(t, trk, change(prod, 0x100, 0, r)))
	require.Equal(t, [2]int{1, 0}, observe(t, trk, change(prod, 0x150, 0, r)))
	require.Equal(t, [2]int{2, 2}, observe(t, trk, change(prod, 0x200, 0, r)), "the version registered at this change, announced again")
	require.Equal(t, [2]int{2, 0}, observe(t, trk, change(prod, 0x200, 1, r)), "a replayed change keeps it")
	require.Equal(t, [2]int{3, 3}, observe(t, trk, change(prod, 0x300, 0, r)), "past what was published, the source's word counts: a new version, never the one before")
	require.Equal(t, [2]int{3, 0}, observe(t, trk, change(prod, 0x300, 1, r)))
}
