package schema_test

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/schema"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func jsT(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv := natsembed.StartT(t, natsembed.Options{})
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// regT returns a schema registry in a fresh in-process JetStream, and
// that JetStream.
func regT(t *testing.T) (*schema.Registry, jetstream.JetStream) {
	t.Helper()
	js := jsT(t)
	reg, err := schema.Open(t.Context(), js, "bridge_schemas", 1)
	require.NoError(t, err)
	return reg, js
}

func rel(cols ...cdc.Column) *cdc.Relation {
	return &cdc.Relation{Schema: "public", Table: "orders", Columns: cols, ReplicaIdentity: 'd'}
}

var (
	id    = cdc.Column{Name: "id", Type: "int4", OID: 23, Key: true}
	total = cdc.Column{Name: "total", Type: "numeric", OID: 1700}
	note  = cdc.Column{Name: "note", Type: "text", OID: 25}
)

func change(producer string, lsn cdc.LSN, seq uint32, r *cdc.Relation) *cdc.Change {
	return &cdc.Change{Producer: producer, Source: "shop", CommitLSN: lsn, Seq: seq, Schema: r.Schema, Table: r.Table, Op: cdc.OpInsert, Rel: r}
}

func TestCompare(t *testing.T) {
	v1 := schema.FromRelation(rel(id, total, note))
	retyped := total
	retyped.Type = "float8"
	newKey := note
	newKey.Key = true
	v2 := schema.FromRelation(rel(id, retyped, newKey, cdc.Column{Name: "tags", Type: "_text"}))
	d := schema.Compare(&v1, &v2)
	require.Equal(t, []schema.Column{{Name: "tags", Type: "_text"}}, d.Added)
	require.Empty(t, d.Dropped)
	require.Equal(t, []schema.Retype{{Name: "total", From: "numeric", To: "float8"}}, d.Retyped)
	require.True(t, d.KeyChanged)
	require.Equal(t, []string{"id"}, d.KeyBefore)
	require.Equal(t, []string{"id", "note"}, d.KeyAfter)
	require.True(t, d.Breaking)

	v3 := schema.FromRelation(rel(id, total))
	d = schema.Compare(&v1, &v3)
	require.Equal(t, []schema.Column{{Name: "note", Type: "text", OID: 25}}, d.Dropped)
	require.True(t, d.Breaking)
	d = schema.Compare(&v3, &v1)
	require.Equal(t, []schema.Column{{Name: "note", Type: "text", OID: 25}}, d.Added)
	require.False(t, d.Breaking, "an added column is not breaking")

	first := schema.Compare(nil, &v1)
	require.Len(t, first.Added, 3)
	require.False(t, first.KeyChanged)
	require.NotEqual(t, v1.Fingerprint, v3.Fingerprint)
	require.Equal(t, v1.Fingerprint, schema.FromRelation(rel(id, total, note)).Fingerprint)
}

func TestKeys(t *testing.T) {
	for _, tc := range []struct{ src, sch, tbl string }{
		{"shop", "public", "orders"},
		{"shop", "My Schema", "order.items*>"},
		{"s-1", "", "ü"},
	} {
		k := schema.VersionKey(tc.src, tc.sch, tc.tbl, 7)
		require.Regexp(t, `^[-/_=.a-zA-Z0-9]+$`, k, "a valid KV key")
		src, sch, tbl, last, err := schema.ParseKey(k)
		require.NoError(t, err)
		require.Equal(t, []string{tc.src, tc.sch, tc.tbl, "7"}, []string{src, sch, tbl, last})
	}
	require.Equal(t, "shop.public.orders.3", schema.VersionKey("shop", "public", "orders", 3))
	require.Equal(t, "shop.public.orders.latest", schema.LatestKey("shop", "public", "orders"))
	_, _, _, _, err := schema.ParseKey("shop.public.orders")
	require.ErrorContains(t, err, "want <source>.<schema>.<table>.<version>")
}

