package e2e_test

// Dead connections (issue 34, part 3): a link that goes silent for good
// without a reset, as when a NAT or load-balancer entry is lost, while new
// connections work. faultproxy.BlackHole does that to every connection
// open through it. The tests run a concurrent writer, black-hole the
// bridge's connections mid-stream, and check that the bridge says which
// connection it found dead, recovers over new connections, and that the
// stream holds every committed change exactly once and in order. They
// log how long noticing and recovering took; those figures are reported,
// not asserted.

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/internal/faultproxy"
)

// logTap is the bridge's logger in a test: lines go to the test's log and
// are kept, with when they were written, for the test to look for.
type logTap struct {
	mu    sync.Mutex
	lines []tapLine
	t     testing.TB
	done  bool
}

type tapLine struct {
	at   time.Time
	text string
}

func newLogTap(t testing.TB) (*slog.Logger, *logTap) {
	l := &logTap{t: t}
	t.Cleanup(func() { l.mu.Lock(); l.done = true; l.mu.Unlock() })
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug})), l
}

func (l *logTap) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	text := strings.TrimRight(string(p), "\n")
	l.lines = append(l.lines, tapLine{at: time.Now(), text: text})
	if !l.done {
		l.t.Log(text)
	}
	return len(p), nil
}

// first returns when the first line holding every one of parts was
// logged, and whether there is one.
func (l *logTap) first(parts ...string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ln := range l.lines {
		if holds(ln.text, parts) {
			return ln.at, true
		}
	}
	return time.Time{}, false
}

// count returns how many lines logged after since hold every one of parts.
func (l *logTap) count(since time.Time, parts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ln := range l.lines {
		if !ln.at.Before(since) && holds(ln.text, parts) {
			n++
		}
	}
	return n
}

