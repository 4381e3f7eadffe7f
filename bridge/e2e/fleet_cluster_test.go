package e2e_test

import (
	"fmt"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/faultproxy"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// logTimes returns, per source, the times of the log lines of out whose
// message is msg, from instant on.
func logTimes(t *testing.T, out, msg string, after time.Time) map[string][]time.Time {
	t.Helper()
	re := regexp.MustCompile(`(?m)^time=(\S+) level=\S+ msg="` + regexp.QuoteMeta(msg) + `".* source=(\S+)`)
	res := map[string][]time.Time{}
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		at, err := time.Parse(time.RFC3339Nano, m[1])
		require.NoError(t, err)
		if at.After(after) {
			res[m[2]] = append(res[m[2]], at)
		}
	}
	return res
}

// TestFleetClusterR3 runs three fleet members over 6 databases against a
// three-server JetStream cluster (streams, checkpoints and the fleet's
// bucket all R3), restarts one NATS server, and then cuts one member off
// NATS (its link through a fault proxy stalled, as in a network
// partition) for three leases, then heals it. The member cut off must stop
// each of its sources before another member starts it (compared on the
// processes' log clocks, one machine), the others must take them over,
// and every committed change must be in its stream exactly once, in commit
// order.
//
// Serial: a partition of a set number of leases, and the processes' log
// clocks compared across a takeover.
func TestFleetClusterR3(t *testing.T) {
	const nsrc = 6
	bin := bridgeBinary(t)
	c := startCluster(t, 3)
	e := &env{t: t, pg: pgtest.StartT(t, pgtest.Options{Settings: map[string]string{"max_wal_senders": "30", "max_replication_slots": "30"}}), dir: t.TempDir(),
		nsOpts: natsembed.Options{Host: "127.0.0.1", Port: c.port(0)}}
	srcs := fleetDatabases(t, e, nsrc)
	cfg := filepath.Join(e.dir, "fleet.yaml")
	fleetConfigOn(t, e, cfg, srcs, "v1", c.urls(), 3)

	// The third member reaches NATS only through a proxy to n3.
	proxy, err := faultproxy.Start(fmt.Sprintf("127.0.0.1:%d", c.port(2)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	procs := []*fleetProc{
		startFleetProc(t, bin, cfg, "r3", "p0"),
		startFleetProc(t, bin, cfg, "r3", "p1"),
		startFleetProc(t, bin, cfg, "r3", "p2", "BRIDGE_NATS__URL=nats://"+proxy.Addr()),
	}
	nc, err := nats.Connect(c.urls())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	pg := e.pg.Conn(t, "")
	ownedBy := func(members []*fleetProc) map[string]string {
		t.Helper()
		return waitOwned(t, js, pg, "r3", srcs, members, 2*time.Minute)
	}
	ls := ownedBy(procs)
	checkReplicas(t, c.urls(), "KV_bridge_fleet_r3", "KV_bridge_checkpoints", "FLEET_DB00")

	stopWriters := startWriters(t, e, srcs)
	defer stopWriters()
	time.Sleep(2 * time.Second)

	// A NATS server restarts: the fleet goes on (a source may change hands
	// while the bucket elects a leader, never to two writers).
	t.Logf("restarting n2; leases %v", ls)
	c.stop(1)
	time.Sleep(3 * time.Second)
	c.start(1)
	c.waitMetaLeader()
	ls = ownedBy(procs)
	t.Logf("after the restart of n2: leases %v", ls)
	time.Sleep(2 * time.Second)

	// Partition p2 from NATS for three leases.
	cut := procs[2]
	var its []string
	for s, o := range leases(t, js, "r3") {
		if o == cut.id {
			its = append(its, s)
		}
	}
	require.NotEmpty(t, its, "p2 should hold sources before the partition: %v", ls)
	stalled := time.Now()
	proxy.Stall()
	ls = ownedBy(procs[:2])
	t.Logf("p2 cut off: its sources %v taken over after %v", its, time.Since(stalled))
	time.Sleep(10 * time.Second)
	proxy.Resume()
	t.Logf("p2's link healed")

	// No overlap: p2 gave each of its sources up (cancelled its pipeline)
	// before anyone else took its lease. Its pipeline's goodbye may last
	// longer (bounded by shutdown.timeout): meanwhile its walsender keeps
	// the slot, and the stream's fence refuses a late publish.
	lostAt := logTimes(t, cut.log.String(), "fleet: lease lost; stopping the source at once (its next owner resumes from the checkpoint)", stalled)
	endedAt := logTimes(t, cut.log.String(), "fleet: source stopped", stalled)
	for _, s := range its {
		require.NotEmpty(t, lostAt[s], "p2 never gave source %s up after losing NATS:\n%s", s, tail(cut.log.String(), 40))
		var took []time.Time
		for _, p := range procs[:2] {
			took = append(took, logTimes(t, p.log.String(), "fleet: source taken", stalled)[s]...)
		}
		require.NotEmpty(t, took, "source %s was not taken over", s)
		for _, at := range took {
			require.True(t, lostAt[s][0].Before(at), "source %s: taken over at %s, before p2 gave it up at %s", s, at, lostAt[s][0])
		}
		var ended time.Duration
		if len(endedAt[s]) > 0 {
			ended = endedAt[s][0].Sub(stalled)
		}
		t.Logf("source %s: p2 gave it up %v after the cut, taken over %v after (its pipeline ended %v after the cut)",
			s, lostAt[s][0].Sub(stalled).Round(time.Millisecond), took[0].Sub(lostAt[s][0]).Round(time.Millisecond), ended.Round(time.Millisecond))
	}
	// Healed, p2 gets its share back.
	require.Eventually(t, func() bool {
		n := 0
		for _, o := range leases(t, js, "r3") {
			if o == cut.id {
				n++
			}
		}
		return n == nsrc/3
	}, time.Minute, 100*time.Millisecond, "p2 should take its share again after the partition")
	ownedBy(procs)
	time.Sleep(2 * time.Second)

	stopWriters()
	c.waitMetaLeader()
	total := 0
	for _, s := range srcs {
		c.waitStreamCurrent(s.stream)
		v := s.verifyRead(t, func(n int) []msg { return clusterMessages(t, c.urls(), s.stream, n) })
		total += v["v1"]
	}
	t.Logf("%d changes over %d sources, each exactly once in commit order, through a NATS restart and a partition", total, nsrc)
	for _, p := range procs {
		p.term(t)
	}
}
