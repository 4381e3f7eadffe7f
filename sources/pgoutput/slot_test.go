package pgoutput_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/pgtest"
	"github.com/bridgecdc/bridge/sources"
)

// invalidate makes Postgres invalidate slot (wal_status = lost): the server
// runs with max_slot_wal_keep_size = 1MB, so switching WAL segments and
// checkpointing removes the WAL the idle slot needs.
func invalidate(t *testing.T, pg *pgtest.Server, slot string) {
	t.Helper()
	conn := pg.Conn(t, "")
	require.Eventually(t, func() bool {
		for _, q := range []string{`CREATE TABLE IF NOT EXISTS walfill (v text)`, `INSERT INTO walfill SELECT repeat('x', 100) FROM generate_series(1, 1000)`,
			`SELECT pg_switch_wal()`, `INSERT INTO walfill VALUES ('y')`, `SELECT pg_switch_wal()`, `CHECKPOINT`} {
			_, err := conn.Exec(t.Context(), q)
			require.NoError(t, err)
		}
		var status string
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&status))
		return status == "lost"
	}, 60*time.Second, 10*time.Millisecond, "slot %s never became invalidated", slot)
}

// TestSlotLostPolicies: an invalidated or dropped slot is found at Open;
// under on_slot_lost: fail it is one SetupError naming slot and database
// with the SQL fix, under recreate the source drops the invalidated slot and
// reports a SlotLostError, and the next Open from 0 creates the slot.
func TestSlotLostPolicies(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{Settings: map[string]string{"max_slot_wal_keep_size": "1MB"}})
	pg.ExecT(t, `CREATE TABLE a (id int PRIMARY KEY)`,
		`SELECT pg_create_logical_replication_slot('inval', 'pgoutput')`,
		`SELECT pg_create_logical_replication_slot('inval2', 'pgoutput')`)
	invalidate(t, pg, "inval")
	invalidate(t, pg, "inval2")
	conn := pg.Conn(t, "")
	exists := func(slot string) (bool, string) {
		var n int
		var status string
		_ = conn.QueryRow(t.Context(), `SELECT count(*), coalesce(max(wal_status), '') FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&n, &status)
		return n == 1, status
	}

	t.Run("invalidated, fail", func(t *testing.T) {
		err := openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "slot": "inval"}), cdc.LSN(0x1000000))
		requireSetup(t, err, `slot "inval" of database "postgres" is invalidated (wal_status = lost)`, "SELECT pg_drop_replication_slot('inval');")
		ok, status := exists("inval")
		require.True(t, ok, "the fail policy never drops the slot")
		require.Equal(t, "lost", status)
	})
	t.Run("invalidated, no checkpoint, fail", func(t *testing.T) {
		err := openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "slot": "inval"}), 0)
		requireSetup(t, err, `slot "inval" of database "postgres" is invalidated`, "max_slot_wal_keep_size")
	})
	t.Run("invalidated, recreate", func(t *testing.T) {
		err := openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "slot": "inval", "on_slot_lost": "recreate"}), cdc.LSN(0x1000000))
		var lost *sources.SlotLostError
		require.True(t, errors.As(err, &lost), "want a SlotLostError, got %T: %v", err, err)
		require.Equal(t, "slot_invalidated", lost.Reason)
		require.Equal(t, "postgres", lost.Database)
		require.NotZero(t, lost.WALEnd)
		ok, _ := exists("inval")
		require.False(t, ok, "the invalidated slot is dropped")
		// The runtime then opens from 0: a new slot.
		require.NoError(t, openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "slot": "inval", "on_slot_lost": "recreate"}), 0))
		ok, status := exists("inval")
		require.True(t, ok)
		require.NotEqual(t, "lost", status)
	})
	t.Run("invalidated, no checkpoint, recreate", func(t *testing.T) {
		require.NoError(t, openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "slot": "inval2", "on_slot_lost": "recreate"}), 0))
		ok, status := exists("inval2")
		require.True(t, ok)
		require.NotEqual(t, "lost", status)
	})
	t.Run("dropped, recreate", func(t *testing.T) {
		err := openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "slot": "dropped", "on_slot_lost": "recreate"}), cdc.LSN(0x1000000))
		var lost *sources.SlotLostError
		require.True(t, errors.As(err, &lost), "want a SlotLostError, got %T: %v", err, err)
		require.Equal(t, "slot_missing", lost.Reason)
	})
	t.Run("bad policy", func(t *testing.T) {
		_, err := newSourceErr("x", map[string]any{"dsn": pg.DSN(""), "on_slot_lost": "ignore", "receive_timeout": "1s"})
		require.ErrorContains(t, err, `sources.x.config.on_slot_lost: must be "fail" or "recreate", got "ignore"`)
		require.ErrorContains(t, err, "sources.x.config.receive_timeout: must be at least twice status_interval")
	})
}
