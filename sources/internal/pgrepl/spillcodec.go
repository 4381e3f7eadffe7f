package pgrepl

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// The spill file holds one record per change: its length (uvarint), then
// the change in the layout of appendChange. Commit fields (CommitLSN, Seq,
// TxSize, CommitTime) are not stored: they are the transaction's, set when
// read back. Xid is stored: a transaction Postgres streamed before its
// commit holds each change's subtransaction there until the commit
// (FinishStreamed leaves out those of aborted subtransactions). Rel is stored as an index into the buffer's relations.

// Value tags.
const (
	tagNil byte = iota
	tagFalse
	tagTrue
	tagInt64
	tagFloat64
	tagNumeric
	tagString
	tagBytes
	tagRawJSON
	tagJSONRaw // json.RawMessage
	tagTime
	tagTimestamp
	tagDate
	tagInfinity
	tagArray
	tagUnchanged
	tagAbsent
	tagRecord    // cdc.Record: text, names, values
	tagGeometry  // cdc.Geometry
	tagGeography // cdc.Geometry with Geography set
)

// Flags of a record.
const (
	flagCascade = 1 << iota
	flagRestartIdentity
	flagTransactional
	flagBefore
	flagAfter
	flagContent
	flagPayload
	flagHeaders
)

// appendChange appends c's record body (without the length) to dst.
func appendChange(dst []byte, c *cdc.Change, rel int) ([]byte, error) {
	var f byte
	set := func(cond bool, bit byte) {
		if cond {
			f |= bit
		}
	}
	set(c.Cascade, flagCascade)
	set(c.RestartIdentity, flagRestartIdentity)
	set(c.Transactional, flagTransactional)
	set(c.Before != nil, flagBefore)
	set(c.After != nil, flagAfter)
	set(c.Content != nil, flagContent)
	set(c.Payload != nil, flagPayload)
	set(c.Headers != nil, flagHeaders)
	dst = append(dst, f)
	dst = binary.AppendUvarint(dst, uint64(rel))
	dst = binary.AppendUvarint(dst, uint64(c.LSN))
	dst = binary.AppendUvarint(dst, uint64(c.Xid))
	for _, s := range [...]string{c.Producer, c.Source, c.Database, c.Schema, c.Table, string(c.Op), c.Prefix, c.Subject} {
		dst = appendStr(dst, s)
	}
	var err error
	for _, row := range [...][]any{c.Before, c.After} {
		if row == nil {
			continue
		}
		if dst, err = appendRow(dst, row); err != nil {
			return nil, err
		}
	}
	if c.Content != nil {
		dst = appendStr(dst, string(c.Content))
	}
	if c.Payload != nil {
		dst = appendStr(dst, string(c.Payload))
	}
	if c.Headers != nil {
		dst = binary.AppendUvarint(dst, uint64(len(c.Headers)))
		for k, v := range c.Headers {
			dst = appendStr(dst, k)
			dst = appendStr(dst, v)
		}
	}
	return dst, nil
}

func appendStr(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendRow(dst []byte, row []any) ([]byte, error) {
	dst = binary.AppendUvarint(dst, uint64(len(row)))
	var err error
	for _, v := range row {
		if dst, err = appendValue(dst, v); err != nil {
			return nil, err
		}
	}
	return dst, nil
}

func appendTime(dst []byte, tag byte, t time.Time) ([]byte, error) {
	dst = append(dst, tag)
	var tb [16]byte
	b, err := t.AppendBinary(tb[:0])
	if err != nil {
		return nil, err
	}
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...), nil
}

