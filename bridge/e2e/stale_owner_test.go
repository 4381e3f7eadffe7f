package e2e_test

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/checkpoint"
)

// Taking a source over from an owner that stalled (issue 34, part 2): a
// frozen owner's walsender keeps the slot until wal_sender_timeout (60 s
// here, Postgres' default), so the new owner ends it with
// pg_terminate_backend. The tests freeze the owner (SIGSTOP) for longer
// than the lease, or kill it, while a writer commits, and measure the time
// from the signal to the first change the other instance stores; they
// check that progress resumed while the frozen owner was still frozen,
// that every committed change is in the stream once and in order, and that
// the owner, once woken, writes nothing.

// frozenFor is how long an owner stays frozen: longer than the lease (5 s)
// and owner_timeout (5 s) with room, far shorter than wal_sender_timeout.
const frozenFor = 15 * time.Second

// streamWatch reads a stream's message count on one connection.
type streamWatch struct {
	js     jetstream.JetStream
	stream string
}

func newStreamWatch(t *testing.T, e *env, stream string) *streamWatch {
	t.Helper()
	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return &streamWatch{js: js, stream: stream}
}

// count returns the stream's message count; 0 when it cannot be read.
func (w *streamWatch) count() uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := w.js.Stream(ctx, w.stream)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// resumed is a measured takeover: times since the signal.
type resumed struct {
	slot   time.Duration // a new walsender holds the slot
	stored time.Duration // the stream holds a change stored since
}

// waitResumed waits, for up to within after from, until the slot is held
// by a walsender other than oldPID and the stream then grows: the other
// instance stores changes. poll runs at each look (nil: nothing).
func waitResumed(t *testing.T, conn *pgx.Conn, slot string, oldPID int, w *streamWatch, from time.Time, within time.Duration, poll func(time.Duration)) resumed {
	t.Helper()
	var r resumed
	var base uint64
	require.Eventually(t, func() bool {
		since := time.Since(from)
		if poll != nil {
			poll(since)
		}
		if r.slot == 0 {
			if pid := slotPID(t, conn, slot); pid == 0 || pid == oldPID {
				return false
			}
			// The old owner's publishes left before the signal (seconds
			// ago): what the stream gains from now on, the new reader
			// stored.
			r.slot, base = since, w.count()
			return false
		}
		if w.count() > base {
			r.stored = since
			return true
		}
		return false
	}, time.Until(from.Add(within)), 20*time.Millisecond, "no other instance stored a change within %s of the signal", within)
	return r
}

// keepFrozen waits until the owner signalled at from has been frozen for
// frozenFor, checking that the stream goes on growing meanwhile.
func keepFrozen(t *testing.T, w *streamWatch, from time.Time) {
	t.Helper()
	n := w.count()
	require.Eventually(t, func() bool { return time.Since(from) >= frozenFor && w.count() > n+50 },
		time.Until(from.Add(frozenFor+time.Minute)), 50*time.Millisecond, "the stream stopped growing while the owner was frozen")
}

// sigName names the signals the tests send.
func sigName(sig syscall.Signal) string {
	if sig == syscall.SIGKILL {
		return "SIGKILL"
	}
	return "SIGSTOP"
}

