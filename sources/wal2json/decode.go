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

	"github.com/jackc/pgx/v5"

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
		d.buf.Discard()
		d.in, d.txn = true, t
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
		return nil, d.add(c)
	case "T":
		tb, err := d.table(ctx, m, shapeNone)
		if err != nil {
			return nil, fmt.Errorf("truncate of %s.%s at %s: %w", m.Schema, m.Table, lsn, err)
		}
		// wal2json does not report CASCADE or RESTART IDENTITY.
		return nil, d.add(cdc.Change{Op: cdc.OpTruncate, Rel: tb.rel, Schema: tb.rel.Schema, Table: tb.rel.Table, LSN: lsn})
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
			return nil, d.add(c)
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

func (d *decoder) add(c cdc.Change) error {
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

// tableName is a schema-qualified table name.
type tableName struct{ schema, table string }

// table is how changes of one table are decoded: its relation and the
// types of its columns.
type table struct {
	rel     *cdc.Relation
	types   []*pgtypes.Type
	pos     map[string]int
	varlena []bool          // may hold an unchanged TOAST value
	notNull []bool          // NOT NULL: a null float or numeric is a lost NaN or ±Infinity
	ident   []bool          // part of the replica identity (every column with FULL)
	skip    map[string]bool // generated columns: wal2json sends them, pgoutput does not
	catalog bool            // described by the catalog, not by a message
}

// shape says which columns a message's "columns" must carry.
type shape uint8

const (
	shapeNone   shape = iota // no new row (delete, truncate)
	shapeInsert              // every column
	shapeUpdate              // every column but unchanged TOAST ones
)

// fits reports whether m's columns and identity can be decoded with t.
func (t *table) fits(m *message, sh shape) bool {
	if sh != shapeNone && !t.fitsRow(m.Columns, sh) {
		return false
	}
	return t.fitsRow(m.Identity, shapeNone)
}

func (t *table) fitsRow(cols []column, sh shape) bool {
	last := -1
	gap := func(from, to int) bool {
		for k := from; k < to; k++ {
			if sh == shapeInsert || sh == shapeUpdate && !t.varlena[k] {
				return true
			}
		}
		return false
	}
	for i := range cols {
		c := &cols[i]
		if t.skip[string(c.Name)] {
			continue
		}
		j, ok := t.pos[string(c.Name)]
		if !ok || j <= last || c.TypeOID != 0 && c.TypeOID != t.rel.Columns[j].OID || gap(last+1, j) {
			return false
		}
		last = j
	}
	return !gap(last+1, len(t.rel.Columns))
}

// identFits reports whether an identity agrees with t's replica identity:
// only identity columns, and every column for REPLICA IDENTITY FULL.
func (t *table) identFits(identity []column) bool {
	n := 0
	for i := range identity {
		if t.skip[string(identity[i].Name)] {
			continue
		}
		if j, ok := t.pos[string(identity[i].Name)]; !ok || !t.ident[j] {
			return false
		}
		n++
	}
	return t.rel.ReplicaIdentity != 'f' || n == len(t.rel.Columns)
}

// table returns the description that decodes m: the cached one, else the
// catalog's, else (the catalog changed since the change was written) one
// made from m itself.
func (d *decoder) table(ctx context.Context, m *message, sh shape) (*table, error) {
	t := d.last
	if t == nil || string(m.Schema) != t.rel.Schema || string(m.Table) != t.rel.Table {
		t = d.tables[tableName{string(m.Schema), string(m.Table)}]
	}
	if t != nil && t.fits(m, sh) && (len(m.Identity) == 0 || !t.catalog || t.identFits(m.Identity)) {
		d.last = t
		return t, nil
	}
	key := tableName{string(m.Schema), string(m.Table)}
	ct, err := d.describe(ctx, key.schema, key.table)
	if err != nil {
		return nil, err
	}
	if ct != nil && ct.fits(m, sh) {
		d.tables[key], d.last = ct, ct
		return ct, nil
	}
	mt, err := d.fromMessage(ctx, m, ct)
	if err != nil {
		return nil, err
	}
	d.log.Warn("the catalog does not describe a change's columns (DDL since it was written?); describing the table by the change",
		"table", key.schema+"."+key.table)
	d.tables[key], d.last = mt, mt
	return mt, nil
}

const describeSQL = `SELECT c.oid, c.relreplident::text,
	array_agg(a.attname::text ORDER BY a.attnum),
	array_agg(a.atttypid ORDER BY a.attnum),
	array_agg(a.attgenerated <> '' ORDER BY a.attnum),
	array_agg(a.attlen = -1 ORDER BY a.attnum),
	array_agg(a.attnotnull ORDER BY a.attnum),
	array_agg(c.relreplident = 'f' OR EXISTS (SELECT 1 FROM pg_catalog.pg_index i
		WHERE i.indrelid = c.oid AND a.attnum = ANY (i.indkey)
		AND CASE c.relreplident WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident ELSE false END) ORDER BY a.attnum),
	array_agg(EXISTS (SELECT 1 FROM pg_catalog.pg_index i
		WHERE i.indrelid = c.oid AND a.attnum = ANY (i.indkey)
		AND CASE c.relreplident WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident ELSE i.indisprimary END) ORDER BY a.attnum)
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE n.nspname = $1 AND c.relname = $2
GROUP BY c.oid, c.relreplident`

// describe reads a table's description from the catalog: its columns
// (generated ones left out, as pgoutput does), their types, which are part
// of the replica identity (all of them with REPLICA IDENTITY FULL) and which
// are key columns, as the pgoutput source flags them: the replica identity
// index's, or with REPLICA IDENTITY FULL the primary key's. It returns nil
// when the table does not exist.
func (d *decoder) describe(ctx context.Context, schema, name string) (*table, error) {
	var (
		oid                                    uint32
		ident                                  string
		names                                  []string
		typs                                   []uint32
		generated, varl, notNull, idents, keys []bool
	)
	err := d.cat.QueryRow(ctx, describeSQL, schema, name).Scan(&oid, &ident, &names, &typs, &generated, &varl, &notNull, &idents, &keys)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, nil
		}
		return nil, fmt.Errorf("describing table %s.%s: %w", schema, name, err)
	}
	t := &table{rel: &cdc.Relation{ID: oid, Schema: schema, Table: name, ReplicaIdentity: identByte(ident)},
		pos: map[string]int{}, skip: map[string]bool{}, catalog: true}
	for i, n := range names {
		if generated[i] {
			t.skip[n] = true
			continue
		}
		typ, err := d.types.Lookup(ctx, typs[i])
		if err != nil {
			return nil, fmt.Errorf("resolving type %d of column %s.%s.%s: %w", typs[i], schema, name, n, err)
		}
		t.pos[n] = len(t.rel.Columns)
		t.rel.Columns = append(t.rel.Columns, cdc.Column{Name: n, Type: typ.Name, OID: typ.OID, Key: keys[i]})
		t.types = append(t.types, typ)
		t.varlena = append(t.varlena, varl[i])
		t.notNull = append(t.notNull, notNull[i])
		t.ident = append(t.ident, idents[i])
	}
	return t, nil
}

