package e2e_test

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// newEnvPG is newEnv with Postgres settings.
func newEnvPG(t testing.TB, settings map[string]string) *env {
	t.Helper()
	e := &env{t: t, pg: pgtest.StartT(t, pgtest.Options{Settings: settings}), dir: t.TempDir()}
	e.nsOpts = natsembed.Options{Host: "127.0.0.1", Port: natsembed.Ports(t, 1)[0], StoreDir: filepath.Join(e.dir, "nats")}
	e.startNATS()
	t.Cleanup(func() {
		if e.ns != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = e.ns.Shutdown(ctx)
		}
	})
	return e
}

// zproc is a bridge process whose output can be read while it runs.
type zproc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

func startZProc(t *testing.T, bin, cfg string) *zproc {
	t.Helper()
	p := &zproc{out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, "run", "-c", cfg)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.Env = append(os.Environ(), "BRIDGE_LOG__FORMAT=text")
	require.NoError(t, p.cmd.Start())
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

func (p *zproc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// TestZombieIsFenced pauses the active bridge with SIGSTOP in the middle
// of a stream, lets a standby with the same configuration take the slot
// over once Postgres drops the paused walsender (wal_sender_timeout 2s),
// then resumes the paused one with SIGCONT. The zombie must neither store
// anything out of order or twice in the stream (the publishes carry
// Nats-Expected-Last-Sequence) nor move the checkpoint (KV compare-and-set):
// once the standby has saved a checkpoint, no revision comes from the
// zombie. The takeover waits for wal_sender_timeout to drop the paused
// walsender; nothing here bounds how long that takes beyond the waits'
// minute, so the test runs beside the others.
func TestZombieIsFenced(t *testing.T) {
	defer parallel(t)()
	for _, tc := range []struct {
		name   string
		atomic bool
	}{{"per_message", false}, {"atomic", true}} {
		t.Run(tc.name, func(t *testing.T) {
			defer parallelLong(t)() // each case has servers of its own
			bin := bridgeBinary(t)
			e := newEnvPG(t, map[string]string{"wal_sender_timeout": "2s"})
			w := newTxnWorkload(t, e, "zt", func() int { return 1 + rand.N(40) })
			t.Cleanup(func() { w.stopped.Store(true) })
			cfg := e.config("zombie", "")
			if tc.atomic {
				setSinkOption(t, cfg, "atomic_transactions: true")
			}
			zombie := startZProc(t, bin, cfg)
			waitSlotActive(t, e, "slot_zombie")
			standby := startZProc(t, bin, cfg)
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("zombie:\n%s\nstandby:\n%s", zombie.out.String(), standby.out.String())
				}
			})

			// Every checkpoint revision, as it is written.
			revs := watchCheckpoints(t, e, checkpoint.Key("zombie", "app"))

			wait := w.run(2, 1<<30, 3*time.Millisecond)
			conn := e.pg.Conn(t, "")
			e.waitStored("CDC_zombie", 2000, time.Minute)
			pid := slotPID(t, conn, "slot_zombie")
			zombie.signal(t, syscall.SIGSTOP)
			paused := time.Now()
			t.Logf("paused the active bridge after %d changes", w.total.Load())
			require.Eventually(t, func() bool {
				p := slotPID(t, conn, "slot_zombie")
				return p != 0 && p != pid
			}, 60*time.Second, 100*time.Millisecond, "the standby never took the slot over")
			t.Logf("the standby streams %s after the pause", time.Since(paused).Round(time.Millisecond))
			// The standby publishes and checkpoints before the zombie wakes.
			n := storedCount(t, e, "CDC_zombie")
			e.waitStored("CDC_zombie", int(n)+500, time.Minute)
			standbyRun := revs.waitOtherRun(t)

			mark := len(zombie.out.String())
			zombie.signal(t, syscall.SIGCONT)
			// The zombie notices: its publishes or its checkpoint are refused,
			// or its replication connection is gone.
			require.Eventually(t, func() bool {
				out := zombie.out.String()[mark:]
				return strings.Contains(out, "run ended") || strings.Contains(out, "pipeline stopped")
			}, 60*time.Second, 100*time.Millisecond, "the resumed bridge never noticed it lost the source")
			// Writes go on for a while, through the standby.
			e.waitStored("CDC_zombie", int(storedCount(t, e, "CDC_zombie"))+500, time.Minute)
			w.stopped.Store(true)
			wait()
			w.verify(t, e, "CDC_zombie")
			// The zombie's run from before the pause never saves again. A
			// new run of the zombie may take the slot over later like any
			// standby (when the standby's run ended meanwhile), and save.
			revs.checkNoneAfter(t, standbyRun, revs.first(t), streamsAgain(t, zombie.out.String()[mark:]))
			t.Logf("zombie after SIGCONT:\n%s", lastLines(zombie.out.String()[mark:], 6))
		})
	}
}

// ckptRevs collects every revision of a checkpoint key.
type ckptRevs struct {
	mu   sync.Mutex
	revs []checkpoint.State
}

func watchCheckpoints(t *testing.T, e *env, key string) *ckptRevs {
	t.Helper()
	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	var kv jetstream.KeyValue
	require.Eventually(t, func() bool {
		kv, err = js.KeyValue(t.Context(), "bridge_checkpoints")
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "no checkpoint bucket")
	wt, err := kv.Watch(t.Context(), key)
	require.NoError(t, err)
	t.Cleanup(func() { _ = wt.Stop() })
	r := &ckptRevs{}
	go func() {
		for e := range wt.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var st checkpoint.State
			if json.Unmarshal(e.Value(), &st) == nil {
				r.mu.Lock()
				r.revs = append(r.revs, st)
				r.mu.Unlock()
			}
		}
	}()
	return r
}

