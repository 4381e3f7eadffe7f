package e2e_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// readIDs returns the ids of table's read (snapshot) changes in ms, with
// how many times each came.
func readIDs(ms []msg, table string) map[int64]int {
	out := map[int64]int{}
	for _, m := range ms {
		if m.Body["op"] == "read" && m.Body["table"] == table {
			out[num(m.Body["after"].(map[string]any)["id"])]++
		}
	}
	return out
}

// TestSnapshotWhere snapshots only the rows a --where selects, through the
// holder's endpoint and directly: each selected row once, no other. A
// where is never SQL: OR, statements and unknown columns are refused
// before anything is queued, and a literal of the wrong type is refused
// by Postgres' own conversion, naming the table.
func TestSnapshotWhere(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE tw (id bigint PRIMARY KEY, tenant int NOT NULL, region text)`,
		`INSERT INTO tw SELECT g, g % 3, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END FROM generate_series(1, 600) g`)
	cfg := e.snapConfig("swhere", "never", 40)
	r := e.start(cfg)
	waitReady(t, r)

	code, out, errs := execCLI(t, "snapshot", "-c", cfg, "--tables", "tw", "--where", "tenant = 2 AND region IN ('eu')", "--timeout", "2m", "--progress", "none")
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	require.Contains(t, out, "requested for public.tw where tenant = 2 AND region IN ('eu') (source app; path: control endpoint bridge.swhere.snapshot.app)")
	require.Contains(t, out, "complete")
	got := readIDs(e.marker("CDC_swhere"), "tw")
	want := map[int64]int{}
	for id := int64(1); id <= 600; id++ {
		if id%3 == 2 && id%2 == 0 {
			want[id] = 1
		}
	}
	require.Equal(t, want, got, "the selected rows, each once")

	for _, tc := range []struct {
		where string
		code  int
		msg   string
	}{
		{"tenant = 2 OR 1 = 1", 2, "OR and parentheses are not accepted"},
		{"tenant = 2; DROP TABLE tw", 2, "conditions are joined with AND"},
		{"tenant = (SELECT 1)", 2, "a literal ('text', a number, true or false) was expected"},
		{"nosuch = 1", 1, `names column "nosuch", which table public.tw does not have; fix: use one of its columns: id, tenant, region`},
		{"tenant = 'abc'", 1, "invalid input syntax for type integer"},
	} {
		code, out, errs := execCLI(t, "snapshot", "-c", cfg, "--tables", "tw", "--where", tc.where, "--progress", "none", "--timeout", "1m")
		require.Equal(t, tc.code, code, "%s: stdout: %s\nstderr: %s", tc.where, out, errs)
		require.Contains(t, errs, tc.msg, tc.where)
		require.NotContains(t, out, "requested", "nothing queued for %q", tc.where)
	}
	var n int
	require.NoError(t, e.pg.Conn(t, "").QueryRow(t.Context(), `SELECT count(*) FROM tw`).Scan(&n))
	require.Equal(t, 600, n)

	// No bridge: checked and queued directly; the next run takes it.
	r.stop(t)
	code, out, errs = execCLI(t, "snapshot", "-c", cfg, "--tables", "tw", "--where", "tenant = 1 AND id <= 30", "--wait=false")
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	require.Contains(t, out, "where tenant = 1 AND id <= 30 (source app; path: direct:")
	e.start(cfg)
	require.Eventually(t, func() bool {
		st, ok := e.snapState("swhere")
		return ok && st.Current == nil && st.Last != nil && st.Last.Where == "tenant = 1 AND id <= 30" && st.Last.Outcome() == "complete"
	}, 2*time.Minute, 100*time.Millisecond, "the queued snapshot never completed")
	got = readIDs(e.marker("CDC_swhere"), "tw")
	for id := int64(1); id <= 30; id++ {
		if id%3 == 1 {
			want[id]++
		}
	}
	require.Equal(t, want, got)
}
