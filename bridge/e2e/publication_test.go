package e2e_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPublicationTablesLive: `tables` creates the publication and is
// checked at start, nothing more: a table added to the publication with
// ALTER PUBLICATION … ADD TABLE streams at once, without a restart, and
// still streams after a restart with the same `tables` (the bridge does
// not take it out again).
func TestPublicationTablesLive(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE a (id int PRIMARY KEY)`, `CREATE TABLE b (id int PRIMARY KEY)`)
	p := e.config("livepub", "      tables: [public.a]")
	r := e.start(p)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO b VALUES (1)`, `INSERT INTO a VALUES (1)`)
	ms := e.waitCount("CDC_livepub", 1, 30*time.Second)
	require.Equal(t, "cdc.livepub.public.a", ms[0].Subject, "b is not in the publication yet")

	e.pg.ExecT(t, `ALTER PUBLICATION pub_livepub ADD TABLE b`, `INSERT INTO b VALUES (2)`)
	ms = e.waitCount("CDC_livepub", 2, 30*time.Second)
	require.Equal(t, "cdc.livepub.public.b", ms[1].Subject)
	require.Equal(t, float64(2), ms[1].Body["after"].(map[string]any)["id"], "the row inserted after ALTER PUBLICATION, while the bridge runs")

	r.stop(t)
	r = e.start(p)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO b VALUES (3)`)
	ms = e.waitCount("CDC_livepub", 3, 30*time.Second)
	require.Equal(t, "cdc.livepub.public.b", ms[2].Subject, "a restart with the same tables keeps b in the publication")
	require.Len(t, ms, 3)
	checkOrdered(t, ms)
}
