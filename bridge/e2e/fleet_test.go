package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/fleet"
	"github.com/bridgecdc/bridge/bridge/status"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// fleetProc is a `bridge run --fleet` process.
type fleetProc struct {
	*proc
	log  *syncBuffer // its output
	id   string      // its member id (instance), from its log
	name string
}

var memberRe = regexp.MustCompile(`msg="fleet member".* member=(\S+)`)

// startFleetProc starts `bridge run --fleet fleetName` with cfg and the
// extra environment variables env, and waits until it joined.
func startFleetProc(t *testing.T, bin, cfg, fleetName, name string, env ...string) *fleetProc {
	t.Helper()
	out := &syncBuffer{}
	cmd := exec.Command(bin, "run", "-c", cfg, "--fleet", fleetName)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(append(os.Environ(), "BRIDGE_LOG__FORMAT=text"), env...)
	require.NoError(t, cmd.Start())
	p := &fleetProc{proc: &proc{cmd: cmd, out: out}, log: out, name: name}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("output of %s (%s):\n%s", p.name, p.id, tail(p.log.String(), 60))
		}
	})
	require.Eventually(t, func() bool {
		if m := memberRe.FindStringSubmatch(out.String()); m != nil {
			p.id = m[1]
			return true
		}
		return false
	}, 60*time.Second, 20*time.Millisecond, "bridge %s never joined the fleet:\n%s", name, out)
	return p
}

func tail(s string, lines int) string {
	ls := strings.Split(s, "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// fleetSource is one source of the fleet test: a database with one writer.
type fleetSource struct {
	name   string // dbNN: source, database, slot and publication suffix
	stream string
	mu     sync.Mutex
	ns     []int // the n of every committed row, in commit order
}

// fleetConfig writes the fleet's bridge.yaml: one pgoutput source per
// database, each to its own stream through its own route, whose subject
// carries version, on e's NATS server.
func fleetConfig(t *testing.T, e *env, path string, srcs []*fleetSource, version string) {
	t.Helper()
	fleetConfigOn(t, e, path, srcs, version, e.natsURL(), 1)
}

// fleetConfigOn is fleetConfig on the NATS servers urls, with streams and
// buckets of replicas.
func fleetConfigOn(t *testing.T, e *env, path string, srcs []*fleetSource, version, urls string, replicas int) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "name: fleet\ndata_dir: %s\nnats:\n  url: %s\ncheckpoint:\n  interval: 200ms\n  replicas: %d\nhttp:\n  listen: \"127.0.0.1:0\"\nsources:\n", filepath.Join(e.dir, "data"), urls, replicas)
	for _, s := range srcs {
		fmt.Fprintf(&b, "  %s:\n    type: pgoutput\n    config:\n      dsn: %s\n      slot: slot_%s\n      publication: pub_%s\n", s.name, e.pg.DSN(s.name), s.name, s.name)
	}
	b.WriteString("sinks:\n")
	for _, s := range srcs {
		fmt.Fprintf(&b, "  js_%s:\n    type: nats_jetstream\n    config:\n      stream: %s\n      subjects: [\"fleet.%s.>\"]\n      duplicate_window: 1s\n      replicas: %d\n      ack_timeout: 5s\n", s.name, s.stream, s.name, replicas)
	}
	b.WriteString("routes:\n")
	for _, s := range srcs {
		fmt.Fprintf(&b, "  - match: {sources: [%s]}\n    sinks: [js_%s]\n    subject: \"fleet.%s.%s.{{.Table}}\"\n", s.name, s.name, s.name, version)
	}
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(b.String()), 0o644))
	require.NoError(t, os.Rename(tmp, path))
}

// write commits transactions of 1 to 3 rows into s's database until stop
// is closed, recording each committed row's n.
func (s *fleetSource) write(t *testing.T, dsn string, stop <-chan struct{}, pace time.Duration) {
	ctx := context.Background()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(ctx)
		}
	}()
	n := 0
	for {
		select {
		case <-stop:
			return
		default:
		}
		if conn == nil {
			c, err := pgx.Connect(ctx, dsn)
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			conn = c
		}
		k := 1 + rand.N(3)
		var batch []int
		tx, err := conn.Begin(ctx)
		if err == nil {
			for i := 0; i < k && err == nil; i++ {
				batch = append(batch, n+i+1)
				_, err = tx.Exec(ctx, `INSERT INTO t (n) VALUES ($1)`, n+i+1)
			}
			if err == nil {
				err = tx.Commit(ctx)
			} else {
				_ = tx.Rollback(ctx)
			}
		}
		if err != nil {
			t.Errorf("writer %s: %v", s.name, err) // Postgres stays up in this test: a commit must not fail
			return
		}
		n += k
		s.mu.Lock()
		s.ns = append(s.ns, batch...)
		s.mu.Unlock()
		time.Sleep(pace)
	}
}

