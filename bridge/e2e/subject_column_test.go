package e2e_test

import (
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
// the table and the column; the change is not published, and a table
// that has the column, or a change without a row (TRUNCATE), goes
// through.
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
	e.pg.ExecT(t, `INSERT INTO accounts VALUES (1, 'acme')`, `TRUNCATE accounts`)
	// Stored before the bad change is committed: a routing error holds
	// back the changes routed with it in one batch (they are neither
	// published nor acknowledged, and come again after a restart).
	e.waitCount("CDC_col", 2, time.Minute)
	e.pg.ExecT(t, `INSERT INTO orders VALUES (1, 10)`)
	err := r.stopped(t, 60*time.Second, "after a change whose subject reads a missing column")
	require.Error(t, err)
	for _, want := range []string{"routes[0].subject", "public.orders", `column "tenant"`} {
		require.Contains(t, err.Error(), want)
	}
	ms := e.messages("CDC_col")
	require.Len(t, ms, 2, "the insert into accounts and the truncate")
	require.Equal(t, "cdc.col.accounts.acme", ms[0].Subject)
	require.Equal(t, "cdc.col.accounts._", ms[1].Subject, "a change without a row renders its columns as _")
}
