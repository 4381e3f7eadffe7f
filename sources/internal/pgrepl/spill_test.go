package pgrepl

import (
	"encoding/json"
	"errors"
	"io"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

var (
	relA = &cdc.Relation{ID: 1, Schema: "public", Table: "a", Columns: []cdc.Column{{Name: "id", Type: "int8", OID: 20, Key: true}}}
	relB = &cdc.Relation{ID: 2, Schema: "s", Table: "b"}
)

// zoo is one change of every kind, with every value type.
func zoo() []cdc.Change {
	ts := time.Date(2026, 12, 3, 1, 2, 3, 456789000, time.UTC)
	row := []any{nil, false, true, int64(-42), int64(math.MaxInt64), 3.25, math.Inf(-1), cdc.Numeric("12345.6789"), "text ✓",
		[]byte{0, 1, 0xff}, []byte{}, cdc.RawJSON(`{"a":[1,2]}`), json.RawMessage(`"x"`), ts, cdc.Timestamp{Time: ts},
		cdc.Date{Time: time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)}, cdc.Infinity(1), cdc.Infinity(-1),
		[]any{int64(1), nil, []any{"a", "b"}}, cdc.Unchanged, cdc.Absent,
		cdc.Record{Names: []string{"a", "b"}, Values: []any{int64(1), cdc.Record{Names: []string{"x"}, Values: []any{nil}, Text: "()"}}, Text: `(1,"()")`},
		cdc.Geometry{EWKB: []byte{1, 1, 0, 0, 0, 0xff}}, cdc.Geometry{EWKB: []byte{0, 0, 0, 0, 1}, Geography: true}}
	return []cdc.Change{
		{Source: "app", Database: "db", LSN: 0x16_B374D848, Schema: "public", Table: "a", Op: cdc.OpInsert, Rel: relA, After: row},
		{Source: "app", Database: "db", LSN: 2, Schema: "public", Table: "a", Op: cdc.OpUpdate, Rel: relA, Before: []any{int64(1), cdc.Absent}, After: row},
		{Source: "app", Database: "db", LSN: 3, Schema: "s", Table: "b", Op: cdc.OpDelete, Rel: relB, Before: []any{}},
		{Source: "app", Database: "db", LSN: 4, Schema: "s", Table: "b", Op: cdc.OpTruncate, Rel: relB, Cascade: true, RestartIdentity: true},
		{Source: "app", Database: "db", LSN: 5, Op: cdc.OpMessage, Prefix: "p", Content: []byte("hello"), Transactional: true,
			Headers: map[string]string{"traceparent": "00-abc", "k": ""}, Subject: "x.y", Payload: []byte{}, Producer: "b.app.e"},
	}
}

// TestSpillRoundTrip spills every kind of change and value and reads them
// back unchanged, with the transaction's commit fields.
func TestSpillRoundTrip(t *testing.T) {
	b := NewTxnBuffer(t.TempDir(), 2, 1<<30)
	var want []cdc.Change
	for range 50 {
		for _, c := range zoo() {
			want = append(want, c)
			_, err := b.Add(c, 100)
			require.NoError(t, err)
		}
	}
	require.True(t, b.Spilled())
	commit := time.Date(2026, 12, 3, 1, 0, 0, 0, time.UTC)
	txn, err := b.Finish(&cdc.Txn{Xid: 77, CommitLSN: 0xABC, CommitTime: commit})
	require.NoError(t, err)
	require.Len(t, txn.Changes, 2)
	require.NotNil(t, txn.Rest)
	got := readAll(t, txn, 7)
	require.Len(t, got, len(want))
	for i := range want {
		w := want[i]
		w.CommitLSN, w.Seq, w.TxSize, w.Xid, w.CommitTime = 0xABC, uint32(i), uint32(len(want)), 77, commit
		assert.Equal(t, w, got[i], "change %d", i)
		assert.Same(t, want[i].Rel, got[i].Rel, "change %d: relation", i)
	}
}

// TestSpillRefusesUnknownTypes checks that a value the codec does not know
// fails the spill with its type named instead of being lost.
func TestSpillRefusesUnknownTypes(t *testing.T) {
	b := NewTxnBuffer(t.TempDir(), 0, 0)
	defer b.Discard()
	_, err := b.Add(cdc.Change{Op: cdc.OpInsert, Rel: relA, After: []any{int32(1)}}, 10)
	require.ErrorContains(t, err, "int32")
}