func identByte(s string) byte {
	if len(s) == 1 {
		return s[0]
	}
	return 'd'
}

// fromMessage describes a table by the columns of m: the new row's, else
// the identity's. Key flags, replica identity and column properties come
// from cat (the catalog's description) when the table still exists, else
// from "pk" and the types.
func (d *decoder) fromMessage(ctx context.Context, m *message, cat *table) (*table, error) {
	t := &table{rel: &cdc.Relation{Schema: string(m.Schema), Table: string(m.Table), ReplicaIdentity: 'd'}, pos: map[string]int{}, skip: map[string]bool{}}
	key := map[string]bool{}
	if cat != nil {
		t.rel.ID, t.rel.ReplicaIdentity, t.skip = cat.rel.ID, cat.rel.ReplicaIdentity, cat.skip
		for _, c := range cat.rel.Columns {
			key[c.Name] = c.Key
		}
	} else {
		for _, c := range m.PK {
			key[string(c.Name)] = true
		}
	}
	cols := m.Columns
	if len(cols) == 0 {
		cols = m.Identity
	}
	for _, c := range cols {
		name := string(c.Name)
		if t.skip[name] {
			continue
		}
		var typ *pgtypes.Type
		var err error
		if c.TypeOID != 0 {
			typ, err = d.types.Lookup(ctx, c.TypeOID)
		} else {
			typ, err = d.types.LookupName(ctx, string(c.Type))
		}
		if err != nil {
			return nil, fmt.Errorf("resolving type of column %s: %w", name, err)
		}
		t.pos[name] = len(t.rel.Columns)
		t.rel.Columns = append(t.rel.Columns, cdc.Column{Name: name, Type: typ.Name, OID: typ.OID, Key: key[name]})
		t.types = append(t.types, typ)
		varl, notNull, ident := maybeVarlena(typ), c.notNull(), key[name] || t.rel.ReplicaIdentity == 'f'
		if cat != nil {
			if j, ok := cat.pos[name]; ok && cat.rel.Columns[j].OID == typ.OID {
				varl, notNull, ident = cat.varlena[j], cat.notNull[j], cat.ident[j]
			}
		}
		t.varlena = append(t.varlena, varl)
		t.notNull = append(t.notNull, notNull)
		t.ident = append(t.ident, ident)
	}
	if !t.fitsRow(m.Identity, shapeNone) {
		return nil, fmt.Errorf("identity columns %s are not among the row's columns", names(m.Identity))
	}
	return t, nil
}

// maybeVarlena reports whether a column of type t might hold an unchanged
// TOAST value, when the catalog cannot tell: every type but the fixed-size
// ones this package knows.
func maybeVarlena(t *pgtypes.Type) bool {
	switch t.Kind {
	case pgtypes.Bool, pgtypes.Int, pgtypes.Float, pgtypes.TimestampTZ, pgtypes.Timestamp, pgtypes.Date:
		return false
	}
	return true
}

func names(cols []column) string {
	s := make([]string, len(cols))
	for i, c := range cols {
		s[i] = string(c.Name)
	}
	return strings.Join(s, ", ")
}

// row decodes cols into a row of t's columns; columns not sent hold fill
// (cdc.Unchanged in a new row, cdc.Absent in an old one). It appends to
// lossy the columns whose value wal2json could not express.
func (t *table) row(cols []column, fill any, lossy []string) ([]any, []string, error) {
	row := make([]any, len(t.rel.Columns))
	for i := range row {
		row[i] = fill
	}
	for i := range cols {
		c := &cols[i]
		if t.skip[string(c.Name)] {
			continue
		}
		j := t.pos[string(c.Name)]
		col := &t.rel.Columns[j]
		v, err := decodeValue(t.types[j], col.OID, c.Value)
		if err != nil {
			return nil, lossy, fmt.Errorf("column %s (%s): %w", col.Name, col.Type, err)
		}
		if v == nil && (t.notNull[j] || c.notNull()) && (col.OID == oidFloat4 || col.OID == oidFloat8 || col.OID == oidNumeric) {
			// NaN or ±Infinity: wal2json < 2.6 prints them as null.
			lossy = appendOnce(lossy, col.Name)
		}
		row[j] = v
	}
	return row, lossy, nil
}

func appendOnce(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
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