// countLines returns how many lines of log contain s.
func countLines(log, s string) int {
	n := 0
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

const (
	evictedLine = "ended the stale reader of the slot"
	heldLine    = "sink already holds changes past the checkpoint"
)

// TestFleetTakeoverFrozenOwner: two `bridge run --fleet` members (lease
// 5 s), the owner of the one source frozen with SIGSTOP for 15 s while a
// writer commits. The other member takes the lease, ends the frozen
// owner's walsender and streams before the owner wakes (without that, the
// walsender holds the slot until the owner wakes or wal_sender_timeout);
// after SIGCONT the woken owner writes no checkpoint, and the stream holds
// every committed change once, in order.
//
// Serial: a takeover, bounded in time, while members renew leases.
func TestFleetTakeoverFrozenOwner(t *testing.T) { fleetTakeover(t, syscall.SIGSTOP) }

// TestFleetTakeoverKilledOwner is TestFleetTakeoverFrozenOwner with SIGKILL:
// the walsender ends with the connection, and the other member streams once
// the lease expired.
//
// Serial: a takeover, bounded in time, while members renew leases.
func TestFleetTakeoverKilledOwner(t *testing.T) { fleetTakeover(t, syscall.SIGKILL) }

func fleetTakeover(t *testing.T, sig syscall.Signal) {
	bin := bridgeBinary(t)
	e := newEnv(t) // wal_sender_timeout: Postgres' default, 60 s
	srcs := fleetDatabases(t, e, 1)
	src := srcs[0]
	cfg := filepath.Join(e.dir, "fleet.yaml")
	fleetConfig(t, e, cfg, srcs, "v1")
	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	pg := e.pg.Conn(t, "")

	members := []*fleetProc{startFleetProc(t, bin, cfg, "ft", "p0"), startFleetProc(t, bin, cfg, "ft", "p1")}
	ls := waitOwned(t, js, pg, "ft", srcs, members, 2*time.Minute)
	owner, other := members[0], members[1]
	if ls[src.name] == other.id {
		owner, other = other, owner
	}
	t.Cleanup(func() { _ = owner.cmd.Process.Signal(syscall.SIGCONT) })
	revs := watchCheckpoints(t, e, checkpoint.Key("fleet", src.name))
	stopWriters := startWriters(t, e, srcs)
	defer stopWriters()
	e.waitStored(src.stream, 200, time.Minute)

	slot := "slot_" + src.name
	pid := slotPID(t, pg, slot)
	w := newStreamWatch(t, e, src.stream)
	signalled := time.Now()
	if sig == syscall.SIGKILL {
		owner.kill9(t)
	} else {
		require.NoError(t, owner.cmd.Process.Signal(sig))
	}
	var leaseAt time.Duration
	within := time.Minute
	if sig == syscall.SIGSTOP {
		within = frozenFor // progress must resume while the owner is frozen
	}
	r := waitResumed(t, pg, slot, pid, w, signalled, within, func(since time.Duration) {
		if leaseAt == 0 {
			if o := leases(t, js, "ft")[src.name]; o != "" && o != owner.id {
				leaseAt = since
			}
		}
	})
	t.Logf("%s of the owner (lease 5s): lease taken after %v, a new walsender after %v, first change stored by the other member after %v",
		sigName(sig), leaseAt.Round(time.Millisecond), r.slot.Round(time.Millisecond), r.stored.Round(time.Millisecond))
	e.waitStored(src.stream, int(w.count())+100, time.Minute) // the other member streams on
	otherRun := revs.waitOtherRun(t)
	require.Equal(t, other.id, otherRun, "the checkpoint's new writer should be the other member")

	if sig == syscall.SIGSTOP {
		require.Contains(t, other.log.String(), evictedLine, "the lease holder should have ended the frozen owner's walsender")
		keepFrozen(t, w, signalled)
		mark := len(owner.log.String())
		require.NoError(t, owner.cmd.Process.Signal(syscall.SIGCONT))
		require.Eventually(t, func() bool {
			return strings.Contains(owner.log.String()[mark:], "fleet: lease lost")
		}, time.Minute, 50*time.Millisecond, "the woken owner never noticed it lost the lease")
		e.waitStored(src.stream, int(w.count())+100, time.Minute) // writes go on after the wake-up
		t.Logf("woken owner:\n%s", lastLines(owner.log.String()[mark:], 8))
	}
	stopWriters()
	src.verify(t, e)
	// The former owner's run never saves after the other member's first
	// revision, and never streams the source again.
	revs.checkNoneAfter(t, otherRun, revs.first(t), time.Time{})
	// One line per run that opened the slot, not one per attempt.
	log := other.log.String()
	require.LessOrEqual(t, countLines(log, heldLine), countLines(log, " msg=streaming "),
		"%q should be logged once per run that owns the slot:\n%s", heldLine, log)
	other.term(t)
	if sig == syscall.SIGSTOP {
		owner.term(t)
	}
}

// plainConfig is e.config(name) with checkpoint.owner_timeout set.
func plainConfig(t *testing.T, e *env, name, ownerTimeout string) string {
	t.Helper()
	cfg := e.config(name, "")
	b, err := os.ReadFile(cfg)
	require.NoError(t, err)
	s := strings.Replace(string(b), "  interval: 200ms\n", "  interval: 200ms\n  owner_timeout: "+ownerTimeout+"\n", 1)
	require.NoError(t, os.WriteFile(cfg, []byte(s), 0o644))
	return cfg
}

// TestStandbyTakeoverFrozenOwner: two plain `bridge run` instances with
// checkpoint.owner_timeout: 5s; the owner frozen with SIGSTOP for 15 s
// while writers commit. The standby sees the owner's heartbeat stop, ends
// its walsender and streams before the owner wakes; the woken owner writes
// no checkpoint after the standby's, and the stream holds every committed
// change once, in order.
//
// Serial: a takeover, bounded in time, while members renew leases.
func TestStandbyTakeoverFrozenOwner(t *testing.T) { standbyTakeover(t, syscall.SIGSTOP) }

// TestStandbyTakeoverKilledOwner is TestStandbyTakeoverFrozenOwner with
// SIGKILL: the walsender ends with the connection; the standby's next
// attempt opens the slot.
//
// Serial: a takeover, bounded in time, while members renew leases.
func TestStandbyTakeoverKilledOwner(t *testing.T) { standbyTakeover(t, syscall.SIGKILL) }

func standbyTakeover(t *testing.T, sig syscall.Signal) {
	bin := bridgeBinary(t)
	e := newEnv(t) // wal_sender_timeout: Postgres' default, 60 s
	w := newTxnWorkload(t, e, "so", func() int { return 1 + rand.N(5) })
	t.Cleanup(func() { w.stopped.Store(true) })
	cfg := plainConfig(t, e, "plain", "5s")
	owner := startZProc(t, bin, cfg)
	waitSlotActive(t, e, "slot_plain")
	standby := startZProc(t, bin, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("owner:\n%s\nstandby:\n%s", tail(owner.out.String(), 60), tail(standby.out.String(), 60))
		}
	})
	revs := watchCheckpoints(t, e, checkpoint.Key("plain", "app"))
	conn := e.pg.Conn(t, "")
	// The standby waits for the slot.
	require.Eventually(t, func() bool { return strings.Contains(standby.out.String(), "is active for PID") },
		time.Minute, 50*time.Millisecond, "the standby never tried the slot")

	wait := w.run(2, 1<<30, 5*time.Millisecond)
	e.waitStored("CDC_plain", 500, time.Minute)
	pid := slotPID(t, conn, "slot_plain")
	sw := newStreamWatch(t, e, "CDC_plain")
	signalled := time.Now()
	within := time.Minute
	if sig == syscall.SIGKILL {
		require.NoError(t, owner.cmd.Process.Signal(sig))
		<-owner.done
	} else {
		owner.signal(t, sig)
		within = frozenFor
	}
	r := waitResumed(t, conn, "slot_plain", pid, sw, signalled, within, nil)
	t.Logf("%s of the owner (owner_timeout 5s): a new walsender after %v, first change stored by the standby after %v",
		sigName(sig), r.slot.Round(time.Millisecond), r.stored.Round(time.Millisecond))
	e.waitStored("CDC_plain", int(sw.count())+500, time.Minute)
	standbyRun := revs.waitOtherRun(t)

	var again time.Time
	if sig == syscall.SIGSTOP {
		require.Contains(t, standby.out.String(), evictedLine, "the standby should have ended the frozen owner's walsender")
		keepFrozen(t, sw, signalled)
		mark := len(owner.out.String())
		owner.signal(t, syscall.SIGCONT)
		require.Eventually(t, func() bool {
			out := owner.out.String()[mark:]
			return strings.Contains(out, "run ended") || strings.Contains(out, "pipeline stopped")
		}, time.Minute, 50*time.Millisecond, "the woken owner never noticed it lost the slot")
		e.waitStored("CDC_plain", int(sw.count())+500, time.Minute) // writes go on after the wake-up
		again = streamsAgain(t, owner.out.String()[mark:])
		t.Logf("woken owner:\n%s", lastLines(owner.out.String()[mark:], 8))
	}
	w.stopped.Store(true)
	wait()
	w.verify(t, e, "CDC_plain")
	// The former owner's run from before the signal never saves after the
	// standby's first revision (a new run of it that opened the slot again
	// later may).
	revs.checkNoneAfter(t, standbyRun, revs.first(t), again)
	out := standby.out.String()
	require.LessOrEqual(t, countLines(out, heldLine), countLines(out, " msg=streaming "),
		"%q should be logged once per run that owns the slot:\n%s", heldLine, out)
}

