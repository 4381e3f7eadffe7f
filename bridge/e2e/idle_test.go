package e2e_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// TestIdleSourceConfirmsWALEnd: with no change to published tables while
// other tables churn, the checkpoint and the slot follow the server's WAL end,
// so the slot does not hold WAL back.
func TestIdleSourceConfirmsWALEnd(t *testing.T) {
	defer parallel(t)()
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

// TestHeartbeatMovesIdleSlot: in a database where nothing at all is
// written, heartbeat_interval writes logical messages, so the checkpoint
// and the slot keep following the WAL end (lag stays measurable and
// retained WAL bounded), and the heartbeats never reach the stream even
// when every message prefix is published.
//
// Serial: it bounds how often the heartbeats move the slot.
func TestHeartbeatMovesIdleSlot(t *testing.T) {
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE watched (id int PRIMARY KEY)`)
	p := e.config("beat", "      tables: [public.watched]\n      status_interval: 300ms\n      heartbeat_interval: 200ms")
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, []byte(strings.Replace(string(b), `message_prefixes: ["app"]`, `message_prefixes: ["*"]`, 1)), 0o644))
	r := e.start(p)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO watched VALUES (1)`)
	e.waitCount("CDC_beat", 1, 30*time.Second)

	conn := e.pg.Conn(t, "")
	ctx := context.Background()
	var startText string
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&startText))
	start, err := cdc.ParseLSN(startText)
	require.NoError(t, err)
	// No writes from here on: only the heartbeats move the WAL, several
	// times a second (Postgres' own background records come every 15 s).
	var seen []cdc.LSN
	last := start
	require.Eventually(t, func() bool {
		var s string
		if err := conn.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'slot_beat'`).Scan(&s); err != nil {
			return false
		}
		confirmed, _ := cdc.ParseLSN(s)
		if confirmed > last {
			seen = append(seen, confirmed)
			last = confirmed
		}
		return len(seen) >= 5 && r.app.Pipelines()[0].Checkpointed() > start
	}, 12*time.Second, 50*time.Millisecond, "heartbeats did not keep moving the slot past %s (advances: %v)", start, seen)
	var beats int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'bridge:app:heartbeat'`).Scan(&beats))
	require.Equal(t, 1, beats, "one heartbeat connection")
	require.Len(t, e.messages("CDC_beat"), 1, "heartbeats are never published")
}
