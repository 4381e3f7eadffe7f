package wal2json

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sources/internal/pgrepl"
	"github.com/bridgecdc/bridge/sources/internal/pgtypes"
)

// fakeCatalog answers describeSQL from a map; built-in types need no query.
type fakeCatalog struct {
	tables  map[string]fakeTable
	queries int
}

type fakeTable struct {
	oid                            uint32
	ident                          string
	names                          []string
	typs                           []uint32
	generated, varl, notNull, keys []bool
	identCols                      []bool   // default: keys, or every column with FULL
	pk                             []bool   // default: keys, unless ident is "i"
	printed, bare                  []string // format_type with and without the modifier; default: not known
}

// bareTypes is format_type(oid, -1) of the built-in types the samples use.
var bareTypes = map[uint32]string{16: "boolean", 17: "bytea", 20: "bigint", 23: "integer", 25: "text", 701: "double precision",
	1043: "character varying", 1082: "date", 1184: "timestamp with time zone", 1231: "numeric[]", 1700: "numeric", 3802: "jsonb"}

func (f *fakeCatalog) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	if sql == `SELECT pg_catalog.format_type($1, $2)` {
		if n, ok := bareTypes[args[0].(uint32)]; ok && args[1].(int32) == -1 {
			return fakeRow{format: n}
		}
		return fakeRow{err: fmt.Errorf("format_type(%v, %v) is not faked", args[0], args[1])}
	}
	if sql != describeSQL {
		return fakeRow{err: fmt.Errorf("unexpected query %q", sql)}
	}
	f.queries++
	t, ok := f.tables[args[0].(string)+"."+args[1].(string)]
	if !ok {
		return fakeRow{err: pgx.ErrNoRows}
	}
	return fakeRow{t: t}
}

type fakeRow struct {
	t      fakeTable
	format string
	err    error
}

func (r fakeRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	if r.format != "" {
		*dest[0].(*string) = r.format
		return nil
	}
	*dest[0].(*uint32) = r.t.oid
	*dest[1].(*string) = r.t.ident
	*dest[2].(*[]string) = r.t.names
	*dest[3].(*[]uint32) = r.t.typs
	*dest[4].(*[]bool) = r.t.generated
	*dest[5].(*[]bool) = r.t.varl
	notNull := r.t.notNull
	if notNull == nil {
		notNull = r.t.keys // a primary key's columns are NOT NULL
	}
	*dest[6].(*[]bool) = notNull
	identCols := r.t.identCols
	if identCols == nil {
		identCols = r.t.keys
		if r.t.ident == "f" {
			identCols = make([]bool, len(r.t.names))
			for i := range identCols {
				identCols[i] = true
			}
		}
	}
	*dest[7].(*[]bool) = identCols
	*dest[8].(*[]bool) = r.t.keys
	pks := r.t.pk
	if pks == nil && r.t.ident != "i" {
		pks = r.t.keys
	}
	if pks == nil {
		pks = make([]bool, len(r.t.names))
	}
	*dest[9].(*[]bool) = pks
	*dest[10].(*[]string) = r.t.printed
	*dest[11].(*[]string) = r.t.bare
	return nil
}

// catalog describes the tables of the captured samples (PostgreSQL 15,
// wal2json 2.5).
func catalog() *fakeCatalog {
	return &fakeCatalog{tables: map[string]fakeTable{
		"public.items": {oid: 16400, ident: "d", names: []string{"id", "name", "qty"}, typs: []uint32{23, 25, 23},
			generated: []bool{false, false, false}, varl: []bool{false, true, false}, keys: []bool{true, false, false}},
		"public.nopk": {oid: 16401, ident: "f", names: []string{"a", "b"}, typs: []uint32{23, 25},
			generated: []bool{false, false}, varl: []bool{false, true}, keys: []bool{false, false}},
		"public.docs": {oid: 16402, ident: "d", names: []string{"id", "body", "n"}, typs: []uint32{23, 25, 23},
			generated: []bool{false, false, false}, varl: []bool{false, true, false}, keys: []bool{true, false, false}},
		"public.sp": {oid: 16403, ident: "d", names: []string{"id", "f", "n", "g", "o"}, typs: []uint32{23, 701, 1700, 23, 701},
			generated: []bool{false, false, false, true, false}, varl: []bool{false, false, true, false, false}, keys: []bool{true, false, false, false, false},
			notNull: []bool{true, true, true, false, false}},
		"public.vals": {oid: 16404, ident: "d", names: []string{"id", "i8", "f8", "num", "b", "t", "by", "j", "ts", "arr", "d"},
			typs:      []uint32{23, 20, 701, 1700, 16, 25, 17, 3802, 1184, 1231, 1082},
			generated: make([]bool, 11), varl: make([]bool, 11), keys: []bool{true, false, false, false, false, false, false, false, false, false, false}},
	}}
}

