package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/pipeline"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks/pluginsink"
)

// Hot reconfiguration against real servers: routes changed under load
// apply from a transaction boundary, refused configurations change
// nothing, sources come and go, SIGHUP, the file watch and config.kv
// trigger it, and kill -9 in the middle loses and duplicates nothing.

// startReloadable starts cfgPath's bridge in this process as `bridge run`
// does: able to read its file again.
func (e *env) startReloadable(cfgPath string) *running {
	e.t.Helper()
	return e.startWith(cfgPath, app.WithConfigFile(cfgPath, app.ConfigOptions()...))
}

// routeVersion returns N of a subject "cdc.<name>.vN.<schema>.<table>",
// 0 for "cdc.<name>.<schema>.<table>".
func routeVersion(t *testing.T, subject string) int {
	t.Helper()
	tok := strings.Split(subject, ".")
	require.GreaterOrEqual(t, len(tok), 4, subject)
	if v, ok := strings.CutPrefix(tok[2], "v"); ok {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, subject)
		return n
	}
	return 0
}

// checkRouteVersions requires every transaction's changes to have gone by
// one route version, and versions to only go forward in commit order; it
// returns how many changes each version carried.
func checkRouteVersions(t *testing.T, ms []msg) map[int]int {
	t.Helper()
	return checkRouteVersionsSplit(t, ms, nil)
}

// checkRouteVersionsSplit is checkRouteVersions allowing a transaction's
// changes to go on by a newer route version where a restarted process
// resumed it: what docs/control.md says of a transaction a crash
// interrupts half published after the configuration changed (the
// restarted process publishes the rest by the routes it starts with).
// resumedAt holds the stream sequence of the first message each restarted
// process could store (the stream's settled last sequence at the kill, +1):
// a transaction may split only there, forward, and once per restart that
// interrupted it. A split anywhere else (a reload applied mid-transaction)
// or backwards fails.
func checkRouteVersionsSplit(t *testing.T, ms []msg, resumedAt map[uint64]bool) map[int]int {
	t.Helper()
	counts := map[int]int{}
	byCommit := map[cdc.LSN]int{}
	splits := 0
	last := 0
	for _, m := range ms {
		if m.Header.Get("Bridge-Op") == "control" {
			continue
		}
		v := routeVersion(t, m.Subject)
		counts[v]++
		if prev, ok := byCommit[m.Pos.LSN]; ok && prev != v {
			if v < prev || !resumedAt[m.Seq] {
				t.Fatalf("transaction %s went by route versions %d and %d from stream seq %d, which is not where a restarted process resumed (%d split(s) at restarts before, %d restarts)",
					m.Pos.LSN, prev, v, m.Seq, splits, len(resumedAt))
			}
			splits++
			t.Logf("transaction %s went by route versions %d and then %d from stream seq %d: a restart resumed it", m.Pos.LSN, prev, v, m.Seq)
		}
		byCommit[m.Pos.LSN] = v
		if v < last {
			t.Fatalf("stream seq %d went by route version %d after version %d", m.Seq, v, last)
		}
		last = v
	}
	return counts
}

// settledLastSeq returns stream's last sequence once it has stayed the
// same for 300 ms: after a kill, what the dead process had sent has landed.
func (e *env) settledLastSeq(stream string) uint64 {
	e.t.Helper()
	js := natsJS(e.t.(*testing.T), e)
	s, err := js.Stream(context.Background(), stream)
	require.NoError(e.t, err)
	last, same := uint64(0), time.Time{}
	for deadline := time.Now().Add(30 * time.Second); ; {
		info, err := s.Info(context.Background())
		require.NoError(e.t, err)
		if same.IsZero() || info.State.LastSeq != last {
			last, same = info.State.LastSeq, time.Now()
		} else if time.Since(same) >= 300*time.Millisecond {
			return last
		}
		require.True(e.t, time.Now().Before(deadline), "stream %s still growing at seq %d after 30 s", stream, last)
		time.Sleep(50 * time.Millisecond)
	}
}

