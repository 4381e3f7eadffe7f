package pgoutput

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sources/internal/pgrepl"
	"github.com/bridgecdc/bridge/sources/internal/pgtypes"
)

// col is one column of a TupleData: kind 'n', 'u' or 't' (with v).
type col struct {
	kind byte
	v    string
}

func appendTuple(b []byte, cols ...col) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		b = append(b, c.kind)
		if c.kind == 't' {
			b = binary.BigEndian.AppendUint32(b, uint32(len(c.v)))
			b = append(b, c.v...)
		}
	}
	return b
}

func msgBegin(final uint64, at time.Time, xid uint32) []byte {
	b := binary.BigEndian.AppendUint64([]byte{'B'}, final)
	b = binary.BigEndian.AppendUint64(b, uint64(at.UnixMicro()-946684800*1000000))
	return binary.BigEndian.AppendUint32(b, xid)
}

func msgCommit(commit, end uint64, at time.Time) []byte {
	b := binary.BigEndian.AppendUint64([]byte{'C', 0}, commit)
	b = binary.BigEndian.AppendUint64(b, end)
	return binary.BigEndian.AppendUint64(b, uint64(at.UnixMicro()-946684800*1000000))
}

// msgRow is an insert ('I'), update ('U') or delete ('D') of relation 7:
// old (marked 'K' or 'O', or none when oldKind is 0) then new.
func msgRow(kind, oldKind byte, old, new []col) []byte {
	b := binary.BigEndian.AppendUint32([]byte{kind}, 7)
	if oldKind != 0 {
		b = appendTuple(append(b, oldKind), old...)
	}
	if new != nil {
		b = appendTuple(append(b, 'N'), new...)
	}
	return b
}

func testDecoder(t testing.TB) *decoder {
	t.Helper()
	types := pgtypes.NewResolver(nil)
	var ts []*pgtypes.Type
	for _, oid := range []uint32{20, 25, 25} {
		ty, err := types.Lookup(context.Background(), oid)
		require.NoError(t, err)
		ts = append(ts, ty)
	}
	rel := &cdc.Relation{ID: 7, Schema: "public", Table: "items", Columns: []cdc.Column{
		{Name: "id", Type: "int8", OID: 20, Key: true}, {Name: "name", Type: "text", OID: 25}, {Name: "doc", Type: "text", OID: 25}}}
	dir := t.TempDir()
	return &decoder{source: "app", buf: pgrepl.NewTxnBuffer(dir, 100, 1<<20),
		rels: map[uint32]*cdc.Relation{7: rel}, types2: map[uint32][]*pgtypes.Type{7: ts},
		spill:   func() *pgrepl.TxnBuffer { return pgrepl.NewTxnBuffer(dir, 100, 1<<20) },
		streams: map[uint32]*inflight{}}
}

