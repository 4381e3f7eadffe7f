package route

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
	"github.com/bridgecdc/bridge/config"
)

const testHashKey = "0123456789abcdef0123456789abcdef"

// orders is a relation of ten columns with the types the sources give.
var orders = &cdc.Relation{Schema: "public", Table: "orders", Columns: []cdc.Column{
	{Name: "id", Type: "int4", OID: 23, Key: true},
	{Name: "status", Type: "text", OID: 25},
	{Name: "total", Type: "numeric", OID: 1700},
	{Name: "email", Type: "varchar", OID: 1043},
	{Name: "note", Type: "text", OID: 25},
	{Name: "tenant", Type: "int8", OID: 20},
	{Name: "payload", Type: "jsonb", OID: 3802},
	{Name: "created", Type: "timestamptz", OID: 1184},
	{Name: "mood", Type: "public.mood", OID: 16999},
	{Name: "blob", Type: "bytea", OID: 17},
}}

func orderRow(id int64, status string, total string) []any {
	return []any{id, status, cdc.Numeric(total), "ann@example.com", "héllo wörld", int64(42),
		cdc.RawJSON(`{"type":"created","n":1}`), time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), "happy", []byte("bytes!")}
}

func change(op cdc.Op, rel *cdc.Relation, before, after []any) *cdc.Change {
	return &cdc.Change{Producer: "b.shop.e1", Source: "shop", Database: "db", CommitLSN: 0x16B37A0, Seq: 2, TxSize: 3, Xid: 777,
		CommitTime: time.Date(2024, 5, 1, 10, 0, 1, 0, time.UTC), Schema: rel.Schema, Table: rel.Table, Op: op, Rel: rel, Before: before, After: after}
}

func newRouter(t *testing.T, unrouted string, routes ...config.Route) *Router {
	t.Helper()
	for i := range routes {
		if routes[i].Sinks == nil {
			routes[i].Sinks = []string{"a"}
		}
	}
	r, err := New(&config.Config{Unrouted: unrouted, Routes: routes}, map[string]int{"a": 0, "b": 1}, "")
	require.NoError(t, err)
	return r
}

func payload(t *testing.T, c *cdc.Change) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(c.Payload, &m), "%s", c.Payload)
	return m
}

