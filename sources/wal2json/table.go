// How a table's changes are decoded: its description (relation, column
// types, which columns a message must carry), from the catalog or, when the
// catalog changed since the change was written, from the message itself;
// and the rows it decodes.

package wal2json

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sources/internal/pgtypes"
)

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