type step struct {
	at   string // walStart
	json string
}

// run decodes steps and returns the transactions they complete.
func run(t *testing.T, d *decoder, steps ...step) []*cdc.Txn {
	t.Helper()
	var out []*cdc.Txn
	for _, s := range steps {
		at, err := cdc.ParseLSN(s.at)
		require.NoError(t, err)
		tx, err := d.Decode(t.Context(), at, []byte(s.json))
		require.NoError(t, err, s.json)
		if tx != nil {
			out = append(out, tx)
		}
	}
	return out
}

func testDecoder(cat *fakeCatalog, prefixes ...string) *decoder {
	return newDecoder("src", prefixes, cat, pgtypes.NewResolver(cat), pgrepl.NewTxnBuffer("", 10000, 64<<20), nil)
}

func lsn(s string) cdc.LSN {
	l, err := cdc.ParseLSN(s)
	if err != nil {
		panic(err)
	}
	return l
}

func TestDecodeTransaction(t *testing.T) {
	d := testDecoder(catalog(), "app")
	txs := run(t, d,
		step{"0/154B0C8", `{"action":"B","xid":736,"timestamp":"2026-12-02 18:42:12.329998+00","lsn":"0/154B238","nextlsn":"0/154B268"}`},
		step{"0/154B0C8", `{"action":"I","xid":736,"timestamp":"2026-12-02 18:42:12.329998+00","lsn":"0/154B0C8","schema":"public","table":"items","columns":[{"name":"id","type":"integer","typeoid":23,"value":1,"optional":false},{"name":"name","type":"text","typeoid":25,"value":"apple","optional":true},{"name":"qty","type":"integer","typeoid":23,"value":1,"optional":true}],"pk":[{"name":"id","type":"integer","typeoid":23}]}`},
		step{"0/154B268", `{"action":"U","xid":736,"lsn":"0/154B268","schema":"public","table":"items","columns":[{"name":"id","type":"integer","typeoid":23,"value":1,"optional":false},{"name":"name","type":"text","typeoid":25,"value":"apple","optional":true},{"name":"qty","type":"integer","typeoid":23,"value":5,"optional":true}],"identity":[{"name":"id","type":"integer","typeoid":23,"value":1}],"pk":[{"name":"id","type":"integer","typeoid":23}]}`},
		step{"0/154B2F0", `{"action":"U","xid":736,"lsn":"0/154B2F0","schema":"public","table":"items","columns":[{"name":"id","type":"integer","typeoid":23,"value":3,"optional":false},{"name":"name","type":"text","typeoid":25,"value":null,"optional":true},{"name":"qty","type":"integer","typeoid":23,"value":2,"optional":true}],"identity":[{"name":"id","type":"integer","typeoid":23,"value":2}],"pk":[{"name":"id","type":"integer","typeoid":23}]}`},
		step{"0/154B3C0", `{"action":"D","xid":736,"lsn":"0/154B3C0","schema":"public","table":"items","identity":[{"name":"id","type":"integer","typeoid":23,"value":1}],"pk":[{"name":"id","type":"integer","typeoid":23}]}`},
		step{"0/154B4F8", `{"action":"M","xid":736,"lsn":"0/154B4F8","transactional":true,"prefix":"app","content":"in-tx"}`},
		step{"0/154B500", `{"action":"M","xid":736,"lsn":"0/154B500","transactional":true,"prefix":"other","content":"filtered"}`},
		step{"0/1553258", `{"action":"T","xid":736,"lsn":"0/1553258","schema":"public","table":"items"}`},
		step{"0/1553258", `{"action":"T","xid":736,"lsn":"0/1553258","schema":"public","table":"nopk"}`},
		// The commit's nextlsn is the identity (here unlike the begin's, to tell them apart).
		step{"0/154B268", `{"action":"C","xid":736,"timestamp":"2026-12-02 18:42:12.329998+00","lsn":"0/154B238","nextlsn":"0/154B270"}`},
	)
	require.Len(t, txs, 1)
	tx := txs[0]
	require.False(t, d.InTxn())
	commit := time.Date(2026, 12, 2, 18, 42, 12, 329998000, time.UTC)
	require.Equal(t, lsn("0/154B270"), tx.CommitLSN)
	require.Equal(t, uint32(736), tx.Xid)
	require.Equal(t, commit, tx.CommitTime)
	require.Len(t, tx.Changes, 7)
	for i, c := range tx.Changes {
		require.Equal(t, "src", c.Source)
		require.Equal(t, tx.CommitLSN, c.CommitLSN)
		require.Equal(t, uint32(i), c.Seq)
		require.Equal(t, uint32(7), c.TxSize)
		require.Equal(t, uint32(736), c.Xid)
		require.Equal(t, commit, c.CommitTime)
		require.Nil(t, c.Headers)
	}
	ins, upd, key, del, msg, tr1, tr2 := tx.Changes[0], tx.Changes[1], tx.Changes[2], tx.Changes[3], tx.Changes[4], tx.Changes[5], tx.Changes[6]

	require.Equal(t, cdc.OpInsert, ins.Op)
	require.Equal(t, lsn("0/154B0C8"), ins.LSN)
	require.Equal(t, "public", ins.Schema)
	require.Equal(t, "items", ins.Table)
	require.Equal(t, &cdc.Relation{ID: 16400, Schema: "public", Table: "items", ReplicaIdentity: 'd', Columns: []cdc.Column{
		{Name: "id", Type: "int4", OID: 23, NotNull: true, Key: true}, {Name: "name", Type: "text", OID: 25}, {Name: "qty", Type: "int4", OID: 23},
	}, Inferred: cdc.InferredIdentity | cdc.InferredColumns}, ins.Rel)
	require.Equal(t, []any{int64(1), "apple", int64(1)}, ins.After)
	require.Nil(t, ins.Before)

	// The relation is shared while it does not change.
	for _, c := range []cdc.Change{upd, key, del, tr1} {
		require.Same(t, ins.Rel, c.Rel)
	}
	// Key unchanged: wal2json's identity comes from the new row; pgoutput sends none.
	require.Equal(t, cdc.OpUpdate, upd.Op)
	require.Nil(t, upd.Before)
	require.Equal(t, []any{int64(1), "apple", int64(5)}, upd.After)
	// Key change: the old key, other columns absent.
	require.Equal(t, []any{int64(2), cdc.Absent, cdc.Absent}, key.Before)
	require.Equal(t, []any{int64(3), nil, int64(2)}, key.After)
	require.Equal(t, cdc.OpDelete, del.Op)
	require.Equal(t, []any{int64(1), cdc.Absent, cdc.Absent}, del.Before)
	require.Nil(t, del.After)

	require.Equal(t, cdc.Change{Source: "src", CommitLSN: tx.CommitLSN, LSN: lsn("0/154B4F8"), Seq: 4, TxSize: 7, Xid: 736, CommitTime: commit,
		Op: cdc.OpMessage, Prefix: "app", Content: []byte("in-tx"), Transactional: true}, msg)

	require.Equal(t, cdc.OpTruncate, tr1.Op)
	require.Equal(t, "items", tr1.Table)
	require.Equal(t, "nopk", tr2.Table)
	require.Equal(t, byte('f'), tr2.Rel.ReplicaIdentity)
	require.False(t, tr2.Cascade || tr2.RestartIdentity)
}

