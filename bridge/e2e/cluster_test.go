package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// natsCluster is a JetStream cluster of in-process nats-servers on
// loopback, each with its own store directory, joined by routes.
type natsCluster struct {
	t       testing.TB
	opts    []*server.Options
	servers []*server.Server // nil while stopped
}

// startCluster starts n servers and waits until JetStream has a meta leader
// that every server follows.
func startCluster(t testing.TB, n int) *natsCluster {
	t.Helper()
	c := &natsCluster{t: t, servers: make([]*server.Server, n)}
	dir := t.TempDir()
	ports := natsembed.Ports(t, 2*n) // client ports, then cluster ports
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[n+i]))
	}
	for i := range n {
		c.opts = append(c.opts, &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       ports[i],
			JetStream:  true,
			StoreDir:   filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			NoSigs:     true,
			NoLog:      true,
			Cluster:    server.ClusterOpts{Name: "bridge-test", Host: "127.0.0.1", Port: ports[n+i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		})
	}
	for i := range n {
		c.start(i)
	}
	t.Cleanup(func() {
		for i := range c.servers {
			c.stop(i)
		}
	})
	c.waitMetaLeader()
	return c
}

// start starts server i (again) on its ports and store.
func (c *natsCluster) start(i int) {
	c.t.Helper()
	o := *c.opts[i]
	s, err := server.NewServer(&o)
	require.NoError(c.t, err)
	s.Start()
	require.True(c.t, s.ReadyForConnections(10*time.Second), "server %s not ready", o.ServerName)
	c.servers[i] = s
}

// stop shuts server i down; a no-op when it is stopped.
func (c *natsCluster) stop(i int) {
	if s := c.servers[i]; s != nil {
		s.Shutdown()
		s.WaitForShutdown()
		c.servers[i] = nil
	}
}

func (c *natsCluster) port(i int) int { return c.opts[i].Port }

// urls is the comma-separated list of every server's client URL.
func (c *natsCluster) urls() string {
	var u []string
	for i := range c.opts {
		u = append(u, fmt.Sprintf("nats://127.0.0.1:%d", c.port(i)))
	}
	return strings.Join(u, ",")
}

func (c *natsCluster) waitMetaLeader() {
	c.t.Helper()
	require.Eventually(c.t, func() bool {
		leader := false
		for _, s := range c.servers {
			if s == nil {
				continue
			}
			if !s.JetStreamIsCurrent() {
				return false
			}
			leader = leader || s.JetStreamIsLeader()
		}
		return leader
	}, 30*time.Second, 50*time.Millisecond, "no JetStream meta leader")
}

// streamLeader returns the index of the server leading stream, or -1.
func (c *natsCluster) streamLeader(stream string) int {
	for i, s := range c.servers {
		if s != nil && s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return i
		}
	}
	return -1
}

// TestClusterR3LeaderRestart runs the bridge against a three-server
// JetStream cluster with an R3 stream and an R3 checkpoint bucket, and
// shuts down the stream's leader (then restarts it) while writers commit.
// Every committed change must be in the stream exactly once, in order.
// It runs with transactions published message by message and as atomic
// batches.
func TestClusterR3LeaderRestart(t *testing.T) {
	defer parallel(t)()
	for _, tc := range []struct {
		name   string
		atomic bool
	}{{"per_message", false}, {"atomic", true}} {
		t.Run(tc.name, func(t *testing.T) {
			defer parallelLong(t)() // each case has servers of its own
			clusterR3LeaderRestart(t, tc.atomic)
		})
	}
}

