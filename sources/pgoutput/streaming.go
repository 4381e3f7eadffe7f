package pgoutput

import (
	"encoding/binary"
	"fmt"

	"github.com/jackc/pglogrepl"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sources/internal/pgrepl"
)

// Transactions streamed before their commit.
//
// With protocol version 2 and the streaming option (Postgres 14 and later,
// config stream_in_progress, off by default), the walsender sends a transaction whose
// changes pass logical_decoding_work_mem while it is still running: blocks
// of its changes between Stream Start and Stream Stop, each change tagged
// with its (sub)transaction's xid, interleaved with other transactions,
// then Stream Commit, or Stream Abort for the transaction or for one of
// its subtransactions. Without it, Postgres decodes such a transaction
// into its own files and sends it only after its commit, so the first of
// a large transaction's changes arrives seconds after COMMIT returned.
//
// The decoder keeps each streamed transaction in a buffer of its own
// (memory, then a temporary file), leaves out the changes of the
// subtransactions that abort, and hands the transaction over whole when
// its Stream Commit arrives: its changes are here already, so its first
// message is published at once.
//
// Identity follows the same rule as for a transaction sent after its
// commit (sources/internal/pgrepl/live.go): up to pgrepl.StreamAfter
// changes, the end of the commit record; above, the start of the commit
// record + 1. Whether Postgres streams a transaction depends on the memory
// its decoding takes at that moment and can change from one run to the
// next; the identity depends only on the changes, so a replay finds what
// the sinks hold.

// inflight is a transaction Postgres streams before its commit.
type inflight struct {
	buf     *pgrepl.TxnBuffer
	n       uint32            // changes added
	counts  map[uint32]uint32 // changes per (sub)transaction
	aborted map[uint32]bool   // subtransactions aborted
}

// streamKind reports whether decodeStream reads messages of type b.
func streamKind(b byte) bool {
	switch b {
	case 'S', 'E', 'c', 'A':
		return true
	}
	return false
}

// decodeStream decodes stream start, stop, commit and abort.
func (d *decoder) decodeStream(walStart cdc.LSN, data []byte) (*cdc.Txn, error) {
	kind := data[0]
	switch kind {
	case 'S': // xid (4), first segment (1)
		if len(data) < 6 {
			return nil, errShort(kind, 6, len(data))
		}
		xid := binary.BigEndian.Uint32(data[1:])
		f := d.streams[xid]
		if f == nil || data[5] == 1 {
			if f != nil {
				f.buf.Discard()
			}
			f = &inflight{buf: d.spill(), counts: map[uint32]uint32{}, aborted: map[uint32]bool{}}
			d.streams[xid] = f
		}
		d.inStream, d.cur = true, f
	case 'E':
		d.inStream, d.cur = false, nil
	case 'A': // xid (4), subtransaction xid (4), then (version 4) abort LSN and time
		if len(data) < 9 {
			return nil, errShort(kind, 9, len(data))
		}
		xid, sub := binary.BigEndian.Uint32(data[1:]), binary.BigEndian.Uint32(data[5:])
		f := d.streams[xid]
		if f == nil {
			return nil, nil
		}
		if sub == xid {
			f.buf.Discard()
			delete(d.streams, xid)
			return nil, nil
		}
		f.aborted[sub] = true
	case 'c': // xid (4), flags (1), commit LSN (8), end LSN (8), commit time (8)
		if len(data) < 30 {
			return nil, errShort(kind, 30, len(data))
		}
		xid := binary.BigEndian.Uint32(data[1:])
		start := cdc.LSN(binary.BigEndian.Uint64(data[6:]))
		end := cdc.LSN(binary.BigEndian.Uint64(data[14:]))
		f := d.streams[xid]
		delete(d.streams, xid)
		if f == nil {
			return nil, nil // nothing of it was published
		}
		n := f.n
		for sub := range f.aborted {
			n -= f.counts[sub]
		}
		id := end
		if n > pgrepl.StreamAfter {
			id = start + 1
		}
		t := &cdc.Txn{Xid: xid, CommitLSN: id, CommitTime: pgTime(int64(binary.BigEndian.Uint64(data[22:])))}
		t, err := f.buf.FinishStreamed(t, f.aborted, n)
		if err != nil {
			return nil, fmt.Errorf("streamed transaction %d committed at %s: %w", xid, walStart, err)
		}
		return t, nil
	}
	return nil, nil
}

// addStreamed adds c, decoded in a streamed block, to its transaction.
func (d *decoder) addStreamed(c cdc.Change) error {
	f := d.cur
	if f == nil {
		return fmt.Errorf("a streamed change at %s outside a stream block", c.LSN)
	}
	c.Xid = d.subXid // until the commit: the subtransaction, to leave out if it aborts
	f.n++
	f.counts[d.subXid]++
	size := d.size + len(c.Content) + 64
	d.size = 0
	_, err := f.buf.Add(c, size)
	return err
}

// parse parses a message that decodeRaw and decodeStream do not read; in a
// streamed block it carries its (sub)transaction's xid, kept in d.subXid.
func (d *decoder) parse(data []byte) (pglogrepl.Message, error) {
	if !d.inStream {
		return pglogrepl.Parse(data)
	}
	msg, err := pglogrepl.ParseV2(data, true)
	if err != nil {
		return nil, err
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessageV2:
		d.subXid = m.Xid
		return &m.RelationMessage, nil
	case *pglogrepl.TypeMessageV2:
		d.subXid = m.Xid
		return &m.TypeMessage, nil
	case *pglogrepl.TruncateMessageV2:
		d.subXid = m.Xid
		return &m.TruncateMessage, nil
	case *pglogrepl.LogicalDecodingMessageV2:
		d.subXid = m.Xid
		return &m.LogicalDecodingMessage, nil
	}
	return msg, nil
}
