package fleet_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/fleet"
	"github.com/bridgecdc/bridge/internal/faultproxy"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

// ledger is what the fake runners of every member did: who runs each
// source, and every time a member started a source another member was
// still running (a violation of the one-writer rule).
type ledger struct {
	mu         sync.Mutex
	running    map[string]string // source → member
	ranBy      map[string]string // source → member that last started it
	startedAt  map[string]time.Time
	violations []string
	starts     int
	drains     int
}

func newLedger() *ledger {
	return &ledger{running: map[string]string{}, ranBy: map[string]string{}, startedAt: map[string]time.Time{}}
}

// runner is one member's fake fleet.Runner: a source "runs" between Start
// and Stop.
type runner struct {
	l      *ledger
	member string
}

func (r *runner) Start(_ context.Context, source string) error {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if o, ok := r.l.running[source]; ok {
		r.l.violations = append(r.l.violations, fmt.Sprintf("%s started %s while %s still ran it", r.member, source, o))
	}
	r.l.running[source] = r.member
	r.l.ranBy[source] = r.member
	r.l.startedAt[source] = time.Now()
	r.l.starts++
	return nil
}

func (r *runner) Stop(_ context.Context, source string, drain bool) {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if r.l.running[source] == r.member {
		delete(r.l.running, source)
		if drain {
			r.l.drains++
		}
	}
}

func (l *ledger) perMember() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for _, m := range l.running {
		out[m]++
	}
	return out
}

func (l *ledger) counters() (starts, drains int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.starts, l.drains
}

// member is a fleet member under test, on its own NATS connection through
// its own fault proxy.
type member struct {
	id     string
	proxy  *faultproxy.Proxy
	nc     *nats.Conn
	m      *fleet.Member
	cancel context.CancelFunc
	done   chan struct{}
}

const testLease = 2 * time.Second

func startMember(t *testing.T, srv *natsembed.Server, l *ledger, id string, sources []string) *member {
	t.Helper()
	p, err := faultproxy.Start(fmt.Sprintf("127.0.0.1:%d", srv.Options().Port))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	nc, err := nats.Connect("nats://"+p.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Timeout(time.Second))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := fleet.Open(t.Context(), js, fleet.Options{Fleet: "test", Member: id, Lease: testLease,
		Sources: func() []string { return sources }, Log: log}, &runner{l: l, member: id})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	mb := &member{id: id, proxy: p, nc: nc, m: m, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(mb.done)
		_ = m.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-mb.done })
	return mb
}

// waitSpread waits until every source runs and each of want members runs
// between ⌊S/M⌋ and ⌈S/M⌉ of them.
func waitSpread(t *testing.T, l *ledger, sources int, want []string) map[string]int {
	t.Helper()
	var last map[string]int
	lo, hi := sources/len(want), (sources+len(want)-1)/len(want)
	require.Eventually(t, func() bool {
		last = l.perMember()
		total := 0
		for _, m := range want {
			if last[m] < lo || last[m] > hi {
				return false
			}
			total += last[m]
		}
		return total == sources && len(last) == len(want)
	}, 60*time.Second, 20*time.Millisecond, "sources never spread evenly over %v", want)
	return last
}

// TestFleetSharesTakesOverAndRebalances runs members of one fleet with
// fake runners against a real NATS server: 12 sources spread 4/4/4; a
// fourth member takes 3 with exactly 3 hand-overs; a member cut off from
// NATS (its link stalled, as in a partition) stops its sources before
// anyone else starts them, and the others take them over; it comes back
// and gets its share; a member that leaves cleanly hands over at once.
// Through all of it no source ever runs on two members.
func TestFleetSharesTakesOverAndRebalances(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	l := newLedger()
	srcs := make([]string, 12)
	for i := range srcs {
		srcs[i] = fmt.Sprintf("db%02d", i)
	}
	a := startMember(t, srv, l, "a", srcs)
	b := startMember(t, srv, l, "b", srcs)
	c := startMember(t, srv, l, "c", srcs)
	waitSpread(t, l, 12, []string{"a", "b", "c"})
	time.Sleep(testLease) // settled: nothing more moves
	starts0, drains0 := l.counters()

	// A fourth member: one source from each of the three, nothing else.
	d := startMember(t, srv, l, "d", srcs)
	waitSpread(t, l, 12, []string{"a", "b", "c", "d"})
	time.Sleep(testLease)
	starts1, drains1 := l.counters()
	require.Equal(t, 3, drains1-drains0, "a newcomer should make exactly 3 hand-overs")
	require.Equal(t, 3, starts1-starts0, "a newcomer should make exactly 3 starts")

	// Partition b: it must stop its sources itself before the lease
	// lets anyone take them.
	before := l.perMember()["b"]
	require.Equal(t, 3, before)
	cut := time.Now()
	b.proxy.Stall()
	waitSpread(t, l, 12, []string{"a", "c", "d"})
	l.mu.Lock()
	var took []time.Duration
	for s, m := range l.ranBy {
		if at := l.startedAt[s]; at.After(cut) && m != "b" {
			took = append(took, at.Sub(cut))
		}
	}
	l.mu.Unlock()
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	t.Logf("partition of one member: %d sources taken over after %v (lease %v)", len(took), took, testLease)
	require.GreaterOrEqual(t, len(took), 3)

	// b's link heals: it rejoins and gets its share back.
	b.proxy.Resume()
	waitSpread(t, l, 12, []string{"a", "b", "c", "d"})

	// c leaves cleanly: its leases are released, not left to expire.
	c.cancel()
	<-c.done
	left := time.Now()
	waitSpread(t, l, 12, []string{"a", "b", "d"})
	t.Logf("a clean leave was taken over within %v", time.Since(left))

	_ = a
	_ = d
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Empty(t, l.violations, "a source ran on two members at once")
}