// TestDecodeRaw decodes a transaction of every row change pgoutput sends,
// each message built by hand and also checked to parse the same way with
// pglogrepl, which the decoder read them with before.
func TestDecodeRaw(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 11, 12, 123456000, time.UTC)
	row := []col{{'t', "1"}, {'t', "widget"}, {'u', ""}}
	key := []col{{'t', "1"}, {'n', ""}, {'n', ""}}
	msgs := [][]byte{
		msgBegin(0x500, at, 991),
		msgRow('I', 0, nil, []col{{'t', "1"}, {'t', "widget"}, {'n', ""}}),
		msgRow('U', 0, nil, row),
		msgRow('U', 'K', key, row),
		msgRow('U', 'O', []col{{'t', "1"}, {'t', "old"}, {'n', ""}}, row),
		msgRow('D', 'K', key, nil),
		msgRow('D', 'O', []col{{'t', "1"}, {'t', "widget"}, {'t', "{}"}}, nil),
		msgCommit(0x4F0, 0x500, at),
	}
	d := testDecoder(t)
	var txn *cdc.Txn
	for i, m := range msgs {
		p, err := pglogrepl.Parse(m)
		require.NoError(t, err, "message %d: pglogrepl reads the hand-built message", i)
		switch p := p.(type) {
		case *pglogrepl.BeginMessage:
			assert.Equal(t, uint32(991), p.Xid)
			assert.True(t, at.Equal(p.CommitTime))
		case *pglogrepl.InsertMessage:
			assert.Len(t, p.Tuple.Columns, 3)
		case *pglogrepl.UpdateMessage:
			assert.Len(t, p.NewTuple.Columns, 3)
		case *pglogrepl.DeleteMessage:
			assert.Len(t, p.OldTuple.Columns, 3)
		case *pglogrepl.CommitMessage:
			assert.Equal(t, pglogrepl.LSN(0x500), p.TransactionEndLSN)
		}
		got, err := d.Decode(context.Background(), cdc.LSN(0x400+i), m)
		require.NoError(t, err, "message %d", i)
		if i < len(msgs)-1 {
			require.Nil(t, got, "message %d", i)
			require.True(t, d.InTxn())
		} else {
			txn = got
		}
	}
	require.NotNil(t, txn)
	require.False(t, d.InTxn())
	assert.Equal(t, cdc.LSN(0x500), txn.CommitLSN)
	assert.Equal(t, uint32(991), txn.Xid)
	assert.Equal(t, at, txn.CommitTime)
	rel := d.rels[7]
	want := []struct {
		op            cdc.Op
		before, after []any
	}{
		{cdc.OpInsert, nil, []any{int64(1), "widget", nil}},
		{cdc.OpUpdate, nil, []any{int64(1), "widget", cdc.Unchanged}},
		{cdc.OpUpdate, []any{int64(1), cdc.Absent, cdc.Absent}, []any{int64(1), "widget", cdc.Unchanged}},
		{cdc.OpUpdate, []any{int64(1), "old", nil}, []any{int64(1), "widget", cdc.Unchanged}},
		{cdc.OpDelete, []any{int64(1), cdc.Absent, cdc.Absent}, nil},
		{cdc.OpDelete, []any{int64(1), "widget", "{}"}, nil},
	}
	require.Len(t, txn.Changes, len(want))
	for i, w := range want {
		c := txn.Changes[i]
		assert.Equal(t, w.op, c.Op, "change %d", i)
		assert.Equal(t, w.before, c.Before, "change %d: before", i)
		assert.Equal(t, w.after, c.After, "change %d: after", i)
		assert.Same(t, rel, c.Rel, "change %d", i)
		assert.Equal(t, "items", c.Table, "change %d", i)
		assert.Equal(t, cdc.LSN(0x401+i), c.LSN, "change %d", i)
		assert.Equal(t, uint32(i), c.Seq, "change %d", i)
		assert.Equal(t, uint32(len(want)), c.TxSize, "change %d", i)
		assert.Equal(t, "app", c.Source, "change %d", i)
	}

	// A value never aliases the replication buffer, which pgconn reuses.
	m := msgRow('I', 0, nil, []col{{'t', "2"}, {'t', "gadget"}, {'t', "x"}})
	_, err := d.Decode(context.Background(), 1, msgBegin(0x600, at, 992))
	require.NoError(t, err)
	_, err = d.Decode(context.Background(), 2, m)
	require.NoError(t, err)
	clear(m)
	txn, err = d.Decode(context.Background(), 3, msgCommit(0x5F0, 0x600, at))
	require.NoError(t, err)
	assert.Equal(t, []any{int64(2), "gadget", "x"}, txn.Changes[0].After)
}

// TestDecodeRawShort: every message cut short anywhere fails with an error
// (pglogrepl panics on some), and nothing is emitted.
func TestDecodeRawShort(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 11, 12, 0, time.UTC)
	row := []col{{'t', "1"}, {'t', "widget"}, {'n', ""}}
	for _, m := range [][]byte{
		msgBegin(0x500, at, 1),
		msgCommit(0x4F0, 0x500, at),
		msgRow('I', 0, nil, row),
		msgRow('U', 'O', row, row),
		msgRow('U', 'K', []col{{'t', "1"}, {'n', ""}, {'n', ""}}, row),
		msgRow('D', 'O', row, nil),
	} {
		for n := 1; n < len(m); n++ {
			t.Run(fmt.Sprintf("%c/%d", m[0], n), func(t *testing.T) {
				d := testDecoder(t)
				if m[0] == 'C' {
					_, err := d.Decode(context.Background(), 1, msgBegin(0x500, at, 1))
					require.NoError(t, err)
				}
				got, err := d.Decode(context.Background(), 2, m[:n])
				require.Error(t, err)
				require.Nil(t, got)
			})
		}
	}
	d := testDecoder(t)
	_, err := d.Decode(context.Background(), 9, msgRow('I', 0, nil, []col{{'t', "x"}, {'t', "a"}, {'n', ""}}))
	require.ErrorContains(t, err, "insert into public.items at 0/9: column id (int8)")
	_, err = d.Decode(context.Background(), 9, msgRow('I', 0, nil, []col{{'t', "1"}, {'n', ""}}))
	require.ErrorContains(t, err, "row has 2 columns, relation has 3")
	_, err = d.Decode(context.Background(), 9, msgRow('D', 'N', row, nil))
	require.ErrorContains(t, err, "old tuple marked 'N'")
	_, err = d.Decode(context.Background(), 9, msgCommit(1, 2, at))
	require.ErrorContains(t, err, "commit at 0/1 without begin")
}

// BenchmarkDecodeTxn decodes single-row transactions (begin, insert of the
// benchmark table's shape, commit), as the single-row backlog sends them.
func BenchmarkDecodeTxn(b *testing.B) {
	at := time.Date(2026, 12, 3, 10, 11, 12, 0, time.UTC)
	pad := strings.Repeat("x", 200)
	msgs := [][]byte{msgBegin(0x500, at, 1), msgRow('I', 0, nil, []col{{'t', "123456"}, {'t', "42"}, {'t', pad}}), msgCommit(0x4F0, 0x500, at)}
	d := testDecoder(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		for _, m := range msgs {
			if _, err := d.Decode(ctx, 1, m); err != nil {
				b.Fatal(err)
			}
		}
	}
}
