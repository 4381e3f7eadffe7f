package wal2json

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sources/internal/pgrepl"
	"github.com/bridgecdc/bridge/sources/internal/pgtypes"
)

// HeaderLossy names, comma-separated, the columns of a change whose value
// wal2json could not express: NaN or ±Infinity in a NOT NULL float or
// numeric column, sent as JSON null by wal2json before 2.6. Their value in
// the change is nil.
const HeaderLossy = "Bridge-Lossy"

// Type OIDs wal2json treats specially.
const (
	oidBytea       = 17
	oidFloat4      = 700
	oidFloat8      = 701
	oidNumeric     = 1700
	oidTimestampTZ = 1184
)

// decoder turns wal2json format-version 2 objects into transactions.
type decoder struct {
	source   string
	prefixes []string
	cat      pgtypes.Querier
	types    *pgtypes.Resolver
	log      *slog.Logger
	tables   map[tableName]*table
	last     *table // the table of the last change, looked up without a map key
	ps       jsonParser

	in      bool
	txn     *cdc.Txn
	nextLSN cdc.LSN // the begin object's nextlsn
	buf     *pgrepl.TxnBuffer
	size    int // approximate bytes of the change being decoded
}

func newDecoder(source string, prefixes []string, cat pgtypes.Querier, types *pgtypes.Resolver, buf *pgrepl.TxnBuffer, log *slog.Logger) *decoder {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &decoder{source: source, prefixes: prefixes, cat: cat, types: types, buf: buf, log: log, tables: map[tableName]*table{}}
}

func (d *decoder) InTxn() bool { return d.in }

func (d *decoder) Buffer() *pgrepl.TxnBuffer { return d.buf }

func (d *decoder) Decode(ctx context.Context, walStart cdc.LSN, data []byte) (*cdc.Txn, error) {
	m, err := d.ps.parse(data)
	if err != nil {
		return nil, fmt.Errorf("parsing wal2json output %q: %w", shorten(data), err)
	}
	lsn := walStart
	if len(m.LSN) > 0 {
		l, err := parseLSN(m.LSN)
		if err != nil {
			return nil, err
		}
		lsn = l
	}
	switch m.Action {
	case "B":
		t := &cdc.Txn{Xid: m.Xid}
		if m.Timestamp != nil {
			ts, err := d.commitTime(ctx, m.Timestamp)
			if err != nil {
				return nil, err
			}
			t.CommitTime = ts
		}
		d.nextLSN = 0
		if len(m.NextLSN) > 0 {
			l, err := parseLSN(m.NextLSN)
			if err != nil {
				return nil, err
			}
			d.nextLSN = l
		}
		d.in, d.txn = true, t
		// The begin's lsn is the start of the commit record: the identity
		// of a transaction handed over before its commit (pgrepl/live.go).
		var final cdc.LSN
		if len(m.LSN) > 0 {
			final = lsn
		}
		d.buf.Begin(t, final)
	case "C":
		t, end := d.txn, d.nextLSN
		d.in, d.txn, d.nextLSN = false, nil, 0
		if t == nil {
			return nil, fmt.Errorf("commit at %s without begin", lsn)
		}
		if d.buf.Len() == 0 {
			return nil, nil
		}
		// The commit's nextlsn is the end of its commit record, pgoutput's
		// TransactionEndLSN: the transaction's identity.
		if len(m.NextLSN) > 0 {
			l, err := parseLSN(m.NextLSN)
			if err != nil {
				return nil, err
			}
			end = l
		}
		if end == 0 {
			return nil, fmt.Errorf("commit at %s without nextlsn (include-lsn is off?)", lsn)
		}
		t.CommitLSN = end
		return d.buf.Finish(t)
	case "I", "U", "D":
		c, err := d.change(ctx, m, lsn)
		if err != nil {
			return nil, err
		}
		d.size = len(data) // about the size of the values
		return d.add(c)
	case "T":
		tb, err := d.table(ctx, m, shapeNone)
		if err != nil {
			return nil, fmt.Errorf("truncate of %s.%s at %s: %w", m.Schema, m.Table, lsn, err)
		}
		// wal2json does not report CASCADE or RESTART IDENTITY.
		return d.add(cdc.Change{Op: cdc.OpTruncate, Rel: tb.rel, Schema: tb.rel.Schema, Table: tb.rel.Table, LSN: lsn})
	case "M":
		if !d.wanted(m.Prefix) {
			return nil, nil
		}
		var content []byte
		if len(m.Content) > 0 {
			b, err := unquote(m.Content)
			if err != nil {
				return nil, fmt.Errorf("message at %s: content: %w", lsn, err)
			}
			if len(b) > 0 {
				content = bytes.Clone(b)
			}
		}
		c := cdc.Change{Op: cdc.OpMessage, LSN: lsn, Prefix: string(m.Prefix), Content: content, Transactional: m.Transactional}
		if m.Transactional && d.in {
			return d.add(c)
		}
		// A non-transactional message is a transaction of its own, with
		// the pgoutput source's identity: its LSN + 1.
		id := lsn + 1
		c.Source, c.CommitLSN, c.TxSize = d.source, id, 1
		return &cdc.Txn{CommitLSN: id, Changes: []cdc.Change{c}}, nil
	default:
		return nil, fmt.Errorf("unknown wal2json action %q at %s (is format-version 2 in effect?)", m.Action, lsn)
	}
	return nil, nil
}