func TestDecodeRows(t *testing.T) {
	cat := catalog()
	d := testDecoder(cat)
	begin := step{"0/1", `{"action":"B","xid":7,"timestamp":"2024-01-01 00:00:00+00","lsn":"0/1","nextlsn":"0/100"}`}
	commit := step{"0/100", `{"action":"C","xid":7,"lsn":"0/1","nextlsn":"0/100"}`}
	txs := run(t, d, begin,
		// TOAST: the unchanged body is left out of the update.
		step{"0/2", `{"action":"U","lsn":"0/2","schema":"public","table":"docs","columns":[{"name":"id","type":"integer","typeoid":23,"value":1,"optional":false},{"name":"n","type":"integer","typeoid":23,"value":1,"optional":true}],"identity":[{"name":"id","type":"integer","typeoid":23,"value":1}],"pk":[{"name":"id","type":"integer","typeoid":23}]}`},
		// REPLICA IDENTITY FULL without a key: whole old rows, nulls included.
		step{"0/3", `{"action":"U","lsn":"0/3","schema":"public","table":"nopk","columns":[{"name":"a","type":"integer","typeoid":23,"value":1,"optional":true},{"name":"b","type":"text","typeoid":25,"value":"x","optional":true}],"identity":[{"name":"a","type":"integer","typeoid":23,"value":1},{"name":"b","type":"text","typeoid":25,"value":null}],"pk":[]}`},
		step{"0/4", `{"action":"D","lsn":"0/4","schema":"public","table":"nopk","identity":[{"name":"a","type":"integer","typeoid":23,"value":1},{"name":"b","type":"text","typeoid":25,"value":"x"}],"pk":[]}`},
		// NaN in NOT NULL columns (f, n) is flagged; null in a nullable one (o) is not; the generated column g is left out.
		step{"0/5", `{"action":"I","lsn":"0/5","schema":"public","table":"sp","columns":[{"name":"id","type":"integer","typeoid":23,"value":1,"optional":false},{"name":"f","type":"double precision","typeoid":701,"value":null,"optional":false},{"name":"n","type":"numeric","typeoid":1700,"value":null,"optional":false},{"name":"g","type":"integer","typeoid":23,"value":2,"optional":true},{"name":"o","type":"double precision","typeoid":701,"value":null,"optional":true}],"pk":[{"name":"id","type":"integer","typeoid":23}]}`},
		// wal2json 2.6 with numeric-data-types-as-string: exact.
		step{"0/6", `{"action":"I","lsn":"0/6","schema":"public","table":"sp","columns":[{"name":"id","type":"integer","typeoid":23,"value":"2","optional":false},{"name":"f","type":"double precision","typeoid":701,"value":"NaN","optional":false},{"name":"n","type":"numeric","typeoid":1700,"value":"-Infinity","optional":false},{"name":"g","type":"integer","typeoid":23,"value":"4","optional":true},{"name":"o","type":"double precision","typeoid":701,"value":"Infinity","optional":true}],"pk":[{"name":"id","type":"integer","typeoid":23}]}`},
		// Values: exact numbers, bytea without its \x, escapes, JSON, time, arrays.
		step{"0/7", `{"action":"I","lsn":"0/7","schema":"public","table":"vals","columns":[` +
			`{"name":"id","typeoid":23,"value":1},{"name":"i8","typeoid":20,"value":9223372036854775807},{"name":"f8","typeoid":701,"value":3.141592653589793},` +
			`{"name":"num","typeoid":1700,"value":123456789012345678901234567890.1234567890},{"name":"b","typeoid":16,"value":true},` +
			`{"name":"t","typeoid":25,"value":"h\u00e9llo \"w\" \\ \ud83d\ude80 \nline\u0001"},{"name":"by","typeoid":17,"value":"00ff10"},` +
			`{"name":"j","typeoid":3802,"value":"{\"n\": 1.0, \"z\": {\"y\": \"\u00fc\"}}"},{"name":"ts","typeoid":1184,"value":"2024-02-29 11:14:15.123456+00"},` +
			`{"name":"arr","typeoid":1231,"value":"{1.10,NaN,-2}"},{"name":"d","typeoid":1082,"value":"infinity"}]}`},
		commit,
	)
	require.Len(t, txs, 1)
	cs := txs[0].Changes
	require.Len(t, cs, 6)

	require.Equal(t, []any{int64(1), cdc.Unchanged, int64(1)}, cs[0].After)
	require.Nil(t, cs[0].Before)

	require.Equal(t, []any{int64(1), nil}, cs[1].Before)
	require.Equal(t, []any{int64(1), "x"}, cs[1].After)
	require.Equal(t, []any{int64(1), "x"}, cs[2].Before)
	require.False(t, cs[2].Rel.Columns[0].Key || cs[2].Rel.Columns[1].Key, "FULL without a primary key: no key columns")

	require.Equal(t, []string{"id", "f", "n", "o"}, colNames(cs[3].Rel))
	require.Equal(t, []any{int64(1), nil, nil, nil}, cs[3].After)
	require.Equal(t, map[string]string{HeaderLossy: "f,n"}, cs[3].Headers)
	require.Nil(t, cs[4].Headers)
	require.Equal(t, int64(2), cs[4].After[0])
	require.True(t, isNaN(cs[4].After[1]))
	require.Equal(t, cdc.Numeric("-Infinity"), cs[4].After[2])

	v := cs[5].After
	require.Equal(t, int64(9223372036854775807), v[1])
	require.Equal(t, 3.141592653589793, v[2])
	require.Equal(t, cdc.Numeric("123456789012345678901234567890.1234567890"), v[3])
	require.Equal(t, true, v[4])
	require.Equal(t, "héllo \"w\" \\ 🚀 \nline\x01", v[5])
	require.Equal(t, []byte{0, 0xff, 0x10}, v[6])
	require.Equal(t, cdc.RawJSON(`{"n": 1.0, "z": {"y": "ü"}}`), v[7])
	require.Equal(t, time.Date(2024, 2, 29, 11, 14, 15, 123456000, time.UTC), v[8])
	require.Equal(t, []any{cdc.Numeric("1.10"), cdc.Numeric("NaN"), cdc.Numeric("-2")}, v[9])
	require.Equal(t, cdc.Infinity(1), v[10])
	require.Equal(t, 4, cat.queries, "one catalog query per table")
}

