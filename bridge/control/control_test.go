package control_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/bridgecdc/bridge/bridge/control"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeBridge is a control.Bridge of its own sources: name → holds.
type fakeBridge struct {
	instance string
	mu       sync.Mutex
	sources  map[string]bool
	paused   map[string]string // source → reason
	reload   error
}

func newFake(instance string, sources map[string]bool) *fakeBridge {
	return &fakeBridge{instance: instance, sources: sources, paused: map[string]string{}}
}

func (f *fakeBridge) Status(context.Context) control.StatusReply {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := control.StatusReply{Identity: control.Identity{Bridge: "shop", Instance: f.instance}, ConfigRev: "abc"}
	for _, n := range []string{"orders", "billing"} {
		holds, ok := f.sources[n]
		if !ok {
			continue
		}
		st := "standby"
		if holds {
			st = "streaming"
		}
		if _, p := f.paused[n]; p {
			st = "paused"
		}
		r.Sources = append(r.Sources, control.SourceStatus{Name: n, Type: "pgoutput", State: st, Holder: holds})
	}
	return r
}

func (f *fakeBridge) Runs(source string) (bool, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.sources[source]
	return ok, h
}

func (f *fakeBridge) Pause(_ context.Context, source string, req control.PauseRequest) (control.SourceReply, error) {
	f.mu.Lock()
	f.paused[source] = req.Reason
	f.mu.Unlock()
	return control.SourceReply{Source: control.SourceStatus{Name: source, State: "paused", Paused: true, PauseReason: req.Reason}}, nil
}

func (f *fakeBridge) Resume(_ context.Context, source string, _ control.ResumeRequest) (control.SourceReply, error) {
	f.mu.Lock()
	delete(f.paused, source)
	f.mu.Unlock()
	return control.SourceReply{Source: control.SourceStatus{Name: source, State: "streaming"}}, nil
}

func (f *fakeBridge) Snapshot(_ context.Context, source string, req control.SnapshotRequest) (control.SnapshotReply, error) {
	if req.Where == "bad" {
		return control.SnapshotReply{}, control.Errorf(control.CodeBadRequest, "where: bad")
	}
	return control.SnapshotReply{Source: source, ID: "r1", Tables: req.Tables}, nil
}

func (f *fakeBridge) Resync(_ context.Context, source string, _ control.ResyncRequest) (control.ResyncReply, error) {
	return control.ResyncReply{Source: source, Producer: "shop." + source + ".new"}, nil
}

func (f *fakeBridge) Reload(context.Context) (control.ReloadReply, error) {
	if f.reload != nil {
		return control.ReloadReply{}, f.reload
	}
	return control.ReloadReply{Revision: "def", Previous: "abc", Changes: []string{"routes swapped"}}, nil
}

// startServer starts a nats-server with the given users (none: open).
func startServer(t *testing.T, users []*server.User) string {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true, Users: users})
	require.NoError(t, err)
	go ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns.ClientURL()
}

func connect(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

func startService(t *testing.T, nc *nats.Conn, b *fakeBridge) *control.Service {
	t.Helper()
	s, err := control.Start(nc, b, control.Options{Bridge: "shop", Instance: b.instance, Version: "v1.2.3", Description: "test"})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Stop()) })
	return s
}

// TestDiscovery: the nats CLI's `nats micro ls/info/stats` requests
// ($SRV.PING, $SRV.INFO.bridge, $SRV.STATS.bridge) find the service with
// its metadata and endpoints.
func TestDiscovery(t *testing.T) {
	url := startServer(t, nil)
	a := startService(t, connect(t, url), newFake("runA", map[string]bool{"orders": true}))
	startService(t, connect(t, url), newFake("runB", map[string]bool{"orders": false}))
	nc := connect(t, url)

	collect := func(subject string) [][]byte {
		inbox := nats.NewInbox()
		sub, err := nc.SubscribeSync(inbox)
		require.NoError(t, err)
		defer sub.Unsubscribe()
		require.NoError(t, nc.PublishRequest(subject, inbox, nil))
		var out [][]byte
		for {
			m, err := sub.NextMsg(500 * time.Millisecond)
			if err != nil {
				return out
			}
			out = append(out, m.Data)
		}
	}
	pings := collect("$SRV.PING.bridge")
	require.Len(t, pings, 2, "both instances answer PING")
	seen := map[string]bool{}
	for _, b := range pings {
		var p micro.Ping
		require.NoError(t, json.Unmarshal(b, &p))
		require.Equal(t, "bridge", p.Name)
		require.Equal(t, "1.2.3", p.Version)
		require.Equal(t, "shop", p.Metadata["bridge"])
		seen[p.Metadata["instance"]] = true
	}
	require.Equal(t, map[string]bool{"runA": true, "runB": true}, seen)

	m, err := nc.Request("$SRV.INFO.bridge."+a.Info().ID, nil, 2*time.Second)
	require.NoError(t, err)
	var info micro.Info
	require.NoError(t, json.Unmarshal(m.Data, &info))
	subjects := map[string]string{}
	for _, e := range info.Endpoints {
		subjects[e.Name] = e.Subject
		require.Empty(t, e.QueueGroup, "no queue group: every instance hears every request")
	}
	require.Equal(t, map[string]string{
		"status": "bridge.shop.status", "sources": "bridge.shop.sources", "reload": "bridge.shop.reload",
		"pause": "bridge.shop.pause.*", "resume": "bridge.shop.resume.*", "snapshot": "bridge.shop.snapshot.*", "resync": "bridge.shop.resync.*",
	}, subjects)

	_, err = nc.Request("bridge.shop.status", nil, 2*time.Second)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		m, err := nc.Request("$SRV.STATS.bridge."+a.Info().ID, nil, 2*time.Second)
		require.NoError(t, err)
		var stats micro.Stats
		require.NoError(t, json.Unmarshal(m.Data, &stats))
		for _, e := range stats.Endpoints {
			if e.Name == "status" {
				return e.NumRequests == 1
			}
		}
		return false
	}, 5*time.Second, 50*time.Millisecond, "STATS counts the status request")
}

