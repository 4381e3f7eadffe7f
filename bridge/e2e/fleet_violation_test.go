package e2e_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/pipeline"
)

// TestFleetForcedTwoOwnersCaught forces what the leases prevent: two
// members that both hold the lease of one source (members of two fleets,
// with different buckets, on one configuration). The safety net behind the
// lease must catch it: the slot admits one walsender, so one streams and
// the other waits (standby); when the streaming one stops, the other takes
// the slot over from the checkpoint, and every change is in the stream
// exactly once, in commit order.
//
// Serial: a takeover, bounded in time, while both members renew leases.
func TestFleetForcedTwoOwnersCaught(t *testing.T) {
	e := newEnv(t)
	w := newWorkload(t, e)
	t.Cleanup(func() { w.stopped.Store(true) })
	cfg := e.config("twoowners", "")
	holds := func(r *running) bool {
		_, held := r.app.Fleet()
		return len(held) == 1 && held[0] == "app"
	}
	// The second owner starts once the first has created the source's
	// checkpoint and streams: started together, the one that loses the
	// race to create the checkpoint is fenced there and stops, which is
	// caught too, but not the slot's safety net this test is about.
	a := e.startWith(cfg, app.WithFleet("fa", 0))
	waitSlotActive(t, e, "slot_twoowners")
	b := e.startWith(cfg, app.WithFleet("fb", 0))
	require.Eventually(t, func() bool { return holds(a) && holds(b) }, 30*time.Second, 20*time.Millisecond,
		"both members should hold the source's lease, each in its own fleet")

	wait := w.run(t, 2, 1<<30, 5*time.Millisecond)
	state := func(r *running) pipeline.State {
		ps := r.app.Pipelines()
		if len(ps) != 1 {
			return ""
		}
		return ps[0].Status().State
	}
	var streaming, waiting *running
	require.Eventually(t, func() bool {
		sa, sb := state(a), state(b)
		switch {
		case sa == pipeline.StateStreaming && sb == pipeline.StateStandby:
			streaming, waiting = a, b
		case sb == pipeline.StateStreaming && sa == pipeline.StateStandby:
			streaming, waiting = b, a
		default:
			return false
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "one member should stream and the other wait for the slot")
	time.Sleep(2 * time.Second)
	require.Equal(t, pipeline.StateStandby, state(waiting), "the second owner must never stream while the first does")

	streaming.stop(t)
	require.Eventually(t, func() bool { return state(waiting) == pipeline.StateStreaming }, 40*time.Second, 50*time.Millisecond,
		"the other owner should take the slot over")
	time.Sleep(time.Second)
	w.stopped.Store(true)
	wait()
	w.verifyExactlyOnce(t, e, "CDC_twoowners")
}
