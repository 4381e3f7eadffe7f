package pipeline

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/bridge/schema"
	"github.com/bridgecdc/bridge/config"
)

const ddlMsg = `{"v": 1, "ddl": "ALTER TABLE t ADD COLUMN n text", "tag": "ALTER TABLE", "user": "app", "table": "t", "schema": "public", "dropped": [], "objects": [{"type": "table", "table": {"name": "t", "schema": "public"}, "schema": "public", "identity": "public.t"}], "search_path": "public"}`

// TestRouteDDLEvents: a DDL message becomes one DDL event per route that
// carries its table, at the message's own position and with its
// transaction's size, never the message itself; the debezium format's
// route gets Debezium's schema change value and key; a delete on a route
// with tombstones is followed by its tombstone, kept with its route's
// changes by groupByDest. With schemas.ddl off, the message is dropped.
func TestRouteDDLEvents(t *testing.T) {
	rel := &cdc.Relation{Schema: "public", Table: "t", Columns: []cdc.Column{{Name: "id", Type: "int4", Key: true}}}
	txn := func() *cdc.Txn {
		return &cdc.Txn{CommitLSN: 99, Changes: []cdc.Change{
			{Source: "app", Database: "db", Schema: "public", Table: "t", Op: cdc.OpInsert, Rel: rel, After: []any{int32(1)}, CommitLSN: 99, Seq: 0, TxSize: 3},
			{Source: "app", Database: "db", Op: cdc.OpMessage, Prefix: cdc.DDLPrefix, Content: []byte(ddlMsg), Transactional: true, CommitLSN: 99, Seq: 1, TxSize: 3},
			{Source: "app", Database: "db", Schema: "public", Table: "t", Op: cdc.OpDelete, Rel: rel, Before: []any{int32(1)}, CommitLSN: 99, Seq: 2, TxSize: 3},
		}}
	}
	routes := []config.Route{
		{Name: "dbz", Continue: true, Sinks: []string{"a"}, Format: "debezium",
			Debezium: config.DebeziumFormat{Key: "header", TombstonesOnDelete: true}},
		{Name: "plain", Sinks: []string{"a"}},
	}
	run := func(ddl bool) []cdc.Change {
		r, err := route.New(&config.Config{Unrouted: "drop", Routes: routes, Schemas: config.Schemas{DDL: ddl}}, map[string]int{"a": 0}, "")
		require.NoError(t, err)
		p := New(Config{Source: "app", Router: r})
		var got []cdc.Change
		require.NoError(t, p.route(t.Context(), p.cur.Load(), txn(), "prod", func(it *txnItem) error {
			require.Len(t, it.dests, len(it.changes))
			got = append(got, it.changes...)
			return nil
		}))
		return got
	}
	var ids []string
	for _, c := range run(true) {
		ids = append(ids, c.ID())
	}
	require.Equal(t, []string{
		"prod:0000000000000063:0@dbz", "prod:0000000000000063:1@dbz", "prod:0000000000000063:2@dbz", "prod:0000000000000063:2@dbz~tombstone",
		"prod:0000000000000063:0@plain", "prod:0000000000000063:1@plain", "prod:0000000000000063:2@plain",
	}, ids, "grouped by route, the tombstone right after its delete")
	got := run(true)
	dbz, plain := got[1], got[5]
	for _, ev := range []cdc.Change{dbz, plain} {
		require.Equal(t, cdc.OpDDL, ev.Op)
		require.Equal(t, "public", ev.Schema)
		require.Equal(t, "t", ev.Table)
		require.Equal(t, uint32(3), ev.TxSize, "one of the transaction's changes")
		require.Equal(t, "cdc.app.public.t", ev.Subject)
	}
	var e schema.DDLEvent
	require.NoError(t, json.Unmarshal(plain.Payload, &e))
	require.Equal(t, "ALTER TABLE t ADD COLUMN n text", e.DDL)
	require.Equal(t, "ALTER TABLE", e.Tag)
	require.Empty(t, plain.Headers)
	require.Contains(t, string(dbz.Payload), `"databaseName":"db","schemaName":"public","ddl":"ALTER TABLE t ADD COLUMN n text","tableChanges":[]}`)
	require.Equal(t, `{"databaseName":"db"}`, dbz.Headers[format.HeaderDebeziumKey])
	require.Equal(t, `{"id":1}`, got[0].Headers[format.HeaderDebeziumKey])
	require.Empty(t, got[3].Payload)

	// schemas.ddl off: the message is dropped, not published as one.
	ids = ids[:0]
	for _, c := range run(false) {
		require.NotEqual(t, cdc.OpMessage, c.Op)
		require.NotEqual(t, cdc.OpDDL, c.Op)
		ids = append(ids, c.ID())
	}
	require.Len(t, ids, 5)
}
