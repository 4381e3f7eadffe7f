package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// invalidateSlot makes Postgres invalidate the idle slot (wal_status =
// lost); the server must run with a small max_slot_wal_keep_size.
func invalidateSlot(t *testing.T, e *env, slot string) {
	t.Helper()
	conn := e.pg.Conn(t, "")
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

// controlOf decodes a stored control message; ok is false for other messages.
func controlOf(t *testing.T, m msg) (cdc.Control, bool) {
	if m.Header.Get("Bridge-Op") != "control" {
		return cdc.Control{}, false
	}
	var c cdc.Control
	require.NoError(t, json.Unmarshal(m.Raw, &c), "control message %d: %s", m.Seq, m.Raw)
	return c, true
}

// requireResync asserts the stream's shape after one resync: changes of
// the old producer, then exactly one resync control message naming both
// producers, then changes of the new producer only. It returns the control.
func requireResync(t *testing.T, ms []msg, reason string) cdc.Control {
	t.Helper()
	var ctl cdc.Control
	at := -1
	for i, m := range ms {
		if c, ok := controlOf(t, m); ok {
			require.Equal(t, -1, at, "one resync message, found another at stream seq %d", m.Seq)
			ctl, at = c, i
			require.Equal(t, cdc.ControlResync, c.Kind)
			require.Equal(t, reason, c.Reason)
			require.Equal(t, "app", c.Source)
			require.NotEqual(t, c.OldProducer, c.Producer)
			require.True(t, strings.HasPrefix(m.ID, c.Producer+":"), "the control message is the new producer's first: %s", m.ID)
			require.Equal(t, "_control.resync", m.Header.Get("Bridge-Table"))
			require.True(t, strings.HasSuffix(m.Subject, "._control.resync"), m.Subject)
		}
	}
	require.GreaterOrEqual(t, at, 0, "no resync message in the stream")
	for i, m := range ms {
		prod, _, err := cdc.ParseID(m.ID)
		require.NoError(t, err)
		switch {
		case i < at:
			require.Equal(t, ctl.OldProducer, prod, "stream seq %d before the resync", m.Seq)
		case i > at:
			require.Equal(t, ctl.Producer, prod, "stream seq %d after the resync", m.Seq)
		}
	}
	return ctl
}

// TestSlotInvalidatedResync: the slot is invalidated while the bridge is
// down. Under on_slot_lost: recreate the bridge drops it, creates a new one,
// publishes one resync message under a new epoch, and streams the changes
// committed after that under the new epoch.
func TestSlotInvalidatedResync(t *testing.T) {
	defer parallel(t)()
	e := newEnvWith(t, pgtest.Options{Settings: map[string]string{"max_slot_wal_keep_size": "1MB"}})
	e.pg.ExecT(t, `CREATE TABLE r (id int PRIMARY KEY)`)
	cfg := e.config("inval", "      tables: [public.r]\n      on_slot_lost: recreate")
	r := e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO r VALUES (1), (2)`)
	e.waitCount("CDC_inval", 2, 30*time.Second)
	r.stop(t)

	e.pg.ExecT(t, `INSERT INTO r VALUES (3)`) // lost with the slot's WAL
	invalidateSlot(t, e, "slot_inval")

	r = e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO r VALUES (4)`)
	ms := e.waitCount("CDC_inval", 4, 60*time.Second)
	ctl := requireResync(t, ms, "slot_invalidated")
	require.NotEmpty(t, ctl.LSN)
	require.Len(t, ms, 4, "rows 1, 2, the resync, row 4")
	require.Equal(t, float64(4), ms[3].Body["after"].(map[string]any)["id"])

	// A restart keeps the new epoch: no second resync.
	r.stop(t)
	r = e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO r VALUES (5)`)
	ms = e.waitCount("CDC_inval", 5, 60*time.Second)
	requireResync(t, ms, "slot_invalidated")
	checkOrdered(t, ms)
}

// TestSlotInvalidatedFailStops: under the default policy the bridge stops
// with one error naming slot and database, with SQL to paste, and leaves
// the slot alone.
func TestSlotInvalidatedFailStops(t *testing.T) {
	defer parallel(t)()
	e := newEnvWith(t, pgtest.Options{Settings: map[string]string{"max_slot_wal_keep_size": "1MB"}})
	e.pg.ExecT(t, `CREATE TABLE r (id int PRIMARY KEY)`)
	cfg := e.config("failpol", "      tables: [public.r]")
	r := e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO r VALUES (1)`)
	e.waitCount("CDC_failpol", 1, 30*time.Second)
	r.stop(t)
	invalidateSlot(t, e, "slot_failpol")

	r = e.start(cfg)
	err := r.stopped(t, 60*time.Second, "on an invalidated slot")
	require.Error(t, err)
	for _, want := range []string{`slot "slot_failpol" of database "postgres" is invalidated (wal_status = lost)`,
		"SELECT pg_drop_replication_slot('slot_failpol');", "on_slot_lost: recreate", "max_slot_wal_keep_size"} {
		require.ErrorContains(t, err, want)
	}
	var status string
	require.NoError(t, e.pg.Conn(t, "").QueryRow(t.Context(), `SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'slot_failpol'`).Scan(&status))
	require.Equal(t, "lost", status, "the fail policy never drops the slot")
	require.Len(t, e.messages("CDC_failpol"), 1, "nothing published")
}

