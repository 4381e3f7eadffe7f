package format

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

var testRel = &cdc.Relation{
	ID: 16384, Schema: "public", Table: "orders", ReplicaIdentity: 'd',
	Columns: []cdc.Column{
		{Name: "id", Type: "int8", OID: 20, Key: true},
		{Name: "region", Type: "text", OID: 25, Key: true},
		{Name: "note", Type: "text", OID: 25},
		{Name: "doc", Type: "jsonb", OID: 3802},
	},
}

func baseChange(op cdc.Op) cdc.Change {
	return cdc.Change{
		Producer: "shop.main.k3x9", Source: "main",
		CommitLSN: 0x16B37A0, LSN: 0x16B3748, Seq: 2, TxSize: 3, Xid: 750,
		CommitTime: time.Date(2024, 2, 29, 7, 4, 56, 789012345, time.UTC),
		Schema:     "public", Table: "orders", Op: op, Rel: testRel,
	}
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	require.True(t, json.Valid(b), "invalid JSON: %s", b)
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	require.NoError(t, d.Decode(&m))
	return m
}

func TestAppendNative(t *testing.T) {
	common := map[string]any{
		"source": "main", "schema": "public", "table": "orders",
		"commit_lsn": "0/16B37A0", "lsn": "0/16B3748", "seq": json.Number("2"), "tx_size": json.Number("3"),
		"xid": json.Number("750"), "commit_time": "2024-02-29T07:04:56.789012Z",
	}
	tests := []struct {
		name   string
		change func() cdc.Change
		want   map[string]any
	}{
		{"insert", func() cdc.Change {
			c := baseChange(cdc.OpInsert)
			c.After = []any{int64(1), "eu", nil, cdc.RawJSON(`{"a": [1, 2.50]}`)}
			return c
		}, map[string]any{
			"op": "insert", "key": map[string]any{"id": json.Number("1"), "region": "eu"}, "before": nil,
			"after": map[string]any{"id": json.Number("1"), "region": "eu", "note": nil, "doc": map[string]any{"a": []any{json.Number("1"), json.Number("2.50")}}},
		}},
		{"read", func() cdc.Change {
			c := baseChange(cdc.OpRead)
			c.After = []any{int64(1), "eu", "n", cdc.RawJSON(`null`)}
			return c
		}, map[string]any{
			"op": "read", "key": map[string]any{"id": json.Number("1"), "region": "eu"}, "before": nil,
			"after": map[string]any{"id": json.Number("1"), "region": "eu", "note": "n", "doc": nil},
		}},
		{"update with key change and unchanged toast", func() cdc.Change {
			c := baseChange(cdc.OpUpdate)
			c.Before = []any{int64(1), "eu", cdc.Absent, cdc.Absent}
			c.After = []any{int64(2), "eu", cdc.Unchanged, cdc.Unchanged}
			return c
		}, map[string]any{
			"op": "update", "key": map[string]any{"id": json.Number("2"), "region": "eu"},
			"before":          map[string]any{"id": json.Number("1"), "region": "eu"},
			"after":           map[string]any{"id": json.Number("2"), "region": "eu"},
			"unchanged_toast": []any{"note", "doc"},
		}},
		{"update without old row", func() cdc.Change {
			c := baseChange(cdc.OpUpdate)
			c.After = []any{int64(1), "eu", "new", cdc.RawJSON(`[]`)}
			return c
		}, map[string]any{
			"op": "update", "key": map[string]any{"id": json.Number("1"), "region": "eu"}, "before": nil,
			"after": map[string]any{"id": json.Number("1"), "region": "eu", "note": "new", "doc": []any{}},
		}},
		{"update with unchanged toast key", func() cdc.Change {
			c := baseChange(cdc.OpUpdate)
			c.Before = []any{int64(1), "a very long region", "old", nil}
			c.After = []any{int64(1), cdc.Unchanged, "new", nil}
			return c
		}, map[string]any{
			"op": "update", "key": map[string]any{"id": json.Number("1"), "region": "a very long region"},
			"before":          map[string]any{"id": json.Number("1"), "region": "a very long region", "note": "old", "doc": nil},
			"after":           map[string]any{"id": json.Number("1"), "note": "new", "doc": nil},
			"unchanged_toast": []any{"region"},
		}},
		{"delete", func() cdc.Change {
			c := baseChange(cdc.OpDelete)
			c.Before = []any{int64(1), "eu", cdc.Absent, cdc.Absent}
			return c
		}, map[string]any{
			"op": "delete", "key": map[string]any{"id": json.Number("1"), "region": "eu"},
			"before": map[string]any{"id": json.Number("1"), "region": "eu"}, "after": nil,
		}},
		{"delete with full identity", func() cdc.Change {
			c := baseChange(cdc.OpDelete)
			c.Before = []any{int64(1), "eu", "gone", cdc.RawJSON(`{}`)}
			return c
		}, map[string]any{
			"op": "delete", "key": map[string]any{"id": json.Number("1"), "region": "eu"},
			"before": map[string]any{"id": json.Number("1"), "region": "eu", "note": "gone", "doc": map[string]any{}}, "after": nil,
		}},
		{"delete without old row", func() cdc.Change {
			return baseChange(cdc.OpDelete)
		}, map[string]any{"op": "delete", "key": nil, "before": nil, "after": nil}},
		{"truncate", func() cdc.Change {
			c := baseChange(cdc.OpTruncate)
			c.Cascade, c.RestartIdentity = true, false
			return c
		}, map[string]any{
			"op": "truncate", "key": nil, "before": nil, "after": nil,
			"truncate": map[string]any{"cascade": true, "restart_identity": false},
		}},
		{"message text", func() cdc.Change {
			c := baseChange(cdc.OpMessage)
			c.Schema, c.Table, c.Rel = "", "", nil
			c.Prefix, c.Content, c.Transactional = "traceparent", []byte("00-abc-01 é"), true
			return c
		}, map[string]any{
			"op": "message", "schema": "", "table": "", "key": nil, "before": nil, "after": nil,
			"message": map[string]any{"prefix": "traceparent", "transactional": true, "content": "00-abc-01 é"},
		}},
		{"message binary", func() cdc.Change {
			c := baseChange(cdc.OpMessage)
			c.Schema, c.Table, c.Rel = "", "", nil
			c.Prefix, c.Content = "bin", []byte{0xff, 0, 1}
			return c
		}, map[string]any{
			"op": "message", "schema": "", "table": "", "key": nil, "before": nil, "after": nil,
			"message": map[string]any{"prefix": "bin", "transactional": false, "content_base64": "/wAB"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.change()
			want := map[string]any{}
			for k, v := range common {
				want[k] = v
			}
			for k, v := range tt.want {
				want[k] = v
			}
			got := decode(t, AppendNative(nil, &c))
			assert.Equal(t, want, got)
			assert.NotContains(t, got, "id", "the id is the message's (Nats-Msg-Id), not the payload's")
			assert.Equal(t, c.CommitLSN.String(), got["commit_lsn"])
			assert.Equal(t, c.LSN.String(), got["lsn"])
		})
	}
}

// TestAppendNativeExact pins the exact bytes, and so the key order.
func TestAppendNativeExact(t *testing.T) {
	c := baseChange(cdc.OpUpdate)
	c.Before = []any{int64(1), "eu", cdc.Absent, cdc.Absent}
	c.After = []any{int64(2), "eu", cdc.Unchanged, cdc.RawJSON(`{"k": "v"}`)}
	want := `{"op":"update","source":"main","schema":"public","table":"orders",` +
		`"commit_lsn":"0/16B37A0","lsn":"0/16B3748","seq":2,"tx_size":3,"xid":750,"commit_time":"2024-02-29T07:04:56.789012Z",` +
		`"key":{"id":2,"region":"eu"},"before":{"id":1,"region":"eu"},"after":{"id":2,"region":"eu","doc":{"k": "v"}},` +
		`"unchanged_toast":["note"]}`
	assert.Equal(t, want, string(AppendNative(nil, &c)))

	tr := baseChange(cdc.OpTruncate)
	tr.RestartIdentity = true
	want = `{"op":"truncate","source":"main","schema":"public","table":"orders",` +
		`"commit_lsn":"0/16B37A0","lsn":"0/16B3748","seq":2,"tx_size":3,"xid":750,"commit_time":"2024-02-29T07:04:56.789012Z",` +
		`"key":null,"before":null,"after":null,"truncate":{"cascade":false,"restart_identity":true}}`
	assert.Equal(t, want, string(AppendNative(nil, &tr)))

	m := baseChange(cdc.OpMessage)
	m.Rel, m.Schema, m.Table, m.CommitTime = nil, "", "", time.Time{}
	m.Prefix, m.Content = "p", []byte("hi")
	want = `{"op":"message","source":"main","schema":"","table":"",` +
		`"commit_lsn":"0/16B37A0","lsn":"0/16B3748","seq":2,"tx_size":3,"xid":750,"commit_time":null,` +
		`"key":null,"before":null,"after":null,"message":{"prefix":"p","transactional":false,"content":"hi"}}`
	assert.Equal(t, want, string(AppendNative(nil, &m)))
}

func TestAppendNativeEdges(t *testing.T) {
	t.Run("escaped names", func(t *testing.T) {
		c := baseChange(cdc.OpInsert)
		c.Source = `we"ird\name`
		c.Rel = &cdc.Relation{Columns: []cdc.Column{{Name: "a\"b", Key: true}, {Name: "line\nbreak"}, {Name: "\xff"}}}
		c.After = []any{int64(1), "x", "y"}
		got := decode(t, AppendNative(nil, &c))
		assert.Equal(t, c.Source, got["source"])
		assert.Equal(t, map[string]any{"a\"b": json.Number("1")}, got["key"])
		assert.Equal(t, map[string]any{"a\"b": json.Number("1"), "line\nbreak": "x", "\ufffd": "y"}, got["after"])
	})
	t.Run("more values than columns", func(t *testing.T) {
		c := baseChange(cdc.OpInsert)
		c.Rel = &cdc.Relation{Columns: []cdc.Column{{Name: "a", Key: true}}}
		c.After = []any{int64(1), "x", cdc.Unchanged}
		got := decode(t, AppendNative(nil, &c))
		assert.Equal(t, map[string]any{"a": json.Number("1"), "2": "x"}, got["after"])
		assert.Equal(t, []any{"3"}, got["unchanged_toast"])
	})
	t.Run("no relation", func(t *testing.T) {
		c := baseChange(cdc.OpInsert)
		c.Rel = nil
		c.After = []any{int64(1)}
		got := decode(t, AppendNative(nil, &c))
		assert.Nil(t, got["key"])
		assert.Equal(t, map[string]any{"1": json.Number("1")}, got["after"])
	})
	t.Run("no key columns", func(t *testing.T) {
		c := baseChange(cdc.OpInsert)
		c.Rel = &cdc.Relation{Columns: []cdc.Column{{Name: "a"}}}
		c.After = []any{int64(1)}
		got := decode(t, AppendNative(nil, &c))
		assert.Nil(t, got["key"])
	})
	t.Run("large LSN and seq", func(t *testing.T) {
		c := baseChange(cdc.OpInsert)
		c.CommitLSN, c.LSN, c.Seq, c.TxSize, c.Xid = 0xFFFFFFFFFFFFFFFF, 0x16_B374D848, 4294967295, 4294967295, 4294967295
		c.After = []any{int64(1), "eu", nil, nil}
		got := decode(t, AppendNative(nil, &c))
		assert.Equal(t, "FFFFFFFF/FFFFFFFF", got["commit_lsn"])
		assert.Equal(t, "16/B374D848", got["lsn"])
		assert.Equal(t, json.Number("4294967295"), got["seq"])
		assert.Equal(t, json.Number("4294967295"), got["tx_size"])
	})
	t.Run("size not known yet", func(t *testing.T) {
		c := baseChange(cdc.OpInsert)
		c.TxSize = 0 // handed over before its transaction's end
		c.After = []any{int64(1), "eu", nil, nil}
		got := decode(t, AppendNative(nil, &c))
		assert.Contains(t, got, "tx_size")
		assert.Nil(t, got["tx_size"])
	})
	t.Run("appends", func(t *testing.T) {
		c := baseChange(cdc.OpTruncate)
		out := AppendNative([]byte("x"), &c)
		assert.True(t, strings.HasPrefix(string(out), `x{"op":`))
	})
}

// benchChange is a 10-column insert of typical values.
func benchChange() *cdc.Change {
	rel := &cdc.Relation{Schema: "public", Table: "orders", Columns: []cdc.Column{
		{Name: "id", Key: true}, {Name: "customer_id"}, {Name: "status"}, {Name: "total"}, {Name: "paid"},
		{Name: "created_at"}, {Name: "note"}, {Name: "attrs"}, {Name: "ratio"}, {Name: "ship_date"},
	}}
	c := baseChange(cdc.OpInsert)
	c.Rel = rel
	c.After = []any{
		int64(1234567), int64(42), "shipped", cdc.Numeric("1234.50"), true,
		time.Date(2024, 2, 29, 7, 4, 56, 789012000, time.UTC), "Leave at the door, ring twice \"please\"",
		cdc.RawJSON(`{"gift": true, "tags": ["a", "b"]}`), 0.25, cdc.Date{Time: time.Date(2024, 3, 2, 0, 0, 0, 0, time.UTC)},
	}
	return &c
}

func TestBenchChangeIsValid(t *testing.T) {
	c := benchChange()
	out := AppendNative(nil, c)
	decode(t, out)
	allocs := testing.AllocsPerRun(100, func() { out = AppendNative(out[:0], c) })
	assert.Zero(t, allocs, "AppendNative into a large enough buffer")
}

func BenchmarkAppendNative(b *testing.B) {
	c := benchChange()
	buf := AppendNative(nil, c)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendNative(buf[:0], c)
	}
}