// TestTrackerVersions: a table seen first registers version 1; the same
// shape under a new relation (a restart, pgoutput resending it) is no new
// version; a new shape is the next version, in the registry before
// Observe returns; a replay from an earlier position yields the same
// versions and events at the same changes; a new epoch continues the
// numbering.
func TestTrackerVersions(t *testing.T) {
	ctx := t.Context()
	reg, _ := regT(t)
	const prod = "b.shop.e1"
	r1, r1again, r2 := rel(id, total), rel(id, total), rel(id, total, note)

	run := func(trk *schema.Tracker, steps []*cdc.Change) (vers []int, events []int) {
		for _, c := range steps {
			v, ev, _, err := trk.Observe(ctx, c)
			require.NoError(t, err)
			vers = append(vers, v.Version)
			if ev != nil {
				events = append(events, ev.Version)
			} else {
				events = append(events, 0)
			}
		}
		return vers, events
	}
	steps := []*cdc.Change{
		change(prod, 0x100, 0, r1), change(prod, 0x100, 1, r1),
		change(prod, 0x200, 0, r1again), // same shape, new relation
		change(prod, 0x300, 0, r2), change(prod, 0x300, 1, r2),
	}
	vers, events := run(schema.NewTracker(reg, "shop"), steps)
	require.Equal(t, []int{1, 1, 1, 2, 2}, vers)
	require.Equal(t, []int{1, 0, 0, 2, 0}, events)

	n, _, err := reg.Latest(ctx, "shop", "public", "orders")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	v2, err := reg.Get(ctx, "shop", "public", "orders", 2)
	require.NoError(t, err)
	require.Equal(t, 1, v2.Previous)
	require.Equal(t, schema.Since{Producer: prod, CommitLSN: "0/300", Seq: 0}, v2.Since)
	require.Equal(t, []string{"id"}, v2.Key)
	require.Contains(t, v2.JSONSchema, "native")
	require.Contains(t, v2.JSONSchema, "debezium")

	// A replay after a crash, from 0/100 and from 0/200, with fresh
	// relations (a new connection): the same versions and events.
	fresh := func(r *cdc.Relation) *cdc.Relation { c := *r; return &c }
	replay := []*cdc.Change{
		change(prod, 0x100, 0, fresh(r1)), change(prod, 0x100, 1, fresh(r1)),
		change(prod, 0x200, 0, fresh(r1)),
		change(prod, 0x300, 0, fresh(r2)), change(prod, 0x300, 1, fresh(r2)),
	}
	vers, events = run(schema.NewTracker(reg, "shop"), replay)
	require.Equal(t, []int{1, 1, 1, 2, 2}, vers)
	require.Equal(t, []int{1, 0, 0, 2, 0}, events)
	vers, events = run(schema.NewTracker(reg, "shop"), replay[2:])
	require.Equal(t, []int{1, 2, 2}, vers)
	require.Equal(t, []int{0, 2, 0}, events)

	// Back to the old shape later: a new version (3), not version 1 again.
	vers, events = run(schema.NewTracker(reg, "shop"), []*cdc.Change{change(prod, 0x400, 0, fresh(r1))})
	require.Equal(t, []int{3}, vers)
	require.Equal(t, []int{3}, events)

	// A new epoch: the latest version stays in effect when the shape is
	// the same, and numbering continues.
	vers, events = run(schema.NewTracker(reg, "shop"), []*cdc.Change{
		change("b.shop.e2", 0x10, 0, fresh(r1)), change("b.shop.e2", 0x20, 0, fresh(r2))})
	require.Equal(t, []int{3, 4}, vers)
	require.Equal(t, []int{0, 4}, events)

	// The source describing a version's first change otherwise on a
	// replay: the registry's version stands there (TestTrackerInferred).
	v, ev, _, err := schema.NewTracker(reg, "shop").Observe(ctx, change("b.shop.e2", 0x20, 0, fresh(r1)))
	require.NoError(t, err)
	require.Equal(t, 4, v.Version)
	require.Same(t, v, ev, "announced again at its change")
}

func TestRegistryPutIdempotent(t *testing.T) {
	ctx := t.Context()
	reg, _ := regT(t)
	v := schema.FromRelation(rel(id))
	v.Source, v.Version, v.Since = "shop", 1, schema.Since{Producer: "p", CommitLSN: "0/10"}
	require.NoError(t, reg.Put(ctx, &v))
	again := v
	again.JSONSchema = nil
	require.NoError(t, reg.Put(ctx, &again), "a replay writes the same version again")
	other := schema.FromRelation(rel(id, note))
	other.Source, other.Version, other.Since = "shop", 1, schema.Since{Producer: "p", CommitLSN: "0/20"}
	err := reg.Put(ctx, &other)
	require.ErrorContains(t, err, `already holds another public.orders version 1 (first seen at 0/10:0 of p, not at 0/20:0 of p)`)
	require.ErrorIs(t, err, schema.ErrConflict)
	tables, err := reg.Tables(ctx)
	require.NoError(t, err)
	require.Equal(t, []schema.TableRef{{Source: "shop", Schema: "public", Table: "orders", Latest: 1}}, tables)
}

// TestRowSchemaValidates: rows as the native and Debezium formats render
// them validate against the version's schemas; a row with a column the
// version lacks, or a value of the wrong type, does not.
func TestRowSchemaValidates(t *testing.T) {
	v := schema.FromRelation(rel(id, total, note, cdc.Column{Name: "tags", Type: "_text"}, cdc.Column{Name: "at", Type: "timestamp"}))
	v.Source, v.Version = "shop", 1
	compile := func(format string) *jsonschema.Schema {
		var doc any
		require.NoError(t, json.Unmarshal(schema.RowSchema(&v, format), &doc))
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
	native, deb := compile("native"), compile("debezium")
	require.NoError(t, valid(native, `{"id":1,"total":42.50,"note":null,"tags":["a",null],"at":"2024-02-29T11:14:15.123456"}`))
	require.NoError(t, valid(native, `{"id":1,"total":"NaN"}`), "a column may be absent (unchanged TOAST)")
	require.Error(t, valid(native, `{"id":1,"extra":2}`), "a column the version lacks")
	require.Error(t, valid(native, `{"id":null}`), "a key column is never null")
	require.Error(t, valid(native, `{"id":"x"}`))
	require.NoError(t, valid(deb, `{"id":1,"total":"42.50","at":1709205255123456}`))
	require.Error(t, valid(deb, `{"id":1,"at":"2024-02-29T11:14:15.123456"}`), "Debezium's timestamps are numbers")
}
