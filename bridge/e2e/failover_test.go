package e2e_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/faultproxy"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// failoverCluster is a primary (e.pg) and a physical standby, the bridge
// reading the primary through a DSN that names both
// (target_session_attrs=read-write), and a log of what the bridge said.
type failoverCluster struct {
	e       *env
	standby *pgtest.Server
	proxy   *faultproxy.Proxy // between the standby and the primary
	dsn     string
	logs    *syncBuffer
}

// newFailoverCluster starts PostgreSQL major with table fo, and a standby
// that streams the primary's WAL through a faultproxy (so that a test can
// make it lag), with slot synchronization on 17 and later; sss sets
// synchronized_standby_slots on the primary to the standby's slot.
func newFailoverCluster(t *testing.T, major int, sss bool) *failoverCluster {
	e := newEnvMajor(t, major)
	e.pg.ExecT(t, `CREATE TABLE fo (id bigserial PRIMARY KEY, u uuid NOT NULL DEFAULT gen_random_uuid(), phase int NOT NULL)`)
	proxy, err := faultproxy.Start(fmt.Sprintf("127.0.0.1:%d", e.pg.Port))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	so := pgtest.StandbyOptions{Slot: "sb", PrimaryAddr: proxy.Addr()}
	if major >= 17 {
		so.Settings = map[string]string{"sync_replication_slots": "on"}
	}
	standby := pgtest.NewStandbyT(t, e.pg, so)
	if sss {
		require.NoError(t, e.pg.SetConf(t.Context(), map[string]string{"synchronized_standby_slots": "'sb'"}))
	}
	return &failoverCluster{e: e, standby: standby, proxy: proxy, logs: &syncBuffer{},
		dsn: fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write connect_timeout=5",
			e.pg.Port, standby.Port)}
}

