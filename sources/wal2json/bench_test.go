package wal2json

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// benchCatalog describes the benchmark's table (bench/pg.go).
func benchCatalog() *fakeCatalog {
	return &fakeCatalog{tables: map[string]fakeTable{
		"public.bench": {oid: 16384, ident: "d", names: []string{"id", "n", "pad"}, typs: []uint32{20, 23, 25},
			generated: []bool{false, false, false}, varl: []bool{false, false, true}, notNull: []bool{true, true, true}, keys: []bool{true, false, false}},
	}}
}

// benchInsert is what wal2json 2.5 sends for one row of the benchmark's
// table with the source's options and the benchmark's 16-byte pad.
func benchInsert(id int) []byte {
	return fmt.Appendf(nil, `{"action":"I","xid":%d,"timestamp":"2026-12-02 18:42:12.329998+00","lsn":"0/154B0C8","schema":"public","table":"bench","columns":[{"name":"id","type":"bigint","typeoid":20,"value":%d,"optional":false},{"name":"n","type":"integer","typeoid":23,"value":%d,"optional":false},{"name":"pad","type":"text","typeoid":25,"value":"%s","optional":false}],"pk":[{"name":"id","type":"bigint","typeoid":20}]}`,
		736, id, id, strings.Repeat("x", 16))
}

// BenchmarkDecodeInsert decodes inserts as a large transaction sends them
// (a commit every 100 changes keeps the transaction buffer out of it).
func BenchmarkDecodeInsert(b *testing.B) {
	d := testDecoder(benchCatalog())
	ctx := context.Background()
	begin := []byte(`{"action":"B","xid":736,"timestamp":"2026-12-02 18:42:12.329998+00","lsn":"0/154B238","nextlsn":"0/154B268"}`)
	commit := []byte(`{"action":"C","xid":736,"timestamp":"2026-12-02 18:42:12.329998+00","lsn":"0/154B238","nextlsn":"0/154B270"}`)
	ins := benchInsert(123456)
	if _, err := d.Decode(ctx, 1, begin); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(ins)))
	n := 0
	for b.Loop() {
		if _, err := d.Decode(ctx, 1, ins); err != nil {
			b.Fatal(err)
		}
		if n++; n%100 == 0 {
			if _, err := d.Decode(ctx, 1, commit); err != nil {
				b.Fatal(err)
			}
			if _, err := d.Decode(ctx, 1, begin); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkDecodeTxn decodes single-row transactions (begin, insert,
// commit), as the single-row backlog sends them.
func BenchmarkDecodeTxn(b *testing.B) {
	d := testDecoder(benchCatalog())
	ctx := context.Background()
	msgs := [][]byte{
		[]byte(`{"action":"B","xid":736,"timestamp":"2026-12-02 18:42:12.329998+00","lsn":"0/154B238","nextlsn":"0/154B268"}`),
		benchInsert(123456),
		[]byte(`{"action":"C","xid":736,"timestamp":"2026-12-02 18:42:12.329998+00","lsn":"0/154B238","nextlsn":"0/154B270"}`),
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, m := range msgs {
			if _, err := d.Decode(ctx, 1, m); err != nil {
				b.Fatal(err)
			}
		}
	}
}