// setSubject rewrites the route subject of e.config's file at path to
// version v ("cdc.<name>.v<v>.{{.Schema}}.{{.Table}}").
func setSubject(t *testing.T, path, name string, v int) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(string(b), "\n")
	found := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "subject: \"cdc."+name+".") {
			lines[i] = fmt.Sprintf("    subject: \"cdc.%s.v%d.{{.Schema}}.{{.Table}}\"", name, v)
			found = true
		}
	}
	require.True(t, found, "no route subject in %s", path)
	writeAtomically(t, path, strings.Join(lines, "\n"))
}

// writeAtomically replaces the file at path with s, as editors and
// Kubernetes do: a new file renamed over it.
func writeAtomically(t *testing.T, path, s string) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(s), 0o644))
	require.NoError(t, os.Rename(tmp, path))
}

// TestReloadRoutesUnderLoad changes a route's subject with `bridge reload`
// while writers commit: every change arrives exactly once, each under the
// route in effect at its transaction (one version per transaction,
// versions forward in commit order), and the checkpoint records the new
// revision. A configuration with problems, and one changing a key only a
// restart applies, are refused whole: nothing changes.
func TestReloadRoutesUnderLoad(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	w := newWorkload(t, e)
	t.Cleanup(func() { w.stopped.Store(true) })
	cfg := e.config("rl", "")
	edit(t, cfg, "checkpoint:\n", "config: { watch: false }\ncheckpoint:\n")
	r := e.startReloadable(cfg)
	waitReady(t, r)
	before := r.app.Pipelines()[0].Status().ConfigRev
	wait := w.run(t, 3, 1<<30, time.Millisecond)
	time.Sleep(700 * time.Millisecond)

	setSubject(t, cfg, "rl", 1)
	code, out, errs := execCLI(t, "reload", "-c", cfg)
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	require.Contains(t, out, "instance "+r.app.Instance()+": configuration "+before+" → ")
	require.Contains(t, out, "routes of revision")
	require.Contains(t, out, "apply from the next transaction of source app")
	require.Contains(t, out, "(path: control endpoint bridge.rl.reload, 1 instance(s) answered)")
	after := r.app.Pipelines()[0].Status().ConfigRev
	require.NotEqual(t, before, after)
	time.Sleep(700 * time.Millisecond)

	// Refused whole: a route to a sink that does not exist.
	b, err := os.ReadFile(cfg)
	require.NoError(t, err)
	good := string(b)
	writeAtomically(t, cfg, strings.Replace(good, "sinks: [js]", "sinks: [nosuch]", 1))
	code, out, _ = execCLI(t, "reload", "-c", cfg)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "refused the configuration: the configuration was refused whole; nothing changed")
	require.Contains(t, out, `routes[0].sinks[0]: no sink named "nosuch"`)
	// And a key only a restart applies.
	writeAtomically(t, cfg, strings.Replace(good, "checkpoint:\n", "checkpoint:\n  bucket: elsewhere\n", 1))
	code, out, _ = execCLI(t, "reload", "-c", cfg)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "checkpoint.bucket changed, and only a restart applies it; nothing was applied")
	require.Equal(t, after, r.app.Pipelines()[0].Status().ConfigRev, "a refused configuration changes nothing")
	writeAtomically(t, cfg, good)
	time.Sleep(500 * time.Millisecond)

	w.stopped.Store(true)
	wait()
	w.verifyExactlyOnce(t, e, "CDC_rl")
	counts := checkRouteVersions(t, e.messages("CDC_rl"))
	require.Positive(t, counts[0], "changes before the reload")
	require.Positive(t, counts[1], "changes after the reload")
	require.Len(t, counts, 2)
	require.Eventually(t, func() bool { return e.ckpt("rl").ConfigRev == after }, 10*time.Second, 50*time.Millisecond,
		"the checkpoint records the revision in effect")
}