func TestDecodeMessages(t *testing.T) {
	d := testDecoder(catalog(), "app")
	txs := run(t, d,
		step{"0/154B568", `{"action":"M","xid":null,"timestamp":null,"lsn":"0/154B568","transactional":false,"prefix":"app","content":"outside"}`},
		step{"0/154B5A0", `{"action":"M","xid":null,"timestamp":null,"lsn":"0/154B5A0","transactional":false,"prefix":"other","content":"dropped"}`},
		// wal2json copies bytes that are not UTF-8 verbatim.
		step{"0/154B5A8", "{\"action\":\"M\",\"xid\":null,\"timestamp\":null,\"lsn\":\"0/154B5A8\",\"transactional\":false,\"prefix\":\"app\",\"content\":\"\xff\\u0001\xfe\"}"},
		// A transaction whose only content is filtered out emits nothing.
		step{"0/2000000", `{"action":"B","xid":9,"timestamp":"2024-01-01 00:00:00+00","lsn":"0/2000010","nextlsn":"0/2000020"}`},
		step{"0/2000000", `{"action":"M","xid":9,"lsn":"0/2000000","transactional":true,"prefix":"other","content":"x"}`},
		step{"0/2000020", `{"action":"C","xid":9,"lsn":"0/2000010","nextlsn":"0/2000020"}`},
	)
	require.Len(t, txs, 2)
	require.Equal(t, &cdc.Txn{CommitLSN: lsn("0/154B569"), Changes: []cdc.Change{{Source: "src", CommitLSN: lsn("0/154B569"), LSN: lsn("0/154B568"),
		TxSize: 1, Op: cdc.OpMessage, Prefix: "app", Content: []byte("outside")}}}, txs[0])
	require.Equal(t, []byte{0xff, 0x01, 0xfe}, txs[1].Changes[0].Content)
	require.Equal(t, lsn("0/154B5A9"), txs[1].CommitLSN)
}

