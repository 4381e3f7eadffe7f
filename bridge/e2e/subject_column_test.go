package e2e_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// configRoutes is env.config with routes (YAML list items, indented by
// two spaces) in place of the default route.
func (e *env) configRoutes(name, extra, routes string) string {
	e.t.Helper()
	p := e.config(name, extra)
	y, err := os.ReadFile(p)
	require.NoError(e.t, err)
	head, _, ok := strings.Cut(string(y), "routes:\n")
	require.True(e.t, ok)
	require.NoError(e.t, os.WriteFile(p, []byte(head+"routes:\n"+routes), 0o644))
	return p
}

// TestSubjectColumnMissing: a subject template that reads a column the
// table does not have stops the bridge with an error naming the route,
// the table and the column. It stops at the transaction that holds the
// change: every transaction committed before it is published and
// checkpointed first, even when they reach the bridge together with it
// (one read, one batch), and nothing of that transaction is published. A
// table that has the column, or a change without a row (TRUNCATE), goes
// through. Restarted with the template fixed, the bridge publishes that
// transaction and what followed it, each change once.
func TestSubjectColumnMissing(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE accounts (id int PRIMARY KEY, tenant text)`,
		`CREATE TABLE orders (id int PRIMARY KEY, total int)`)
	p := e.configRoutes("col", "", `  - sinks: [js]
    subject: "cdc.col.{{.Table}}.{{.Col.tenant}}"
`)
	r := e.start(p)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO accounts VALUES (1, 'acme')`)
	e.waitCount("CDC_col", 1, time.Minute)
	r.stop(t)
	// A backlog, so that the bridge reads these transactions together: a
	// large one (handed to the writer in parts), small ones that the reader
	// gathers into one hand-over, the one the route cannot publish, and
	// one more.
	e.pg.ExecT(t, `BEGIN; TRUNCATE accounts; COMMIT;
BEGIN; INSERT INTO accounts SELECT g, 't' || g % 7 FROM generate_series(1, 3000) g; COMMIT;
BEGIN; INSERT INTO accounts VALUES (3001, 'acme'); COMMIT;
BEGIN; INSERT INTO accounts VALUES (3002, 'acme'); INSERT INTO accounts VALUES (3003, 'acme'); COMMIT;
BEGIN; INSERT INTO accounts VALUES (3004, 'acme'); INSERT INTO orders VALUES (1, 10); INSERT INTO accounts VALUES (3005, 'acme'); COMMIT;
BEGIN; INSERT INTO accounts VALUES (3006, 'acme'); COMMIT;`)
	time.Sleep(300 * time.Millisecond) // older than the source's catch-up threshold (100 ms)
	r = e.start(p)
	err := r.stopped(t, 60*time.Second, "after a change whose subject reads a missing column")
	require.Error(t, err)
	for _, want := range []string{"routes[0].subject for public.orders (insert at commit LSN ", "change 2 of the transaction", `column "tenant"`} {
		require.Contains(t, err.Error(), want)
	}
	ms := e.messages("CDC_col")
	require.Equal(t, 3005, len(ms), "every change committed before the transaction with the bad change, and none of it")
	require.Equal(t, "cdc.col.accounts.acme", ms[0].Subject)
	require.Equal(t, "cdc.col.accounts._", ms[1].Subject, "a change without a row renders its columns as _")
	require.Equal(t, "cdc.col.accounts.t1", ms[2].Subject)
	last := ms[len(ms)-1]
	require.Equal(t, float64(3003), last.Body["after"].(map[string]any)["id"])
	require.Equal(t, last.Pos.LSN, e.ckpt("col").LSN, "checkpointed up to the last transaction before the bad change")

	// The template fixed: the bridge resumes at that transaction.
	p = e.configRoutes("col", "", `  - sinks: [js]
    subject: "cdc.col.{{.Table}}"
`)
	r = e.start(p)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO accounts VALUES (3007, 'acme')`)
	e.waitCount("CDC_col", 3010, time.Minute)
	r.stop(t)
	ms = e.messages("CDC_col")
	require.Equal(t, 3010, len(ms))
	seen := map[string]bool{}
	for i, m := range ms {
		require.False(t, seen[m.ID], "message %s stored twice", m.ID)
		seen[m.ID] = true
		if i > 0 {
			require.True(t, ms[i-1].Pos.Less(m.Pos), "out of order at stream seq %d", m.Seq)
		}
	}
	var tail []string
	for _, m := range ms[3005:] {
		id := m.Body["after"].(map[string]any)["id"]
		tail = append(tail, m.Subject+":"+fmt.Sprint(id))
	}
	require.Equal(t, []string{"cdc.col.accounts:3004", "cdc.col.orders:1", "cdc.col.accounts:3005", "cdc.col.accounts:3006", "cdc.col.accounts:3007"}, tail)
}