// TestAnotherClusterRefused: the DSN is changed to point at another
// cluster (another system identifier) that has a slot of the same name,
// as after a restore from another cluster's backup. Under the default
// policy the bridge stops with one error naming both system identifiers
// and the way on, and publishes nothing from that cluster.
func TestAnotherClusterRefused(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	other := pgtest.StartT(t, pgtest.Options{OwnSystem: true})
	sysid := func(pg *pgtest.Server) string {
		var id string
		require.NoError(t, pg.Conn(t, "").QueryRow(t.Context(), `SELECT system_identifier::text FROM pg_control_system()`).Scan(&id))
		return id
	}
	first, second := sysid(e.pg), sysid(other)
	require.NotEqual(t, first, second, "the two clusters must be two database systems")
	e.pg.ExecT(t, `CREATE TABLE r (id int PRIMARY KEY)`)
	cfg := e.config("othercl", "      tables: [public.r]")
	r := e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO r VALUES (1)`)
	e.waitCount("CDC_othercl", 1, 30*time.Second)
	r.stop(t)

	other.ExecT(t, `CREATE TABLE r (id int PRIMARY KEY)`, `CREATE PUBLICATION pub_othercl FOR TABLE r`,
		`SELECT pg_create_logical_replication_slot('slot_othercl', 'pgoutput')`, `INSERT INTO r VALUES (2)`)
	b, err := os.ReadFile(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cfg, []byte(strings.Replace(string(b), e.pg.DSN(""), other.DSN(""), 1)), 0o644))

	r = e.start(cfg)
	err = r.stopped(t, 60*time.Second, "on another cluster")
	require.Error(t, err)
	for _, want := range []string{`slot "slot_othercl"`, "another database system", "system_identifier " + second,
		"recorded on " + first, "point it back at the cluster the checkpoint was recorded on", "on_slot_lost: recreate"} {
		require.ErrorContains(t, err, want)
	}
	require.EqualValues(t, 1, storedCount(t, e, "CDC_othercl"), "nothing published from the other cluster")
	// validate --connect says the same before a run.
	code, out, errs := execCLI(t, "validate", "--connect", "-c", cfg)
	require.Equal(t, 1, code, "stdout:\n%s\nstderr:\n%s", out, errs)
	require.Contains(t, out, "FAIL  the server is another database system (system_identifier "+second)
	require.Contains(t, out, "point it back at the cluster the checkpoint was recorded on")
}

// TestSlotDroppedWhileRunningResync drops the slot under a streaming
// bridge (terminating its walsender until the drop succeeds). Under
// recreate it resyncs and keeps streaming under a new epoch.
func TestSlotDroppedWhileRunningResync(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE r (id int PRIMARY KEY)`)
	r := e.start(e.config("dropped", "      tables: [public.r]\n      on_slot_lost: recreate"))
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO r VALUES (1)`)
	e.waitCount("CDC_dropped", 1, 30*time.Second)

	conn := e.pg.Conn(t, "")
	require.Eventually(t, func() bool {
		_, _ = conn.Exec(t.Context(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'slot_dropped' AND active_pid IS NOT NULL`)
		_, err := conn.Exec(t.Context(), `SELECT pg_drop_replication_slot('slot_dropped')`)
		return err == nil
	}, 60*time.Second, time.Millisecond, "could not drop the slot")

	// The bridge notices, resyncs and streams again.
	waitSlotActive(t, e, "slot_dropped")
	require.Eventually(t, func() bool {
		_, err := conn.Exec(t.Context(), fmt.Sprintf(`INSERT INTO r VALUES (%d)`, 100+time.Now().Nanosecond()%1000000))
		require.NoError(t, err)
		ms := e.messages("CDC_dropped")
		return len(ms) >= 3 && ms[len(ms)-1].Header.Get("Bridge-Op") == "insert"
	}, 60*time.Second, 500*time.Millisecond)
	requireResync(t, e.messages("CDC_dropped"), "slot_missing")
}