func TestDecodeFollowsTheCatalog(t *testing.T) {
	cat := catalog()
	d := testDecoder(cat)
	begin := `{"action":"B","xid":7,"timestamp":"2024-01-01 00:00:00+00","lsn":"0/1","nextlsn":"0/100"}`
	commit := `{"action":"C","xid":7,"lsn":"0/1","nextlsn":"0/100"}`
	ins := func(cols string) string {
		return `{"action":"I","lsn":"0/2","schema":"public","table":"items","columns":[` + cols + `]}`
	}
	base := `{"name":"id","typeoid":23,"value":1},{"name":"name","typeoid":25,"value":"a"},{"name":"qty","typeoid":23,"value":1}`
	first := run(t, d, step{"0/1", begin}, step{"0/2", ins(base)}, step{"0/100", commit})[0].Changes[0]
	require.Equal(t, 1, cat.queries)

	// ALTER TABLE ... REPLICA IDENTITY FULL: an identity wider than the
	// key makes the source read the catalog again.
	tb := cat.tables["public.items"]
	tb.ident = "f"
	cat.tables["public.items"] = tb
	upd := run(t, d, step{"0/1", begin},
		step{"0/3", `{"action":"U","lsn":"0/3","schema":"public","table":"items","columns":[` + base + `],"identity":[` + base + `]}`},
		step{"0/100", commit})[0].Changes[0]
	require.Equal(t, 2, cat.queries)
	require.NotSame(t, first.Rel, upd.Rel)
	require.Equal(t, byte('f'), upd.Rel.ReplicaIdentity)
	require.Equal(t, []bool{true, false, false}, []bool{upd.Rel.Columns[0].Key, upd.Rel.Columns[1].Key, upd.Rel.Columns[2].Key}, "FULL: the primary key is the key")
	require.Equal(t, []any{int64(1), "a", int64(1)}, upd.Before, "FULL: the old row even though it equals the new one")

	// A column the catalog does not know (dropped since the change was
	// written): the change describes the table itself.
	extra := run(t, d, step{"0/1", begin}, step{"0/4", ins(base + `,{"name":"gone","typeoid":25,"value":"g"}`)}, step{"0/100", commit})[0].Changes[0]
	require.Equal(t, []string{"id", "name", "qty", "gone"}, colNames(extra.Rel))
	require.Equal(t, []any{int64(1), "a", int64(1), "g"}, extra.After)
	require.Equal(t, 3, cat.queries)
	// That description serves the next changes, unchanged TOAST included.
	toast := run(t, d, step{"0/1", begin},
		step{"0/4", `{"action":"U","lsn":"0/4","schema":"public","table":"items","columns":[{"name":"id","typeoid":23,"value":1},{"name":"qty","typeoid":23,"value":2},{"name":"gone","typeoid":25,"value":"g"}],"identity":[{"name":"id","typeoid":23,"value":1}]}`},
		step{"0/100", commit})[0].Changes[0]
	require.Same(t, extra.Rel, toast.Rel)
	require.Equal(t, []any{int64(1), cdc.Unchanged, int64(2), "g"}, toast.After)
	require.Equal(t, 3, cat.queries)
	// And a table the catalog no longer has at all: keys from "pk".
	gone := run(t, d, step{"0/1", begin},
		step{"0/5", `{"action":"I","lsn":"0/5","schema":"public","table":"dropped","columns":[{"name":"k","type":"text","typeoid":25,"value":"x"}],"pk":[{"name":"k","type":"text","typeoid":25}]}`},
		step{"0/100", commit})[0].Changes[0]
	require.Equal(t, []cdc.Column{{Name: "k", Type: "text", OID: 25, Key: true}}, gone.Rel.Columns)
}

