package e2e_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// parityConfig writes a bridge.yaml with two sources on the same database,
// "pg" (pgoutput) and "wj" (wal2json), each routed to its own stream:
// CDC_<name>_pg and CDC_<name>_wj. It starts from env.config's file, so it
// keeps whatever the harness sets there.
func (e *env) parityConfig(name string) string {
	e.t.Helper()
	p := e.config(name, "")
	raw, err := os.ReadFile(p)
	require.NoError(e.t, err)
	var y map[string]any
	require.NoError(e.t, yaml.Unmarshal(raw, &y))
	srcs, sinks := y["sources"].(map[string]any), y["sinks"].(map[string]any)
	app, js := srcs["app"].(map[string]any), sinks["js"].(map[string]any)
	delete(srcs, "app")
	delete(sinks, "js")
	var routes []any
	for _, s := range []struct{ name, typ string }{{"pg", "pgoutput"}, {"wj", "wal2json"}} {
		cfg := maps.Clone(app["config"].(map[string]any))
		cfg["slot"] = fmt.Sprintf("slot_%s_%s", name, s.name)
		srcs[s.name] = map[string]any{"type": s.typ, "config": cfg}
		sk := maps.Clone(js)
		skc := maps.Clone(js["config"].(map[string]any))
		skc["stream"] = fmt.Sprintf("CDC_%s_%s", name, s.name)
		skc["subjects"] = []any{fmt.Sprintf("cdc.%s.%s.>", name, s.name)}
		sk["config"] = skc
		sinks[s.name] = sk
		routes = append(routes, map[string]any{
			"match":   map[string]any{"sources": []any{s.name}},
			"sinks":   []any{s.name},
			"subject": fmt.Sprintf("cdc.%s.{{.Source}}.{{.Schema}}.{{.Table}}", name),
		})
	}
	y["routes"] = routes
	out, err := yaml.Marshal(y)
	require.NoError(e.t, err)
	require.NoError(e.t, os.WriteFile(p, out, 0o644))
	return p
}

const parityDDL = `
CREATE TABLE items (id int PRIMARY KEY, name text, qty int);
CREATE TABLE nopk (a int, b text);
ALTER TABLE nopk REPLICA IDENTITY FULL;
CREATE TABLE fullpk (id int PRIMARY KEY, v text, n numeric, big text);
ALTER TABLE fullpk REPLICA IDENTITY FULL;
ALTER TABLE fullpk ALTER big SET STORAGE EXTERNAL;
CREATE TABLE docs (id int PRIMARY KEY, body text, n int);
ALTER TABLE docs ALTER body SET STORAGE EXTERNAL;
CREATE TABLE special (id int PRIMARY KEY, f float8 NOT NULL, n numeric NOT NULL, r float4 NOT NULL);
ALTER TABLE special REPLICA IDENTITY FULL;
CREATE TABLE gen (id int PRIMARY KEY, a int, b int GENERATED ALWAYS AS (a * 2) STORED);
CREATE TABLE seqd (id serial PRIMARY KEY, v text)`