// verify checks that s's stream holds every committed row exactly once, in
// commit order, and returns how many messages carry each route version.
func (s *fleetSource) verify(t *testing.T, e *env) map[string]int {
	t.Helper()
	return s.verifyRead(t, func(n int) []msg { return e.waitCount(s.stream, n, 3*time.Minute) })
}

// verifyRead is verify with the stream read by read, which waits for at
// least n messages.
func (s *fleetSource) verifyRead(t *testing.T, read func(n int) []msg) map[string]int {
	t.Helper()
	s.mu.Lock()
	want := append([]int{}, s.ns...)
	s.mu.Unlock()
	ms := read(len(want))
	checkOrdered(t, ms)
	got := make([]int, 0, len(ms))
	versions := map[string]int{}
	for _, m := range ms {
		a, _ := m.Body["after"].(map[string]any)
		n, _ := a["n"].(float64)
		got = append(got, int(n))
		versions[strings.Split(m.Subject, ".")[2]]++
	}
	require.Equal(t, want, got, "source %s: the stream must hold every committed row once, in commit order", s.name)
	return versions
}

// leases reads the fleet's leases: source → owner ("" when released).
func leases(t *testing.T, js jetstream.JetStream, name string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := fleet.ReadStatus(ctx, js, name)
	if err != nil {
		return map[string]string{}
	}
	out := map[string]string{}
	for _, l := range st.Leases {
		out[l.Source] = l.Owner
	}
	return out
}