func TestLossyOldRow(t *testing.T) {
	cat := catalog()
	cat.tables["public.spfull"] = fakeTable{oid: 16405, ident: "f", names: []string{"id", "f"}, typs: []uint32{23, 701},
		generated: []bool{false, false}, varl: []bool{false, false}, notNull: []bool{true, true}, keys: []bool{true, false}}
	d := testDecoder(cat)
	c := run(t, d, step{"0/1", `{"action":"B","xid":7,"timestamp":"2024-01-01 00:00:00+00","lsn":"0/1","nextlsn":"0/100"}`},
		step{"0/2", `{"action":"U","lsn":"0/2","schema":"public","table":"spfull","columns":[{"name":"id","typeoid":23,"value":2,"optional":false},{"name":"f","typeoid":701,"value":1.5,"optional":false}],"identity":[{"name":"id","typeoid":23,"value":1},{"name":"f","typeoid":701,"value":null}]}`},
		step{"0/100", `{"action":"C","xid":7,"lsn":"0/1","nextlsn":"0/100"}`})[0].Changes[0]
	require.Equal(t, []any{int64(1), nil}, c.Before)
	require.Equal(t, []any{int64(2), 1.5}, c.After)
	require.Equal(t, map[string]string{HeaderLossy: "f"}, c.Headers)
}