func appendValue(dst []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(dst, tagNil), nil
	case bool:
		if v {
			return append(dst, tagTrue), nil
		}
		return append(dst, tagFalse), nil
	case int64:
		return binary.AppendVarint(append(dst, tagInt64), v), nil
	case float64:
		return binary.LittleEndian.AppendUint64(append(dst, tagFloat64), math.Float64bits(v)), nil
	case cdc.Numeric:
		return appendStr(append(dst, tagNumeric), string(v)), nil
	case string:
		return appendStr(append(dst, tagString), v), nil
	case []byte:
		return appendStr(append(dst, tagBytes), string(v)), nil
	case cdc.RawJSON:
		return appendStr(append(dst, tagRawJSON), string(v)), nil
	case json.RawMessage:
		return appendStr(append(dst, tagJSONRaw), string(v)), nil
	case time.Time:
		return appendTime(dst, tagTime, v)
	case cdc.Timestamp:
		return appendTime(dst, tagTimestamp, v.Time)
	case cdc.Date:
		return appendTime(dst, tagDate, v.Time)
	case cdc.Infinity:
		return append(dst, tagInfinity, byte(v)), nil
	case []any:
		if v == nil {
			return append(dst, tagNil), nil
		}
		return appendRow(append(dst, tagArray), v)
	case cdc.UnchangedToast:
		return append(dst, tagUnchanged), nil
	case cdc.AbsentValue:
		return append(dst, tagAbsent), nil
	case cdc.Record:
		dst = appendStr(append(dst, tagRecord), v.Text)
		dst = binary.AppendUvarint(dst, uint64(len(v.Names)))
		for _, n := range v.Names {
			dst = appendStr(dst, n)
		}
		return appendRow(dst, v.Values)
	case cdc.Geometry:
		tag := tagGeometry
		if v.Geography {
			tag = tagGeography
		}
		return appendStr(append(dst, tag), string(v.EWKB)), nil
	}
	return nil, fmt.Errorf("cannot spill a value of type %T", v)
}

var errCorrupt = errors.New("corrupt spill record")

// changeReader decodes records. It interns the strings that repeat from
// change to change (source, database, schema, table, op, prefix).
type changeReader struct {
	b      []byte
	intern map[string]string
}

func (r *changeReader) uvarint() (uint64, error) {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		return 0, errCorrupt
	}
	r.b = r.b[n:]
	return v, nil
}

func (r *changeReader) bytes() ([]byte, error) {
	n, err := r.uvarint()
	if err != nil || n > uint64(len(r.b)) {
		return nil, errCorrupt
	}
	b := r.b[:n:n]
	r.b = r.b[n:]
	return b, nil
}

func (r *changeReader) str() (string, error) {
	b, err := r.bytes()
	return string(b), err
}

func (r *changeReader) interned() (string, error) {
	b, err := r.bytes()
	if err != nil {
		return "", err
	}
	if s, ok := r.intern[string(b)]; ok {
		return s, nil
	}
	s := string(b)
	if len(r.intern) < 1024 {
		r.intern[s] = s
	}
	return s, nil
}

func (r *changeReader) copyBytes() ([]byte, error) {
	b, err := r.bytes()
	if err != nil {
		return nil, err
	}
	return append(make([]byte, 0, len(b)), b...), nil
}

// change decodes record body b into c (commit fields and Rel untouched) and
// returns the relation index.
func (r *changeReader) change(b []byte, c *cdc.Change) (rel int, err error) {
	if r.intern == nil {
		r.intern = map[string]string{}
	}
	r.b = b
	if len(r.b) == 0 {
		return 0, errCorrupt
	}
	f := r.b[0]
	r.b = r.b[1:]
	c.Cascade, c.RestartIdentity, c.Transactional = f&flagCascade != 0, f&flagRestartIdentity != 0, f&flagTransactional != 0
	ri, err := r.uvarint()
	if err != nil {
		return 0, err
	}
	lsn, err := r.uvarint()
	if err != nil {
		return 0, err
	}
	c.LSN = cdc.LSN(lsn)
	xid, err := r.uvarint()
	if err != nil {
		return 0, err
	}
	c.Xid = uint32(xid)
	var op string
	for _, p := range [...]*string{&c.Producer, &c.Source, &c.Database, &c.Schema, &c.Table, &op, &c.Prefix, &c.Subject} {
		if *p, err = r.interned(); err != nil {
			return 0, err
		}
	}
	c.Op = cdc.Op(op)
	if f&flagBefore != 0 {
		if c.Before, err = r.row(); err != nil {
			return 0, err
		}
	}
	if f&flagAfter != 0 {
		if c.After, err = r.row(); err != nil {
			return 0, err
		}
	}
	if f&flagContent != 0 {
		if c.Content, err = r.copyBytes(); err != nil {
			return 0, err
		}
	}
	if f&flagPayload != 0 {
		if c.Payload, err = r.copyBytes(); err != nil {
			return 0, err
		}
	}
	if f&flagHeaders != 0 {
		n, err := r.uvarint()
		if err != nil || n > uint64(len(r.b)) {
			return 0, errCorrupt
		}
		c.Headers = make(map[string]string, n)
		for range n {
			k, err := r.str()
			if err != nil {
				return 0, err
			}
			if c.Headers[k], err = r.str(); err != nil {
				return 0, err
			}
		}
	}
	if len(r.b) != 0 {
		return 0, errCorrupt
	}
	return int(ri), nil
}

