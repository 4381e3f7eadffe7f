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
	printed []string        // the type as wal2json prints it (format_type with the column's modifier); "" when not known
	varlena []bool          // may hold an unchanged TOAST value
	notNull []bool          // NOT NULL: a null float or numeric is a lost NaN or ±Infinity
	ident   []bool          // part of the replica identity (every column with FULL)
	pk      []bool          // part of the primary key, as "pk" lists them
	nident  int             // how many columns ident marks
	npk     int             // how many columns pk marks
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

// fits reports whether m's columns, identity and primary key can be
// decoded with t, and agree with it on what wal2json says of them as of
// the change (the historic catalog it decodes with): names, type OIDs,
// types with their modifiers, NOT NULL ("optional") and the primary key
// ("pk"). So a description read from a catalog that has moved on since
// the change does not serve it.
func (t *table) fits(m *message, sh shape) bool {
	if sh != shapeNone && !t.fitsRow(m.Columns, sh) {
		return false
	}
	if !t.fitsRow(m.Identity, shapeNone) {
		return false
	}
	return !m.HasPK || t.pkFits(m.PK)
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
		if len(c.Type) > 0 && t.printed[j] != "" && string(c.Type) != t.printed[j] {
			return false // the modifier changed: varchar(20) → varchar(40)
		}
		if c.HasOpt && c.Opt == t.notNull[j] {
			return false // NOT NULL set or dropped
		}
		last = j
	}
	return !gap(last+1, len(t.rel.Columns))
}

// pkFits reports whether pk, a message's "pk", names t's primary key.
func (t *table) pkFits(pk []column) bool {
	n := 0
	for i := range pk {
		if t.skip[string(pk[i].Name)] {
			continue
		}
		j, ok := t.pos[string(pk[i].Name)]
		if !ok || !t.pk[j] {
			return false
		}
		n++
	}
	return n == t.npk
}

// identFits reports whether an identity agrees with t's replica identity:
// only identity columns, every column for REPLICA IDENTITY FULL, and
// every identity column otherwise, but those an update may leave out as
// unchanged TOAST.
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
	if t.rel.ReplicaIdentity == 'f' {
		return n == len(t.rel.Columns)
	}
	if n == t.nident {
		return true
	}
	for j := range t.ident {
		if t.ident[j] && !t.varlena[j] && !hasColumn(identity, t.rel.Columns[j].Name) {
			return false
		}
	}
	return true
}

func hasColumn(cols []column, name string) bool {
	for i := range cols {
		if string(cols[i].Name) == name {
			return true
		}
	}
	return false
}

// inferred is what of a description of a table with replica identity
// ident the WAL does not say: the replica identity itself; the key unless
// it is the primary key (REPLICA IDENTITY DEFAULT or FULL), which every
// change's "pk" confirms; and the columns a change does not carry (a
// delete's, an unchanged TOAST value's), whose description comes from the
// catalog or an earlier change.
func inferred(ident byte) cdc.Inferred {
	in := cdc.InferredIdentity | cdc.InferredColumns
	if ident != 'd' && ident != 'f' {
		in |= cdc.InferredKey
	}
	return in
}