func clusterR3LeaderRestart(t *testing.T, atomic bool) {
	c := startCluster(t, 3)
	e := &env{t: t, pg: pgtest.StartT(t, pgtest.Options{}), dir: t.TempDir(),
		nsOpts: natsembed.Options{Host: "127.0.0.1", Port: c.port(0)}}
	w := newWorkload(t, e)
	t.Cleanup(func() { w.stopped.Store(true) })

	cfgPath := filepath.Join(e.dir, "cluster.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf(`name: cluster
data_dir: %s
nats:
  url: %s
sources:
  app:
    type: pgoutput
    config:
      dsn: %s
      slot: slot_cluster
      publication: pub_cluster
checkpoint:
  interval: 200ms
  replicas: 3
http:
  listen: "127.0.0.1:0"
sinks:
  js:
    type: nats_jetstream
    config:
      stream: CDC_cluster
      subjects: ["cdc.cluster.>"]
      duplicate_window: 1s
      replicas: 3
      ack_timeout: 5s
      atomic_transactions: %t
routes:
  - sinks: [js]
    subject: "cdc.cluster.{{.Schema}}.{{.Table}}"
`, filepath.Join(e.dir, "data"), c.urls(), e.pg.DSN(""), atomic)), 0o644))

	r := e.start(cfgPath)
	waitReady(t, r)
	checkReplicas(t, c.urls(), "CDC_cluster", "KV_bridge_checkpoints")

	wait := w.run(t, 2, 1<<30, 5*time.Millisecond)
	time.Sleep(time.Second)
	leader := c.streamLeader("CDC_cluster")
	if leader < 0 {
		leader = 2 // no leader known right now: any server will do
	}
	t.Logf("shutting down n%d, the stream leader, after %d changes", leader+1, w.total.Load())
	c.stop(leader)
	// The other two elect a new leader; the bridge carries on with it.
	require.Eventually(t, func() bool { return c.streamLeader("CDC_cluster") >= 0 }, 30*time.Second, 50*time.Millisecond,
		"no new stream leader")
	t.Logf("n%d leads the stream after %d changes", c.streamLeader("CDC_cluster")+1, w.total.Load())
	time.Sleep(time.Second)
	t.Logf("restarting n%d after %d changes", leader+1, w.total.Load())
	c.start(leader)
	time.Sleep(time.Second)
	w.stopped.Store(true)
	wait()
	t.Logf("%d changes committed", w.total.Load())

	// Every server catches up; then read back through one that stayed up.
	c.waitMetaLeader()
	c.waitStreamCurrent("CDC_cluster")
	url := fmt.Sprintf("nats://127.0.0.1:%d", c.port((leader+1)%3))
	w.verifyStored(t, func(n int) []msg { return clusterMessages(t, url, "CDC_cluster", n) })
}

// verifyStored is verifyExactlyOnce over messages read by read (which
// waits, within reason, for n messages): every recorded event once, nothing
// else, in commit order, and nothing more arriving later.
func (w *workload) verifyStored(t *testing.T, read func(n int) []msg) {
	t.Helper()
	want, total := w.expected()
	ms := read(total)
	checkOrdered(t, ms)
	checkEvents(t, "the stream", ms, want, total)
	time.Sleep(500 * time.Millisecond)
	require.Len(t, read(total), total)
}

// clusterMessages waits up to a minute for stream to hold n messages, then
// reads every message of it like env.messages, through url, retrying what a
// cluster refuses for a moment: a new consumer's interest takes a little
// while to reach every server ("no responders").
func clusterMessages(t *testing.T, url, stream string, n int) []msg {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var s jetstream.Stream
	var info *jetstream.StreamInfo
	deadline := time.Now().Add(time.Minute)
	for {
		if s, err = js.Stream(ctx, stream); err == nil {
			info, err = s.Info(ctx)
		}
		if err == nil && info.State.Msgs >= uint64(n) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, err, "stream %s", stream)
	if info.State.Msgs == 0 {
		return nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	var out []msg
	for uint64(len(out)) < info.State.Msgs {
		require.NoError(t, ctx.Err(), "reading %s: %d of %d messages", stream, len(out), info.State.Msgs)
		batch, err := cons.FetchNoWait(1000)
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			require.NoError(t, err)
			id := m.Headers().Get("Nats-Msg-Id")
			_, pos, err := cdc.ParseID(id)
			require.NoError(t, err, "message %d", md.Sequence.Stream)
			body, err := decodeBody(m.Data())
			require.NoError(t, err, "message %d: %s", md.Sequence.Stream, m.Data())
			out = append(out, msg{Seq: md.Sequence.Stream, Subject: m.Subject(), ID: id, Pos: pos, Header: m.Headers(), Body: body, Raw: append([]byte(nil), m.Data()...)})
		}
		if batch.Error() != nil || n == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return out
}

// waitStreamCurrent waits until stream has a leader and every server's
// replica of it is current, for up to two minutes; then a leader and a
// quorum of current replicas will do, with the stragglers logged. A
// restarted server's replica sometimes never catches up (three times in
// two of four full runs on 2026-12-06, in TestClusterR3LeaderRestart and
// TestFleetClusterR3, idle cluster, two minutes): nats-server's own
// catch-up, as in nats-server#8319, not something the bridge does or can
// see. What the tests prove is read from the stream's leader after it.
//
// A stream with no leader at all after two minutes, every server up, is
// nats-server's Raft group wedged (TestFleetClusterR3 met it twice in CI,
// on 152f68b and ac96d6c: all three replicas behind, every publish timing
// out, the class of nats-server#8519, where a step-down cannot land
// either). Then it logs each server's view of the group and applies an
// operator's remedy, a rolling restart of the servers, and waits two
// minutes more; only a stream still without a leader after that fails the
// test. What the test proves about the bridge (every change exactly once,
// in order) is still read from the stream afterwards, so a bridge that
// lost or doubled a change across the wedge fails all the same.
func (c *natsCluster) waitStreamCurrent(stream string) {
	c.t.Helper()
	if c.streamSettled(stream, 2*time.Minute) {
		return
	}
	if c.streamLeader(stream) >= 0 {
		c.t.Fatalf("stream %s: a leader but no quorum of current replicas after two minutes; its group as each server sees it:\n%s", stream, c.raftState(stream))
	}
	c.t.Logf("stream %s: no leader after two minutes with every server up (nats-server Raft group wedged); its group as each server sees it:\n%s",
		stream, c.raftState(stream))
	c.rollingRestart(stream)
	if !c.streamSettled(stream, 2*time.Minute) {
		c.t.Fatalf("stream %s: no leader with a quorum of current replicas two minutes after a rolling restart of the cluster; its group as each server sees it:\n%s",
			stream, c.raftState(stream))
	}
}

// streamSettled waits up to wait for stream to have a leader and every
// replica current. At the deadline a leader with a quorum of current
// replicas is enough (the stragglers are logged); otherwise it reports
// false.
func (c *natsCluster) streamSettled(stream string, wait time.Duration) bool {
	c.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		var behind []string
		current := 0
		for i, s := range c.servers {
			if s != nil && s.JetStreamIsStreamCurrent(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
				current++
			} else {
				behind = append(behind, fmt.Sprintf("n%d", i+1))
			}
		}
		leader := c.streamLeader(stream) >= 0
		if leader && len(behind) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			if leader && current > len(c.servers)/2 {
				c.t.Logf("stream %s: the replicas on %v are still not current after %v; a quorum is, with a leader (nats-server catch-up)", stream, behind, wait)
				return true
			}
			c.t.Logf("stream %s: after %v, leader: %v, replicas behind: %v", stream, wait, leader, behind)
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rollingRestart restarts the servers one at a time, each after the
// cluster has a meta leader again, stopping early once stream has a
// leader and a quorum of current replicas.
func (c *natsCluster) rollingRestart(stream string) {
	c.t.Helper()
	for i := range c.servers {
		c.t.Logf("stream %s: restarting n%d", stream, i+1)
		c.stop(i)
		time.Sleep(time.Second)
		c.start(i)
		c.waitMetaLeader()
		if c.streamSettled(stream, 20*time.Second) {
			c.t.Logf("stream %s: a leader again after restarting n1..n%d", stream, i+1)
			return
		}
	}
}

// raftState is one line per server: its view of stream's Raft group
// (state, term, vote, leader, commit and apply indexes, catch-up), for a
// failure's log.
func (c *natsCluster) raftState(stream string) string {
	var b strings.Builder
	for i, s := range c.servers {
		fmt.Fprintf(&b, "  n%d: ", i+1)
		if s == nil {
			b.WriteString("stopped\n")
			continue
		}
		group := ""
		if info, err := s.Jsz(&server.JSzOptions{Accounts: true, Streams: true, RaftGroups: true}); err == nil {
			for _, a := range info.AccountDetails {
				for _, sd := range a.Streams {
					if sd.Name == stream {
						group = sd.RaftGroup
					}
				}
			}
		}
		if group == "" {
			b.WriteString("no replica of the stream\n")
			continue
		}
		st := s.Raftz(&server.RaftzOptions{AccountFilter: server.DEFAULT_GLOBAL_ACCOUNT, GroupFilter: group})
		if st == nil {
			fmt.Fprintf(&b, "group %s: no Raft state\n", group)
			continue
		}
		g, ok := (*st)[server.DEFAULT_GLOBAL_ACCOUNT][group]
		if !ok {
			fmt.Fprintf(&b, "group %s: not registered\n", group)
			continue
		}
		fmt.Fprintf(&b, "group %s state=%s term=%d vote=%q leader=%q ever_had_leader=%v committed=%d applied=%d pindex=%d pterm=%d catching_up=%v paused=%v proposals=%d entries=%d\n",
			group, g.State, g.Term, g.Vote, g.Leader, g.EverHadLeader, g.Committed, g.Applied, g.PIndex, g.PTerm, g.CatchingUp, g.Paused, g.IPQPropLen, g.IPQEntryLen)
	}
	return b.String()
}

// checkReplicas asserts that every named stream has three replicas.
func checkReplicas(t *testing.T, url string, streams ...string) {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range streams {
		s, err := js.Stream(ctx, name)
		require.NoError(t, err, name)
		info, err := s.Info(ctx)
		require.NoError(t, err, name)
		require.Equal(t, 3, info.Config.Replicas, "%s replicas", name)
	}
}

// TestClusterRollingRestartRemedy runs the remedy waitStreamCurrent applies
// to a wedged stream (a rolling restart) on a healthy R3 stream, since a
// wedge cannot be had on demand: the stream must have a leader again, hold
// every message, and each server's view of its Raft group must be
// readable for the failure log.
func TestClusterRollingRestartRemedy(t *testing.T) {
	defer parallel(t)()
	c := startCluster(t, 3)
	js := jsAt(t, c.urls())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "REMEDY", Subjects: []string{"remedy.>"}, Replicas: 3})
	require.NoError(t, err)
	const n = 50
	for i := range n {
		_, err := js.Publish(ctx, fmt.Sprintf("remedy.%d", i), []byte("x"))
		require.NoError(t, err)
	}
	require.True(t, c.streamSettled("REMEDY", time.Minute))
	state := c.raftState("REMEDY")
	t.Logf("before:\n%s", state)
	require.Equal(t, 1, strings.Count(state, "state=LEADER"), state)
	require.Equal(t, 3, strings.Count(state, " committed="), state)

	c.rollingRestart("REMEDY")
	require.True(t, c.streamSettled("REMEDY", time.Minute))
	st, err := js.Stream(ctx, "REMEDY")
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(n), info.State.Msgs, "messages after the rolling restart")
	_, err = js.Publish(ctx, "remedy.after", []byte("x"))
	require.NoError(t, err, "publishing after the rolling restart")
	t.Logf("after:\n%s", c.raftState("REMEDY"))
}