// waitOtherRun waits until a revision comes from another run than the
// first one seen, and returns that run.
func (r *ckptRevs) waitOtherRun(t *testing.T) string {
	t.Helper()
	var other string
	require.Eventually(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, st := range r.revs {
			if len(r.revs) > 0 && st.Run != r.revs[0].Run {
				other = st.Run
				return true
			}
		}
		return false
	}, 60*time.Second, 50*time.Millisecond, "the standby never saved a checkpoint")
	return other
}

// checkNoneAfter checks that once run wrote a revision, every later one
// came from run too, but for revisions of zombie (the instance paused)
// saved after again, when a new run of it opened the slot (zero: it never
// did); and that the checkpoint never moved back. Such a run holds the
// slot: the standby's run ended meanwhile and the zombie's next attempt
// came first. That happens when the zombie's publishes, sent before the
// pause, reach the stream exactly where the standby's of the same
// transactions were about to go (the same ids, so the stream is unchanged
// by who stored them), and the standby's next publish then meets them.
func (r *ckptRevs) checkNoneAfter(t *testing.T, run, zombie string, again time.Time) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := false
	for i, st := range r.revs {
		if i > 0 {
			require.GreaterOrEqual(t, uint64(st.LSN), uint64(r.revs[i-1].LSN), "checkpoint moved back at revision #%d", i)
		}
		if st.Run == run {
			seen = true
			continue
		}
		if seen && st.Run == zombie && !again.IsZero() && !st.UpdatedAt.Before(again) {
			t.Logf("revision #%d (LSN %s) by a new run of the resumed instance, which opened the slot at %s", i, st.LSN, again.Format(time.RFC3339Nano))
			continue
		}
		require.False(t, seen, "revision #%d (LSN %s, saved %s) was written by run %s after the standby's run %s had taken over, and not by a run that opened the slot again (%s)",
			i, st.LSN, st.UpdatedAt.Format(time.RFC3339Nano), st.Run, run, again.Format(time.RFC3339Nano))
	}
	require.True(t, seen)
}

// first returns the run that wrote the first revision.
func (r *ckptRevs) first(t *testing.T) string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.NotEmpty(t, r.revs)
	return r.revs[0].Run
}

// streamsAgain returns when out (a bridge's text log since its resume)
// first says a run opened the slot ("msg=streaming"), zero when never.
func streamsAgain(t *testing.T, out string) time.Time {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, " msg=streaming ") || !strings.HasPrefix(line, "time=") {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		require.NoError(t, err, "log line %q", line)
		return at
	}
	return time.Time{}
}

func storedCount(t *testing.T, e *env, stream string) uint64 {
	t.Helper()
	nc, err := nats.Connect(e.natsURL(), e.natsOpts...)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := js.Stream(t.Context(), stream)
	require.NoError(t, err)
	return st.CachedInfo().State.Msgs
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestConfirmDelay: with checkpoint.confirm_delay the slot's
// confirmed_flush_lsn stays behind the KV checkpoint until the checkpoint
// is that old (Postgres keeps the WAL a NATS crash could need), then
// follows it; a restart resumes from the checkpoint, not the slot, so
// nothing is published twice.
func TestConfirmDelay(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE cd (id int PRIMARY KEY)`)
	conn := e.pg.Conn(t, "")
	confirmed := func() uint64 {
		var s string
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'slot_cdelay'`).Scan(&s))
		l, err := cdc.ParseLSN(s)
		require.NoError(t, err)
		return uint64(l)
	}
	withDelay := func(d string) string {
		cfg := e.config("cdelay", "")
		b, err := os.ReadFile(cfg)
		require.NoError(t, err)
		s := strings.Replace(string(b), "  interval: 200ms\n", "  interval: 200ms\n  confirm_delay: "+d+"\n", 1)
		require.NoError(t, os.WriteFile(cfg, []byte(s), 0o644))
		return cfg
	}

	r := e.start(withDelay("1h"))
	waitReady(t, r)
	start := confirmed()
	e.pg.ExecT(t, `INSERT INTO cd SELECT g FROM generate_series(1, 100) g`)
	var end string
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT pg_current_wal_lsn()::text`).Scan(&end))
	endLSN, err := cdc.ParseLSN(end)
	require.NoError(t, err)
	p := r.app.Pipelines()[0]
	require.Eventually(t, func() bool { return p.Checkpointed() > 0 && uint64(p.Checkpointed()) >= uint64(endLSN)-1024 }, time.Minute, 50*time.Millisecond)
	e.waitStored("CDC_cdelay", 100, time.Minute)
	ckpt := uint64(p.Checkpointed())
	require.Less(t, confirmed(), ckpt, "the slot was confirmed up to the checkpoint despite confirm_delay: 1h")
	r.stop(t) // the goodbye does not confirm an undue checkpoint either
	require.Equal(t, start, confirmed(), "confirmed_flush_lsn moved with confirm_delay: 1h")

	r = e.start(withDelay("300ms"))
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO cd SELECT g FROM generate_series(101, 150) g`)
	e.waitStored("CDC_cdelay", 150, time.Minute)
	require.Eventually(t, func() bool { return confirmed() >= ckpt }, time.Minute, 50*time.Millisecond,
		"the slot never caught up with the checkpoint once it was 300ms old")
	ms := e.messages("CDC_cdelay")
	checkOrdered(t, ms)
	require.Len(t, ms, 150, "the restart resumed from the checkpoint: nothing twice")
}