// TestFleetStatusReadsTheBucket reads members and leases back.
func TestFleetStatusReadsTheBucket(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	l := newLedger()
	srcs := []string{"shop", "billing.eu"}
	startMember(t, srv, l, "a", srcs)
	waitSpread(t, l, 2, []string{"a"})
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := fleet.ReadStatus(t.Context(), js, "test")
		require.NoError(t, err)
		return len(st.Members) == 1 && len(st.Members[0].Sources) == 2
	}, 10*time.Second, 50*time.Millisecond)
	st, err := fleet.ReadStatus(t.Context(), js, "test")
	require.NoError(t, err)
	require.Equal(t, "bridge_fleet_test", st.Bucket)
	require.Len(t, st.Leases, 2)
	require.Equal(t, "billing.eu", st.Leases[0].Source, "source names with dots are escaped in keys and read back")
	require.Equal(t, "a", st.Leases[0].Owner)
	require.Equal(t, uint64(1), st.Leases[0].Epoch)

	_, err = fleet.ReadStatus(t.Context(), js, "nosuch")
	require.ErrorContains(t, err, "bridge run --fleet nosuch")
}

// TestFleetStolenLeaseStopsAtOnce overwrites the lease a member holds, as a
// writer outside the protocol would: the member's next renewal fails its
// compare-and-set and it stops the source at once; once the foreign lease
// expires (nobody renews it) the fleet takes the source again.
func TestFleetStolenLeaseStopsAtOnce(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	l := newLedger()
	startMember(t, srv, l, "a", []string{"shop"})
	waitSpread(t, l, 1, []string{"a"})
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(t.Context(), fleet.Bucket("test"))
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), "lease.shop", []byte(`{"owner":"intruder","epoch":99}`))
	require.NoError(t, err)
	stolen := time.Now()
	require.Eventually(t, func() bool { return len(l.perMember()) == 0 }, 10*time.Second, 10*time.Millisecond,
		"the member should stop a source whose lease another wrote")
	t.Logf("stopped %v after the lease was overwritten (renewals every %v)", time.Since(stolen), testLease/5)
	waitSpread(t, l, 1, []string{"a"})
	e, err := kv.Get(t.Context(), "lease.shop")
	require.NoError(t, err)
	require.Contains(t, string(e.Value()), `"epoch":100`, "the epoch grows past the foreign one")
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Empty(t, l.violations)
}

// TestFleetHoldingWhileTheLeaseIsValid: Holding, which lets a member end a
// former owner's reader of the slot, is true while the member holds the
// lease, with its epoch, and false once it could not renew it in time (cut
// off from NATS), before another member takes the source over at the next
// epoch.
func TestFleetHoldingWhileTheLeaseIsValid(t *testing.T) {
	holds := func(mb *member, source string) bool { _, ok := mb.m.Holding(source); return ok }
	srv := natsembed.StartT(t, natsembed.Options{})
	l := newLedger()
	a := startMember(t, srv, l, "a", []string{"shop"})
	waitSpread(t, l, 1, []string{"a"})
	epoch, ok := a.m.Holding("shop")
	require.True(t, ok)
	require.Equal(t, uint64(1), epoch)
	require.False(t, holds(a, "billing"), "a source it does not hold")
	b := startMember(t, srv, l, "b", []string{"shop"})
	require.Never(t, func() bool { return !holds(a, "shop") }, testLease, 20*time.Millisecond, "a lease kept renewed stays held")

	a.proxy.Stall()
	cut := time.Now()
	var gaveUp time.Duration
	overlap := false
	require.Eventually(t, func() bool {
		aHolds := holds(a, "shop")
		l.mu.Lock()
		bRuns := l.running["shop"] == "b"
		l.mu.Unlock()
		overlap = overlap || aHolds && bRuns
		if !aHolds && gaveUp == 0 {
			gaveUp = time.Since(cut)
		}
		return bRuns
	}, 20*time.Second, 5*time.Millisecond, "the other member never took the source over")
	require.False(t, overlap, "the cut-off member still held the lease while the other ran the source")
	epoch, ok = b.m.Holding("shop")
	require.True(t, ok)
	require.Equal(t, uint64(2), epoch, "the next epoch")
	l.mu.Lock()
	taken := l.startedAt["shop"].Sub(cut)
	l.mu.Unlock()
	t.Logf("cut off: held until %v after the cut; taken over after %v (lease %v)", gaveUp, taken, testLease)
}

// TestFleetCutOffStopsOnItsLeasesClock: a member cut off from NATS sees
// the other member's key go stale and tries to take its sources, each
// take a call that times out; its own sources must still stop when their
// leases run out, before the other member may start them, however long
// those calls keep its loop busy.
func TestFleetCutOffStopsOnItsLeasesClock(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	l := newLedger()
	var sources []string
	for i := range 16 {
		sources = append(sources, fmt.Sprintf("s%02d", i))
	}
	a := startMember(t, srv, l, "a", sources)
	startMember(t, srv, l, "b", sources)
	waitSpread(t, l, len(sources), []string{"a", "b"})

	aHeld := a.m.Held()
	require.NotEmpty(t, aHeld)
	a.proxy.Stall()
	overlap := ""
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, s := range aHeld {
			if _, holds := a.m.Holding(s); holds && l.running[s] == "b" && overlap == "" {
				overlap = s
			}
		}
		for _, s := range aHeld {
			if l.running[s] != "b" {
				return false
			}
		}
		return true
	}, 30*time.Second, 2*time.Millisecond, "the other member never took the cut-off member's sources over")
	require.Empty(t, overlap, "the cut-off member still held the lease of %s while the other member ran it", overlap)
}
