package bridge_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// TestIdleSourceConfirmsWALEnd: with no change to published tables while
// other tables churn, the checkpoint and the slot follow the server's WAL end,
// so the slot does not hold WAL back.
func TestIdleSourceConfirmsWALEnd(t *testing.T) {
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE watched (id int PRIMARY KEY)`, `CREATE TABLE churn (id serial PRIMARY KEY, pad text)`)
	r := e.start(e.config("idle", "      tables: [public.watched]\n      status_interval: 300ms"))
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO watched VALUES (1)`)
	e.waitCount("CDC_idle", 1, 30*time.Second)

	conn := e.pg.Conn(t, "")
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		_, err := conn.Exec(ctx, `INSERT INTO churn (pad) SELECT repeat('x', 500) FROM generate_series(1, 2000)`)
		require.NoError(t, err)
	}
	var endText string
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&endText))
	end, err := cdc.ParseLSN(endText)
	require.NoError(t, err)

	var confirmed cdc.LSN
	require.Eventually(t, func() bool {
		var s string
		if err := conn.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'slot_idle'`).Scan(&s); err != nil {
			return false
		}
		confirmed, _ = cdc.ParseLSN(s)
		return confirmed >= end
	}, 30*time.Second, 100*time.Millisecond, "slot confirmed_flush stayed behind the WAL end %s", end)
	require.GreaterOrEqual(t, uint64(r.app.Pipelines()[0].Checkpointed()), uint64(end), "the checkpoint leads the slot")
	require.Len(t, e.messages("CDC_idle"), 1, "churn on unpublished tables publishes nothing")
}