// TestParityPgoutputWal2json captures one workload through pgoutput and
// wal2json and compares the two streams message by message: same
// positions (commit LSN, ordinal), same headers, same payload but for the
// producer and source names, except the differences wal2json forces (see
// sources/wal2json), which are asserted explicitly. It runs on PostgreSQL
// 15 only: wal2json exists only there (Debian's postgresql-15-wal2json; the
// npm builds of 16 to 18 that the version matrix uses have none).
func TestParityPgoutputWal2json(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, zooDDL, parityDDL)
	r := e.start(e.parityConfig("par"))
	waitReady(t, r)

	big := randText(20000)
	work := append(append([]string{}, zooRows...),
		`UPDATE zoo SET c_text = 'changed', c_int4 = NULL WHERE id = 1`,
		`INSERT INTO items VALUES (1, 'äpfel 🍎 "quoted" \ back'||chr(9)||'tab', 1), (2, NULL, NULL)`,
		`UPDATE items SET qty = 5 WHERE id = 1`,
		`UPDATE items SET id = 3 WHERE id = 2`,
		`DELETE FROM items WHERE id = 1`,
		`BEGIN; INSERT INTO items VALUES (4, 'fig', 4); SELECT pg_logical_emit_message(true, 'app', 'in-tx'); SELECT pg_logical_emit_message(true, 'other', 'filtered'); UPDATE items SET name = 'figs' WHERE id = 4; COMMIT`,
		`SELECT pg_logical_emit_message(false, 'app', 'outside ✓')`,
		`BEGIN; INSERT INTO items VALUES (9, 'x', 9); SELECT pg_logical_emit_message(false, 'app', 'non-tx inside'); COMMIT`,
		`INSERT INTO nopk VALUES (1, NULL), (2, 'two')`,
		`UPDATE nopk SET b = 'one' WHERE a = 1`,
		`DELETE FROM nopk WHERE a = 2`,
		fmt.Sprintf(`INSERT INTO fullpk VALUES (1, 'v', 1.50, '%s')`, big),
		`UPDATE fullpk SET v = 'w'`,
		`UPDATE fullpk SET id = 2`,
		`DELETE FROM fullpk`,
		fmt.Sprintf(`INSERT INTO docs VALUES (1, '%s', 0)`, big),
		`UPDATE docs SET n = 1 WHERE id = 1`,
		`UPDATE docs SET id = 2 WHERE id = 1`,
		`DELETE FROM docs`,
		`INSERT INTO special VALUES (1, 'NaN', 'Infinity', '-Infinity'), (2, 1.5, 2.5, 3.5)`,
		`UPDATE special SET id = 3 WHERE id = 1`,
		`INSERT INTO gen (id, a) VALUES (1, 21)`,
		`UPDATE gen SET a = 2`,
		`INSERT INTO seqd (v) VALUES ('a')`,
		`TRUNCATE items, nopk`,
		`TRUNCATE seqd RESTART IDENTITY`,
	)
	e.pg.ExecT(t, work...)
	const total = 35
	pg := e.waitCount("CDC_par_pg", total, time.Minute)
	wj := e.waitCount("CDC_par_wj", total, time.Minute)
	// Nothing more arrives on either side.
	time.Sleep(300 * time.Millisecond)
	pg, wj = e.messages("CDC_par_pg"), e.messages("CDC_par_wj")
	require.Len(t, pg, total)
	require.Len(t, wj, total)
	checkOrdered(t, pg)
	checkOrdered(t, wj)

	var flagged, nulled, truncs int
	for i := range pg {
		p, w := pg[i], wj[i]
		where := fmt.Sprintf("message %d (%s %s.%s)", i, p.Body["op"], p.Body["schema"], p.Body["table"])
		require.Equal(t, p.Pos, w.Pos, "%s: position", where)
		require.Equal(t, strings.Replace(p.Subject, ".pg.", ".wj.", 1), w.Subject, where)
		for _, h := range []string{"Bridge-Tx-Size", "Bridge-Table", "Bridge-Op"} {
			require.Equal(t, p.Header.Get(h), w.Header.Get(h), "%s: header %s", where, h)
		}
		require.Empty(t, p.Header.Get("Bridge-Lossy"), where)

		want, got := exactBody(t, p.Raw), exactBody(t, w.Raw)
		require.Equal(t, "pg", want["source"])
		require.Equal(t, "wj", got["source"])
		for _, k := range []string{"source"} {
			delete(want, k)
			delete(got, k)
		}
		// The documented, forced differences.
		lossy := ""
		switch {
		case want["table"] == "zoo" && want["op"] != "truncate" && afterOf(want)["id"] == json.Number("1"):
			// NaN and ±Infinity in nullable columns: null, not flagged.
			nulled += nullSpecial(t, want, "c_float8_nan", "c_float8_inf", "c_float8_ninf", "c_numeric_nan", "c_numeric_inf", "c_numeric_ninf")
		case want["table"] == "special" && (afterOf(want)["f"] == "NaN"):
			// NaN and ±Infinity in NOT NULL columns: null and flagged, in
			// every image (REPLICA IDENTITY FULL: before and key too).
			flagged += nullSpecial(t, want, "f", "n", "r")
			lossy = "f,n,r"
		case want["op"] == "truncate":
			// TRUNCATE's options are not reported.
			want["truncate"] = map[string]any{"cascade": false, "restart_identity": false}
			truncs++
		}
		require.Equal(t, lossy, w.Header.Get("Bridge-Lossy"), "%s: Bridge-Lossy", where)
		if !reflect.DeepEqual(want, got) {
			require.Equal(t, want, got, "%s: payload", where) // shows the diff
		}
	}
	require.Equal(t, 12, nulled)
	require.Equal(t, 3+6, flagged) // insert: after; update: before, after
	require.Equal(t, 3, truncs)

	// Spot checks that the workload exercised what it should, through both.
	find := func(op, table string, pred func(b map[string]any) bool) map[string]any {
		t.Helper()
		for _, m := range wj {
			b := exactBody(t, m.Raw)
			if b["op"] == op && b["table"] == table && pred(b) {
				return b
			}
		}
		t.Fatalf("no %s on %s matching", op, table)
		return nil
	}
	all := func(map[string]any) bool { return true }
	// TOAST unchanged: listed, not nulled; also across a key change.
	u := find("update", "docs", func(b map[string]any) bool { return afterOf(b)["n"] == json.Number("1") })
	require.Equal(t, []any{"body"}, u["unchanged_toast"])
	require.Nil(t, u["before"])
	k := find("update", "docs", func(b map[string]any) bool { return afterOf(b)["id"] == json.Number("2") })
	require.Equal(t, []any{"body"}, k["unchanged_toast"])
	require.Equal(t, map[string]any{"id": json.Number("1")}, k["before"])
	// Key change with the default identity: the old key only.
	require.Equal(t, map[string]any{"id": json.Number("2")}, find("update", "items", func(b map[string]any) bool { return afterOf(b)["id"] == json.Number("3") })["before"])
	// REPLICA IDENTITY FULL: whole old rows.
	fu := find("update", "fullpk", func(b map[string]any) bool { return afterOf(b)["v"] == "w" })
	require.Equal(t, map[string]any{"id": json.Number("1"), "v": "v", "n": json.Number("1.50"), "big": big}, fu["before"])
	require.Equal(t, []any{"big"}, fu["unchanged_toast"])
	nd := find("delete", "nopk", all)
	require.Equal(t, map[string]any{"a": json.Number("2"), "b": "two"}, nd["before"])
	// Generated columns are left out, as pgoutput does.
	require.Equal(t, map[string]any{"id": json.Number("1"), "a": json.Number("21")}, afterOf(find("insert", "gen", all)))
	// Unicode and escapes survive.
	require.Equal(t, "äpfel 🍎 \"quoted\" \\ back\ttab", afterOf(find("insert", "items", func(b map[string]any) bool { return afterOf(b)["id"] == json.Number("1") }))["name"])
	// Both kinds of message.
	require.Equal(t, map[string]any{"prefix": "app", "transactional": true, "content": "in-tx"}, find("message", "", func(b map[string]any) bool { return b["message"].(map[string]any)["transactional"] == true })["message"])
	require.Equal(t, "outside ✓", find("message", "", func(b map[string]any) bool {
		return b["message"].(map[string]any)["content"] == "outside ✓"
	})["message"].(map[string]any)["content"])
}

// exactBody decodes a payload keeping numbers exact.
func exactBody(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var m map[string]any
	require.NoError(t, d.Decode(&m))
	return m
}

// nullSpecial asserts that pgoutput's payload holds NaN or ±Infinity in cols
// wherever they appear (after, before, key) and sets them to null, as
// wal2json < 2.6 sends them. It returns how many values it changed in
// after and before.
func nullSpecial(t *testing.T, body map[string]any, cols ...string) int {
	t.Helper()
	n := 0
	for _, part := range []string{"after", "before", "key"} {
		row, _ := body[part].(map[string]any)
		for _, c := range cols {
			if v, ok := row[c]; ok {
				require.Contains(t, []any{"NaN", "Infinity", "-Infinity"}, v, "%s.%s", part, c)
				row[c] = nil
				if part != "key" {
					n++
				}
			}
		}
	}
	return n
}

func afterOf(b map[string]any) map[string]any {
	a, _ := b["after"].(map[string]any)
	return a
}
