package e2e_test

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/control"
	"github.com/bridgecdc/bridge/bridge/pipeline"
	"github.com/bridgecdc/bridge/bridge/status"
)

// The control plane against real servers: pause and resume through the
// endpoints and the `bridge` commands, the pause surviving a restart,
// kill -9 around pauses, online resync, permissions.

// waitSlotInactive waits until no walsender streams from slot, which
// exists.
func waitSlotInactive(t testing.TB, e *env, slot string) {
	t.Helper()
	conn := e.pg.Conn(t, "")
	require.Eventually(t, func() bool {
		var active *bool
		_ = conn.QueryRow(context.Background(), `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		return active != nil && !*active
	}, 60*time.Second, 50*time.Millisecond, "slot %s is still streamed (or gone)", slot)
}

// storedCount returns how many messages stream holds.
func (e *env) storedCount(stream string) uint64 {
	e.t.Helper()
	js := natsJS(e.t.(*testing.T), e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	require.NoError(e.t, err)
	info, err := s.Info(ctx)
	require.NoError(e.t, err)
	return info.State.Msgs
}

// ckpt reads the checkpoint of bridge's source app.
func (e *env) ckpt(bridge string) checkpoint.State {
	e.t.Helper()
	js := natsJS(e.t.(*testing.T), e)
	store, err := checkpoint.Open(context.Background(), js, "bridge_checkpoints", 1)
	require.NoError(e.t, err)
	st, _, err := store.Load(context.Background(), checkpoint.Key(bridge, "app"))
	require.NoError(e.t, err)
	return st
}

// statusOf runs `bridge status -o json`.
func statusOf(t *testing.T, cfg string) status.Report {
	t.Helper()
	code, out, errs := execCLI(t, "status", "-c", cfg, "-o", "json", "--timeout", "3s")
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	var rep status.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	return rep
}

// TestControlPauseResume pauses a source under load through `bridge pause`
// (the holder's endpoint): the run ends at a transaction boundary, the
// slot stays with the WAL written meanwhile, nothing is published, and
// status says so; the pause survives a restart; `bridge resume` with no
// holder clears it in the bucket directly and the bridge follows; then a
// pause and resume through the endpoints again. Every committed change
// arrives exactly once, in commit order.
func TestControlPauseResume(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	w := newWorkload(t, e)
	t.Cleanup(func() { w.stopped.Store(true) })
	cfg := e.config("pause", "")
	r := e.start(cfg)
	waitReady(t, r)
	wait := w.run(t, 2, 1<<30, 2*time.Millisecond)
	time.Sleep(500 * time.Millisecond)

	code, out, errs := execCLI(t, "pause", "-c", cfg, "--reason", "maintenance")
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	require.Contains(t, out, "source app paused on instance "+r.app.Instance())
	require.Contains(t, out, "path: control endpoint bridge.pause.pause.app")
	waitSlotInactive(t, e, "slot_pause")
	st := e.ckpt("pause")
	require.True(t, st.Paused, "the run's last checkpoint records the pause")
	require.Equal(t, r.app.Pipelines()[0].Checkpointed(), st.LSN)

	// Changes go on being committed; none is published.
	n, committed := e.storedCount("CDC_pause"), w.total.Load()
	require.Eventually(t, func() bool { return w.total.Load() > committed+100 }, 30*time.Second, 20*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, n, e.storedCount("CDC_pause"), "published while paused")

	rep := statusOf(t, cfg)
	require.Equal(t, "control", rep.Via)
	require.Len(t, rep.Instances, 1)
	run := rep.Sources[0].Running
	require.NotNil(t, run)
	require.Equal(t, "paused", run.State)
	require.True(t, run.Paused)
	require.Equal(t, "maintenance", run.PauseReason)
	require.True(t, run.Holder, "the instance that drained it holds it")
	require.NotNil(t, rep.Sources[0].Slot)
	require.True(t, rep.Sources[0].Slot.Exists)
	require.False(t, rep.Sources[0].Slot.Active)
	require.Positive(t, rep.Sources[0].Slot.RetainedWALBytes, "the slot keeps the WAL written while paused")
	code, out, _ = execCLI(t, "status", "-c", cfg)
	require.Equal(t, 0, code)
	require.Contains(t, out, "via         the control endpoint bridge.pause.status: 1 instance(s) answered")
	require.Contains(t, out, "state       paused by bridge pause")

	// A restart honours the recorded pause.
	r.stop(t)
	rep = statusOf(t, cfg)
	require.Equal(t, "direct", rep.Via, "no bridge runs")
	require.Nil(t, rep.Sources[0].Running)
	r = e.start(cfg)
	require.Eventually(t, func() bool { return r.app.Pipelines()[0].Status().State == pipeline.StatePaused }, 30*time.Second, 20*time.Millisecond)
	time.Sleep(time.Second)
	waitSlotInactive(t, e, "slot_pause")
	require.Equal(t, n, e.storedCount("CDC_pause"))

	// This instance never streamed the source, so it does not hold it:
	// resume clears the pause in the bucket, and the bridge follows.
	code, out, errs = execCLI(t, "resume", "-c", cfg)
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	require.Contains(t, out, "source app resumed: running bridges stream it again at once (path: direct;")
	waitSlotActive(t, e, "slot_pause")
	require.Eventually(t, func() bool { return e.storedCount("CDC_pause") > n }, 30*time.Second, 20*time.Millisecond)

	// Again through the endpoints, now that it holds the source.
	code, out, errs = execCLI(t, "pause", "-c", cfg)
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	require.Contains(t, out, "path: control endpoint bridge.pause.pause.app")
	code, out, errs = execCLI(t, "resume", "-c", cfg)
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	require.Contains(t, out, "source app streaming on instance "+r.app.Instance())
	require.Contains(t, out, "path: control endpoint bridge.pause.resume.app")
	require.False(t, e.ckpt("pause").Paused)

	time.Sleep(300 * time.Millisecond)
	w.stopped.Store(true)
	wait()
	w.verifyExactlyOnce(t, e, "CDC_pause")
}

// TestControlKill9AroundPause kills the bridge process with SIGKILL at
// random moments while sources are paused and resumed under load (during
// the drain, while paused, right after resume), restarting it each time:
// every committed change arrives exactly once, in commit order.
func TestControlKill9AroundPause(t *testing.T) {
	defer parallelLong(t)()
	bin := bridgeBinary(t)
	e := newEnv(t)
	w := newWorkload(t, e)
	t.Cleanup(func() { w.stopped.Store(true) })
	cfg := e.config("pkill", "")
	p := startProc(t, bin, cfg)
	t.Cleanup(func() {
		p.kill9(t)
		if t.Failed() {
			t.Logf("bridge:\n%s", p.out.String())
		}
	})
	waitSlotActive(t, e, "slot_pkill")
	wait := w.run(t, 3, 1<<30, time.Millisecond)
	for round := 0; round < 6; round++ {
		time.Sleep(time.Duration(300+rand.N(500)) * time.Millisecond)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Killed midway, it fails or falls back; either is fine here.
			_, _, _ = execCLI(t, "pause", "-c", cfg, "--wait", "5s")
		}()
		time.Sleep(time.Duration(rand.N(600)) * time.Millisecond)
		p.kill9(t)
		wg.Wait()
		p = startProc(t, bin, cfg)
		if rand.N(2) == 0 {
			time.Sleep(time.Duration(rand.N(800)) * time.Millisecond)
		}
		code, out, errs := execCLI(t, "resume", "-c", cfg, "--wait", "20s")
		require.Equal(t, 0, code, "round %d: stdout: %s\nstderr: %s", round, out, errs)
		waitSlotActive(t, e, "slot_pkill")
		if rand.N(2) == 0 {
			time.Sleep(time.Duration(rand.N(300)) * time.Millisecond)
			p.kill9(t)
			p = startProc(t, bin, cfg)
		}
	}
	t.Logf("%d changes committed", w.total.Load())
	w.stopped.Store(true)
	wait()
	w.verifyExactlyOnce(t, e, "CDC_pkill")
	require.False(t, e.ckpt("pkill").Paused || mustControl(t, e, "pkill").Paused, "resumed at the end")
	p.term(t)
}

func mustControl(t *testing.T, e *env, bridge string) checkpoint.Control {
	t.Helper()
	store, err := checkpoint.Open(t.Context(), natsJS(t, e), "bridge_checkpoints", 1)
	require.NoError(t, err)
	c, err := store.LoadControl(t.Context(), checkpoint.ControlKey(bridge, "app"))
	require.NoError(t, err)
	return c
}

// TestControlResync: `bridge resync` while the bridge streams goes to the
// holder's endpoint: its run ends at a transaction boundary, the resync
// message goes out under a new epoch from the checkpoint, and the bridge
// streams on under it: nothing lost, nothing sent twice, the resync
// between the old producer's changes and the new one's. Paused, the
// bridge resyncs without a run and stays paused.
func TestControlResync(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE r (id int PRIMARY KEY)`)
	cfg := e.config("oresync", "      tables: [public.r]")
	r := e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO r SELECT generate_series(1, 50)`)
	e.waitCount("CDC_oresync", 50, 30*time.Second)

	code, out, errs := execCLI(t, "resync", "-c", cfg, "--reason", "schema rebuilt")
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	require.Contains(t, out, "resync published by instance "+r.app.Instance()+"; new producer oresync.app.")
	require.Contains(t, out, "path: control endpoint bridge.oresync.resync.app")
	e.pg.ExecT(t, `INSERT INTO r SELECT generate_series(51, 80)`)
	ms := e.waitCount("CDC_oresync", 81, 60*time.Second)
	ctl := requireResync(t, ms, "operator: schema rebuilt")
	require.Len(t, ms, 81, "50 rows, the resync, 30 rows: nothing sent twice")
	checkOrdered(t, ms)
	require.Equal(t, strings.TrimPrefix(ctl.Producer, "oresync.app."), e.ckpt("oresync").Epoch)

	// Paused: resynced without a run, and still paused after.
	code, out, errs = execCLI(t, "pause", "-c", cfg)
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	code, out, errs = execCLI(t, "resync", "-c", cfg)
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	require.Contains(t, out, "path: control endpoint")
	require.Equal(t, pipeline.StatePaused, r.app.Pipelines()[0].Status().State)
	require.True(t, e.ckpt("oresync").Paused)
	e.pg.ExecT(t, `INSERT INTO r VALUES (81)`)
	code, _, errs = execCLI(t, "resume", "-c", cfg)
	require.Equal(t, 0, code, errs)
	ms = e.waitCount("CDC_oresync", 83, 60*time.Second)
	require.Len(t, ms, 83)
	require.Equal(t, cdcControlReason(t, ms[81]), "operator")
	require.Equal(t, float64(81), ms[82].Body["after"].(map[string]any)["id"])
}

func cdcControlReason(t *testing.T, m msg) string {
	t.Helper()
	c, ok := controlOf(t, m)
	require.True(t, ok, "stream seq %d is not a control message", m.Seq)
	return c.Reason
}

// natsServerWithUsers starts a JetStream nats-server whose users are
// users, and returns its URL.
func natsServerWithUsers(t *testing.T, users []*server.User) string {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		JetStream: true, StoreDir: t.TempDir(), Users: users})
	require.NoError(t, err)
	go ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns.ClientURL()
}

// TestControlPermissions: the bridge's control subjects are authorised by
// NATS permissions. A user granted only bridge.<name>.status and .sources
// reads the status through the endpoint, and `bridge pause` fails at once
// with the subject it may not publish to and where the fix is documented;
// a user granted nothing of the bridge's gets the same for status, which
// then shows what it read directly.
func TestControlPermissions(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	all := &server.SubjectPermission{Allow: []string{">"}}
	url := natsServerWithUsers(t, []*server.User{
		{Username: "bridge", Password: "bridge-secret", Permissions: &server.Permissions{Publish: all, Subscribe: all}},
		{Username: "viewer", Password: "viewer-secret", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"bridge.perm.status", "bridge.perm.sources", "$JS.API.>", "$KV.bridge_checkpoints.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}},
		{Username: "other", Password: "other-secret", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.>"}, Deny: []string{"bridge.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}},
	})
	cfg := e.config("perm", "")
	edit(t, cfg, "  url: "+e.natsURL(), "  url: "+url+"\n  user: bridge\n  password: bridge-secret")
	r := e.start(cfg)
	waitReady(t, r)
	asUser := func(user string) string {
		p := filepath.Join(e.dir, user+".yaml")
		b, err := os.ReadFile(cfg)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(p, []byte(strings.Replace(string(b), "user: bridge\n  password: bridge-secret", "user: "+user+"\n  password: "+user+"-secret", 1)), 0o600))
		return p
	}

	viewer := asUser("viewer")
	rep := statusOf(t, viewer)
	require.Equal(t, "control", rep.Via)
	require.Equal(t, "streaming", rep.Sources[0].Running.State)
	code, out, errs := execCLI(t, "pause", "-c", viewer)
	require.Equal(t, 1, code, "stdout: %s", out)
	require.Contains(t, errs, "NATS refused this user publishing to bridge.perm.pause.app")
	require.Contains(t, errs, "docs/control.md")
	require.NotContains(t, out, "path: direct", "a refusal is no reason to act directly")
	code, _, errs = execCLI(t, "reload", "-c", viewer)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "publishing to bridge.perm.reload")

	other := asUser("other")
	code, out, errs = execCLI(t, "status", "-c", other, "-o", "json")
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Equal(t, "direct", rep.Via)
	require.Contains(t, rep.ControlError, "NATS refused this user publishing to bridge.perm.status")
	require.Equal(t, pipeline.StateStreaming, r.app.Pipelines()[0].Status().State)
}

// TestControlNATSCLIPath: the requests the nats CLI sends (`nats micro ls`
// and `info` on $SRV, `nats req` on an endpoint) reach the running bridge.
func TestControlNATSCLIPath(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	cfg := e.config("natscli", "")
	r := e.start(cfg)
	waitReady(t, r)
	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	defer nc.Close()

	m, err := nc.Request("$SRV.PING.bridge", nil, 5*time.Second)
	require.NoError(t, err)
	var id struct {
		Name     string            `json:"name"`
		ID       string            `json:"id"`
		Metadata map[string]string `json:"metadata"`
	}
	require.NoError(t, json.Unmarshal(m.Data, &id))
	require.Equal(t, "bridge", id.Name)
	require.Equal(t, "natscli", id.Metadata["bridge"])
	require.Equal(t, r.app.Instance(), id.Metadata["instance"])
	m, err = nc.Request("$SRV.INFO.bridge."+id.ID, nil, 5*time.Second)
	require.NoError(t, err)
	require.Contains(t, string(m.Data), `"subject":"bridge.natscli.pause.*"`)

	m, err = nc.Request("bridge.natscli.status", nil, 5*time.Second)
	require.NoError(t, err)
	var st control.StatusReply
	require.NoError(t, json.Unmarshal(m.Data, &st))
	require.Equal(t, "streaming", st.Sources[0].State)
	require.True(t, st.Sources[0].Holder)
	require.Equal(t, "slot_natscli", func() string {
		require.Eventually(t, func() bool {
			m, err := nc.Request("bridge.natscli.status", nil, 5*time.Second)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(m.Data, &st))
			return st.Sources[0].Slot != nil
		}, 30*time.Second, 100*time.Millisecond, "the slot poller never reported")
		return st.Sources[0].Slot.Name
	}())

	m, err = nc.Request("bridge.natscli.pause.app", []byte(`{"reason": "nats req"}`), 35*time.Second)
	require.NoError(t, err)
	require.Empty(t, m.Header.Get("Nats-Service-Error"), string(m.Data))
	var sr control.SourceReply
	require.NoError(t, json.Unmarshal(m.Data, &sr))
	require.Equal(t, "paused", sr.Source.State)
	require.Equal(t, "nats req", sr.Source.PauseReason)
	m, err = nc.Request("bridge.natscli.resume.app", nil, 35*time.Second)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(m.Data, &sr))
	require.Equal(t, "streaming", sr.Source.State)

	m, err = nc.Request("bridge.natscli.snapshot.app", []byte(`{"tables": ["public.nosuch"]}`), 35*time.Second)
	require.NoError(t, err)
	require.Equal(t, "400", m.Header.Get("Nats-Service-Error-Code"))
	require.Contains(t, m.Header.Get("Nats-Service-Error"), "nosuch")
}