// TestHolderAnswers: status goes to every instance; an action on a source
// only to the instance holding it, whether asked by the client or by a
// plain request (the nats CLI's `nats req`).
func TestHolderAnswers(t *testing.T) {
	url := startServer(t, nil)
	fa := newFake("runA", map[string]bool{"orders": true, "billing": false})
	fb := newFake("runB", map[string]bool{"orders": false, "billing": false})
	startService(t, connect(t, url), fa)
	startService(t, connect(t, url), fb)
	nc := connect(t, url)
	c := control.NewClient(nc, "shop")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	sts, err := c.Status(ctx)
	require.NoError(t, err)
	require.Len(t, sts, 2)
	require.Equal(t, "runA", sts[0].Instance)
	require.Equal(t, "runB", sts[1].Instance)

	r, err := c.Pause(ctx, "orders", control.PauseRequest{Reason: "maintenance"})
	require.NoError(t, err)
	require.Equal(t, "runA", r.Instance)
	require.Equal(t, "paused", r.Source.State)
	require.Equal(t, "maintenance", fa.paused["orders"])
	require.Empty(t, fb.paused, "only the holder acts")

	m, err := nc.Request("bridge.shop.resume.orders", []byte(`{}`), 2*time.Second)
	require.NoError(t, err, "a plain request reaches the holder")
	var sr control.SourceReply
	require.NoError(t, json.Unmarshal(m.Data, &sr))
	require.Equal(t, "runA", sr.Instance)

	_, err = c.Pause(ctx, "billing", control.PauseRequest{})
	var nh *control.NoHolderError
	require.ErrorAs(t, err, &nh)
	require.ErrorIs(t, err, control.ErrNoAnswer, "the caller falls back")
	require.Contains(t, err.Error(), "instance runA: standby")

	_, err = c.Pause(ctx, "nosuch", control.PauseRequest{})
	require.ErrorAs(t, err, &nh)
	require.Contains(t, err.Error(), `no running instance of the bridge has a source named "nosuch"`)

	// Addressed to an instance that does not run the source: 404 in the
	// micro error headers.
	msg := &nats.Msg{Subject: "bridge.shop.pause.nosuch", Data: []byte(`{}`), Header: nats.Header{control.InstanceHeader: []string{"runA"}}}
	m, err = nc.RequestMsg(msg, 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "404", m.Header.Get("Nats-Service-Error-Code"))
	require.Contains(t, m.Header.Get("Nats-Service-Error"), `no source named "nosuch"`)

	// A body that does not decode: 400.
	m, err = nc.Request("bridge.shop.pause.orders", []byte(`{"reason": 1}`), 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "400", m.Header.Get("Nats-Service-Error-Code"))
	m, err = nc.Request("bridge.shop.pause.orders", []byte(`{"wait": "soon"}`), 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "400", m.Header.Get("Nats-Service-Error-Code"))
	require.Contains(t, m.Header.Get("Nats-Service-Error"), `"soon" is not a positive duration`)

	// Free texts are bounded: they are logged, kept in the checkpoint
	// bucket and echoed in every status (a megabyte reason would make
	// status replies too large to send).
	_, err = c.Pause(ctx, "orders", control.PauseRequest{Reason: strings.Repeat("r", 1025)})
	var big *control.Error
	require.ErrorAs(t, err, &big)
	require.Equal(t, "400", big.Code)
	require.Contains(t, big.Description, "reason is 1025 bytes, more than 1024")
	require.NotEqual(t, strings.Repeat("r", 1025), fa.paused["orders"], "not applied")
	m, err = nc.Request("bridge.shop.resync.orders", []byte(`{"reason": "`+strings.Repeat("x", 70<<10)+`"}`), 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "400", m.Header.Get("Nats-Service-Error-Code"))
	require.Contains(t, m.Header.Get("Nats-Service-Error"), "more than 65536")

	_, err = c.Snapshot(ctx, "orders", control.SnapshotRequest{Where: "bad"})
	var ce *control.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "400", ce.Code)
	require.Equal(t, "runA", ce.Instance)

	got, err := c.Resync(ctx, "orders", control.ResyncRequest{})
	require.NoError(t, err)
	require.Equal(t, "shop.orders.new", got.Producer)
}

