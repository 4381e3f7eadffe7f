package wal2json

import (
	"fmt"

	"github.com/valyala/fastjson"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// message is one wal2json format-version 2 object: a begin ("B"), commit
// ("C"), insert ("I"), update ("U"), delete ("D"), truncate ("T") or
// logical decoding message ("M").
//
// Its byte slices point into the decoder's parser and scratch buffer: they
// are valid until the next parse, and anything kept longer is copied.
type message struct {
	Action        string // one byte: Go interns it, no allocation
	Xid           uint32 // 0 when absent
	Timestamp     []byte // nil when absent
	LSN           []byte
	NextLSN       []byte
	Schema        []byte
	Table         []byte
	Columns       []column
	Identity      []column
	PK            []column
	HasPK         bool // "pk" was sent (include-pk: insert, update, delete), maybe empty
	Transactional bool
	Prefix        []byte
	Content       []byte // the JSON text of "content"
}

// column is one column of "columns", "identity" or "pk".
type column struct {
	Name    []byte
	Type    []byte
	TypeOID uint32
	Value   []byte // the JSON text of "value": a number, string, true, false or null; nil when absent
	HasOpt  bool   // "optional" was sent (include-not-null; only in "columns")
	Opt     bool

	vs, ve int // where Value is in the parser's scratch buffer, while it grows
}

// notNull reports whether wal2json marked the column NOT NULL.
func (c *column) notNull() bool { return c.HasOpt && !c.Opt }

// jsonParser parses wal2json objects into one reused message without an
// allocation per object: fastjson's values point into its own copy of the
// input, and the values' JSON text goes into one scratch buffer.
type jsonParser struct {
	p       fastjson.Parser
	m       message
	scratch []byte
}

// parse parses data. The message is valid until the next call.
func (ps *jsonParser) parse(data []byte) (*message, error) {
	v, err := ps.p.ParseBytes(data)
	if err != nil {
		return nil, err
	}
	o, err := v.Object()
	if err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	m := &ps.m
	cols, ident, pk := m.Columns[:0], m.Identity[:0], m.PK[:0]
	*m = message{}
	ps.scratch = ps.scratch[:0]
	// Values go into scratch, which may move as it grows: their offsets
	// are kept until every one is in, then turned into slices.
	var content [2]int
	err = visit(o, func(key []byte, f *fastjson.Value) (err error) {
		switch string(key) {
		case "action":
			var b []byte
			if b, err = str(f); len(b) > 0 {
				m.Action = string(b)
			}
		case "xid":
			m.Xid, err = uint32Of(f)
		case "timestamp":
			m.Timestamp, err = str(f)
		case "lsn":
			m.LSN, err = str(f)
		case "nextlsn":
			m.NextLSN, err = str(f)
		case "schema":
			m.Schema, err = str(f)
		case "table":
			m.Table, err = str(f)
		case "columns":
			cols, err = ps.columns(f, cols)
		case "identity":
			ident, err = ps.columns(f, ident)
		case "pk":
			m.HasPK = true
			pk, err = ps.columns(f, pk)
		case "transactional":
			m.Transactional = f.Type() == fastjson.TypeTrue
		case "prefix":
			m.Prefix, err = str(f)
		case "content":
			content[0] = len(ps.scratch)
			ps.scratch = f.MarshalTo(ps.scratch)
			content[1] = len(ps.scratch)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, cs := range [...][]column{cols, ident, pk} {
		for i := range cs {
			if c := &cs[i]; c.ve > c.vs {
				c.Value = ps.scratch[c.vs:c.ve:c.ve]
			}
		}
	}
	if content[1] > content[0] {
		m.Content = ps.scratch[content[0]:content[1]:content[1]]
	}
	m.Columns, m.Identity, m.PK = cols, ident, pk
	return m, nil
}

// columns appends the columns of the array f to cs. A value's JSON text
// goes into scratch; parse makes it a slice once scratch stops growing.
func (ps *jsonParser) columns(f *fastjson.Value, cs []column) ([]column, error) {
	if f.Type() == fastjson.TypeNull {
		return cs, nil
	}
	a, err := f.Array()
	if err != nil {
		return cs, err
	}
	for i, e := range a {
		o, err := e.Object()
		if err != nil {
			return cs, fmt.Errorf("element %d: %w", i, err)
		}
		var c column
		err = visit(o, func(key []byte, f *fastjson.Value) (err error) {
			switch string(key) {
			case "name":
				c.Name, err = str(f)
			case "type":
				c.Type, err = str(f)
			case "typeoid":
				c.TypeOID, err = uint32Of(f)
			case "value":
				c.vs = len(ps.scratch)
				ps.scratch = f.MarshalTo(ps.scratch)
				c.ve = len(ps.scratch)
			case "optional":
				switch f.Type() {
				case fastjson.TypeTrue:
					c.HasOpt, c.Opt = true, true
				case fastjson.TypeFalse:
					c.HasOpt = true
				}
			}
			return err
		})
		if err != nil {
			return cs, fmt.Errorf("element %d: %w", i, err)
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// visit calls f for each key of o in order until f fails, and returns
// that error naming the key.
func visit(o *fastjson.Object, f func(key []byte, v *fastjson.Value) error) error {
	var ferr error
	o.Visit(func(key []byte, v *fastjson.Value) {
		if ferr != nil {
			return
		}
		if err := f(key, v); err != nil {
			ferr = fmt.Errorf("%q: %w", key, err)
		}
	})
	return ferr
}

// str returns a string value's bytes, or nil for null.
func str(f *fastjson.Value) ([]byte, error) {
	if f.Type() == fastjson.TypeNull {
		return nil, nil
	}
	return f.StringBytes()
}

// uint32Of returns a number that fits 32 bits, or 0 for null.
func uint32Of(f *fastjson.Value) (uint32, error) {
	if f.Type() == fastjson.TypeNull {
		return 0, nil
	}
	u, err := f.Uint64()
	if err != nil {
		return 0, err
	}
	if u > 1<<32-1 {
		return 0, fmt.Errorf("%d does not fit 32 bits", u)
	}
	return uint32(u), nil
}

// parseLSN parses an LSN as wal2json prints it ("16/B374D848") without an
// allocation; anything else goes to cdc.ParseLSN for its error.
func parseLSN(b []byte) (cdc.LSN, error) {
	var v [2]uint64
	part, digits := 0, 0
	for _, c := range b {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c == '/' && part == 0 && digits > 0:
			part, digits = 1, 0
			continue
		default:
			return cdc.ParseLSN(string(b))
		}
		if digits++; digits > 8 {
			return cdc.ParseLSN(string(b))
		}
		v[part] = v[part]<<4 | uint64(d)
	}
	if part == 0 || digits == 0 {
		return cdc.ParseLSN(string(b))
	}
	return cdc.LSN(v[0]<<32 | v[1]), nil
}