func (r *changeReader) row() ([]any, error) {
	n, err := r.uvarint()
	if err != nil || n > uint64(len(r.b)) {
		return nil, errCorrupt
	}
	row := make([]any, n)
	for i := range row {
		if row[i], err = r.value(); err != nil {
			return nil, err
		}
	}
	return row, nil
}

func (r *changeReader) time() (time.Time, error) {
	var t time.Time
	b, err := r.bytes()
	if err != nil {
		return t, err
	}
	if err := t.UnmarshalBinary(b); err != nil {
		return t, errCorrupt
	}
	return t, nil
}

func (r *changeReader) value() (any, error) {
	if len(r.b) == 0 {
		return nil, errCorrupt
	}
	tag := r.b[0]
	r.b = r.b[1:]
	switch tag {
	case tagNil:
		return nil, nil
	case tagFalse:
		return false, nil
	case tagTrue:
		return true, nil
	case tagInt64:
		v, n := binary.Varint(r.b)
		if n <= 0 {
			return nil, errCorrupt
		}
		r.b = r.b[n:]
		return v, nil
	case tagFloat64:
		if len(r.b) < 8 {
			return nil, errCorrupt
		}
		v := math.Float64frombits(binary.LittleEndian.Uint64(r.b))
		r.b = r.b[8:]
		return v, nil
	case tagNumeric:
		s, err := r.str()
		return cdc.Numeric(s), err
	case tagString:
		return r.str()
	case tagBytes:
		return r.copyBytes()
	case tagRawJSON:
		b, err := r.copyBytes()
		return cdc.RawJSON(b), err
	case tagJSONRaw:
		b, err := r.copyBytes()
		return json.RawMessage(b), err
	case tagTime:
		return r.time()
	case tagTimestamp:
		t, err := r.time()
		return cdc.Timestamp{Time: t}, err
	case tagDate:
		t, err := r.time()
		return cdc.Date{Time: t}, err
	case tagInfinity:
		if len(r.b) < 1 {
			return nil, errCorrupt
		}
		v := cdc.Infinity(int8(r.b[0]))
		r.b = r.b[1:]
		return v, nil
	case tagArray:
		return r.row()
	case tagUnchanged:
		return cdc.Unchanged, nil
	case tagAbsent:
		return cdc.Absent, nil
	case tagRecord:
		return r.record()
	case tagGeometry, tagGeography:
		b, err := r.copyBytes()
		return cdc.Geometry{EWKB: b, Geography: tag == tagGeography}, err
	}
	return nil, errCorrupt
}

func (r *changeReader) record() (any, error) {
	text, err := r.str()
	if err != nil {
		return nil, err
	}
	n, err := r.uvarint()
	if err != nil || n > uint64(len(r.b)) {
		return nil, errCorrupt
	}
	names := make([]string, n)
	for i := range names {
		if names[i], err = r.str(); err != nil {
			return nil, err
		}
	}
	vals, err := r.row()
	if err != nil {
		return nil, err
	}
	if len(vals) != len(names) {
		return nil, errCorrupt
	}
	return cdc.Record{Names: names, Values: vals, Text: text}, nil
}
