package e2e_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGeneratedColumns streams a table with a stored generated column
// (and, from PostgreSQL 18, a virtual one) through a publication made as
// the docs say: with publish_generated_columns = stored on 18, Postgres'
// default before. From 18 the stored column arrives like any other, in the
// snapshot and in the stream; the virtual one never does (Postgres does not
// publish it). Before 18 Postgres publishes no generated column, and the
// snapshot leaves it out too, so that both carry the same columns. Each row
// is compared with to_jsonb of the same row, less what is not published.
// It runs on 15 and 18, as far as the version matrix (PG_MAJORS) has them.
func TestGeneratedColumns(t *testing.T) {
	defer parallel(t)()
	// 15 (nothing generated published) and 18 (stored ones published),
	// where the matrix runs them.
	eachMajorOf(t, []int{15, 18}, false, generatedColumns)
}

func generatedColumns(t *testing.T, major int) {
	e := newEnvMajor(t, major)
	conn := e.pg.Conn(t, "")
	var version int
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT current_setting('server_version_num')::int`).Scan(&version))
	pg18 := version >= 180000
	ddl := `CREATE TABLE gen (id int PRIMARY KEY, price numeric, qty int, total numeric GENERATED ALWAYS AS (price * qty) STORED)`
	pub := `CREATE PUBLICATION pub_gen FOR TABLE gen`
	unpublished := []string{"total"}
	if pg18 {
		ddl = `CREATE TABLE gen (id int PRIMARY KEY, price numeric, qty int, total numeric GENERATED ALWAYS AS (price * qty) STORED,
			label text GENERATED ALWAYS AS ('item ' || id) VIRTUAL)`
		pub += ` WITH (publish_generated_columns = stored)`
		unpublished = []string{"label"}
	}
	e.pg.ExecT(t, ddl, pub, `INSERT INTO gen (id, price, qty) VALUES (1, 2.50, 4)`)
	cfg := e.config("gen", "      snapshot: {mode: initial, request_poll: 200ms}")
	r := e.start(cfg)
	waitReady(t, r)
	e.waitSnapshotDone("gen", time.Minute, nil)
	e.pg.ExecT(t, `INSERT INTO gen (id, price, qty) VALUES (2, 1.25, 3)`, `UPDATE gen SET qty = 10 WHERE id = 2`)
	ms := e.waitCount("CDC_gen", 3, time.Minute)
	require.Len(t, ms, 3)

	oracle := func(id int) map[string]any {
		q := `SELECT to_jsonb(g)`
		for _, c := range unpublished {
			q += fmt.Sprintf(" - '%s'", c)
		}
		var b []byte
		require.NoError(t, conn.QueryRow(t.Context(), q+` FROM gen g WHERE id = $1`, id).Scan(&b))
		return exactJSON(t, b).(map[string]any)
	}
	var ops []string
	for i, m := range ms {
		body := exactJSON(t, m.Raw).(map[string]any)
		after := body["after"].(map[string]any)
		ops = append(ops, fmt.Sprint(body["op"]))
		id := 1
		if i > 0 {
			id = 2
		}
		want := oracle(id)
		if i == 1 { // the insert, before the update
			want["qty"], want["total"] = exactJSON(t, []byte("3")), exactJSON(t, []byte("3.75"))
			if !pg18 {
				delete(want, "total")
			}
		}
		require.True(t, sameJSON(want, after), "message %d: delivered %s, postgres %v", i, m.Raw, want)
	}
	require.Equal(t, []string{"read", "insert", "update"}, ops)
}