func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []string
		want  string
	}{
		{"not JSON", []string{`{"action":`}, "parsing wal2json output"},
		{"format version 1", []string{`{"change":[]}`}, `unknown wal2json action ""`},
		{"commit without begin", []string{`{"action":"C","nextlsn":"0/10"}`}, "without begin"},
		{"no nextlsn", []string{`{"action":"B","xid":1}`, `{"action":"M","transactional":true,"prefix":"app","content":"x"}`, `{"action":"C"}`}, "without nextlsn"},
		{"bad value", []string{`{"action":"B","xid":1,"nextlsn":"0/10"}`,
			`{"action":"I","lsn":"0/5","schema":"public","table":"items","columns":[{"name":"id","typeoid":23,"value":"x1"},{"name":"name","typeoid":25,"value":"a"},{"name":"qty","typeoid":23,"value":1}]}`},
			`insert into public.items at 0/5: column id (int4): decoding int4 value "x1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := testDecoder(catalog(), "app")
			var err error
			for _, s := range tc.steps {
				if _, err = d.Decode(t.Context(), 1, []byte(s)); err != nil {
					break
				}
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestUnquote(t *testing.T) {
	for in, want := range map[string]string{
		`""`:                    "",
		`"plain"`:               "plain",
		`"a\"b\\c\/d"`:          `a"b\c/d`,
		`"\b\f\n\r\t"`:          "\b\f\n\r\t",
		`"\u00e9\u0000"`:        "é\x00",
		`"\ud83d\ude80"`:        "🚀",
		`"\ud83d x"`:            "\uFFFD x",
		`"\ud83d\u0041"`:        "\uFFFDA",
		"\"raw \xff bytes\\n\"": "raw \xff bytes\n",
	} {
		got, err := unquote([]byte(in))
		require.NoError(t, err, in)
		require.Equal(t, want, string(got), in)
	}
	for _, bad := range []string{`"`, `x`, `"\q"`, `"\u12"`, `"\`, `"abc\"`} {
		_, err := unquote([]byte(bad))
		require.Error(t, err, bad)
	}
}

func colNames(r *cdc.Relation) []string {
	var s []string
	for _, c := range r.Columns {
		s = append(s, c.Name)
	}
	return s
}

func isNaN(v any) bool {
	f, ok := v.(float64)
	return ok && f != f
}

func TestDecodeSpillsLargeTransactions(t *testing.T) {
	cat := catalog()
	d := newDecoder("src", nil, cat, pgtypes.NewResolver(cat), pgrepl.NewTxnBuffer(t.TempDir(), 2, 1<<20), nil)
	steps := []step{{"0/1", `{"action":"B","xid":7,"timestamp":"2024-01-01 00:00:00+00","lsn":"0/1","nextlsn":"0/100"}`}}
	for i := 1; i <= 4; i++ {
		steps = append(steps, step{"0/2", fmt.Sprintf(`{"action":"I","lsn":"0/%d","schema":"public","table":"sp","columns":[{"name":"id","typeoid":23,"value":%d},{"name":"f","typeoid":701,"value":null,"optional":false},{"name":"n","typeoid":1700,"value":1.5,"optional":false},{"name":"o","typeoid":701,"value":null,"optional":true}]}`, i+1, i)})
	}
	steps = append(steps, step{"0/3", `{"action":"U","lsn":"0/9","schema":"public","table":"docs","columns":[{"name":"id","typeoid":23,"value":1},{"name":"n","typeoid":23,"value":1}],"identity":[{"name":"id","typeoid":23,"value":1}]}`},
		step{"0/100", `{"action":"C","xid":7,"lsn":"0/1","nextlsn":"0/100"}`})
	txs := run(t, d, steps...)
	require.Len(t, txs, 1)
	tx := txs[0]
	require.Len(t, tx.Changes, 2)
	require.NotNil(t, tx.Rest)
	defer tx.Rest.Close()
	rest := make([]cdc.Change, 10)
	n, err := tx.Rest.Next(rest)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	all := append(tx.Changes, rest[:n]...)
	for i, c := range all {
		require.Equal(t, uint32(i), c.Seq)
		require.Equal(t, uint32(5), c.TxSize)
		require.Equal(t, lsn("0/100"), c.CommitLSN)
	}
	require.Equal(t, map[string]string{HeaderLossy: "f"}, all[3].Headers)
	require.Equal(t, []any{int64(4), nil, cdc.Numeric("1.5"), nil}, all[3].After)
	require.Equal(t, []any{int64(1), cdc.Unchanged, int64(1)}, all[4].After)
	require.Same(t, all[0].Rel, all[3].Rel)
}
