package pgoutput_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/pgtest"
	"github.com/bridgecdc/bridge/sources"
)

// TestEvictStaleReader: a source that finds its slot held gets a
// SlotBusyError naming the walsender, and may end it (sources.Evicter):
// allowed to the walsender's own role; another role is refused until it is
// granted pg_signal_backend, with that GRANT as the fix (run here as
// printed). Once ended, the slot is free and opens.
func TestEvictStaleReader(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{})
	pg.ExecT(t, `CREATE TABLE a (id int PRIMARY KEY)`,
		`CREATE ROLE alice LOGIN REPLICATION`, `CREATE ROLE bob LOGIN REPLICATION`,
		`CREATE PUBLICATION pub FOR ALL TABLES`,
		`SELECT pg_create_logical_replication_slot('ev', 'pgoutput')`)
	dsn := func(role string) string { return strings.Replace(pg.DSN(""), "postgres@", role+"@", 1) }
	block := func(role string) map[string]any {
		return map[string]any{"dsn": dsn(role), "slot": "ev", "publication": "pub", "create_publication": false}
	}
	conn := pg.Conn(t, "")
	holder := func() int {
		var pid *int32
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'ev'`).Scan(&pid))
		if pid == nil {
			return 0
		}
		return int(*pid)
	}
	busyOpen := func(src sources.Source) *sources.SlotBusyError {
		t.Helper()
		err := openErr(t, src, 0)
		var busy *sources.SlotBusyError
		require.True(t, errors.As(err, &busy), "want a SlotBusyError, got %T: %v", err, err)
		require.Contains(t, err.Error(), `replication slot "ev" is active for PID`)
		require.Equal(t, "ev", busy.Slot)
		require.Equal(t, "postgres", busy.Database)
		return busy
	}
	evict := func(src sources.Source, r sources.SlotReader) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return src.(sources.Evicter).Evict(ctx, r)
	}

	// The same role: allowed without a grant.
	first := newSource(t, "x", block("alice"))
	require.NoError(t, openErr(t, first, 0))
	own := first.(sources.Evicter).Reader()
	require.Equal(t, holder(), own.PID, "Reader names the slot's walsender")
	require.False(t, own.Started.IsZero())
	second := newSource(t, "x", block("alice"))
	busy := busyOpen(second)
	require.Equal(t, own, busy.Holder, "the same role sees the walsender's start time too")
	require.NoError(t, evict(second, busy.Holder))
	require.NotEqual(t, own.PID, holder(), "Evict returns once the walsender let the slot go")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err := first.Read(ctx) // its connection was ended under it
	cancel()
	require.Error(t, err)
	require.NoError(t, evict(second, busy.Holder), "a reader that is gone already is no error")

	// Another role: refused, with the GRANT that fixes it.
	third := newSource(t, "x", block("alice"))
	require.NoError(t, openErr(t, third, 0))
	held := third.(sources.Evicter).Reader()
	other := newSource(t, "y", block("bob"))
	busy = busyOpen(other)
	require.Equal(t, held.PID, busy.Holder.PID)
	err = evict(other, busy.Holder)
	require.ErrorIs(t, err, sources.ErrEvictDenied)
	require.Contains(t, err.Error(), `role "bob" may not end PID`)
	_, fix, ok := strings.Cut(err.Error(), "fix: ")
	require.True(t, ok, "the error carries its fix: %v", err)
	grant, _, _ := strings.Cut(fix, ";")
	require.Equal(t, `GRANT pg_signal_backend TO "bob"`, grant)
	require.Equal(t, held.PID, holder(), "a refused eviction leaves the reader")
	pg.ExecT(t, grant)
	require.NoError(t, evict(other, busy.Holder))
	require.NotEqual(t, held.PID, holder())
	require.NoError(t, openErr(t, newSource(t, "y", block("bob")), 0), "the slot is free")
}