// config writes the bridge's config: source app over the multi-host DSN,
// table fo only, with extra source keys.
func (c *failoverCluster) config(t *testing.T, name, extra string) string {
	p := c.e.config(name, "      tables: [public.fo]\n"+extra)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	b = regexp.MustCompile(`(?m)^      dsn: .*$`).ReplaceAll(b, []byte(fmt.Sprintf("      dsn: %q", c.dsn)))
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

func (c *failoverCluster) start(t *testing.T, cfg string) *running {
	tw := &testWriter{t: t}
	t.Cleanup(func() { tw.mu.Lock(); tw.done = true; tw.mu.Unlock() })
	return c.e.startWith(cfg, app.WithLogger(slog.New(slog.NewTextHandler(io.MultiWriter(c.logs, tw), nil))))
}

// waitSynced waits until the standby holds a synced copy of slot
// (PostgreSQL 17) that a promotion keeps (synced, not temporary),
// committing on the primary meanwhile: a new slot syncs only once the
// standby's catalog xmin allows it.
func (c *failoverCluster) waitSynced(t *testing.T, slot string) {
	conn := c.standby.Conn(t, "")
	require.Eventually(t, func() bool {
		c.e.pg.ExecT(t, `INSERT INTO fo (phase) VALUES (0)`)
		// A synced slot stays temporary until the primary's slot passes
		// the standby's catalog xmin; a promotion drops it until then.
		var synced bool
		err := conn.QueryRow(t.Context(), `SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&synced)
		return err == nil && synced
	}, 90*time.Second, 200*time.Millisecond, "slot %s never synced to the standby:\n%s", slot, c.standby.Log())
}

// writer commits one row per transaction on the primary until stopped or
// until the primary is gone.
type writer struct {
	n    atomic.Int64
	stop chan struct{}
	done chan struct{}
}

func startWriter(t *testing.T, s *pgtest.Server, phase int) *writer {
	w := &writer{stop: make(chan struct{}), done: make(chan struct{})}
	conn, err := pgx.Connect(t.Context(), s.DSN(""))
	require.NoError(t, err)
	go func() {
		defer close(w.done)
		defer conn.Close(context.Background())
		for {
			select {
			case <-w.stop:
				return
			default:
			}
			if _, err := conn.Exec(context.Background(), `INSERT INTO fo (phase) VALUES ($1)`, phase); err != nil {
				return // the primary is gone
			}
			w.n.Add(1)
			time.Sleep(time.Millisecond)
		}
	}()
	return w
}

func (w *writer) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// rowsOf returns the rows of fo on s by their uuid: ids are not unique
// across a failover (the new primary's sequence may hand out again ids of
// rows it never got).
func rowsOf(t *testing.T, s *pgtest.Server) map[string]bool {
	conn := s.Conn(t, "")
	rows, err := conn.Query(t.Context(), `SELECT u::text FROM fo`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}

// tally counts the fo inserts of ms by uuid, per producer.
func tally(ms []msg) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, m := range ms {
		if m.Header.Get("Bridge-Op") != "insert" {
			continue
		}
		prod, _, _ := cdc.ParseID(m.ID)
		if out[prod] == nil {
			out[prod] = map[string]int{}
		}
		out[prod][m.Body["after"].(map[string]any)["u"].(string)]++
	}
	return out
}

// counts compares what the stream holds of one producer (got) with the
// rows of the new primary (has): delivered, duplicated, missing, and
// phantoms (delivered but not on the new primary).
type counts struct{ has, delivered, duplicates, missing, phantoms int }

func compare(has map[string]bool, got map[string]int) counts {
	c := counts{has: len(has)}
	for id, n := range got {
		c.delivered++
		if n > 1 {
			c.duplicates += n - 1
		}
		if !has[id] {
			c.phantoms++
		}
	}
	for id := range has {
		if got[id] == 0 {
			c.missing++
		}
	}
	return c
}

// failOver writes on the primary for a while (the standby lagging when
// lag is set: its link to the primary stalled for the last part, while
// the bridge keeps publishing), stops the primary at once (-m immediate),
// promotes the standby and writes on it.
func (c *failoverCluster) failOver(t *testing.T, stream string, lag bool) {
	w := startWriter(t, c.e.pg, 1)
	time.Sleep(2 * time.Second)
	if lag {
		c.proxy.Stall() // the standby gets no more WAL; the bridge does
		before := storedCount(t, c.e, stream)
		require.Eventually(t, func() bool { return storedCount(t, c.e, stream) > before+200 }, 60*time.Second, 100*time.Millisecond,
			"the bridge published nothing while the standby lagged")
	} else {
		time.Sleep(2 * time.Second)
	}
	require.NoError(t, c.e.pg.Stop(t.Context(), "immediate"))
	w.halt()
	// The primary is gone: its links end (the WAL held back stays
	// undelivered), and the standby's next attempts are refused as a
	// dead host's are. A stalled proxy would instead hold them open
	// unanswered, and a walreceiver or slot sync worker caught in such a
	// connect can keep the promotion waiting past pg_ctl's 60 s.
	c.proxy.Cut()
	c.proxy.Resume()
	require.NoError(t, c.standby.Promote(t.Context()))
	t.Logf("primary stopped after %d commits of its writer; standby promoted", w.n.Load())
	c.standby.ExecT(t, `INSERT INTO fo (phase) SELECT 2 FROM generate_series(1, 100)`)
	for range 200 {
		c.standby.ExecT(t, `INSERT INTO fo (phase) VALUES (2)`)
	}
}

// TestFailoverSlotSynced fails a PostgreSQL 17 (and 18) primary over to
// its standby while the bridge streams under a writer: the slot is a
// failover slot (failover: true), the standby syncs it
// (sync_replication_slots) and the primary waits for the standby before it
// sends changes (synchronized_standby_slots). The bridge finds the new
// primary through its multi-host DSN and carries on from the synced slot:
// every row the new primary has arrives exactly once, and nothing it lacks.
func TestFailoverSlotSynced(t *testing.T) {
	defer parallelLong(t)()
	eachMajorOf(t, []int{17, 18}, true, failoverSlotSynced)
}

func failoverSlotSynced(t *testing.T, major int) {
	c := newFailoverCluster(t, major, true)
	cfg := c.config(t, "fos", "      failover: true")
	r := c.start(t, cfg)
	waitReady(t, r)
	var failover bool
	require.NoError(t, c.e.pg.Conn(t, "").QueryRow(t.Context(), `SELECT failover FROM pg_replication_slots WHERE slot_name = 'slot_fos'`).Scan(&failover))
	require.True(t, failover, "failover: true creates a failover slot")
	c.waitSynced(t, "slot_fos")
	// validate --connect and the metrics say that the slot survives a
	// failover to the standby.
	code, out, errs := execCLI(t, "validate", "--connect", "-c", cfg)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errs)
	for _, want := range []string{`slot "slot_fos" is a failover slot`, "synchronized_standby_slots = 'sb'",
		fmt.Sprintf(`standby 127.0.0.1:%d holds a synced copy of slot "slot_fos"`, c.standby.Port)} {
		require.Contains(t, out, want)
	}
	require.Eventually(t, func() bool {
		fams := scrape(t, "http://"+r.app.HTTPAddr())
		ready, _ := metricValue(fams, "bridge_slot_failover_ready", map[string]string{"source": "app", "slot": "slot_fos"})
		n, _ := metricValue(fams, "bridge_slot_synced_standbys", map[string]string{"source": "app", "slot": "slot_fos"})
		return ready == 1 && n == 1
	}, 60*time.Second, 500*time.Millisecond, "the metrics never said the slot survives a failover")
	c.failOver(t, "CDC_fos", false)

	has := rowsOf(t, c.standby)
	var got counts
	require.Eventually(t, func() bool {
		by := tally(c.e.messages("CDC_fos"))
		require.Len(t, by, 1, "one epoch: no resync")
		for _, g := range by {
			got = compare(has, g)
		}
		return got.missing == 0
	}, 2*time.Minute, 500*time.Millisecond, "rows of the new primary never arrived")
	t.Logf("synced failover: new primary has %d rows; delivered %d, duplicates %d, missing %d, phantoms %d",
		got.has, got.delivered, got.duplicates, got.missing, got.phantoms)
	require.Zero(t, got.duplicates)
	require.Zero(t, got.phantoms)
	checkOrdered(t, c.e.messages("CDC_fos"))
	require.Contains(t, c.logs.String(), "failover: the server's timeline changed since the checkpoint")
	// validate --connect judges the lineage as the run does: once the run
	// checkpoints on the new primary, the checkpoint is on its timeline.
	var vout string
	require.Eventually(t, func() bool {
		_, vout, _ = execCLI(t, "validate", "--connect", "-c", cfg)
		return strings.Contains(vout, "the server is on timeline 2, the one the checkpoint was recorded on")
	}, 60*time.Second, time.Second, "validate --connect never saw the checkpoint on the new timeline:\n%s", vout)
}

// TestFailoverLaggingStandbyIsLoud fails a PostgreSQL 17 (and 18) primary
// over to a standby that lagged (its link stalled) while the bridge kept
// publishing, without synchronized_standby_slots: the stream then holds
// changes the new primary never got, and its new commits take positions
// below the stream's end. The bridge must not stream on from its
// checkpoint (Postgres would skip those commits without a word): under
// on_slot_lost: fail it stops naming the failover; under recreate it
// publishes a resync message and streams the new primary's rows from the
// slot's position under a new epoch, none missing.
func TestFailoverLaggingStandbyIsLoud(t *testing.T) {
	defer parallelLong(t)()
	eachMajorOf(t, []int{17, 18}, true, failoverLaggingStandbyIsLoud)
}

func failoverLaggingStandbyIsLoud(t *testing.T, major int) {
	c := newFailoverCluster(t, major, false)
	cfg := c.config(t, "fol", "      failover: true")
	r := c.start(t, cfg)
	waitReady(t, r)
	c.waitSynced(t, "slot_fol")
	// Synced, but without synchronized_standby_slots: validate warns.
	code, out, errs := execCLI(t, "validate", "--connect", "-c", cfg)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errs)
	require.Contains(t, out, "synchronized_standby_slots is not set on the primary")
	// The slot poller exports on its own schedule, so the first scrape
	// after the sync can come before it sees the synced standby: wait for
	// that, then the slot must still not count as failover-ready.
	labels := map[string]string{"source": "app", "slot": "slot_fol"}
	var ready float64
	require.Eventually(t, func() bool {
		fams := scrape(t, "http://"+r.app.HTTPAddr())
		synced, _ := metricValue(fams, "bridge_slot_synced_standbys", labels)
		v, ok := metricValue(fams, "bridge_slot_failover_ready", labels)
		ready = v
		return ok && synced >= 1
	}, 60*time.Second, 500*time.Millisecond, "the bridge's slot poller never exported a synced standby for slot_fol")
	require.Zero(t, ready)
	c.failOver(t, "CDC_fol", true)

	err := r.stopped(t, 2*time.Minute, "after a failover that lost part of the stream:\n"+c.logs.String())
	require.Error(t, err)
	for _, want := range []string{"a failover (or a point-in-time recovery) happened", "timeline 2", "timeline 1",
		"synchronized_standby_slots", "would skip every commit", "on_slot_lost: recreate"} {
		require.ErrorContains(t, err, want)
	}
	has := rowsOf(t, c.standby)
	ms := c.e.messages("CDC_fol")
	by := tally(ms)
	require.Len(t, by, 1)
	var old counts
	for _, g := range by {
		old = compare(has, g)
	}
	t.Logf("lagging failover, stopped: new primary has %d rows; delivered %d, duplicates %d, missing %d (stopped), phantoms %d (published before the failover, not on the new primary)",
		old.has, old.delivered, old.duplicates, old.missing, old.phantoms)
	require.Positive(t, old.phantoms, "the test must make the stream hold changes the new primary lacks")
	require.Zero(t, old.duplicates)
	// validate --connect names the failover the run stopped at. Whether it
	// fails depends on whether the checkpoint, not only the stream, got
	// past the switch point before the primary stopped.
	code, out, errs = execCLI(t, "validate", "--connect", "-c", cfg)
	require.Contains(t, out, "a failover (or a point-in-time recovery) happened: the server is on timeline 2, the checkpoint was recorded on timeline 1, which its history left at",
		"stdout:\n%s\nstderr:\n%s", out, errs)
	if code == 0 {
		require.Contains(t, out, "streams on if the sinks hold nothing past it either")
	} else {
		require.Contains(t, out, "`bridge run` stops here (on_slot_lost: fail)")
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "timeline 2") {
			t.Logf("validate --connect after the lagging failover (exit %d): %s", code, line)
		}
	}

	// Under recreate: a resync, then the new primary's rows from the
	// slot's position, none missing, none twice, no phantom.
	r = c.start(t, c.config(t, "fol", "      failover: true\n      on_slot_lost: recreate"))
	var all map[string]map[string]int
	require.Eventually(t, func() bool {
		ms = c.e.messages("CDC_fol")
		all = tally(ms)
		if len(all) != 2 {
			return false
		}
		for id := range has {
			seen := 0
			for _, g := range all {
				seen += g[id]
			}
			if seen == 0 {
				return false
			}
		}
		return true
	}, 2*time.Minute, 500*time.Millisecond, "after the resync, rows of the new primary never arrived:\n%s", c.logs.String())
	ctl := requireResync(t, ms, "failover")
	neu := compare(has, all[ctl.Producer])
	missing := 0
	for id := range has {
		if all[ctl.OldProducer][id] == 0 && all[ctl.Producer][id] == 0 {
			missing++
		}
	}
	t.Logf("lagging failover, resynced: new epoch delivered %d, duplicates %d, phantoms %d; rows of the new primary in neither epoch: %d",
		neu.delivered, neu.duplicates, neu.phantoms, missing)
	require.Zero(t, missing)
	require.Zero(t, neu.duplicates)
	require.Zero(t, neu.phantoms)
	require.Contains(t, c.logs.String(), "the server's history lacks part of the stream")
	r.stop(t)
}

// TestFailoverBefore17Resyncs fails a PostgreSQL 15 (and 16) primary over
// to its standby: slots before 17 live on the primary only, so the new
// primary has none. Under on_slot_lost: recreate the bridge resyncs
// (reason "failover"), saying that a failover happened rather than that
// the slot was dropped, and streams the new primary's rows under a new
// epoch.
func TestFailoverBefore17Resyncs(t *testing.T) {
	defer parallel(t)()
	eachMajorOf(t, []int{15, 16}, false, failoverBefore17Resyncs)
}

func failoverBefore17Resyncs(t *testing.T, major int) {
	c := newFailoverCluster(t, major, false)
	r := c.start(t, c.config(t, "fo15", "      on_slot_lost: recreate"))
	waitReady(t, r)
	w := startWriter(t, c.e.pg, 1)
	time.Sleep(2 * time.Second)
	require.NoError(t, c.e.pg.Stop(t.Context(), "immediate"))
	w.halt()
	require.NoError(t, c.standby.Promote(t.Context()))
	// The bridge creates a new slot on the new primary: rows from then on
	// stream under the new epoch.
	conn := c.standby.Conn(t, "")
	require.Eventually(t, func() bool {
		var n int
		_ = conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'slot_fo15' AND active`).Scan(&n)
		return n == 1
	}, 2*time.Minute, 100*time.Millisecond, "the bridge never streamed from the new primary:\n%s", c.logs.String())
	var ids []string
	for range 200 {
		var id string
		require.NoError(t, conn.QueryRow(t.Context(), `INSERT INTO fo (phase) VALUES (2) RETURNING u::text`).Scan(&id))
		ids = append(ids, id)
	}
	var ms []msg
	require.Eventually(t, func() bool {
		ms = c.e.messages("CDC_fo15")
		all := tally(ms)
		if len(all) != 2 {
			return false
		}
		for _, g := range all {
			if g[ids[len(ids)-1]] > 0 {
				return true
			}
		}
		return false
	}, 2*time.Minute, 500*time.Millisecond)
	ctl := requireResync(t, ms, "failover")
	neu := tally(ms)[ctl.Producer]
	for _, id := range ids {
		require.Equal(t, 1, neu[id], "row %s of the new primary, committed after the new slot (old epoch: %d); logs:\n%s", id, tally(ms)[ctl.OldProducer][id], c.logs.String())
	}
	logs := c.logs.String()
	require.Contains(t, logs, "is missing after a failover")
	require.Contains(t, logs, "timeline 2")
	require.NotContains(t, logs, "it was dropped")
	has := rowsOf(t, c.standby)
	t.Logf("PostgreSQL %d failover: new primary has %d rows; the new epoch delivered %d (all %d committed after the new slot, once each)",
		major, len(has), len(neu), len(ids))
	r.stop(t)
}