// TestFilter: a filter sees the change as committed, with numeric columns
// as doubles, ints as ints, NULL as null and unchanged TOAST values
// absent; a change it rejects falls through to the next route, one it
// accepts does not.
func TestFilter(t *testing.T) {
	upd := func(status, total string) *cdc.Change {
		return change(cdc.OpUpdate, orders, nil, orderRow(7, status, total))
	}
	for _, c := range []struct {
		filter string
		c      *cdc.Change
		want   bool
	}{
		{`op != "delete" && after.status in ["paid", "shipped"] && after.total > 100.0`, upd("paid", "150.25"), true},
		{`op != "delete" && after.status in ["paid", "shipped"] && after.total > 100.0`, upd("paid", "99.99"), false},
		{`op != "delete" && after.status in ["paid", "shipped"] && after.total > 100.0`, upd("open", "150.25"), false},
		{`after.total > 100`, upd("paid", "150.25"), true}, // an int literal compares with a double column
		{`after.total == 150.25`, upd("paid", "150.25"), true},
		{`after.id == 7 && key.id == 7 && after.tenant > 40`, upd("paid", "1"), true},
		{`after.payload.type == "created" && after.payload.n == 1`, upd("paid", "1"), true},
		{`after.created > timestamp("2024-01-01T00:00:00Z")`, upd("paid", "1"), true},
		{`after.mood == "happy"`, upd("paid", "1"), true}, // a type the bridge does not know is dyn
		{`after.blob == b"bytes!"`, upd("paid", "1"), true},
		{`schema == "public" && table == "orders" && source == "shop" && xid == 777`, upd("paid", "1"), true},
		{`commit_time == timestamp("2024-05-01T10:00:01Z")`, upd("paid", "1"), true},
		{`after.note == null`, change(cdc.OpInsert, orders, nil, []any{int64(1), "a", nil, nil, nil, nil, nil, nil, nil, nil}), true},
		{`after.total == null`, change(cdc.OpInsert, orders, nil, []any{int64(1), "a", nil, nil, nil, nil, nil, nil, nil, nil}), true},
		{`has(after.note)`, change(cdc.OpUpdate, orders, nil, []any{int64(1), "a", nil, nil, cdc.Unchanged, nil, nil, nil, nil, nil}), false},
		{`has(after.note)`, change(cdc.OpUpdate, orders, nil, []any{int64(1), "a", nil, nil, nil, nil, nil, nil, nil, nil}), true},
		{`has(before.status)`, change(cdc.OpDelete, orders, []any{int64(1), cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent}, nil), false},
		{`after == null && key.id == 1`, change(cdc.OpDelete, orders, []any{int64(1), cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent}, nil), true},
		{`op == "truncate" && key == null && after == null`, change(cdc.OpTruncate, orders, nil, nil), true},
		// A condition on a row the change does not have rejects it.
		{`after.status == "paid"`, change(cdc.OpDelete, orders, orderRow(1, "paid", "1"), nil), false},
		{`!(after.status == "paid")`, change(cdc.OpTruncate, orders, nil, nil), false},
		{`op != "delete" && after.status in ["paid", "shipped"]`, change(cdc.OpTruncate, orders, nil, nil), false},
		{`after.status == "paid" || op == "delete"`, change(cdc.OpDelete, orders, orderRow(1, "paid", "1"), nil), true},
		{`after.email.endsWith("@example.com")`, upd("paid", "1"), true},
	} {
		t.Run(c.filter, func(t *testing.T) {
			r := newRouter(t, "drop", config.Route{Filter: c.filter, Sinks: []string{"a"}}, config.Route{Sinks: []string{"b"}})
			sinks, ok, err := r.Route(c.c)
			require.NoError(t, err)
			require.True(t, ok)
			if c.want {
				require.Equal(t, []int{0}, sinks, "the filtering route takes it")
			} else {
				require.Equal(t, []int{1}, sinks, "a rejected change falls through to the next route")
			}
		})
	}
}

// TestFilterUserTypes: a filter reads a composite column's fields as a
// map, and a PostGIS value as its text, hex EWKB.
func TestFilterUserTypes(t *testing.T) {
	rel := &cdc.Relation{Schema: "public", Table: "places", Columns: []cdc.Column{
		{Name: "id", Type: "int4", OID: 23, Key: true},
		{Name: "addr", Type: "public.addr", OID: 17001},
		{Name: "pos", Type: "public.geometry", OID: 17002},
	}}
	row := []any{int64(1),
		cdc.Record{Names: []string{"city", "no", "tags"}, Values: []any{"Oslo", int64(7), []any{"a", nil}}, Text: `(Oslo,7,"{a,NULL}")`},
		cdc.Geometry{EWKB: []byte{1, 1, 0, 0, 0}}}
	for _, c := range []struct {
		filter string
		want   bool
	}{
		{`after.addr.city == "Oslo" && after.addr.no > 5 && after.addr.tags[0] == "a"`, true},
		{`after.addr.city == "Bergen"`, false},
		{`after.pos == "0101000000"`, true},
	} {
		t.Run(c.filter, func(t *testing.T) {
			r := newRouter(t, "drop", config.Route{Filter: c.filter, Sinks: []string{"a"}}, config.Route{Sinks: []string{"b"}})
			sinks, ok, err := r.Route(change(cdc.OpInsert, rel, nil, row))
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, c.want, slices.Equal(sinks, []int{0}), "sinks %v", sinks)
		})
	}
}