// TestReloadEveryInstance: reload reaches every instance; a refusal comes
// back as a 422 with the problems.
func TestReloadEveryInstance(t *testing.T) {
	url := startServer(t, nil)
	fa := newFake("runA", map[string]bool{"orders": true})
	fb := newFake("runB", map[string]bool{"orders": false})
	fb.reload = &control.Error{Code: control.CodeInvalid, Description: "the new configuration is invalid; nothing changed", Details: []string{"routes[0].sinks[0]: no sink named \"x\""}}
	startService(t, connect(t, url), fa)
	startService(t, connect(t, url), fb)
	c := control.NewClient(connect(t, url), "shop")
	rs, err := c.Reload(t.Context())
	require.NoError(t, err)
	require.Len(t, rs, 2)
	var ok, refused int
	for _, r := range rs {
		if r.Err != nil {
			refused++
			require.Equal(t, "422", r.Err.Code)
			require.Equal(t, []string{`routes[0].sinks[0]: no sink named "x"`}, r.Err.Details)
			continue
		}
		ok++
		require.Equal(t, "def", r.Reply.Revision)
	}
	require.Equal(t, 1, ok)
	require.Equal(t, 1, refused)
}

// TestNoBridge: with nothing listening the client says so at once (NATS'
// no-responders status), not after a timeout.
func TestNoBridge(t *testing.T) {
	url := startServer(t, nil)
	c := control.NewClient(connect(t, url), "shop")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.Status(ctx)
	require.ErrorIs(t, err, control.ErrNoAnswer)
	require.Contains(t, err.Error(), "no bridge listens there")
	require.Less(t, time.Since(start), 20*time.Second, "no-responders ends the wait")
}

// TestPermissionDenied: a user that may not publish to a bridge's control
// subjects (or subscribe to its replies) gets an error naming the subject
// and the fix, not a timeout; a user granted one action gets that one.
func TestPermissionDenied(t *testing.T) {
	allowAll := &server.SubjectPermission{Allow: []string{">"}}
	users := []*server.User{
		{Username: "bridge", Password: "b", Permissions: &server.Permissions{Publish: allowAll, Subscribe: allowAll}},
		{Username: "viewer", Password: "v", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"bridge.shop.status", "bridge.shop.sources"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}},
		{Username: "noreply", Password: "n", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"bridge.shop.>"}},
			Subscribe: &server.SubjectPermission{Deny: []string{">"}},
		}},
	}
	url := startServer(t, users)
	startService(t, connect(t, url, nats.UserInfo("bridge", "b")), newFake("runA", map[string]bool{"orders": true}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	viewer := control.NewClient(connect(t, url, nats.UserInfo("viewer", "v"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})), "shop")
	sts, err := viewer.Status(ctx)
	require.NoError(t, err, "the viewer may read the status")
	require.Len(t, sts, 1)
	_, err = viewer.Pause(ctx, "orders", control.PauseRequest{})
	var pe *control.PermissionError
	require.ErrorAs(t, err, &pe)
	require.ErrorIs(t, err, nats.ErrPermissionViolation)
	require.Contains(t, err.Error(), "publishing to bridge.shop.pause.orders")
	require.Contains(t, err.Error(), "docs/control.md")
	_, err = viewer.Reload(ctx)
	require.ErrorAs(t, err, &pe)
	require.Contains(t, err.Error(), "publishing to bridge.shop.reload")

	noreply := control.NewClient(connect(t, url, nats.UserInfo("noreply", "n"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})), "shop")
	_, err = noreply.Status(ctx)
	require.ErrorAs(t, err, &pe)
	require.Contains(t, err.Error(), "subscribing to its reply inbox")
	require.False(t, errors.Is(err, control.ErrNoAnswer), "a refusal is not a missing bridge: no fallback")
}

func TestSubjects(t *testing.T) {
	require.Equal(t, "bridge.shop.status", control.Subject("shop", control.ActionStatus))
	require.Equal(t, "bridge.shop.pause.orders", control.SourceSubject("shop", control.ActionPause, "orders"))
	e := control.Errorf(control.CodeInvalid, "refused %d", 2)
	e.Details = []string{"a", "b"}
	require.Equal(t, "refused 2\na\nb", e.Error())
	require.Equal(t, fmt.Sprint(30*time.Second), func() string { d, _ := control.Wait("", 30*time.Second); return d.String() }())
}
