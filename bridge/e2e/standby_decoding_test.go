package e2e_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// TestDecodeOnStandby streams from a slot on a physical standby of a
// PostgreSQL 16 primary (logical decoding on a standby, 16 and later,
// with hot_standby_feedback), sparing the primary: the publication is
// made on the primary, the bridge creates its slot on the standby and
// streams the primary's commits as the standby replays them. Then the
// standby is promoted (the primary stopped first) and the bridge carries
// on from the same slot, through a restart too: every row exactly once.
func TestDecodeOnStandby(t *testing.T) {
	defer parallelLong(t)()
	e := newEnvMajor(t, 16)
	e.pg.ExecT(t, `CREATE TABLE sbt (id int PRIMARY KEY, v text)`, `CREATE PUBLICATION pub_sbd FOR TABLE sbt`)
	standby := pgtest.NewStandbyT(t, e.pg, pgtest.StandbyOptions{Slot: "sb"})
	cfg := e.config("sbd", "      tables: [public.sbt]")
	b, err := os.ReadFile(cfg)
	require.NoError(t, err)
	b = regexp.MustCompile(`(?m)^      dsn: .*$`).ReplaceAll(b, []byte("      dsn: "+standby.DSN("")))
	require.NoError(t, os.WriteFile(cfg, b, 0o644))
	logs := &syncBuffer{}
	c := &failoverCluster{e: e, standby: standby, logs: logs}
	r := c.start(t, cfg)

	// Creating a slot on a standby waits for the primary to log the
	// running transactions; pg_log_standby_snapshot() (16) does it now.
	sconn := standby.Conn(t, "")
	require.Eventually(t, func() bool {
		e.pg.ExecT(t, `SELECT pg_log_standby_snapshot()`)
		var n int
		_ = sconn.QueryRow(t.Context(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'slot_sbd' AND active`).Scan(&n)
		return n == 1
	}, 90*time.Second, 200*time.Millisecond, "the bridge never streamed from its slot on the standby:\n%s", logs.String())
	var onPrimary int
	require.NoError(t, e.pg.Conn(t, "").QueryRow(t.Context(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'slot_sbd'`).Scan(&onPrimary))
	require.Zero(t, onPrimary, "the slot is the standby's, not the primary's")

	want := map[int]string{} // id → last value
	write := func(s *pgtest.Server, from, to int) {
		for i := from; i < to; i++ {
			s.ExecT(t, fmt.Sprintf(`INSERT INTO sbt VALUES (%d, 'v%d')`, i, i))
			want[i] = fmt.Sprintf("v%d", i)
			if i%10 == 0 {
				s.ExecT(t, fmt.Sprintf(`UPDATE sbt SET v = 'u%d' WHERE id = %d`, i, i))
				want[i] = fmt.Sprintf("u%d", i)
			}
		}
	}
	changes := func(from, to int) int { return (to - from) + (to-from+9)/10 }
	// check waits until the stream holds n changes and checks it: every
	// row's inserts and updates once each, in commit order.
	check := func(n int) {
		t.Helper()
		ms := e.waitCount("CDC_sbd", n, 2*time.Minute)
		require.Len(t, ms, n)
		checkOrdered(t, ms)
		seen := map[string]bool{}
		last := map[int]string{}
		for _, m := range ms {
			after := m.Body["after"].(map[string]any)
			id, v := int(after["id"].(float64)), after["v"].(string)
			k := fmt.Sprint(m.Body["op"], id, v)
			require.False(t, seen[k], "change %s twice", k)
			seen[k] = true
			last[id] = v
		}
		for id, v := range want {
			require.Equal(t, v, last[id], "row %d", id)
		}
	}

	write(e.pg, 0, 300)
	check(changes(0, 300))

	// Promotion: the primary stops, the standby becomes the primary; the
	// bridge keeps its DSN (the standby's) and its slot.
	require.NoError(t, e.pg.Stop(t.Context(), "fast"))
	require.NoError(t, standby.Promote(t.Context()))
	write(standby, 300, 500)
	check(changes(0, 500))
	var ckptTimeline string
	if strings.Contains(logs.String(), "run ended; restarting") {
		ckptTimeline = "the run ended at the promotion and the next one opened the slot on timeline 2"
	} else {
		ckptTimeline = "the walsender streamed on across the promotion"
	}
	t.Logf("promotion: %s", ckptTimeline)

	// A restart after the promotion opens the same slot on the new
	// timeline: nothing lost, nothing twice.
	r.stop(t)
	r = c.start(t, cfg)
	waitReady(t, r)
	write(standby, 500, 600)
	check(changes(0, 600))
	require.NotContains(t, logs.String(), "pipeline stopped")
	// The restart saw the new timeline and knew why streaming on is safe:
	// the stream was read from this very server (its own slot, not a
	// synced copy), or it ended before the switch point.
	require.Regexp(t, "the standby this source reads was promoted; its slot carries on|the stream ends before the switch point", logs.String())
	var lsn string
	require.NoError(t, sconn.QueryRow(t.Context(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'slot_sbd'`).Scan(&lsn))
	_, err = cdc.ParseLSN(lsn)
	require.NoError(t, err)
	r.stop(t)
}
