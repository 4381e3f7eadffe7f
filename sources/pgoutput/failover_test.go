package pgoutput_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/pgtest"
)

// TestFailoverOption: failover: true creates a failover slot on
// PostgreSQL 17 and later, makes an existing slot one, and before 17
// stops with a SetupError naming the version and the fix.
func TestFailoverOption(t *testing.T) {
	for _, m := range pgtest.Majors() {
		t.Run(fmt.Sprint("pg", m), func(t *testing.T) {
			t.Parallel()
			pg := pgtest.StartT(t, pgtest.Options{Major: m})
			pg.ExecT(t, `CREATE TABLE a (id int PRIMARY KEY)`)
			failover := func(slot string) bool {
				var f bool
				require.NoError(t, pg.Conn(t, "").QueryRow(t.Context(), `SELECT failover FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&f))
				return f
			}
			err := openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "slot": "fo", "failover": true}), 0)
			if m < 17 {
				requireSetup(t, err, `source "x" has failover: true, but failover slots need PostgreSQL 17 or later`, "remove failover from sources.x.config")
				return
			}
			require.NoError(t, err)
			require.True(t, failover("fo"))
			pg.ExecT(t, `SELECT pg_create_logical_replication_slot('plain', 'pgoutput')`)
			require.False(t, failover("plain"))
			require.NoError(t, openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "slot": "plain", "failover": true}), 0))
			require.True(t, failover("plain"), "an existing slot is made a failover slot")
		})
	}
}