// table returns the description that decodes m: the cached one, else the
// catalog's, else (the catalog changed since the change was written) one
// made from m itself.
func (d *decoder) table(ctx context.Context, m *message, sh shape) (*table, error) {
	t := d.last
	if t == nil || string(m.Schema) != t.rel.Schema || string(m.Table) != t.rel.Table {
		t = d.tables[tableName{string(m.Schema), string(m.Table)}]
	}
	// A description made from a change keeps what that change said of the
	// replica identity: later ones are not checked against it.
	if t != nil && t.fits(m, sh) && (len(m.Identity) == 0 || !t.catalog || t.identFits(m.Identity)) {
		d.last = t
		return t, nil
	}
	key := tableName{string(m.Schema), string(m.Table)}
	ct, err := d.describe(ctx, key.schema, key.table)
	if err != nil {
		return nil, err
	}
	if ct != nil && ct.fits(m, sh) && (len(m.Identity) == 0 || ct.identFits(m.Identity)) {
		d.tables[key], d.last = ct, ct
		return ct, nil
	}
	mt, err := d.fromMessage(ctx, m, sh, ct, t)
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
		AND CASE c.relreplident WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident WHEN 'f' THEN i.indisprimary ELSE false END) ORDER BY a.attnum),
	array_agg(EXISTS (SELECT 1 FROM pg_catalog.pg_index i
		WHERE i.indrelid = c.oid AND a.attnum = ANY (i.indkey) AND i.indisprimary) ORDER BY a.attnum),
	array_agg(pg_catalog.format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum),
	array_agg(pg_catalog.format_type(a.atttypid, -1) ORDER BY a.attnum)
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE n.nspname = $1 AND c.relname = $2
GROUP BY c.oid, c.relreplident`

// describe reads a table's description from the catalog: its columns
// (generated ones left out, as pgoutput does), their types with their
// modifiers, NOT NULL, which are part of the replica identity (all of
// them with REPLICA IDENTITY FULL), which form the primary key, and which
// are key columns, as the pgoutput source flags them: the replica
// identity index's, or with REPLICA IDENTITY DEFAULT or FULL the primary
// key's. It returns nil when the table does not exist.
func (d *decoder) describe(ctx context.Context, schema, name string) (*table, error) {
	var (
		oid                                         uint32
		ident                                       string
		names, printed, bare                        []string
		typs                                        []uint32
		generated, varl, notNull, idents, keys, pks []bool
	)
	err := d.cat.QueryRow(ctx, describeSQL, schema, name).Scan(&oid, &ident, &names, &typs, &generated, &varl, &notNull, &idents, &keys, &pks, &printed, &bare)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, nil
		}
		return nil, fmt.Errorf("describing table %s.%s: %w", schema, name, err)
	}
	id := identByte(ident)
	t := &table{rel: &cdc.Relation{ID: oid, Schema: schema, Table: name, ReplicaIdentity: id, Inferred: inferred(id)},
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
		var pr, decl string
		if i < len(printed) {
			pr = printed[i]
			if i < len(bare) && pr != bare[i] {
				decl = pr
			}
		}
		t.pos[n] = len(t.rel.Columns)
		t.rel.Columns = append(t.rel.Columns, cdc.Column{Name: n, Type: typ.Name, OID: typ.OID, Declared: decl, NotNull: notNull[i], Key: keys[i]})
		t.types = append(t.types, typ)
		t.printed = append(t.printed, pr)
		t.varlena = append(t.varlena, varl[i])
		t.notNull = append(t.notNull, notNull[i])
		t.ident = append(t.ident, idents[i])
		pk := i < len(pks) && pks[i]
		t.pk = append(t.pk, pk)
		if idents[i] {
			t.nident++
		}
		if pk {
			t.npk++
		}
	}
	return t, nil
}

func identByte(s string) byte {
	if len(s) == 1 {
		return s[0]
	}
	return 'd'
}

// fromMessage describes a table by m: its columns, those of the new row,
// else of the identity, with their types (modifiers included) and NOT
// NULL as wal2json prints them; the primary key from "pk"; the replica
// identity's columns from the identity when m has one. The replica
// identity, and what m does not say, come from cat (the catalog's
// description) when the table still exists. The columns an update (sh)
// leaves out as unchanged TOAST come from prev, the description of the
// table's change before (it held them), else from cat: their columns that
// may hold one and that m lacks, in their order.
func (d *decoder) fromMessage(ctx context.Context, m *message, sh shape, cat, prev *table) (*table, error) {
	t := &table{rel: &cdc.Relation{Schema: string(m.Schema), Table: string(m.Table), ReplicaIdentity: 'd'}, pos: map[string]int{}, skip: map[string]bool{}}
	catCol := func(name string, oid uint32) (int, bool) {
		if cat == nil {
			return 0, false
		}
		j, ok := cat.pos[name]
		return j, ok && cat.rel.Columns[j].OID == oid
	}
	if cat != nil {
		t.rel.ID, t.rel.ReplicaIdentity, t.skip = cat.rel.ID, cat.rel.ReplicaIdentity, cat.skip
	}
	pk := map[string]bool{}
	if m.HasPK || cat == nil {
		for _, c := range m.PK {
			pk[string(c.Name)] = true
		}
	} else {
		for j, c := range cat.rel.Columns {
			pk[c.Name] = cat.pk[j]
		}
	}
	inIdent := map[string]bool{}
	for _, c := range m.Identity {
		inIdent[string(c.Name)] = true
	}
	ri := t.rel.ReplicaIdentity
	cols := m.Columns
	t.rel.Inferred = inferred(ri)
	if len(cols) == 0 {
		cols = m.Identity
	}
	inMsg := map[string]bool{}
	for _, c := range cols {
		inMsg[string(c.Name)] = true
	}
	toast := prev // where the columns left out as unchanged TOAST are described
	if toast == nil {
		toast = cat
	}
	next := 0 // toast's next column not placed yet
	fromCat := func(upTo int) {
		if sh != shapeUpdate || toast == nil {
			return
		}
		for ; next < upTo; next++ {
			cc := toast.rel.Columns[next]
			if inMsg[cc.Name] || !toast.varlena[next] {
				continue
			}
			t.pos[cc.Name] = len(t.rel.Columns)
			cc.Key = cc.Key && ri != 'i' || ri == 'i' && toast.ident[next]
			t.rel.Columns = append(t.rel.Columns, cc)
			t.types = append(t.types, toast.types[next])
			t.printed = append(t.printed, toast.printed[next])
			t.varlena = append(t.varlena, true)
			t.notNull = append(t.notNull, toast.notNull[next])
			t.ident = append(t.ident, toast.ident[next])
			t.pk = append(t.pk, pk[cc.Name])
			if toast.ident[next] {
				t.nident++
			}
			if pk[cc.Name] {
				t.npk++
			}
		}
	}
	for _, c := range cols {
		name := string(c.Name)
		if t.skip[name] {
			continue
		}
		if toast != nil {
			if j, ok := toast.pos[name]; ok && j >= next {
				fromCat(j)
				next = j + 1
			}
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
		var decl string
		if len(c.Type) > 0 {
			if decl, err = d.types.Declared(ctx, typ.OID, string(c.Type)); err != nil {
				return nil, fmt.Errorf("formatting the type of column %s: %w", name, err)
			}
		}
		varl, notNull := maybeVarlena(typ), c.notNull()
		var ident bool
		switch {
		case ri == 'f':
			ident = true
		case len(m.Identity) > 0:
			ident = inIdent[name]
		default:
			ident = pk[name]
			if j, ok := catCol(name, typ.OID); ok {
				ident = cat.ident[j]
			}
		}
		if j, ok := catCol(name, typ.OID); ok {
			varl = cat.varlena[j]
			if !c.HasOpt {
				notNull = cat.notNull[j]
			}
		}
		key := false
		switch ri {
		case 'd', 'f':
			key = pk[name]
		case 'i':
			key = ident
		}
		t.pos[name] = len(t.rel.Columns)
		t.rel.Columns = append(t.rel.Columns, cdc.Column{Name: name, Type: typ.Name, OID: typ.OID, Declared: decl, NotNull: notNull, Key: key})
		t.types = append(t.types, typ)
		t.printed = append(t.printed, string(c.Type))
		t.varlena = append(t.varlena, varl)
		t.notNull = append(t.notNull, notNull)
		t.ident = append(t.ident, ident)
		t.pk = append(t.pk, pk[name])
		if ident {
			t.nident++
		}
		if pk[name] {
			t.npk++
		}
	}
	if toast != nil {
		fromCat(len(toast.rel.Columns))
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