// TestFilterRejectedIsDropped: a change every matching route's filter
// rejects is dropped, even with unrouted: error (it was routed, and
// rejected on purpose); a change no route matches still is an error.
func TestFilterRejectedIsDropped(t *testing.T) {
	r := newRouter(t, "error", config.Route{Match: config.Match{Tables: []string{"public.orders"}}, Filter: `after.status == "paid"`})
	_, ok, err := r.Route(change(cdc.OpInsert, orders, nil, orderRow(1, "open", "1")))
	require.NoError(t, err)
	require.False(t, ok)
	_, ok, err = r.Route(change(cdc.OpInsert, orders, nil, orderRow(1, "paid", "1")))
	require.NoError(t, err)
	require.True(t, ok)
	users := &cdc.Relation{Schema: "public", Table: "users", Columns: []cdc.Column{{Name: "id", Type: "int4", Key: true}}}
	_, _, err = r.Route(change(cdc.OpInsert, users, nil, []any{int64(1)}))
	require.ErrorContains(t, err, "no route matches insert public.users at commit LSN 0/16B37A0, change 3 of the transaction (unrouted: error)")
}

// TestShapingErrorsAtLoad: New reports each expression's mistakes at
// its YAML path and CEL position, and a subject reading a transform's
// value without one.
func TestShapingErrorsAtLoad(t *testing.T) {
	for _, c := range []struct {
		route config.Route
		want  string
	}{
		{config.Route{Filter: `op != "x" && afterr.status == "a"`}, `routes[2].filter:1:14: undeclared reference to 'afterr'`},
		{config.Route{Filter: `after.status ==`}, `routes[2].filter:1:16: Syntax error: mismatched input '<EOF>'`},
		{config.Route{Filter: `op`}, `routes[2].filter: a filter must be a condition (bool), this one is string`},
		{config.Route{Transform: `op`}, `routes[2].transform: a transform must produce a map`},
		{config.Route{Transform: `{"a": nope}`}, `routes[2].transform:1:7: undeclared reference to 'nope'`},
		{config.Route{Subject: "x.{{.Out.kind}}"}, `routes[2].subject: reads {{.Out.kind}}, the result of a transform, but the route has none`},
	} {
		routes := []config.Route{{Sinks: []string{"a"}, Match: config.Match{Ops: []string{"message"}}}, {Sinks: []string{"a"}, Match: config.Match{Ops: []string{"message"}}}, c.route}
		routes[2].Sinks = []string{"a"}
		_, err := New(&config.Config{Routes: routes}, map[string]int{"a": 0}, "")
		require.ErrorContains(t, err, c.want)
	}
}