// slotPIDs reads the walsender pid of every active slot.
func slotPIDs(t *testing.T, conn *pgx.Conn) map[string]int {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT slot_name, coalesce(active_pid, 0) FROM pg_replication_slots WHERE active`)
	require.NoError(t, err)
	out := map[string]int{}
	for rows.Next() {
		var s string
		var pid int
		require.NoError(t, rows.Scan(&s, &pid))
		out[s] = pid
	}
	require.NoError(t, rows.Err())
	return out
}

// fleetDatabases creates n databases db00, db01... on e's Postgres, each
// with a table t, and returns them as sources.
func fleetDatabases(t *testing.T, e *env, n int) []*fleetSource {
	t.Helper()
	var srcs []*fleetSource
	for i := 0; i < n; i++ {
		s := &fleetSource{name: fmt.Sprintf("db%02d", i), stream: fmt.Sprintf("FLEET_DB%02d", i)}
		e.pg.ExecT(t, "CREATE DATABASE "+s.name)
		require.NoError(t, e.pg.Exec(t.Context(), s.name, `CREATE TABLE t (id bigserial PRIMARY KEY, n int NOT NULL)`))
		srcs = append(srcs, s)
	}
	return srcs
}

// startWriters starts one writer per source, each committing every 20 ms;
// the function returned stops them and waits (once).
func startWriters(t *testing.T, e *env, srcs []*fleetSource) func() {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range srcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.write(t, e.pg.DSN(s.name), stop, 20*time.Millisecond)
		}()
	}
	return sync.OnceFunc(func() { close(stop); wg.Wait() })
}

// waitOwned waits until every source of srcs has a lease of fleet
// fleetName held by one of members and a walsender on its slot, and
// returns the leases.
func waitOwned(t *testing.T, js jetstream.JetStream, pg *pgx.Conn, fleetName string, srcs []*fleetSource, members []*fleetProc, within time.Duration) map[string]string {
	t.Helper()
	ids := map[string]bool{}
	for _, p := range members {
		ids[p.id] = true
	}
	var ls map[string]string
	require.Eventually(t, func() bool {
		ls = leases(t, js, fleetName)
		for _, s := range srcs {
			if !ids[ls[s.name]] {
				return false
			}
		}
		return len(slotPIDs(t, pg)) == len(srcs)
	}, within, 50*time.Millisecond, "not every source is owned by %v and streaming: %v", sortedStrings(ids), ls)
	return ls
}

// takeover is one measured takeover of a killed member's sources.
type takeover struct {
	sources      int
	lease, slot  time.Duration // until every source had a new lease owner; a new walsender
	leaseBySrc   []time.Duration
	streamBySrce []time.Duration
}

// TestFleet runs three `bridge run --fleet` processes over 12 sources (12
// databases), kills one with SIGKILL at random moments (restarting it),
// adds a fourth, stops one with SIGTERM and reloads a changed route, while
// one writer per database commits. Every committed change of every source
// must be in its stream exactly once, in commit order; the takeover after
// each kill is measured (until each source has a new lease owner, and until
// a new walsender streams from its slot) and logged with p50 and max.
// TEST_LONG=1 writes for longer and kills more often.
//
// Serial: it measures the takeover times, and the members' lease renewals
// must keep their 5 s lease.
func TestFleet(t *testing.T) {
	const nsrc = 12
	kills, writeFor := 2, 20*time.Second
	if os.Getenv("TEST_LONG") == "1" {
		kills, writeFor = 8, 3*time.Minute
	}
	bin := bridgeBinary(t)
	e := newEnvWith(t, pgtest.Options{Settings: map[string]string{"max_wal_senders": "40", "max_replication_slots": "40"}})
	srcs := fleetDatabases(t, e, nsrc)
	cfg := filepath.Join(e.dir, "fleet.yaml")
	fleetConfig(t, e, cfg, srcs, "v1")

	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	pg := e.pg.Conn(t, "")

	procs := []*fleetProc{}
	for i := 0; i < 3; i++ {
		procs = append(procs, startFleetProc(t, bin, cfg, "f1", fmt.Sprintf("p%d", i)))
	}
	allOwned := func(members []*fleetProc, within time.Duration) map[string]string {
		t.Helper()
		return waitOwned(t, js, pg, "f1", srcs, members, within)
	}
	spread := func(ls map[string]string) map[string]int {
		c := map[string]int{}
		for _, o := range ls {
			c[o]++
		}
		return c
	}
	ls := allOwned(procs, 2*time.Minute)
	t.Logf("3 members: %v", spread(ls))

	stopWriters := startWriters(t, e, srcs)
	defer stopWriters()

	// Kill -9 a random member at random moments, measuring each takeover,
	// and start a new process in its place.
	var takeovers []takeover
	deadline := time.Now().Add(writeFor)
	for k := 0; k < kills || time.Now().Before(deadline); k++ {
		time.Sleep(time.Duration(500+rand.N(2500)) * time.Millisecond)
		i := rand.N(len(procs))
		victim := procs[i]
		before := leases(t, js, "f1")
		pids := slotPIDs(t, pg)
		var its []string
		for s, o := range before {
			if o == victim.id {
				its = append(its, s)
			}
		}
		killed := time.Now()
		victim.kill9(t)
		tk := takeover{sources: len(its)}
		leaseAt, slotAt := map[string]time.Duration{}, map[string]time.Duration{}
		require.Eventually(t, func() bool {
			now := time.Since(killed)
			ls := leases(t, js, "f1")
			cur := slotPIDs(t, pg)
			for _, s := range its {
				if _, ok := leaseAt[s]; !ok && ls[s] != "" && ls[s] != victim.id {
					leaseAt[s] = now
				}
				if pid, ok := cur["slot_"+s]; ok && pid != pids["slot_"+s] {
					if _, seen := slotAt[s]; !seen {
						slotAt[s] = now
					}
				}
			}
			return len(leaseAt) == len(its) && len(slotAt) == len(its)
		}, time.Minute, 20*time.Millisecond, "the sources %v of killed member %s were not taken over", its, victim.id)
		for _, s := range its {
			tk.leaseBySrc = append(tk.leaseBySrc, leaseAt[s])
			tk.streamBySrce = append(tk.streamBySrce, slotAt[s])
			tk.lease, tk.slot = max(tk.lease, leaseAt[s]), max(tk.slot, slotAt[s])
		}
		takeovers = append(takeovers, tk)
		t.Logf("kill -9 of %s (%d sources): leases taken over after %v, streaming again after %v", victim.name, len(its), tk.lease, tk.slot)
		procs[i] = startFleetProc(t, bin, cfg, "f1", fmt.Sprintf("p%d'", i))
		ls = allOwned(procs, time.Minute)
	}

	// A fourth member takes its share.
	procs = append(procs, startFleetProc(t, bin, cfg, "f1", "p3"))
	require.Eventually(t, func() bool {
		c := spread(leases(t, js, "f1"))
		for _, p := range procs {
			if c[p.id] != 3 {
				return false
			}
		}
		return true
	}, time.Minute, 50*time.Millisecond, "four members should hold 3 sources each")
	ls = allOwned(procs, time.Minute)
	t.Logf("4 members: %v", spread(ls))

	// One member stops (SIGTERM): its sources are handed over at once.
	gone := procs[0]
	procs = procs[1:]
	termAt := time.Now()
	gone.term(t)
	ls = allOwned(procs, time.Minute)
	t.Logf("SIGTERM of %s: its sources streaming elsewhere %v after the signal; spread %v", gone.name, time.Since(termAt), spread(ls))

	// Control plane: every member answers status, with the fleet and the
	// sources it holds, together each source once.
	out, err := exec.Command(bin, "status", "-c", cfg, "-o", "json").CombinedOutput()
	require.NoError(t, err, "%s", out)
	var st status.Report
	require.NoError(t, json.Unmarshal(out, &st), "%s", out)
	require.Equal(t, "control", st.Via)
	require.Len(t, st.Instances, len(procs))
	members := map[string]bool{}
	for _, in := range st.Instances {
		require.Equal(t, "f1", in.Fleet, "instance %s", in.ID)
		members[in.ID] = true
	}
	held := map[string]string{}
	for _, s := range st.Sources {
		require.NotNil(t, s.Running, "source %s: no member reports it", s.Name)
		require.True(t, s.Running.Holder && members[s.Running.Instance], "source %s: %+v", s.Name, s.Running)
		require.Empty(t, s.Running.Others, "source %s runs on one member only", s.Name)
		held[s.Name] = s.Running.Instance
	}
	require.Len(t, held, nsrc, "the members' status together should list every source: %s", out)
	out, err = exec.Command(bin, "fleet", "status", "f1", "-c", cfg).CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, p := range procs {
		require.Contains(t, string(out), p.id)
	}
	t.Logf("bridge fleet status:\n%s", out)

	// A changed route, reloaded on every member: config.watch sees the
	// file change, and `bridge reload` asks every member through the
	// control plane; either way each must end on the new revision.
	revs := map[string]bool{}
	for _, in := range st.Instances {
		revs[in.ConfigRev] = true
	}
	require.Len(t, revs, 1, "the members should share one configuration revision")
	fleetConfig(t, e, cfg, srcs, "v2")
	out, err = exec.Command(bin, "reload", "-c", cfg).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), fmt.Sprintf("%d instance(s) answered", len(procs)), "%s", out)
	require.Eventually(t, func() bool {
		out, err := exec.Command(bin, "status", "-c", cfg, "-o", "json").CombinedOutput()
		if err != nil {
			return false
		}
		var st status.Report
		if json.Unmarshal(out, &st) != nil || len(st.Instances) != len(procs) {
			return false
		}
		for _, in := range st.Instances {
			if revs[in.ConfigRev] {
				return false
			}
		}
		return true
	}, 30*time.Second, 200*time.Millisecond, "every member should run the new configuration")
	time.Sleep(2 * time.Second) // some changes under the new route

	stopWriters()
	total := 0
	for _, s := range srcs {
		v := s.verify(t, e)
		require.Positive(t, v["v1"], "source %s", s.name)
		require.Positive(t, v["v2"], "source %s: the changed route should apply after the reload", s.name)
		total += v["v1"] + v["v2"]
	}
	var all, allStream []time.Duration
	for _, tk := range takeovers {
		all = append(all, tk.leaseBySrc...)
		allStream = append(allStream, tk.streamBySrce...)
	}
	t.Logf("%d changes over %d sources, each exactly once in commit order; %d kills; takeover after kill -9 (lease 5s): new lease p50 %v max %v; streaming again p50 %v max %v",
		total, nsrc, len(takeovers), pct(all, 50), pct(all, 100), pct(allStream, 50), pct(allStream, 100))
	for _, p := range procs {
		p.term(t)
	}
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration{}, ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s) - 1) * p / 100
	return s[i].Round(time.Millisecond)
}