// TestSpillCorrupt checks that a truncated record is an error, not a
// silently shorter transaction.
func TestSpillCorrupt(t *testing.T) {
	c := zoo()[0]
	rec, err := appendChange(nil, &c, 0)
	require.NoError(t, err)
	for _, n := range []int{0, 1, len(rec) / 2, len(rec) - 1} {
		var r changeReader
		var got cdc.Change
		_, err := r.change(rec[:n], &got)
		assert.Error(t, err, "record cut at %d of %d bytes", n, len(rec))
	}
}

// BenchmarkSpill writes and reads back a transaction of BenchmarkSpill's
// rows (the benchmark table's shape) through a spill file.
func BenchmarkSpill(b *testing.B) {
	rel := &cdc.Relation{ID: 16384, Schema: "public", Table: "bench", Columns: []cdc.Column{
		{Name: "id", Type: "int8", OID: 20, Key: true}, {Name: "n", Type: "int4", OID: 23}, {Name: "pad", Type: "text", OID: 25}}}
	pad := string(make([]byte, 200))
	const rows = 20000
	b.ReportAllocs()
	dir := b.TempDir()
	buf := make([]cdc.Change, 1000)
	for range b.N {
		tb := NewTxnBuffer(dir, 0, 0)
		for i := range rows {
			c := cdc.Change{Source: "app", Database: "postgres", LSN: cdc.LSN(i), Schema: "public", Table: "bench", Op: cdc.OpInsert, Rel: rel,
				After: []any{int64(i), int64(i), pad}}
			if _, err := tb.Add(c, 250); err != nil {
				b.Fatal(err)
			}
		}
		txn, err := tb.Finish(&cdc.Txn{CommitLSN: 1})
		if err != nil {
			b.Fatal(err)
		}
		got := 0
		for {
			n, err := txn.Rest.Next(buf)
			got += n
			if err != nil {
				break
			}
		}
		if got != rows {
			b.Fatalf("read back %d of %d", got, rows)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*rows), "ns/change")
}

// TestSpillKeepsOnlyHead: once a transaction spills, only its first
// spillHead changes stay in memory, whichever limit it passed, and reading
// it back gives every change once, in order, with its ordinal.
func TestSpillKeepsOnlyHead(t *testing.T) {
	for _, tc := range []struct {
		name     string
		changes  int
		maxBytes int64
		add      int
	}{
		{"by count", 500, 1 << 30, 700},
		{"by bytes", 100000, 300 * 100, 700},
		{"just past the count", 500, 1 << 30, 501},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewTxnBuffer(t.TempDir(), tc.changes, tc.maxBytes)
			for i := range tc.add {
				_, err := b.Add(cdc.Change{Op: cdc.OpInsert, Rel: relA, LSN: cdc.LSN(i + 1), After: []any{int64(i)}}, 100)
				require.NoError(t, err)
			}
			require.True(t, b.Spilled())
			txn, err := b.Finish(&cdc.Txn{Xid: 9, CommitLSN: 0x100})
			require.NoError(t, err)
			require.Len(t, txn.Changes, spillHead)
			assert.Equal(t, spillHead, cap(txn.Changes), "the in-memory array is let go, not kept behind a short slice")
			got := readAll(t, txn, 100)
			require.Len(t, got, tc.add)
			for i, c := range got {
				assert.Equal(t, cdc.LSN(i+1), c.LSN, "change %d", i)
				assert.Equal(t, []any{int64(i)}, c.After, "change %d", i)
				assert.Equal(t, uint32(i), c.Seq, "change %d", i)
				assert.Equal(t, uint32(tc.add), c.TxSize, "change %d", i)
			}
		})
	}
}

// readAll returns txn's changes: those in memory, then the spilled ones
// read back chunk at a time.
func readAll(t *testing.T, txn *cdc.Txn, chunk int) []cdc.Change {
	t.Helper()
	got := append([]cdc.Change(nil), txn.Changes...)
	buf := make([]cdc.Change, chunk)
	for {
		n, err := txn.Rest.Next(buf)
		got = append(got, buf[:n]...)
		if errors.Is(err, io.EOF) {
			return got
		}
		require.NoError(t, err)
	}
}
