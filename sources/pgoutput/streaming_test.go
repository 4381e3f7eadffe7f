package pgoutput

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sources/internal/pgrepl"
)

func msgStreamStart(xid uint32, first bool) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'S'}, xid)
	if first {
		return append(b, 1)
	}
	return append(b, 0)
}

func msgStreamStop() []byte { return []byte{'E'} }

func msgStreamCommit(xid uint32, commit, end uint64, at time.Time) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'c'}, xid)
	b = binary.BigEndian.AppendUint64(append(b, 0), commit)
	b = binary.BigEndian.AppendUint64(b, end)
	return binary.BigEndian.AppendUint64(b, uint64(at.UnixMicro()-946684800*1000000))
}

func msgStreamAbort(xid, sub uint32) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32([]byte{'A'}, xid), sub)
}

// msgStreamedInsert is an insert of row id into relation 7 by (sub)transaction xid,
// as sent in a streamed block.
func msgStreamedInsert(xid uint32, id int) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'I'}, xid)
	b = binary.BigEndian.AppendUint32(b, 7)
	return appendTuple(append(b, 'N'), col{'t', strconv.Itoa(id)}, col{'t', "x"}, col{'n', ""})
}

// readAll reads a transaction whole.
func readAll(t *testing.T, txn *cdc.Txn) []cdc.Change {
	t.Helper()
	out := append([]cdc.Change(nil), txn.Changes...)
	if txn.Rest == nil {
		return out
	}
	defer txn.Rest.Close()
	buf := make([]cdc.Change, 64)
	for {
		n, err := txn.Rest.Next(buf)
		out = append(out, buf[:n]...)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
	}
}

// TestDecodeStreamed decodes a transaction Postgres streams before its
// commit, in two blocks with a whole transaction between them and a
// subtransaction that aborts: it comes out at its stream commit, whole, in
// order, without the aborted subtransaction's changes, numbered without
// gaps; the transaction between the blocks comes out at its own commit. The
// hand-built messages parse the same way with pglogrepl.
func TestDecodeStreamed(t *testing.T) {
	at := time.Date(2026, 12, 5, 1, 2, 3, 0, time.UTC)
	msgs := [][]byte{
		msgStreamStart(900, true),
		msgStreamedInsert(900, 1),
		msgStreamedInsert(900, 2),
		msgStreamedInsert(901, 3), // a subtransaction that aborts below
		msgStreamStop(),
		msgBegin(0x700, at, 950),
		msgRow('I', 0, nil, []col{{'t', "100"}, {'t', "between"}, {'n', ""}}),
		msgCommit(0x6F0, 0x700, at),
		msgStreamStart(900, false),
		msgStreamedInsert(902, 4), // a subtransaction that commits
		msgStreamedInsert(900, 5),
		msgStreamStop(),
		msgStreamAbort(900, 901),
		msgStreamStart(960, true), // a transaction that aborts whole
		msgStreamedInsert(960, 6),
		msgStreamStop(),
		msgStreamAbort(960, 960),
		msgStreamCommit(900, 0x7F0, 0x800, at),
	}
	inStream := false
	for i, m := range msgs {
		p, err := pglogrepl.ParseV2(m, inStream)
		require.NoError(t, err, "message %d: pglogrepl reads the hand-built message", i)
		switch p := p.(type) {
		case *pglogrepl.StreamStartMessageV2:
			inStream = true
		case *pglogrepl.StreamStopMessageV2:
			inStream = false
		case *pglogrepl.InsertMessageV2:
			if inStream {
				require.NotZero(t, p.Xid, "message %d", i)
			}
		case *pglogrepl.StreamCommitMessageV2:
			assert.Equal(t, pglogrepl.LSN(0x7F0), p.CommitLSN)
			assert.Equal(t, pglogrepl.LSN(0x800), p.TransactionEndLSN)
		case *pglogrepl.StreamAbortMessageV2:
			require.NotZero(t, p.SubXid)
		}
	}

	d := testDecoder(t)
	var out []*cdc.Txn
	for i, m := range msgs {
		txn, err := d.Decode(context.Background(), cdc.LSN(0x600+i), m)
		require.NoError(t, err, "message %d", i)
		if txn != nil {
			out = append(out, txn)
		}
	}
	require.Len(t, out, 2)
	between := readAll(t, out[0])
	require.Len(t, between, 1)
	assert.Equal(t, cdc.LSN(0x700), out[0].CommitLSN)
	assert.Equal(t, int64(100), between[0].After[0])

	assert.Equal(t, cdc.LSN(0x800), out[1].CommitLSN, "up to 1000 changes: the commit end")
	assert.Equal(t, uint32(900), out[1].Xid)
	got := readAll(t, out[1])
	var ids []int64
	for i, c := range got {
		ids = append(ids, c.After[0].(int64))
		assert.Equal(t, uint32(i), c.Seq)
		assert.Equal(t, uint32(4), c.TxSize)
		assert.Equal(t, uint32(900), c.Xid)
		assert.Equal(t, cdc.LSN(0x800), c.CommitLSN)
		assert.Equal(t, at, c.CommitTime)
	}
	assert.Equal(t, []int64{1, 2, 4, 5}, ids)
	assert.False(t, d.InTxn())
	assert.Empty(t, d.streams, "nothing left of the aborted and committed transactions")
}

// TestDecodeStreamedLarge: a streamed transaction of more than StreamAfter
// changes, most of them spilled to a file, some in an aborted
// subtransaction, gets the identity start of commit record + 1 (the same
// as when Postgres sends it after its commit) and its size on every change.
func TestDecodeStreamedLarge(t *testing.T) {
	at := time.Date(2026, 12, 5, 1, 2, 3, 0, time.UTC)
	d := testDecoder(t)
	const n = 2*pgrepl.StreamAfter + 300
	dec := func(m []byte) *cdc.Txn {
		txn, err := d.Decode(context.Background(), 0x600, m)
		require.NoError(t, err)
		return txn
	}
	dec(msgStreamStart(900, true))
	for i := range n {
		xid := uint32(900)
		if i%10 == 3 {
			xid = 901 + uint32(i%7) // subtransactions 901..907; 904 aborts
		}
		if i == n/2 {
			dec(msgStreamStop())
			dec(msgStreamStart(900, false))
		}
		dec(msgStreamedInsert(xid, i))
	}
	dec(msgStreamStop())
	dec(msgStreamAbort(900, 904))
	txn := dec(msgStreamCommit(900, 0x7F0, 0x800, at))
	require.NotNil(t, txn)
	assert.Equal(t, cdc.LSN(0x7F1), txn.CommitLSN)
	got := readAll(t, txn)
	var want []int64
	for i := range n {
		if !(i%10 == 3 && 901+i%7 == 904) {
			want = append(want, int64(i))
		}
	}
	require.Len(t, got, len(want))
	for i, c := range got {
		require.Equal(t, want[i], c.After[0], "change %d", i)
		require.Equal(t, uint32(i), c.Seq)
		require.Equal(t, uint32(len(want)), c.TxSize)
		require.Equal(t, uint32(900), c.Xid)
		require.Equal(t, cdc.LSN(0x7F1), c.CommitLSN)
	}
}
