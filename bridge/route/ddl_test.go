package route

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

// TestDDLDests: which routes carry a DDL event, as SchemaDests for a
// table; a command on no table goes only to routes without
// match.tables; nothing with schemas.ddl off.
func TestDDLDests(t *testing.T) {
	cfg := testConfig(
		config.Route{Name: "a", Continue: true, Match: config.Match{Tables: []string{"public.orders"}}, Sinks: []string{"main"}, SchemaSubject: "schemas.{{.Schema}}.{{.Table}}.{{.Op}}"},
		config.Route{Name: "b", Match: config.Match{Ops: []string{"insert"}}, Sinks: []string{"main"}},
		config.Route{Name: "c", Match: config.Match{Ops: []string{"ddl"}}, Sinks: []string{"other"}, Format: "debezium"},
		config.Route{Name: "d", Sinks: []string{"main"}},
		config.Route{Name: "e", Sinks: []string{"main"}},
	)
	r, err := New(cfg, map[string]int{"main": 0, "other": 1}, "")
	require.NoError(t, err)
	ds, err := r.DDLDests("shop", "public", "orders")
	require.NoError(t, err)
	require.Empty(t, ds, "schemas.ddl off")

	cfg.Schemas.DDL = true
	r, err = New(cfg, map[string]int{"main": 0, "other": 1}, "")
	require.NoError(t, err)
	ds, err = r.DDLDests("shop", "public", "orders")
	require.NoError(t, err)
	deb := &format.DebeziumOptions{}
	require.Equal(t, []SchemaDest{
		{Sinks: []int{0}, Subject: "schemas.public.orders.ddl", Dest: "a", Route: "routes[0]"},
		{Sinks: []int{1}, Subject: "cdc.shop.public.orders", Dest: "c", Route: "routes[2]", Debezium: deb},
		{Sinks: []int{0}, Subject: "cdc.shop.public.orders", Dest: "d", Route: "routes[3]"}, // takes every change: e sees none
	}, ds)
	ds, err = r.DDLDests("shop", "public", "")
	require.NoError(t, err)
	require.Equal(t, []string{"c", "d"}, []string{ds[0].Dest, ds[1].Dest})
	require.Equal(t, "cdc.shop.public._", ds[1].Subject)
}

// TestDDLMessageConsumed: the trigger's messages are never published as
// messages, whatever the routes, and are not unrouted.
func TestDDLMessageConsumed(t *testing.T) {
	r := newRouter(t, "error", config.Route{})
	c := &cdc.Change{Source: "shop", Op: cdc.OpMessage, Prefix: cdc.DDLPrefix, Content: []byte(`{}`), Transactional: true}
	sinks, ok, err := r.Route(c)
	require.NoError(t, err)
	require.False(t, ok)
	require.Nil(t, sinks)
	n, err := r.Each(c, func(*cdc.Change, []int) error { t.Fatal("emitted"); return nil })
	require.NoError(t, err)
	require.Zero(t, n)
	other := &cdc.Change{Source: "shop", Op: cdc.OpMessage, Prefix: "app", Content: []byte(`{}`)}
	_, ok, err = r.Route(other)
	require.NoError(t, err)
	require.True(t, ok)
}

// TestDebeziumOptions: the key header, the schema envelope, and a
// tombstone after each delete (through Each, which the option turns on).
func TestDebeziumOptions(t *testing.T) {
	r := newRouter(t, "drop", config.Route{Name: "dbz", Format: "debezium",
		Debezium: config.DebeziumFormat{SchemasEnable: true, Key: "header", TombstonesOnDelete: true}})
	require.True(t, r.Fanout(), "tombstones are a second message: Each")
	rel := &cdc.Relation{Schema: "public", Table: "orders", ReplicaIdentity: 'd', Columns: []cdc.Column{
		{Name: "id", Type: "int4", Key: true}, {Name: "note", Type: "text"}}}
	shared := map[string]string{"Bridge-Schema-Version": "3"}
	del := change(cdc.OpDelete, rel, []any{int32(7), cdc.Absent}, nil)
	del.Headers = shared
	var got []cdc.Change
	n, err := r.Each(del, func(d *cdc.Change, s []int) error {
		got = append(got, *d)
		require.Equal(t, []int{0}, s)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Len(t, got, 2)
	require.Equal(t, "dbz", got[0].Dest)
	require.Contains(t, string(got[0].Payload), `{"schema":{"type":"struct"`)
	require.Contains(t, string(got[0].Payload), `"payload":{"before":{"id":7,"note":null}`)
	key := `{"schema":{"type":"struct","fields":[{"type":"int32","optional":false,"field":"id"}],"optional":false,"name":"shop.public.orders.Key"},"payload":{"id":7}}`
	require.Equal(t, key, got[0].Headers[format.HeaderDebeziumKey])
	require.Equal(t, "3", got[0].Headers["Bridge-Schema-Version"])
	require.Len(t, shared, 1, "shared headers are not written")
	tomb := got[1]
	require.Equal(t, "dbz"+cdc.TombstoneDest, tomb.Dest)
	require.Empty(t, tomb.Payload)
	require.NotNil(t, tomb.Payload)
	require.Zero(t, tomb.TxSize, "not one of the transaction's changes")
	require.Equal(t, got[0].Subject, tomb.Subject)
	require.Equal(t, key, tomb.Headers[format.HeaderDebeziumKey])
	require.Equal(t, del.ID()+"@dbz~tombstone", tomb.ID())

	// An insert: one message, its key from after.
	got = got[:0]
	ins := change(cdc.OpInsert, rel, nil, []any{int32(8), "x"})
	_, err = r.Each(ins, func(d *cdc.Change, _ []int) error { got = append(got, *d); return nil })
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Contains(t, got[0].Headers[format.HeaderDebeziumKey], `"payload":{"id":8}`)

	// Without the options: no header, no tombstone, the bare payload.
	plain := newRouter(t, "drop", config.Route{Format: "debezium"})
	require.False(t, plain.Fanout())
	d := change(cdc.OpDelete, rel, []any{int32(7), cdc.Absent}, nil)
	_, ok, err := plain.Route(d)
	require.NoError(t, err)
	require.True(t, ok)
	require.NotContains(t, d.Headers, format.HeaderDebeziumKey)
	require.Contains(t, string(d.Payload), `{"before":{"id":7,"note":null}`)
}

// TestCheckSubjectsDDL: a route's schema_subject must fall within its
// sinks' streams with schemas.ddl on, as with schema change events.
func TestCheckSubjectsDDL(t *testing.T) {
	cfg := testConfig(config.Route{Sinks: []string{"main"}, Subject: "cdc.{{.Source}}.{{.Table}}", SchemaSubject: "ddl.{{.Source}}.{{.Op}}"})
	cfg.Sources = map[string]config.Plugin{"shop": {}}
	set := sinks.SubjectSet{Filters: []string{"cdc.shop.>"}, Of: `stream "CDC"`, Key: "subjects"}
	require.NoError(t, CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": set}))
	cfg.Schemas.DDL = true
	require.ErrorContains(t, CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": set}), "ddl.shop.ddl")
}