func (d *decoder) commitTime(ctx context.Context, s []byte) (time.Time, error) {
	typ, err := d.types.Lookup(ctx, oidTimestampTZ)
	if err != nil {
		return time.Time{}, err
	}
	v, err := typ.DecodeText(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("commit timestamp: %w", err)
	}
	ts, ok := v.(time.Time)
	if !ok {
		return time.Time{}, fmt.Errorf("commit timestamp %q is not a point in time", s)
	}
	return ts.UTC(), nil
}

func (d *decoder) wanted(prefix []byte) bool {
	if string(prefix) == pgrepl.HeartbeatPrefix {
		return false // the bridge's own heartbeat: never published
	}
	for _, p := range d.prefixes {
		if p == "*" || p == string(prefix) {
			return true
		}
	}
	return false
}

func (d *decoder) add(c cdc.Change) (*cdc.Txn, error) {
	c.Source = d.source
	if d.txn == nil {
		// Not reachable with include-transaction: changes come between
		// begin and commit.
		d.txn = &cdc.Txn{}
		d.in = true
	}
	size := d.size + len(c.Content) + 64
	d.size = 0
	return d.buf.Add(c, size)
}

// change decodes an insert, update or delete.
func (d *decoder) change(ctx context.Context, m *message, lsn cdc.LSN) (cdc.Change, error) {
	var op cdc.Op
	var sh shape
	var what string
	switch m.Action {
	case "I":
		op, sh, what = cdc.OpInsert, shapeInsert, "insert into"
	case "U":
		op, sh, what = cdc.OpUpdate, shapeUpdate, "update of"
	default:
		op, sh, what = cdc.OpDelete, shapeNone, "delete from"
	}
	fail := func(err error) (cdc.Change, error) {
		return cdc.Change{}, fmt.Errorf("%s %s.%s at %s: %w", what, m.Schema, m.Table, lsn, err)
	}
	tb, err := d.table(ctx, m, sh)
	if err != nil {
		return fail(err)
	}
	c := cdc.Change{Op: op, Rel: tb.rel, Schema: tb.rel.Schema, Table: tb.rel.Table, LSN: lsn}
	var lossy []string
	if op != cdc.OpDelete {
		if c.After, lossy, err = tb.row(m.Columns, cdc.Unchanged, lossy); err != nil {
			return fail(err)
		}
	}
	// wal2json sends an update's identity even when the key did not
	// change, taken from the new row; pgoutput sends no old row then.
	if len(m.Identity) > 0 && (op == cdc.OpDelete || tb.rel.ReplicaIdentity == 'f' || !sameKey(m.Identity, m.Columns)) {
		if c.Before, lossy, err = tb.row(m.Identity, cdc.Absent, lossy); err != nil {
			return fail(fmt.Errorf("old row: %w", err))
		}
	}
	if len(lossy) > 0 {
		c.Headers = map[string]string{HeaderLossy: strings.Join(lossy, ",")}
	}
	return c, nil
}

// sameKey reports whether every identity column has the same value in the
// new row (or is missing from both: an unchanged TOAST key).
func sameKey(identity, cols []column) bool {
	for i := range identity {
		found := false
		for j := range cols {
			if bytes.Equal(cols[j].Name, identity[i].Name) {
				if !bytes.Equal(cols[j].Value, identity[i].Value) {
					return false
				}
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// decodeValue decodes one JSON value of a column whose type OID is oid.
// wal2json prints the type's text output as a JSON string, except numbers
// (JSON numbers, the exact text), booleans (true, false) and bytea (the hex
// output without its "\x").
func decodeValue(typ *pgtypes.Type, oid uint32, raw []byte) (any, error) {
	if len(raw) == 0 {
		return nil, errors.New("no value")
	}
	switch raw[0] {
	case 'n':
		return nil, nil
	case '"':
		b, err := unquote(raw)
		if err != nil {
			return nil, err
		}
		if oid == oidBytea {
			b = append([]byte(`\x`), b...)
		}
		return typ.DecodeText(b)
	}
	return typ.DecodeText(raw)
}

// unquote decodes a JSON string, keeping bytes that are not valid UTF-8 as
// they are (wal2json copies them verbatim). Without escapes the result is
// a slice of raw.
func unquote(raw []byte) ([]byte, error) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, fmt.Errorf("not a JSON string: %q", shorten(raw))
	}
	s := raw[1 : len(raw)-1]
	if bytes.IndexByte(s, '\\') < 0 {
		return s, nil
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		if i >= len(s) {
			return nil, errors.New("truncated escape in JSON string")
		}
		switch s[i] {
		case '"', '\\', '/':
			out = append(out, s[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(s[i+1:])
			if !ok {
				return nil, errors.New(`invalid \u escape in JSON string`)
			}
			i += 4
			if utf16.IsSurrogate(r) {
				r2, ok := rune(0), false
				if i+2 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
					r2, ok = hex4(s[i+3:])
				}
				if dec := utf16.DecodeRune(r, r2); ok && dec != unicode.ReplacementChar {
					r = dec
					i += 6
				} else {
					r = unicode.ReplacementChar
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, fmt.Errorf(`invalid escape \%c in JSON string`, s[i])
		}
	}
	return out, nil
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// shorten returns at most 200 bytes of b for messages.
func shorten(b []byte) string {
	if len(b) <= 200 {
		return string(b)
	}
	return string(b[:200]) + "…"
}
