package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// dbWorkload is a workload writing to database db of e's server.
func dbWorkload(t *testing.T, e *env, db string) *workload {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, e.pg.Exec(ctx, db, `CREATE TABLE kt (id bigserial PRIMARY KEY, w int NOT NULL, n int NOT NULL, v int NOT NULL DEFAULT 0, pad text)`))
	return &workload{dsn: e.pg.DSN(db), events: map[string]int{}}
}

// TestTwoSourcesOneProcess runs two pipelines in one bridge: two sources on
// two databases of one server, each routed to its own stream, with a
// graceful restart in the middle. Each stream holds its database's changes
// exactly once, and nothing of the other's.
func TestTwoSourcesOneProcess(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE DATABASE db_a`, `CREATE DATABASE db_b`)
	wa, wb := dbWorkload(t, e, "db_a"), dbWorkload(t, e, "db_b")
	cfg := filepath.Join(e.dir, "multi.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`name: multi
nats:
  url: %s
sources:
  a:
    type: pgoutput
    config: { dsn: "%s", slot: slot_a, publication: pub_a }
  b:
    type: wal2json
    config: { dsn: "%s", slot: slot_b }
checkpoint:
  interval: 200ms
http:
  listen: "127.0.0.1:0"
sinks:
  js_a:
    type: nats_jetstream
    config: { stream: MULTI_A, subjects: ["multi.a.>"], duplicate_window: 1s }
  js_b:
    type: nats_jetstream
    config: { stream: MULTI_B, subjects: ["multi.b.>"], duplicate_window: 1s }
routes:
  - match: { sources: [a] }
    sinks: [js_a]
    subject: "multi.a.{{.Schema}}.{{.Table}}"
  - match: { sources: [b] }
    sinks: [js_b]
    subject: "multi.b.{{.Schema}}.{{.Table}}"
`, e.natsURL(), e.pg.DSN("db_a"), e.pg.DSN("db_b"))), 0o644))

	r := e.start(cfg)
	waitReady(t, r)
	require.Len(t, r.app.Pipelines(), 2)
	waitA := wa.run(t, 2, 3000, 2*time.Millisecond)
	waitB := wb.run(t, 2, 3000, 2*time.Millisecond)
	time.Sleep(700 * time.Millisecond)
	r.stop(t)
	r = e.start(cfg)
	waitA()
	waitB()
	wa.verifyExactlyOnce(t, e, "MULTI_A")
	wb.verifyExactlyOnce(t, e, "MULTI_B")
	for _, m := range e.messages("MULTI_B") {
		require.Equal(t, "multi.b.public.kt", m.Subject)
		require.Regexp(t, `^multi\.b\.`, m.ID, "producer ids name the bridge and the source")
	}
}

// TestTwoProcesses runs two bridge processes (the built binary) with
// different names, slots and streams over the same table, and kills one of
// them with SIGKILL while writers commit: the other is unaffected, and each
// stream holds every change exactly once.
func TestTwoProcesses(t *testing.T) {
	defer parallel(t)()
	bin := bridgeBinary(t)
	e := newEnv(t)
	w := newWorkload(t, e)
	cfg1, cfg2 := e.config("proc1", ""), e.config("proc2", "")
	p1, p2 := startProc(t, bin, cfg1), startProc(t, bin, cfg2)
	t.Cleanup(func() { p1.kill9(t); p2.kill9(t) }) // no-ops after term
	waitSlotActive(t, e, "slot_proc1")
	waitSlotActive(t, e, "slot_proc2")

	wait := w.run(t, 2, 3000, 2*time.Millisecond)
	time.Sleep(800 * time.Millisecond)
	p1.kill9(t)
	time.Sleep(300 * time.Millisecond)
	p1 = startProc(t, bin, cfg1)
	wait()
	w.verifyExactlyOnce(t, e, "CDC_proc1")
	w.verifyExactlyOnce(t, e, "CDC_proc2")
	p1.term(t)
	p2.term(t)
}

// TestStandbyTakesOver runs an active bridge and a standby with the same
// configuration (same name, slot and checkpoint). The slot admits one
// walsender, so the standby retries until the active one dies; killed with
// SIGKILL mid-stream, it is replaced by the standby, and every change is in
// the stream exactly once.
//
// Serial: a takeover, bounded in time.
func TestStandbyTakesOver(t *testing.T) {
	bin := bridgeBinary(t)
	e := newEnv(t)
	w := newWorkload(t, e)
	t.Cleanup(func() { w.stopped.Store(true) })
	cfg := e.config("standby", "")
	active := startProc(t, bin, cfg)
	waitSlotActive(t, e, "slot_standby")
	standby := startProc(t, bin, cfg)
	t.Cleanup(func() {
		// Both have exited after this (kill9 waits), so their output can
		// be read.
		active.kill9(t)
		standby.kill9(t)
		if t.Failed() {
			t.Logf("active bridge:\n%s\nstandby:\n%s", active.out.String(), standby.out.String())
		}
	})

	wait := w.run(t, 2, 1<<30, 5*time.Millisecond)
	time.Sleep(2 * time.Second)
	conn := e.pg.Conn(t, "")
	pid := slotPID(t, conn, "slot_standby")
	active.kill9(t)
	t.Logf("killed the active bridge after %d changes", w.total.Load())
	// The standby's next attempt finds the slot free.
	require.Eventually(t, func() bool {
		p := slotPID(t, conn, "slot_standby")
		return p != 0 && p != pid
	}, 40*time.Second, 100*time.Millisecond, "the standby never took the slot over")
	t.Logf("the standby streams after %d changes", w.total.Load())
	time.Sleep(time.Second)
	w.stopped.Store(true)
	wait()
	w.verifyExactlyOnce(t, e, "CDC_standby")
	standby.term(t)
}

// slotPID returns the PID of the walsender streaming from slot, 0 when none.
func slotPID(t *testing.T, c *pgx.Conn, slot string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var pid *int32
	require.NoError(t, c.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid))
	if pid == nil {
		return 0
	}
	return int(*pid)
}