// TestShapingErrorsPerTable: what only a table's columns tell fails on
// the table's first change, naming the YAML path, the CEL position and
// the table: a misspelt column, a type mismatch, a key column left out,
// redacted or truncated, a truncated number, a subject reading a column
// the route leaves out, a column an exact rule names that the table lacks.
func TestShapingErrorsPerTable(t *testing.T) {
	tables := config.Match{Tables: []string{"public.orders"}}
	for _, c := range []struct {
		name  string
		route config.Route
		want  string
	}{
		{"misspelt column", config.Route{Filter: `after.totl > 1.0`}, `routes[0].filter:1:6: undefined field 'totl' (checked against public.orders)`},
		{"type mismatch", config.Route{Filter: `after.status > 1`}, `routes[0].filter:1:14: found no matching overload for '_>_'`},
		{"transform misspelt", config.Route{Transform: `{"s": after.stat}`}, `routes[0].transform:1:12: undefined field 'stat' (checked against public.orders)`},
		{"transform reads an excluded column", config.Route{Transform: `{"e": after.email}`, Columns: []config.Columns{{Exclude: []string{"email"}}}},
			`routes[0].transform:1:12: undefined field 'email' (checked against public.orders)`},
		{"key excluded", config.Route{Columns: []config.Columns{{Exclude: []string{"id", "email"}}}},
			`routes[0].columns[0].exclude[0]: "id" is part of the key of public.orders, which every message keeps so that consumers can address the row; remove it from exclude, or mask it with hash`},
		{"key redacted", config.Route{Mask: []config.Mask{{Redact: []string{"id"}}}},
			`routes[0].mask[0].redact[0]: "id" is part of the key of public.orders; a redacted key could not address the row: hash it instead`},
		{"key truncated", config.Route{Mask: []config.Mask{{Truncate: map[string]int{"id": 2}}}},
			`routes[0].mask[0].truncate.id: "id" is part of the key of public.orders`},
		{"number truncated", config.Route{Mask: []config.Mask{{Truncate: map[string]int{"tenant": 2}}}},
			`routes[0].mask[0].truncate.tenant: public.orders.tenant is int8, and truncate applies to text and bytea columns; redact or hash it instead`},
		{"json truncated", config.Route{Mask: []config.Mask{{Truncate: map[string]int{"payload": 2}}}},
			`routes[0].mask[0].truncate.payload: public.orders.payload is jsonb, and truncate applies to text and bytea columns`},
		{"subject reads an excluded column", config.Route{Subject: "o.{{.Col.email}}", Columns: []config.Columns{{Include: []string{"status"}}}},
			`routes[0].subject reads {{.Col.email}}, but routes[0].columns[0] leaves "email" out of public.orders`},
		{"exact rule, missing column", config.Route{Columns: []config.Columns{{Tables: []string{"public.orders"}, Exclude: []string{"emial"}}}},
			`routes[0].columns[0].exclude[0]: public.orders has no column "emial" (its columns: id, status, total, email, note, tenant, payload, created, mood, blob)`},
		{"exact route, missing mask column", config.Route{Match: tables, Mask: []config.Mask{{Hash: []string{"emial"}, HashKey: testHashKey}}},
			`routes[0].mask[0].hash[0]: public.orders has no column "emial"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRouter(t, "drop", c.route)
			_, _, err := r.Route(change(cdc.OpInsert, orders, nil, orderRow(1, "paid", "1")))
			require.ErrorContains(t, err, c.want)
			// The next change of the table fails the same way.
			_, _, err = r.Route(change(cdc.OpInsert, orders, nil, orderRow(2, "paid", "1")))
			require.ErrorContains(t, err, c.want)
		})
	}
	// A rule for several tables passes over those without the column: it
	// cannot leak what is not there (validate --connect checks that one of
	// them has it).
	for _, tables := range [][]string{{"public.*"}, {"public.orders", "public.users"}} {
		r := newRouter(t, "drop", config.Route{Columns: []config.Columns{{Tables: tables, Exclude: []string{"password"}}}})
		_, ok, err := r.Route(change(cdc.OpInsert, orders, nil, orderRow(1, "paid", "1")))
		require.NoError(t, err)
		require.True(t, ok)
	}
}

// TestShapingDryRuns: what every truncate or delete of a table would hit
// fails on the table's first change, before one arrives: a transform
// reading the row those do not have, a filter reading a column a key-only
// before image lacks.
func TestShapingDryRuns(t *testing.T) {
	for _, c := range []struct {
		route config.Route
		want  string
	}{
		{config.Route{Transform: `after`},
			`routes[0].transform fails on every truncate of public.orders (before, after and key are null): the result is null, and a transform must produce a map; guard it with op (e.g. op != "truncate" && ...), or list the ops the route takes in match.ops`},
		{config.Route{Transform: `{"s": after.status}`, Match: config.Match{Ops: []string{"insert", "delete"}}},
			`routes[0].transform fails on every delete of public.orders (after is null; before holds the key columns only, as with REPLICA IDENTITY DEFAULT): no row to read "status" from`},
		{config.Route{Filter: `op == "insert" || before.status != "x"`},
			`routes[0].filter fails on every delete of public.orders (after is null; before holds the key columns only, as with REPLICA IDENTITY DEFAULT): column "status" is not in this row`},
	} {
		r := newRouter(t, "drop", c.route)
		_, _, err := r.Route(change(cdc.OpInsert, orders, nil, orderRow(1, "paid", "1")))
		require.ErrorContains(t, err, c.want)
	}
	// With REPLICA IDENTITY FULL a delete's before image has every column.
	full := *orders
	full.ReplicaIdentity = 'f'
	r := newRouter(t, "drop", config.Route{Filter: `op == "insert" || before.status != "x"`})
	_, ok, err := r.Route(change(cdc.OpInsert, &full, nil, orderRow(1, "paid", "1")))
	require.NoError(t, err)
	require.True(t, ok)
}

// TestFilterFailsOnChange: a filter that fails on a change (a column the
// change does not carry) stops with the route, the table, the position
// and the fix, rather than dropping or publishing the change.
func TestFilterFailsOnChange(t *testing.T) {
	r := newRouter(t, "drop", config.Route{Filter: `after.note == "x"`})
	c := change(cdc.OpUpdate, orders, nil, []any{int64(1), "a", nil, nil, cdc.Unchanged, nil, nil, nil, nil, nil})
	_, _, err := r.Route(c)
	require.ErrorContains(t, err, `routes[0].filter on public.orders (update at commit LSN 0/16B37A0, change 3 of the transaction): column "note" is not in this row (an unchanged TOAST value`)
	require.ErrorContains(t, err, "guard the expression")
}

// TestColumns: include keeps the listed columns and the key, exclude
// drops the listed ones; the first rule for a table applies; the
// payload, the key and the subject see only what is kept.
func TestColumns(t *testing.T) {
	r := newRouter(t, "drop", config.Route{
		Subject: "o.{{.Key.id}}.{{.Col.status}}",
		Columns: []config.Columns{
			{Tables: []string{"public.orders"}, Include: []string{"status", "total"}},
			{Exclude: []string{"email"}}, // not reached for public.orders
		}})
	c := change(cdc.OpUpdate, orders, orderRow(7, "open", "1"), orderRow(7, "paid", "2.50"))
	_, ok, err := r.Route(c)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "o.7.paid", c.Subject)
	m := payload(t, c)
	require.Equal(t, map[string]any{"id": 7.0, "status": "paid", "total": 2.5}, m["after"])
	require.Equal(t, map[string]any{"id": 7.0, "status": "open", "total": 1.0}, m["before"])
	require.Equal(t, map[string]any{"id": 7.0}, m["key"])
	require.NotContains(t, string(c.Payload), "ann@example.com")
	require.Len(t, c.Rel.Columns, 3)
	require.Len(t, orders.Columns, 10, "the source's relation is not changed")

	users := &cdc.Relation{Schema: "public", Table: "users", Columns: []cdc.Column{{Name: "id", Type: "int4", Key: true}, {Name: "email", Type: "text"}, {Name: "status", Type: "text"}}}
	u := change(cdc.OpInsert, users, nil, []any{int64(3), "bob@example.com", "new"})
	row := u.After
	_, _, err = r.Route(u)
	require.NoError(t, err)
	require.Equal(t, map[string]any{"id": 3.0, "status": "new"}, payload(t, u)["after"])
	require.Equal(t, "bob@example.com", row[1], "the source's row is not written")
}

// TestMask: redact publishes null and lists the column as masked, hash the
// keyed HMAC-SHA256 in hex (the same for the same value in any table),
// truncate the first N characters; the Bridge-Masked header and every
// format carry the list.
func TestMask(t *testing.T) {
	mask := []config.Mask{
		{Tables: []string{"public.orders"}, Redact: []string{"note"}, Hash: []string{"email"}, HashKey: testHashKey, Truncate: map[string]int{"status": 2, "blob": 3}},
		{Redact: []string{"email", "status"}}, // email and status are masked by the first rule already
	}
	sum := func(s string) string {
		m := hmac.New(sha256.New, []byte(testHashKey))
		m.Write([]byte(s))
		return hex.EncodeToString(m.Sum(nil))
	}
	for _, f := range []string{"native", "debezium", "cloudevents"} {
		t.Run(f, func(t *testing.T) {
			r := newRouter(t, "drop", config.Route{Format: f, Mask: mask, Subject: "o.{{.Col.email}}.{{.Col.status}}"})
			c := change(cdc.OpUpdate, orders, nil, orderRow(7, "pänding", "2.50"))
			_, _, err := r.Route(c)
			require.NoError(t, err)
			require.Equal(t, "o."+sum("ann@example.com")+".pä", c.Subject, "the subject shows masked values")
			require.Equal(t, "status=truncate,email=hash,note=redact,blob=truncate", c.Headers[format.HeaderMasked])
			m := payload(t, c)
			var after, masked any
			switch f {
			case "native":
				after, masked = m["after"], m["masked"]
			case "debezium":
				after, masked = m["after"], m["source"].(map[string]any)["masked"]
			case "cloudevents":
				require.Equal(t, "status=truncate,email=hash,note=redact,blob=truncate", m["pgmasked"])
				data := m["data"].(map[string]any)
				after, masked = data["after"], data["masked"]
			}
			a := after.(map[string]any)
			require.Equal(t, sum("ann@example.com"), a["email"])
			require.Equal(t, "pä", a["status"], "characters, not bytes")
			require.Nil(t, a["note"])
			require.Contains(t, a, "note", "a redacted column stays, as null")
			require.Equal(t, "Ynl0", a["blob"], "bytea keeps 3 bytes")
			require.Equal(t, map[string]any{"status": "truncate", "email": "hash", "note": "redact", "blob": "truncate"}, masked)
			for _, s := range []string{"ann@example.com", "héllo", "nding", "bytes!"} {
				require.NotContains(t, string(c.Payload), s)
			}
		})
	}
	// The same value hashes the same in another table (joins work), and a
	// non-text value hashes its text.
	users := &cdc.Relation{Schema: "public", Table: "users", Columns: []cdc.Column{{Name: "id", Type: "int4", Key: true}, {Name: "email", Type: "text"}, {Name: "age", Type: "int4"}}}
	r := newRouter(t, "drop", config.Route{Mask: []config.Mask{{Hash: []string{"email", "age", "id"}, HashKey: testHashKey}}})
	u := change(cdc.OpInsert, users, nil, []any{int64(3), "ann@example.com", int64(41)})
	_, _, err := r.Route(u)
	require.NoError(t, err)
	m := payload(t, u)
	require.Equal(t, map[string]any{"id": sum("3"), "email": sum("ann@example.com"), "age": sum("41")}, m["after"])
	require.Equal(t, map[string]any{"id": sum("3")}, m["key"], "a hashed key still addresses the row")
}

// TestTransform: the transform's map is the whole payload of the native
// and debezium formats and the data of a cloudevents event; it sees the
// row as published (masked); the subject reads its values with .Out.
func TestTransform(t *testing.T) {
	outbox := &cdc.Relation{Schema: "public", Table: "outbox", Columns: []cdc.Column{
		{Name: "id", Type: "uuid", OID: 2950, Key: true}, {Name: "aggregate_type", Type: "text", OID: 25},
		{Name: "aggregate_id", Type: "text", OID: 25}, {Name: "payload", Type: "jsonb", OID: 3802}, {Name: "secret", Type: "text", OID: 25}}}
	row := []any{"6a1f", "order", "o-17", cdc.RawJSON(`{"b":2,"a":{"x":[1,2.5]}}`), "s3cr3t"}
	for _, f := range []string{"native", "debezium", "cloudevents"} {
		t.Run(f, func(t *testing.T) {
			r := newRouter(t, "drop", config.Route{Format: f, Transform: `after.payload`, Match: config.Match{Ops: []string{"insert"}},
				Subject: "outbox.{{.Col.aggregate_type}}.{{.Col.aggregate_id}}"})
			c := change(cdc.OpInsert, outbox, nil, row)
			_, _, err := r.Route(c)
			require.NoError(t, err)
			require.Equal(t, "outbox.order.o-17", c.Subject)
			body := `{"b":2,"a":{"x":[1,2.5]}}`
			if f == "cloudevents" {
				m := payload(t, c)
				require.Equal(t, "io.bridgecdc.insert", m["type"])
				raw, _ := json.Marshal(m["data"])
				require.JSONEq(t, body, string(raw))
				require.Contains(t, string(c.Payload), `"data":`+body+`}`, "a json object is published as it was")
			} else {
				require.Equal(t, body, string(c.Payload))
			}
		})
	}
	// A map built in CEL, from masked values; .Out reads its values.
	r := newRouter(t, "drop", config.Route{
		Transform: `{"kind": after.aggregate_type, "id": after.aggregate_id, "secret": after.secret, "n": 1, "at": commit_time}`,
		Match:     config.Match{Ops: []string{"insert", "update"}},
		Mask:      []config.Mask{{Hash: []string{"secret"}, HashKey: testHashKey}},
		Subject:   "ev.{{.Out.kind}}.{{.Out.n}}.{{.Out.missing}}"})
	c := change(cdc.OpInsert, outbox, nil, row)
	_, _, err := r.Route(c)
	require.NoError(t, err)
	require.Equal(t, "ev.order.1._", c.Subject)
	m := payload(t, c)
	require.Equal(t, "order", m["kind"])
	require.Len(t, m["secret"], 64)
	require.Equal(t, "2024-05-01T10:00:01Z", m["at"])
	require.NotContains(t, string(c.Payload), "s3cr3t")
	require.Equal(t, `{"at":"2024-05-01T10:00:01Z","id":"o-17","kind":"order","n":1,"secret":"`+m["secret"].(string)+`"}`, string(c.Payload), "keys sorted")

	// A whole row keeps its column order and exact values.
	r = newRouter(t, "drop", config.Route{Transform: `op == "delete" ? before : after`, Columns: []config.Columns{{Include: []string{"total"}}}, Match: config.Match{Ops: []string{"insert", "delete"}}})
	c = change(cdc.OpInsert, orders, nil, orderRow(5, "x", "12.50"))
	_, _, err = r.Route(c)
	require.NoError(t, err)
	require.Equal(t, `{"id":5,"total":12.50}`, string(c.Payload))

	c = change(cdc.OpDelete, orders, orderRow(5, "x", "1"), nil)
	_, _, err = r.Route(c)
	require.NoError(t, err)
	require.Equal(t, `{"id":5,"total":1}`, string(c.Payload))

	// A transform producing null stops with the route and the change.
	r = newRouter(t, "drop", config.Route{Transform: `op == "update" ? before : after`, Match: config.Match{Ops: []string{"insert", "update"}}})
	_, _, err = r.Route(change(cdc.OpUpdate, orders, nil, orderRow(5, "x", "1")))
	require.ErrorContains(t, err, "routes[0].transform on public.orders (update at commit LSN 0/16B37A0, change 3 of the transaction): the result is null")
}

// TestShapingSnapshotRelations: a relation describing the same columns
// again (a snapshot's per chunk) reuses the compiled shaping, and the
// published relation follows the change's own.
func TestShapingSnapshotRelations(t *testing.T) {
	r := newRouter(t, "drop", config.Route{Filter: `after.status == "paid"`, Columns: []config.Columns{{Include: []string{"status"}}}})
	for i := range 3 {
		rel := *orders
		c := change(cdc.OpRead, &rel, nil, orderRow(int64(i), "paid", "1"))
		_, ok, err := r.Route(c)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, map[string]any{"id": float64(i), "status": "paid"}, payload(t, c)["after"])
	}
	require.Len(t, r.routes[0].shape.sigs, 1)
}

func routeWithFilter(f string) config.Route { return config.Route{Filter: f, Sinks: []string{"a"}} }