// TestReloadAddRemoveSources adds a source by editing the file (the
// watch reloads it), removes another, and adds it back, while writers
// commit to both databases: the removed source is drained at a
// transaction boundary, keeps its slot, and on its return streams what
// was committed meanwhile; each stream holds its database's changes
// exactly once.
func TestReloadAddRemoveSources(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE DATABASE db_a`, `CREATE DATABASE db_b`)
	wa, wb := dbWorkload(t, e, "db_a"), dbWorkload(t, e, "db_b")
	t.Cleanup(func() { wa.stopped.Store(true); wb.stopped.Store(true) })
	cfg := filepath.Join(e.dir, "addrm.yaml")
	source := func(n, db string) string {
		return fmt.Sprintf("  %s:\n    type: pgoutput\n    config: { dsn: \"%s\", slot: slot_%s, publication: pub_%s }\n", n, e.pg.DSN(db), n, n)
	}
	sink := func(n string) string {
		return fmt.Sprintf("  js_%s:\n    type: nats_jetstream\n    config: { stream: ADDRM_%s, subjects: [\"addrm.%s.>\"], duplicate_window: 1s }\n", n, strings.ToUpper(n), n)
	}
	route := func(n string) string {
		return fmt.Sprintf("  - match: { sources: [%s] }\n    sinks: [js_%s]\n    subject: \"addrm.%s.{{.Schema}}.{{.Table}}\"\n", n, n, n)
	}
	write := func(names ...string) {
		var srcs, sinks, routes string
		for _, n := range names {
			srcs += source(n, "db_"+n)
			sinks += sink(n)
			routes += route(n)
		}
		writeAtomically(t, cfg, fmt.Sprintf("name: addrm\ndata_dir: %s\nnats:\n  url: %s\ncheckpoint:\n  interval: 200ms\nhttp:\n  listen: \"127.0.0.1:0\"\nsources:\n%ssinks:\n%sroutes:\n%s",
			filepath.Join(e.dir, "data"), e.natsURL(), srcs, sinks, routes))
	}
	write("a")
	r := e.startReloadable(cfg)
	waitReady(t, r)
	waitA := wa.run(t, 2, 1<<30, 2*time.Millisecond)
	time.Sleep(500 * time.Millisecond)

	write("a", "b") // the watch reloads it
	// A new slot decodes the transactions that begin once it is created
	// (waiting for those running elsewhere): the writers start after that.
	require.Eventually(t, func() bool {
		ps := r.app.Pipelines()
		return len(ps) == 2 && ps[1].Source() == "b" && ps[1].Status().State == pipeline.StateStreaming
	}, 60*time.Second, 20*time.Millisecond)
	waitB := wb.run(t, 2, 1<<30, 2*time.Millisecond)
	time.Sleep(500 * time.Millisecond)

	write("b")
	waitSlotInactive(t, e, "slot_a")
	require.Eventually(t, func() bool { return len(r.app.Pipelines()) == 1 }, 30*time.Second, 20*time.Millisecond)
	n := e.storedCount("ADDRM_A")
	committed := wa.total.Load()
	require.Eventually(t, func() bool { return wa.total.Load() > committed+100 }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, n, e.storedCount("ADDRM_A"), "a removed source publishes nothing")

	write("a", "b")
	waitSlotActive(t, e, "slot_a")
	time.Sleep(500 * time.Millisecond)
	wa.stopped.Store(true)
	wb.stopped.Store(true)
	waitA()
	waitB()
	wa.verifyExactlyOnce(t, e, "ADDRM_A")
	wb.verifyExactlyOnce(t, e, "ADDRM_B")
}

// TestReloadSIGHUPKill9 runs the bridge process, changes its route on
// SIGHUP (config.watch off) again and again while writers commit, and
// kills it with SIGKILL at random moments, some right after a SIGHUP:
// every change arrives exactly once, in order, and versions only go
// forward. Each transaction goes by one route version, except one that a
// kill interrupts half published after the file changed: the restarted
// process publishes its rest by the routes it starts with (the resume
// skips what the stream holds, and nothing records the routes the first
// part went by; docs/control.md says so): such a split, forward, is
// allowed only at the first message a restarted process stored.
func TestReloadSIGHUPKill9(t *testing.T) {
	defer parallel(t)()
	bin := bridgeBinary(t)
	e := newEnv(t)
	w := newWorkload(t, e)
	t.Cleanup(func() { w.stopped.Store(true) })
	cfg := e.config("hup", "")
	edit(t, cfg, "checkpoint:\n", "config: { watch: false }\ncheckpoint:\n")
	p := startProc(t, bin, cfg)
	t.Cleanup(func() {
		p.kill9(t)
		if t.Failed() {
			t.Logf("bridge:\n%s", p.out.String())
		}
	})
	waitSlotActive(t, e, "slot_hup")
	wait := w.run(t, 3, 1<<30, time.Millisecond)
	kills, reloads := 0, 0
	resumedAt := map[uint64]bool{}
	for v := 1; v <= 8; v++ {
		time.Sleep(time.Duration(200+rand.N(600)) * time.Millisecond)
		setSubject(t, cfg, "hup", v)
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
		if rand.N(2) == 0 || v == 8 {
			time.Sleep(time.Duration(rand.N(400)) * time.Millisecond)
			if v == 8 {
				time.Sleep(time.Second) // the last one reloads for sure
			}
			p.kill9(t) // its output can be read once it exited
			kills++
			resumedAt[e.settledLastSeq("CDC_hup")+1] = true
			reloads += strings.Count(p.out.String(), "configuration reloaded")
			p = startProc(t, bin, cfg)
		}
	}
	require.Positive(t, reloads, "SIGHUP reloads")
	w.stopped.Store(true)
	wait()
	t.Logf("%d changes, %d kills, %d reloads", w.total.Load(), kills, reloads)
	w.verifyExactlyOnce(t, e, "CDC_hup")
	counts := checkRouteVersionsSplit(t, e.messages("CDC_hup"), resumedAt)
	require.Greater(t, len(counts), 2, "several route versions carried changes: %v", counts)
	p.term(t)
}

// TestReloadConfigKV keeps the sources, sinks and routes in a KV entry
// (config.kv): the bridge starts from it, follows a new revision by itself,
// refuses one with problems, and reports where its configuration comes
// from.
func TestReloadConfigKV(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE k (id int PRIMARY KEY)`)
	js := natsJS(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bridge_config", History: 10})
	require.NoError(t, err)
	// shared is revision v of the entry: its route writes to sinks, and
	// more adds sinks to the entry's.
	shared := func(v int, sinks string, more ...string) string {
		return fmt.Sprintf(`sources:
  app:
    type: pgoutput
    config: { slot: slot_kvc, publication: pub_kvc }
sinks:
  js:
    type: nats_jetstream
    config: { stream: CDC_kvc, subjects: ["cdc.kvc.>"], duplicate_window: 1s }
%sroutes:
  - sinks: [%s]
    subject: "cdc.kvc.v%d.{{.Schema}}.{{.Table}}"
`, strings.Join(more, ""), sinks, v)
	}
	_, err = kv.Put(ctx, "kvc", []byte(shared(1, "js")))
	require.NoError(t, err)
	local := filepath.Join(e.dir, "kvc.yaml")
	// Where the source connects is the machine's own: in the file (an
	// entry may not set a dsn).
	require.NoError(t, os.WriteFile(local, []byte(fmt.Sprintf("name: kvc\ndata_dir: %s\nnats:\n  url: %s\nconfig:\n  kv: bridge_config/kvc\ncheckpoint:\n  interval: 200ms\nhttp:\n  listen: \"127.0.0.1:0\"\nsources:\n  app:\n    config: { dsn: %q }\n",
		filepath.Join(e.dir, "data"), e.natsURL(), e.pg.DSN(""))), 0o644))

	// Started as `bridge run` does: the entry layered over the file.
	cfg, from, rev, err := app.LoadConfig(ctx, local, app.ConfigOptions()...)
	require.NoError(t, err)
	require.Equal(t, "file "+local+" + kv bridge_config/kvc revision 1", from)
	require.Equal(t, uint64(1), rev)
	a, err := app.New(cfg, app.WithLogger(testLogger(t)), app.WithConfigFile(local, app.ConfigOptions()...))
	require.NoError(t, err)
	rctx, rcancel := context.WithCancel(context.Background())
	require.NoError(t, a.Start(rctx))
	r := &running{cancel: rcancel, done: make(chan error, 1), app: a}
	go func() { r.done <- a.Run(rctx) }()
	t.Cleanup(func() { r.stop(t) })
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO k VALUES (1)`)
	ms := e.waitCount("CDC_kvc", 1, 30*time.Second)
	require.Equal(t, "cdc.kvc.v1.public.k", ms[0].Subject)

	// A new revision: the bridge follows it by itself.
	_, err = kv.Put(ctx, "kvc", []byte(shared(2, "js")))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rep := statusOf(t, local)
		return len(rep.Instances) == 1 && rep.Instances[0].ConfigFrom == "file "+local+" + kv bridge_config/kvc revision 2"
	}, 30*time.Second, 100*time.Millisecond, "the bridge never took revision 2")
	e.pg.ExecT(t, `INSERT INTO k VALUES (2)`)
	ms = e.waitCount("CDC_kvc", 2, 30*time.Second)
	require.Equal(t, "cdc.kvc.v2.public.k", ms[1].Subject)
	rev2 := a.Pipelines()[0].Status().ConfigRev

	// A revision with a problem is refused; the running configuration goes on.
	_, err = kv.Put(ctx, "kvc", []byte(shared(3, "nosuch")))
	require.NoError(t, err)
	code, out, _ := execCLI(t, "reload", "-c", local)
	require.Equal(t, 1, code, "the CLI reads the same entry: %s", out)
	require.Contains(t, out, `routes[0].sinks[0]: no sink named "nosuch"`)
	code, _, errs := execCLI(t, "validate", "-c", local)
	require.Equal(t, 1, code)
	require.Contains(t, errs, `routes[0].sinks[0]: no sink named "nosuch"`, "validate reads the entry too")
	e.pg.ExecT(t, `INSERT INTO k VALUES (3)`)
	ms = e.waitCount("CDC_kvc", 3, 30*time.Second)
	require.Equal(t, "cdc.kvc.v2.public.k", ms[2].Subject)
	require.Equal(t, rev2, a.Pipelines()[0].Status().ConfigRev)

	// A revision that reads a file of this machine is refused by the
	// running bridge and the CLI alike: the secret reaches no subject.
	secret := filepath.Join(e.dir, "pg_password")
	require.NoError(t, os.WriteFile(secret, []byte("hunter2\n"), 0o600))
	_, err = kv.Put(ctx, "kvc", []byte(strings.Replace(shared(4, "js"), "cdc.kvc.v4.", "cdc.kvc.${file:"+secret+"}.", 1)))
	require.NoError(t, err)
	code, out, _ = execCLI(t, "reload", "-c", local)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "routes[0].subject: kv bridge_config/kvc revision 4 may not read files (${file:...})")
	require.NotContains(t, out, "hunter2")
	e.pg.ExecT(t, `INSERT INTO k VALUES (4)`)
	ms = e.waitCount("CDC_kvc", 4, 30*time.Second)
	require.Equal(t, "cdc.kvc.v2.public.k", ms[3].Subject)
	require.Equal(t, rev2, a.Pipelines()[0].Status().ConfigRev)
	checkOrdered(t, ms)

	// An entry that cannot set config.
	_, err = config.Load(local, config.WithDocument("kv bridge_config/kvc", []byte("config: { kv: x/y }\n")))
	require.ErrorContains(t, err, "kv bridge_config/kvc sets config")

	// A revision that would run a program on every bridge (a plugin sink:
	// its sha256 pins nothing an attacker cannot hash) is refused by the
	// running bridge and the CLI, and the program never runs.
	marker := filepath.Join(e.dir, "ran")
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	sum, err := pluginsink.FileSHA256(sh)
	require.NoError(t, err)
	_, err = kv.Put(ctx, "kvc", []byte(shared(5, "js, run",
		fmt.Sprintf("  run:\n    type: plugin\n    config: { command: %q, sha256: %q, args: [\"-c\", \"touch %s\"] }\n", sh, sum, marker))))
	require.NoError(t, err)
	code, out, _ = execCLI(t, "reload", "-c", local)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, `sinks.run: kv bridge_config/kvc revision 5 sets sink "run" of type plugin, which runs a program`)
	code, _, errs = execCLI(t, "validate", "-c", local)
	require.Equal(t, 1, code)
	require.Contains(t, errs, `sinks.run: kv bridge_config/kvc revision 5 sets sink "run" of type plugin`)
	e.pg.ExecT(t, `INSERT INTO k VALUES (5)`)
	ms = e.waitCount("CDC_kvc", 5, 30*time.Second)
	require.Equal(t, "cdc.kvc.v2.public.k", ms[4].Subject, "the running configuration goes on")
	require.NoFileExists(t, marker, "the entry's program never ran")
}
