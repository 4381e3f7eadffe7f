package e2e_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// snapKills is how many times TestSnapshotKill9Random kills the bridge per
// case: 4, times KILL_FACTOR.
func snapKills(t *testing.T) int { return 4 * killFactor(t) }

// TestSnapshotKill9Random kills the bridge with SIGKILL at random moments
// of an initial snapshot while a writer changes the table, with a 1 s
// duplicate window (so the window cannot hide a row sent twice), in every
// configuration the docs allow: plain, with checkpoint.confirm_delay (the
// slot confirmed seconds after the checkpoint), with fan-out routes (every
// row twice into one stream, ids told apart by their destination), and
// with two streams. Every message id must be stored once per stream, every
// change the writer committed once, and the stream must leave the table's
// rows. Each process runs with debug logs, which name the chunks each run
// sent and counted and what the sinks held; they are printed on failure.
func TestSnapshotKill9Random(t *testing.T) {
	defer parallel(t)()
	for _, tc := range []struct {
		name string
		// rows per kill, rows per chunk, and how long a process lives at least
		rows, chunk int
		minLife     time.Duration
		edit        func(t *testing.T, e *env, p string)
		// streams and subject prefixes to check: each holds the table whole
		checks [][2]string
	}{
		{name: "plain", checks: [][2]string{{"CDC_%s", ""}}},
		// The slot is confirmed 2 s after each checkpoint: a process
		// lives past that, so that it is killed with chunks checkpointed
		// and not yet confirmed.
		{name: "confirm_delay", rows: 4000, chunk: 10, minLife: 2200 * time.Millisecond, edit: func(t *testing.T, e *env, p string) {
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			y := strings.Replace(string(b), "checkpoint:\n  interval: 200ms\n", "checkpoint:\n  interval: 200ms\n  confirm_delay: 2s\n", 1)
			require.Contains(t, y, "confirm_delay: 2s")
			require.NoError(t, os.WriteFile(p, []byte(y), 0o644))
		}, checks: [][2]string{{"CDC_%s", ""}}},
		{name: "fanout", edit: func(t *testing.T, e *env, p string) {
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			y := string(b)
			i := strings.Index(y, "routes:\n")
			name := strings.TrimPrefix(y[:strings.Index(y, "\n")], "name: ")
			y = y[:i] + fmt.Sprintf("routes:\n  - name: one\n    continue: true\n    sinks: [js]\n    subject: \"cdc.%[1]s.one.{{.Table}}\"\n"+
				"  - name: two\n    sinks: [js]\n    subject: \"cdc.%[1]s.two.{{.Table}}\"\n", name)
			require.NoError(t, os.WriteFile(p, []byte(y), 0o644))
		}, checks: [][2]string{{"CDC_%s", "cdc.%s.one."}, {"CDC_%s", "cdc.%s.two."}}},
		{name: "two_streams", edit: func(t *testing.T, e *env, p string) {
			// Two routes, each to a stream of its own.
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			y := string(b)
			name := strings.TrimPrefix(y[:strings.Index(y, "\n")], "name: ")
			y = strings.Replace(y, "sinks:\n  js:\n", fmt.Sprintf("sinks:\n  js2:\n    type: nats_jetstream\n    config:\n      stream: CDC2_%[1]s\n      subjects: [\"cdc2.%[1]s.>\"]\n      duplicate_window: 1s\n  js:\n", name), 1)
			i := strings.Index(y, "routes:\n")
			y = y[:i] + fmt.Sprintf("routes:\n  - name: one\n    continue: true\n    sinks: [js]\n    subject: \"cdc.%[1]s.{{.Table}}\"\n"+
				"  - name: two\n    sinks: [js2]\n    subject: \"cdc2.%[1]s.{{.Table}}\"\n", name)
			require.NoError(t, os.WriteFile(p, []byte(y), 0o644))
		}, checks: [][2]string{{"CDC_%s", ""}, {"CDC2_%s", ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer parallelLong(t)() // each case has servers of its own
			bin := bridgeBinary(t)
			e := newEnv(t)
			kills := snapKills(t)
			n := max(10000, 2500*kills) // about 6 chunks per kill, and more
			if tc.rows > 0 {
				n = tc.rows * kills
			}
			e.pg.ExecT(t, `CREATE TABLE big (id bigint PRIMARY KEY, v bigint NOT NULL, pad text)`,
				fmt.Sprintf(`INSERT INTO big SELECT g, g, repeat('z', 200) FROM generate_series(1, %d) g`, n), `ANALYZE big`)
			name := "sr" + strings.ReplaceAll(tc.name, "_", "")
			chunk := 40
			if tc.chunk > 0 {
				chunk = tc.chunk
			}
			cfg := e.snapConfig(name, "initial", chunk)
			if tc.edit != nil {
				tc.edit(t, e, cfg)
			}
			var outs []*syncBuffer
			t.Cleanup(func() {
				if t.Failed() {
					for i, o := range outs {
						t.Logf("bridge process %d of %d:\n%s", i+1, len(outs), o.String())
					}
				}
			})
			start := func() *proc {
				out := &syncBuffer{}
				outs = append(outs, out)
				cmd := exec.Command(bin, "run", "-c", cfg, "--log-level", "debug")
				cmd.Stdout, cmd.Stderr = out, out
				cmd.Env = append(os.Environ(), "BRIDGE_LOG__FORMAT=text")
				require.NoError(t, cmd.Start())
				return &proc{cmd: cmd, out: out}
			}
			seed := uint64(time.Now().UnixNano())
			rng := rand.New(rand.NewPCG(seed, 0))
			t.Logf("seed %d", seed)
			p := start()
			began := time.Now()
			waitSlotActive(t, e, "slot_"+name)
			w := startSnapWriter(t, e, "big", 1_000_000, int64(n), 2*time.Millisecond)
			killed := 0
			for killed < kills {
				// Let the snapshot count a random few chunks more (none
				// at times), then kill it a random moment later: between
				// a chunk and its checkpoint, or between the checkpoint
				// and the progress.
				st, _ := e.snapState(name)
				target := int64(rng.IntN(7))
				if st.Current != nil && len(st.Current.Tables) > 0 {
					target += st.Current.Tables[0].Chunks
				}
				require.Eventually(t, func() bool {
					st, ok := e.snapState(name)
					return ok && (st.Current == nil && st.Last != nil ||
						st.Current != nil && len(st.Current.Tables) > 0 && st.Current.Tables[0].Chunks >= target)
				}, 2*time.Minute, 20*time.Millisecond, "no snapshot progress")
				time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
				if tc.minLife > 0 {
					life := tc.minLife + time.Duration(rng.IntN(1000))*time.Millisecond
					time.Sleep(life - time.Since(began))
				}
				if st, _ := e.snapState(name); st.Current == nil {
					break // finished
				}
				p.kill9(t)
				killed++
				p, began = start(), time.Now()
			}
			st := e.waitSnapshotDone(name, 5*time.Minute, nil)
			w.halt()
			t.Logf("killed the bridge %d times during the snapshot; %d chunks", killed, st.Last.Tables[0].Chunks)
			for _, c := range tc.checks {
				stream := fmt.Sprintf(c[0], name)
				ms := e.marker(stream)
				if c[1] != "" {
					prefix := fmt.Sprintf(c[1], name)
					var sub []msg
					for _, m := range ms {
						if strings.HasPrefix(m.Subject, prefix) {
							sub = append(sub, m)
						}
					}
					ms = sub
				}
				checkSnapshotStream(t, e, name, ms, []string{"public.big"}, w)
			}
			p.term(t)
		})
	}
}

// TestSnapshotProgressFollowsCheckpoint: with checkpoint.confirm_delay the
// slot is confirmed long after the checkpoint; snapshot progress follows
// the checkpoint, with its sink cursors, not the slot's confirmation (a
// chunk counted at the confirmation while the resume scan started at a
// newer checkpoint's cursors left copies that no later run found).
func TestSnapshotProgressFollowsCheckpoint(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE cd (id int PRIMARY KEY, v int)`, `INSERT INTO cd SELECT g, g FROM generate_series(1, 500) g`)
	p := e.snapConfig("scd", "initial", 100)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	y := strings.Replace(string(b), "checkpoint:\n  interval: 200ms\n", "checkpoint:\n  interval: 200ms\n  confirm_delay: 1h\n", 1)
	require.Contains(t, y, "confirm_delay: 1h")
	require.NoError(t, os.WriteFile(p, []byte(y), 0o644))
	e.start(p)
	st := e.waitSnapshotDone("scd", time.Minute, nil)
	require.EqualValues(t, 500, st.Last.Tables[0].Rows)
	require.Equal(t, "complete", st.Last.Outcome())

	// The slot is not confirmed past the reads: the delay holds it back.
	ms := e.marker("CDC_scd")
	require.Equal(t, 500, countReads(ms)["cd"])
	var last string
	for _, m := range ms {
		if m.Body["op"] == "read" {
			last, _ = m.Body["commit_lsn"].(string)
		}
	}
	require.NotEmpty(t, last, "reads carry their high watermark's commit_lsn")
	var behind bool
	var confirmed string
	require.NoError(t, e.pg.Conn(t, "").QueryRow(t.Context(),
		`SELECT confirmed_flush_lsn < $1::pg_lsn, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'slot_scd'`, last).Scan(&behind, &confirmed))
	require.True(t, behind, "slot confirmed at %s, past the last read at %s, though confirm_delay is 1h", confirmed, last)
	checkSnapshotStream(t, e, "scd", ms, []string{"public.cd"}, nil)
}