// TestOperatorResync: `bridge resync` refuses while the bridge streams;
// with it stopped it publishes a resync message under a new epoch, and the
// next run streams on under that epoch from the same position.
func TestOperatorResync(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE r (id int PRIMARY KEY)`)
	cfg := e.config("opres", "      tables: [public.r]")
	r := e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO r VALUES (1)`)
	e.waitCount("CDC_opres", 1, 30*time.Second)
	waitSlotActive(t, e, "slot_opres")

	// Directly (a running bridge does it online: TestControlResync).
	code, out, errOut := execCLI(t, "resync", "-c", cfg, "--direct")
	require.NotEqual(t, 0, code, "resync must refuse while the bridge streams: %s", out)
	require.Contains(t, errOut, "stop the bridge first")

	r.stop(t)
	code, out, errOut = execCLI(t, "resync", "-c", cfg, "--reason", "schema rebuilt")
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errOut)
	require.Contains(t, out, "resync published; new producer opres.app.")

	r = e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO r VALUES (2)`)
	ms := e.waitCount("CDC_opres", 3, 60*time.Second)
	ctl := requireResync(t, ms, "operator: schema rebuilt")
	require.Len(t, ms, 3, "row 1, the resync, row 2: nothing sent twice after a clean stop")
	require.Equal(t, ctl.Producer+":", ms[2].ID[:len(ctl.Producer)+1])
}

// TestOperatorResyncEmbeddedNATS: with the embedded NATS server, resync
// refuses in one line while the bridge runs (it used to fail on the bridge's
// own http.listen, then on the embedded port), and with the bridge stopped
// it starts the embedded server for its own time only, so the next `bridge
// run` finds the port free and streams under the new epoch.
func TestOperatorResyncEmbeddedNATS(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE re (id int PRIMARY KEY)`)
	port, httpPort := freePort(t), freePort(t)
	cfg := e.config("opemb", "      tables: [public.re]")
	edit(t, cfg, "  url: "+e.natsURL(), fmt.Sprintf("  embedded: { port: %d }", port),
		`listen: "127.0.0.1:0"`, fmt.Sprintf("listen: \"127.0.0.1:%d\"", httpPort))
	r := e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO re VALUES (1)`)
	require.Eventually(t, func() bool { return r.app.Pipelines()[0].Checkpointed() > 0 }, 30*time.Second, 20*time.Millisecond)
	waitSlotActive(t, e, "slot_opemb")

	code, out, errOut := execCLI(t, "resync", "-c", cfg, "--direct")
	require.Equal(t, 1, code, "resync must refuse while the bridge streams: %s", out)
	require.Contains(t, errOut, "stop the bridge first")
	require.NotContains(t, errOut, "http.listen")
	require.Equal(t, 1, strings.Count(strings.TrimSpace(errOut), "\n")+1, "one line: %q", errOut)

	r.stop(t)
	code, out, errOut = execCLI(t, "resync", "-c", cfg)
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errOut)
	require.Contains(t, out, "resync published; new producer opemb.app.")
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	require.NoError(t, err, "resync left its embedded server running")
	ln.Close()

	r = e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO re VALUES (2)`)
	key, err := nats.NkeyOptionFromSeed(filepath.Join(e.dir, "data", natsembed.KeyFile)) // the embedded server's
	require.NoError(t, err)
	nc, err := nats.Connect(r.app.NATSURL(), key)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := js.Stream(t.Context(), "CDC_opemb")
		if err != nil {
			return false
		}
		info, err := st.Info(t.Context())
		return err == nil && info.State.Msgs == 3
	}, 60*time.Second, 50*time.Millisecond, "row 1, the resync message, row 2")
}

// TestSetupChangesWhileStreaming: a published table switched to REPLICA
// IDENTITY NOTHING is reported with the fix when its next change arrives;
// a publication dropped under the streaming bridge stops it (Postgres 15
// cannot decode past the drop) with one error naming publication, database
// and slot, and the SQL to recover.
func TestSetupChangesWhileStreaming(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE r (id int PRIMARY KEY)`)
	cfg, err := config.Load(e.config("pubdrop", "      tables: [public.r]"))
	require.NoError(t, err)
	var logs syncBuffer
	tw := &testWriter{t: t}
	t.Cleanup(func() { tw.mu.Lock(); tw.done = true; tw.mu.Unlock() })
	a, err := app.New(cfg, app.WithLogger(slog.New(slog.NewTextHandler(io.MultiWriter(&logs, tw), nil))))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, a.Start(ctx))
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	require.Eventually(t, func() bool { return a.Pipelines()[0].Ready() }, 60*time.Second, 20*time.Millisecond)

	e.pg.ExecT(t, `INSERT INTO r VALUES (1)`, `ALTER TABLE r REPLICA IDENTITY NOTHING`, `INSERT INTO r VALUES (2)`)
	e.waitCount("CDC_pubdrop", 2, 30*time.Second)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "table has REPLICA IDENTITY NOTHING") }, 10*time.Second, 50*time.Millisecond)
	require.Contains(t, logs.String(), `ALTER TABLE \"public\".\"r\" REPLICA IDENTITY FULL;`)

	e.pg.ExecT(t, `DROP PUBLICATION pub_pubdrop`, `INSERT INTO r VALUES (3)`)
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the bridge went on after its publication was dropped")
	}
	require.Error(t, err)
	for _, want := range []string{`publication "pub_pubdrop" of database "postgres" is gone while slot "slot_pubdrop" needs it`,
		`CREATE PUBLICATION "pub_pubdrop" FOR TABLE "public"."r"`, "pg_replication_slot_advance('slot_pubdrop'"} {
		require.ErrorContains(t, err, want)
	}
}
