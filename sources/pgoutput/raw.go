package pgoutput

import (
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sources/internal/pgtypes"
)

// The messages every transaction is made of (begin, commit, insert, update,
// delete) are read here, straight from the replication buffer, rather than
// through pglogrepl.Parse. That allocates a struct per message, per tuple
// and per column and copies each value byte by byte (0.5–1 µs per
// single-row transaction), and it does not check a tuple against the
// message's length: a short message panics instead of failing. The other
// messages (relation, type, origin, truncate, logical message) are rare and
// still go through pglogrepl. Values are decoded by pgtypes, whose results
// never alias the buffer.

// rawKind reports whether decodeRaw reads messages of type b.
func rawKind(b byte) bool {
	switch b {
	case 'B', 'C', 'I', 'U', 'D':
		return true
	}
	return false
}

// errShort reports a message that ends before what its layout says.
func errShort(kind byte, want, got int) error {
	return fmt.Errorf("pgoutput message %q: needs at least %d bytes, has %d", kind, want, got)
}

// pgTime converts microseconds since 2000-01-01 UTC.
func pgTime(us int64) time.Time {
	const y2k = 946684800 * 1000000
	return time.UnixMicro(y2k + us).UTC()
}

// decodeRaw decodes one message of a kind rawKind accepts.
func (d *decoder) decodeRaw(walStart cdc.LSN, data []byte) (*cdc.Txn, error) {
	kind := data[0]
	switch kind {
	case 'B': // final LSN (8), commit time (8), xid (4)
		if len(data) < 21 {
			return nil, errShort(kind, 21, len(data))
		}
		d.in = true
		d.txn = &cdc.Txn{Xid: binary.BigEndian.Uint32(data[17:]), CommitTime: pgTime(int64(binary.BigEndian.Uint64(data[9:])))}
		// The final LSN is the start of the commit record: the identity of
		// a transaction handed over before its commit (pgrepl/live.go).
		d.buf.Begin(d.txn, cdc.LSN(binary.BigEndian.Uint64(data[1:])))
		return nil, nil
	case 'C': // flags (1), commit LSN (8), end LSN (8), commit time (8)
		if len(data) < 26 {
			return nil, errShort(kind, 26, len(data))
		}
		t := d.txn
		d.in, d.txn = false, nil
		if t == nil {
			return nil, fmt.Errorf("commit at %s without begin", cdc.LSN(binary.BigEndian.Uint64(data[2:])))
		}
		if d.buf.Len() == 0 {
			return nil, nil
		}
		t.CommitLSN = cdc.LSN(binary.BigEndian.Uint64(data[10:]))
		return d.buf.Finish(t)
	}
	// insert, update, delete: in a streamed block the (sub)transaction's
	// xid (4), then the relation id (4), then tuples each after a byte
	// saying which: N new, K old key, O old row.
	o := 1
	if d.inStream {
		if len(data) < 5 {
			return nil, errShort(kind, 5, len(data))
		}
		d.subXid = binary.BigEndian.Uint32(data[1:])
		o = 5
	}
	if len(data) < o+5 {
		return nil, errShort(kind, o+5, len(data))
	}
	rel, types, err := d.rel(binary.BigEndian.Uint32(data[o:]))
	if err != nil {
		return nil, err
	}
	c := cdc.Change{Rel: rel, Schema: rel.Schema, Table: rel.Table, LSN: walStart}
	fail := func(part string, err error) error {
		what := "delete from"
		switch kind {
		case 'I':
			what = "insert into"
		case 'U':
			what = "update of"
		}
		return fmt.Errorf("%s %s.%s at %s%s: %w", what, rel.Schema, rel.Table, walStart, part, err)
	}
	rest := data[o+4:]
	switch kind {
	case 'I', 'U':
		c.Op = cdc.OpInsert
		if kind == 'U' {
			c.Op = cdc.OpUpdate
			if m := rest[0]; m == 'K' || m == 'O' { // the old key or row first
				var n int
				if c.Before, n, err = d.rawTuple(rel, types, rest[1:], m == 'K'); err != nil {
					return nil, fail(" (old row)", err)
				}
				rest = rest[1+n:]
				if len(rest) == 0 {
					return nil, fail("", fmt.Errorf("message ends after the old row"))
				}
			}
		}
		if rest[0] != 'N' {
			return nil, fail("", fmt.Errorf("tuple marked %q, want 'N'", rest[0]))
		}
		if c.After, _, err = d.rawTuple(rel, types, rest[1:], false); err != nil {
			return nil, fail("", err)
		}
	case 'D':
		c.Op = cdc.OpDelete
		m := rest[0]
		if m != 'K' && m != 'O' {
			return nil, fail("", fmt.Errorf("old tuple marked %q, want 'K' or 'O'", m))
		}
		if c.Before, _, err = d.rawTuple(rel, types, rest[1:], m == 'K'); err != nil {
			return nil, fail("", err)
		}
	}
	return d.add(c)
}

// rawTuple decodes the TupleData at the start of src and returns the row
// and the bytes it took. keyOnly marks an old-key tuple, whose non-key
// columns are not sent and become cdc.Absent.
func (d *decoder) rawTuple(rel *cdc.Relation, types []*pgtypes.Type, src []byte, keyOnly bool) ([]any, int, error) {
	if len(src) < 2 {
		return nil, 0, fmt.Errorf("tuple cut short: %d bytes", len(src))
	}
	n := int(binary.BigEndian.Uint16(src))
	if n != len(rel.Columns) {
		return nil, 0, fmt.Errorf("row has %d columns, relation has %d", n, len(rel.Columns))
	}
	row := make([]any, n)
	off := 2
	for i := range n {
		if off >= len(src) {
			return nil, 0, fmt.Errorf("tuple cut short before column %s", rel.Columns[i].Name)
		}
		kind := src[off]
		off++
		d.size += 16
		switch kind {
		case 'n':
			if keyOnly && !rel.Columns[i].Key {
				row[i] = cdc.Absent
			}
		case 'u':
			row[i] = cdc.Unchanged
		case 't':
			if len(src)-off < 4 {
				return nil, 0, fmt.Errorf("tuple cut short in column %s", rel.Columns[i].Name)
			}
			l := int(binary.BigEndian.Uint32(src[off:]))
			off += 4
			if l > len(src)-off {
				return nil, 0, fmt.Errorf("column %s: value of %d bytes, %d left in the message", rel.Columns[i].Name, l, len(src)-off)
			}
			d.size += l
			v, err := types[i].DecodeText(src[off : off+l])
			if err != nil {
				return nil, 0, fmt.Errorf("column %s (%s): %w", rel.Columns[i].Name, rel.Columns[i].Type, err)
			}
			row[i] = v
			off += l
		default:
			return nil, 0, fmt.Errorf("column %s: unexpected tuple data kind %q", rel.Columns[i].Name, strings.ToValidUTF8(string(rune(kind)), "?"))
		}
	}
	return row, off, nil
}
