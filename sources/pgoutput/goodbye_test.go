package pgoutput_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// TestCloseConfirmsAcked: once Close returns, the slot is confirmed up to
// the last acknowledged commit, read at once, with no wait: the goodbye
// ends the copy and waits for the walsender's answer, so the status is
// taken before the process that closed may exit. Each round acks a
// commit the slot has not seen confirmed (no periodic status carried it:
// the round lasts less than status_interval), closes and reads the slot.
func TestCloseConfirmsAcked(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{})
	pg.ExecT(t, `CREATE TABLE a (id int PRIMARY KEY)`, `CREATE PUBLICATION pub FOR ALL TABLES`,
		`SELECT pg_create_logical_replication_slot('bye', 'pgoutput')`)
	conn := pg.Conn(t, "")
	confirmed := func() cdc.LSN {
		var s string
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'bye'`).Scan(&s))
		l, err := cdc.ParseLSN(s)
		require.NoError(t, err)
		return l
	}
	block := map[string]any{"dsn": pg.DSN(""), "slot": "bye", "publication": "pub", "create_publication": false, "status_interval": "1h"}
	for i := range 10 {
		before := confirmed()
		src := newSource(t, "x", block)
		require.NoError(t, openErr(t, src, before))
		pg.ExecT(t, fmt.Sprintf("INSERT INTO a VALUES (%d)", i))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		txn, err := src.Read(ctx)
		cancel()
		require.NoError(t, err)
		require.Greater(t, uint64(txn.CommitLSN), uint64(before))
		require.NoError(t, src.Ack(context.Background(), txn.CommitLSN))
		require.NoError(t, src.Close(context.Background()))
		require.GreaterOrEqual(t, uint64(confirmed()), uint64(txn.CommitLSN),
			"round %d: once Close returned, the slot must be confirmed up to the acked commit %s", i, txn.CommitLSN)
	}
}