func holds(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// TestDeadConnNATS black-holes every NATS connection of the bridge (its
// checkpoint connection and its sink's) mid-stream, with default ping
// settings. The pings must take both for dead and say so by name, the
// bridge must reconnect over new connections and go on, and the stream
// must hold every committed change exactly once and in order.
//
// Serial: it black-holes links against the pings and timeouts and reports how long noticing took.
func TestDeadConnNATS(t *testing.T) {
	e := newEnv(t)
	w := newSeqWorkload(t, e)
	np, err := faultproxy.Start(fmt.Sprintf("127.0.0.1:%d", e.nsOpts.Port))
	require.NoError(t, err)
	t.Cleanup(func() { _ = np.Close() })
	cfg := faultConfig(e, "deadnats", e.pg.DSN(""), "nats://"+np.Addr(), "")
	log, tap := newLogTap(t)
	r := e.startWith(cfg, app.WithLogger(log))
	waitReady(t, r)

	w.start(2, 5*time.Millisecond)
	e.waitStored("CDC_deadnats", 200, time.Minute)
	holed := np.BlackHole()
	t0 := time.Now()
	before := storedCount(t, e, "CDC_deadnats")
	t.Logf("black-holed %d NATS connections with %d messages stored", holed, before)
	require.GreaterOrEqual(t, holed, 2, "the checkpoint connection and the sink's go through the proxy")

	// Noticed: both connections are named dead. nats.go's default pings
	// (2m × 2) would take 4 to 6 minutes; the bridge's take seconds.
	var sinkAt, ckptAt time.Time
	require.Eventually(t, func() bool {
		var ok1, ok2 bool
		sinkAt, ok1 = tap.first("NATS connection is dead", `connection="bridge sink js"`)
		ckptAt, ok2 = tap.first("NATS connection is dead", `connection="bridge deadnats checkpoints"`)
		return ok1 && ok2
	}, 3*time.Minute, 100*time.Millisecond, "the bridge did not take its black-holed NATS connections for dead")
	// Recovered: changes are stored again, over new connections.
	require.Eventually(t, func() bool { return storedCount(t, e, "CDC_deadnats") > before }, 3*time.Minute, 50*time.Millisecond,
		"nothing was stored after the black hole")
	recovered := time.Since(t0)
	time.Sleep(2 * time.Second) // the writer goes on after the recovery
	w.halt()
	t.Logf("sink connection noticed dead after %s, checkpoint connection after %s; changes stored again after %s; %d run restarts meanwhile",
		sinkAt.Sub(t0).Round(time.Millisecond), ckptAt.Sub(t0).Round(time.Millisecond), recovered.Round(time.Millisecond),
		tap.count(t0, "run ended; restarting"))
	check(t, e, w, "CDC_deadnats")
	select {
	case err := <-r.done:
		t.Fatalf("the bridge stopped: %v", err)
	default:
	}
}

// deadConfig writes a bridge.yaml for source "app" of type plugin
// (pgoutput or wal2json) streaming tables through dsn into stream
// CDC_<name> on natsURL, with extra lines for the source's config block.
func deadConfig(e *env, name, plugin, dsn, natsURL, tables, extra string) string {
	e.t.Helper()
	y := fmt.Sprintf(`name: %s
data_dir: %s
nats:
  url: %s
sources:
  app:
    type: %s
    config:
      dsn: %s
      slot: slot_%s
      publication: pub_%s
      tables: [%s]
%s
checkpoint:
  interval: 200ms
http:
  listen: "127.0.0.1:0"
sinks:
  js:
    type: nats_jetstream
    config:
      stream: CDC_%s
      subjects: ["cdc.%s.>"]
      duplicate_window: 1s
routes:
  - sinks: [js]
    subject: "cdc.%s.{{.Schema}}.{{.Table}}"
`, name, filepath.Join(e.dir, "data-"+name), natsURL, plugin, dsn, name, name, tables, extra, name, name, name)
	p := filepath.Join(e.dir, name+".yaml")
	require.NoError(e.t, os.WriteFile(p, []byte(y), 0o644))
	return p
}

// walsenderPID returns the PID of the walsender streaming from slot (0:
// none).
func walsenderPID(t *testing.T, e *env, slot string) int {
	t.Helper()
	var pid int
	require.NoError(t, e.pg.Conn(t, "").QueryRow(t.Context(),
		`SELECT coalesce(max(active_pid), 0) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid))
	return pid
}

// TestDeadConnPostgres black-holes every Postgres connection of the bridge
// (replication, catalog, slot poller) mid-stream, with the default
// status_interval and receive_timeout, while a writer commits over its own
// connection. The bridge must take the replication connection as lost and
// say so naming the slot, end its walsender (the server runs with its
// default wal_sender_timeout, 60 s, which would otherwise hold the slot),
// stream again over new connections, and the stream must hold every
// committed change exactly once and in order.
//
// Serial: it black-holes the replication link against receive_timeout and TCP_USER_TIMEOUT and reports how long noticing took.
func TestDeadConnPostgres(t *testing.T) {
	e := newEnv(t)
	w := newSeqWorkload(t, e)
	pgp, err := faultproxy.Start(fmt.Sprintf("127.0.0.1:%d", e.pg.Port))
	require.NoError(t, err)
	t.Cleanup(func() { _ = pgp.Close() })
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", pgp.Port())
	log, tap := newLogTap(t)
	r := e.startWith(deadConfig(e, "deadpg", "pgoutput", dsn, e.natsURL(), "public.fw", ""), app.WithLogger(log))
	waitReady(t, r)
	w.start(2, 5*time.Millisecond)
	e.waitStored("CDC_deadpg", 200, time.Minute)
	pid := walsenderPID(t, e, "slot_deadpg")
	holed := pgp.BlackHole()
	t0 := time.Now()
	t.Logf("black-holed %d Postgres connections; walsender %d", holed, pid)
	require.GreaterOrEqual(t, holed, 2, "the catalog and replication connections go through the proxy")

	var noticed time.Time
	require.Eventually(t, func() bool {
		var ok bool
		noticed, ok = tap.first(`replication connection on slot \"slot_deadpg\" of database \"postgres\" silent for`, "taking it as lost")
		return ok
	}, 3*time.Minute, 100*time.Millisecond, "the bridge did not take its black-holed replication connection as lost")
	atNotice := storedCount(t, e, "CDC_deadpg")
	require.Eventually(t, func() bool { return storedCount(t, e, "CDC_deadpg") > atNotice }, 3*time.Minute, 50*time.Millisecond,
		"nothing was stored after the bridge noticed")
	recovered := time.Since(t0)
	_, ended := tap.first("ended the walsender of the lost replication connection", fmt.Sprintf("walsender=%d", pid))
	time.Sleep(2 * time.Second)
	w.halt()
	t.Logf("replication connection noticed dead after %s; walsender %d ended by the bridge: %v; changes stored again after %s; %d run restarts meanwhile",
		noticed.Sub(t0).Round(time.Millisecond), pid, ended, recovered.Round(time.Millisecond), tap.count(t0, "run ended; restarting"))
	require.True(t, ended, "the bridge did not end the walsender of the dead connection")
	check(t, e, w, "CDC_deadpg")
	select {
	case err := <-r.done:
		t.Fatalf("the bridge stopped: %v", err)
	default:
	}
}

// TestDeadConnBusyWalsender: a walsender replaying a large transaction
// whose changes are not published sends nothing for seconds (wal2json:
// for the whole replay; pgoutput: up to wal_sender_timeout/2). With a
// receive_timeout scaled down far below that silence, the bridge must ask
// Postgres, find the walsender busy and wait: no connection taken as
// lost, no run restarted, the same walsender, and the next change
// delivered once.
//
// Serial: a large transaction replayed against receive_timeout, which other tests' load would stretch unevenly.
func TestDeadConnBusyWalsender(t *testing.T) {
	for _, plugin := range []string{"pgoutput", "wal2json"} {
		t.Run(plugin, func(t *testing.T) {
			e := newEnv(t)
			e.pg.ExecT(t, `CREATE TABLE watched (id int PRIMARY KEY)`, `CREATE TABLE churn (id int, pad text)`)
			log, tap := newLogTap(t)
			name := "busy" + plugin[:3]
			r := e.startWith(deadConfig(e, name, plugin, e.pg.DSN(""), e.natsURL(), "public.watched",
				"      status_interval: 200ms\n      receive_timeout: 1s"), app.WithLogger(log))
			waitReady(t, r)
			e.pg.ExecT(t, `INSERT INTO watched VALUES (1)`)
			e.waitStored("CDC_"+name, 1, time.Minute)
			pid := walsenderPID(t, e, "slot_"+name)
			t0 := time.Now()
			e.pg.ExecT(t, `INSERT INTO churn SELECT g, repeat('x', 40) FROM generate_series(1, 1000000) g`,
				`INSERT INTO watched VALUES (2)`)
			e.waitStored("CDC_"+name, 2, 5*time.Minute)
			_, busy := tap.first("replication connection silent, but its walsender is busy")
			_, again := tap.first("the walsender answered again")
			lost := tap.count(t0, "taking it as lost")
			restarts := tap.count(t0, "run ended; restarting")
			t.Logf("busy seen: %v, answered again: %v; lost: %d, restarts: %d", busy, again, lost, restarts)
			require.True(t, busy, "the walsender was never silent for receive_timeout: the test proves nothing")
			require.Zero(t, lost, "a busy walsender was taken for a dead connection")
			require.Zero(t, restarts)
			require.Equal(t, pid, walsenderPID(t, e, "slot_"+name), "the walsender was replaced")
			ms := e.messages("CDC_" + name)
			checkOrdered(t, ms)
			require.Len(t, ms, 2)
		})
	}
}

// TestDeadConnIdleDatabase: an idle database sends nothing, but the
// walsender answers every status update the bridge sends, so the
// connection is never silent for receive_timeout: over an idle period of
// 30 times a scaled-down receive_timeout (1 s, status_interval 200ms) the
// bridge takes nothing for dead and keeps its walsender; a change after
// it is delivered. TEST_LONG=1 runs it with the default status_interval
// and receive_timeout (10 s, 30 s) over 5 minutes instead.
//
// Serial: it waits out the liveness timeouts on an idle database, which other tests' load would stretch unevenly.
func TestDeadConnIdleDatabase(t *testing.T) {
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE watched (id int PRIMARY KEY)`)
	log, tap := newLogTap(t)
	extra, idle := "      status_interval: 200ms\n      receive_timeout: 1s", 30*time.Second
	if long() {
		extra, idle = "", 5*time.Minute
	}
	r := e.startWith(deadConfig(e, "idle", "pgoutput", e.pg.DSN(""), e.natsURL(), "public.watched", extra), app.WithLogger(log))
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO watched VALUES (1)`)
	e.waitStored("CDC_idle", 1, time.Minute)
	pid := walsenderPID(t, e, "slot_idle")
	t0 := time.Now()
	time.Sleep(idle) // the idle period itself is what is tested
	e.pg.ExecT(t, `INSERT INTO watched VALUES (2)`)
	e.waitStored("CDC_idle", 2, time.Minute)
	silent, lost, restarts := tap.count(t0, "replication connection silent"), tap.count(t0, "taking it as lost"), tap.count(t0, "run ended; restarting")
	t.Logf("idle for %s: %d silences, %d connections taken as lost, %d restarts", idle, silent, lost, restarts)
	require.Zero(t, silent, "the walsender of an idle database did not answer")
	require.Zero(t, lost)
	require.Zero(t, restarts)
	require.Equal(t, pid, walsenderPID(t, e, "slot_idle"), "the walsender was replaced")
	require.Len(t, e.messages("CDC_idle"), 2)
}
