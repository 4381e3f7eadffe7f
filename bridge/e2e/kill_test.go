package e2e_test

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// proc is a bridge process started from the built binary.
type proc struct {
	cmd *exec.Cmd
	out fmt.Stringer // its output
}

func startProc(t *testing.T, bin, cfg string) *proc {
	t.Helper()
	return startProcEnv(t, bin, cfg)
}

// startProcEnv is startProc with environment variables of the process's
// own ("KEY=value"): a parallel test cannot t.Setenv.
func startProcEnv(t *testing.T, bin, cfg string, env ...string) *proc {
	t.Helper()
	out := &syncBuffer{}
	cmd := exec.Command(bin, "run", "-c", cfg)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(append(os.Environ(), "BRIDGE_LOG__FORMAT=text"), env...)
	if dir := os.Getenv("E2E_PROC_LOGS"); dir != "" {
		// Every process's whole output in a file of its own, at debug
		// level: what a rare failure of a kill test needs, the runs
		// before the last.
		f, err := os.CreateTemp(dir, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())+"-*.log")
		require.NoError(t, err)
		t.Cleanup(func() { _ = f.Close() })
		w := io.MultiWriter(out, f)
		cmd.Stdout, cmd.Stderr = w, w
		cmd.Env = append(cmd.Env, "BRIDGE_LOG__LEVEL=debug")
	}
	require.NoError(t, cmd.Start())
	return &proc{cmd: cmd, out: out}
}

func (p *proc) kill9(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
}

func (p *proc) term(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "bridge exited badly after SIGTERM:\n%s", p.out.String())
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		t.Fatalf("bridge did not exit within 20s of SIGTERM:\n%s", p.out.String())
	}
}

// TestKill9MidStream kills the bridge process with SIGKILL at random moments
// while four writers commit about 50k changes, restarting it each time, with
// a 1 s duplicate window so JetStream's dedupe alone cannot hide a replay.
// It runs with transactions published message by message, as atomic
// batches, and as fast-ingest batches (fast_batch, whose acks cover runs of
// messages), unfenced and fenced.
func TestKill9MidStream(t *testing.T) {
	defer parallel(t)()
	for _, tc := range []struct {
		name    string
		options []string
		changes int
		bulk    int
	}{
		{"per_message", nil, 50000, 0},
		// Small transactions as atomic batches go at a few hundred per
		// second (docs/operations.md#atomic-transactions).
		{"atomic", []string{"atomic_transactions: true"}, 20000, 0},
		{"fast_batch", []string{"fast_batch: true", "expect_last_sequence: false"}, 30000, 0},
		// Fenced: a Write's first change alone, the rest as one fast batch
		// whose every message carries its expected last sequence.
		{"fast_batch_fenced", []string{"fast_batch: true"}, 30000, 0},
		// Transactions of up to 4000 changes among the small ones: handed
		// to the writer in parts of 1000, spilled to disk past 2048.
		{"large_txns", nil, 60000, 4000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer parallelLong(t)() // each case has servers of its own
			kill9MidStream(t, 0, tc.options, tc.changes, tc.bulk, 12)
		})
	}
	// The version matrix: the other majors run the message-by-message case
	// at a tenth of the size (5000 changes, 4 kills at least): the
	// exactly-once machinery is the bridge's own, the same on every major;
	// what a major may change is how its walsender resumes a slot, which
	// a few kills cover.
	for _, m := range pgtest.Majors() {
		if m == pgtest.DefaultMajor {
			continue // the cases above
		}
		t.Run(fmt.Sprintf("pg%d_per_message", m), func(t *testing.T) {
			defer parallel(t)()
			kill9MidStream(t, m, nil, 5000, 0, 4)
		})
	}
}

func kill9MidStream(t *testing.T, major int, options []string, changes, bulk, minKills int) {
	if testing.Short() {
		changes = min(changes, 10000)
	}
	bin := bridgeBinary(t)
	e := newEnvMajor(t, major)
	w := newWorkload(t, e)
	w.bulk = bulk
	cfg := e.config("kill", "")
	for _, o := range options {
		setSinkOption(t, cfg, o)
	}

	p := startProc(t, bin, cfg)
	// Let it create the publication and slot before the writers start.
	waitSlotActive(t, e, "slot_kill")
	p, kills := killWhileWriting(t, p, bin, cfg, w, changes, minKills)
	w.verifyExactlyOnce(t, e, "CDC_kill")
	p.term(t)
	// A clean stop writes the final checkpoint and confirms it to Postgres.
	var confirmed string
	require.NoError(t, e.pg.Conn(t, "").QueryRow(t.Context(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'slot_kill'`).Scan(&confirmed))
	got, err := cdc.ParseLSN(confirmed)
	require.NoError(t, err)
	last := e.lastMessage("CDC_kill").Pos.LSN
	require.GreaterOrEqual(t, uint64(got), uint64(last),
		"after SIGTERM the slot must be confirmed up to the last published commit %s, got %s", last, got)
	t.Logf("slot confirmed_flush_lsn after stop: %s, last commit %s (kills: %s)", confirmed, last, strconv.Itoa(kills))
}

// killWhileWriting starts four writers committing about changes changes
// and meanwhile kills the bridge p with SIGKILL at random moments,
// restarting it from cfg each time (now and then after a pause), until
// the writers are done and it was killed at least minKills times. It
// returns the bridge running last and how often it was killed.
func killWhileWriting(t *testing.T, p *proc, bin, cfg string, w *workload, changes, minKills int) (*proc, int) {
	t.Helper()
	f := killFactor(t)
	changes, minKills = changes*f, minKills*f
	done := make(chan struct{})
	go func() {
		w.run(t, 4, changes, 500*time.Microsecond)()
		close(done)
	}()
	kills := 0
	writing := true
	for writing || kills < minKills {
		time.Sleep(time.Duration(200+rand.N(1200)) * time.Millisecond)
		p.kill9(t)
		kills++
		if rand.N(3) == 0 {
			time.Sleep(time.Duration(rand.N(1500)) * time.Millisecond)
		}
		p = startProc(t, bin, cfg)
		select {
		case <-done:
			writing = false
		default:
		}
	}
	t.Logf("killed the bridge %d times while %d changes were committed", kills, w.total.Load())
	return p, kills
}

// killFactor multiplies the kills (and the changes written meanwhile) of
// the kill tests: KILL_FACTOR=10 runs them at 10× their usual count, as a
// change to identity, the fence, the resume scan or the checkpoint needs.
func killFactor(t *testing.T) int {
	t.Helper()
	s := os.Getenv("KILL_FACTOR")
	if s == "" {
		return 1
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, "KILL_FACTOR")
	require.Positive(t, n, "KILL_FACTOR")
	return n
}