// TestStandbyHealthyOwnerNotTerminated: with checkpoint.owner_timeout: 5s a
// standby retries the slot for 20 s (four timeouts) while the owner is
// healthy, first streaming a writer's changes, then idle: the owner's
// heartbeat keeps changing, so the standby never ends its walsender, and
// the slot keeps its reader throughout.
//
// Serial: a takeover, bounded in time, while members renew leases.
func TestStandbyHealthyOwnerNotTerminated(t *testing.T) {
	bin := bridgeBinary(t)
	e := newEnv(t)
	w := newTxnWorkload(t, e, "ho", func() int { return 1 + rand.N(5) })
	t.Cleanup(func() { w.stopped.Store(true) })
	cfg := plainConfig(t, e, "healthy", "5s")
	owner := startZProc(t, bin, cfg)
	waitSlotActive(t, e, "slot_healthy")
	standby := startZProc(t, bin, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("owner:\n%s\nstandby:\n%s", tail(owner.out.String(), 60), tail(standby.out.String(), 60))
		}
	})
	conn := e.pg.Conn(t, "")
	pid := slotPID(t, conn, "slot_healthy")
	require.Eventually(t, func() bool { return strings.Contains(standby.out.String(), "is active for PID") },
		time.Minute, 50*time.Millisecond, "the standby never tried the slot")

	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	store, err := checkpoint.Open(t.Context(), js, "bridge_checkpoints", 1)
	require.NoError(t, err)
	key := checkpoint.OwnerKey("healthy", "app")
	first, err := store.LoadOwner(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, pid, first.PID, "the owner's heartbeat should name the slot's walsender")

	var connMu sync.Mutex // require.Never may return with a call of its condition under way
	untouched := func() bool {
		connMu.Lock()
		defer connMu.Unlock()
		return slotPID(t, conn, "slot_healthy") != pid || strings.Contains(standby.out.String(), evictedLine) ||
			strings.Contains(owner.out.String(), "run ended")
	}
	wait := w.run(2, 1<<30, 5*time.Millisecond)
	require.Never(t, untouched, 10*time.Second, 100*time.Millisecond, "the owner was disturbed while streaming")
	w.stopped.Store(true)
	wait()
	require.Never(t, untouched, 10*time.Second, 100*time.Millisecond, "the owner was disturbed while idle")
	last, err := store.LoadOwner(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, pid, last.PID)
	require.Greater(t, last.Revision, first.Revision, "the owner's heartbeat should keep changing")
	require.Greater(t, countLines(standby.out.String(), "is active for PID"), 3, "the standby should have kept trying the slot")
	w.verify(t, e, "CDC_healthy")
	t.Logf("the standby tried the slot %d times in 20s; the owner's heartbeat went from revision %d to %d",
		countLines(standby.out.String(), "is active for PID"), first.Revision, last.Revision)
}
