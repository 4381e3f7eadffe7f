package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sources"
)

func storeT(t *testing.T) *checkpoint.Store {
	t.Helper()
	srv := natsembed.StartT(t, natsembed.Options{})
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := checkpoint.Open(t.Context(), js, "bridge_checkpoints", 1)
	require.NoError(t, err)
	return st
}

// TestMayEvictJudgesTheOwnersHeartbeat: outside a fleet a reader of the
// slot is stale only when the owner's heartbeat names it and kept one
// revision for owner_timeout as this pipeline saw it; a new revision, a
// heartbeat of another reader, or none, is no reason. In a fleet the lease
// (MayEvict) alone decides.
func TestMayEvictJudgesTheOwnersHeartbeat(t *testing.T) {
	store := storeT(t)
	const timeout = 400 * time.Millisecond
	p := New(Config{Bridge: "b", Source: "s", Store: store, OwnerTimeout: timeout, Shutdown: 5 * time.Second})
	key := checkpoint.OwnerKey("b", "s")
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	busy := &sources.SlotBusyError{Slot: "slot", Holder: sources.SlotReader{PID: 42, Started: started}}
	may := func() bool { _, ok := p.mayEvict(t.Context(), busy); return ok }
	set := func(o checkpoint.Owner) {
		_, err := store.SetOwner(t.Context(), key, o)
		require.NoError(t, err)
	}

	require.False(t, may(), "no heartbeat: not known to be a bridge")
	set(checkpoint.Owner{Run: "r1", PID: 42, Started: started})
	seen := time.Now()
	require.False(t, may(), "a heartbeat just seen")
	require.Eventually(t, may, 10*time.Second, 20*time.Millisecond, "a heartbeat unchanged for owner_timeout is stale")
	require.GreaterOrEqual(t, time.Since(seen), timeout)
	why, _ := p.mayEvict(t.Context(), busy)
	require.Contains(t, why, "run r1")
	require.Contains(t, why, "checkpoint.owner_timeout 400ms")

	set(checkpoint.Owner{Run: "r1", PID: 42, Started: started})
	require.False(t, may(), "a new revision: the owner lives")

	for _, o := range []checkpoint.Owner{
		{Run: "r2", PID: 43, Started: started},                // another walsender
		{Run: "r2", PID: 42, Started: started.Add(time.Hour)}, // the PID reused by another process
	} {
		set(o)
		require.Never(t, may, 3*timeout, 20*time.Millisecond, "the heartbeat names another reader than %+v: %+v", busy.Holder, o)
	}

	// A fleet: the lease decides, whatever the heartbeat says.
	held := false
	p = New(Config{Bridge: "b", Source: "s", Store: store, OwnerTimeout: timeout, Shutdown: 5 * time.Second,
		MayEvict: func() (bool, string) { return held, "lease" }})
	require.False(t, may())
	held = true
	why, ok := p.mayEvict(t.Context(), busy)
	require.True(t, ok)
	require.Equal(t, "lease", why)

	// Off: never.
	p = New(Config{Bridge: "b", Source: "s", Store: store, Shutdown: 5 * time.Second})
	set(checkpoint.Owner{Run: "r3", PID: 42, Started: started})
	require.Never(t, may, 3*timeout, 20*time.Millisecond)
}

// readerSource is a source that names its reader, for beat.
type readerSource struct {
	sources.Source
	r sources.SlotReader
}

func (s readerSource) Reader() sources.SlotReader                      { return s.r }
func (s readerSource) Evict(context.Context, sources.SlotReader) error { return nil }
func (s readerSource) Open(context.Context, cdc.LSN) error             { return nil }

// TestOwnerHeartbeatWhileHolding: a run holding the slot writes the
// heartbeat at once naming its reader, rewrites it every owner_timeout/4,
// and deletes it when it lets the slot go.
func TestOwnerHeartbeatWhileHolding(t *testing.T) {
	store := storeT(t)
	p := New(Config{Bridge: "b", Source: "s", Store: store, Run: "me", OwnerTimeout: time.Second, Shutdown: 5 * time.Second})
	key := checkpoint.OwnerKey("b", "s")
	r := sources.SlotReader{PID: 7, Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	stop := p.beat(t.Context(), readerSource{r: r})
	o, err := store.LoadOwner(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, "me", o.Run)
	require.Equal(t, 7, o.PID)
	require.True(t, o.Started.Equal(r.Started))
	first := o.Revision
	require.Eventually(t, func() bool {
		o, err := store.LoadOwner(t.Context(), key)
		return err == nil && o.Revision >= first+2
	}, 5*time.Second, 20*time.Millisecond, "the heartbeat is rewritten every owner_timeout/4")
	stop()
	o, err = store.LoadOwner(t.Context(), key)
	require.NoError(t, err)
	require.Zero(t, o, "deleted once the slot is let go")

	// Off: nothing written.
	p = New(Config{Bridge: "b", Source: "s", Store: store, Run: "me", Shutdown: 5 * time.Second})
	p.beat(t.Context(), readerSource{r: r})()
	o, err = store.LoadOwner(t.Context(), key)
	require.NoError(t, err)
	require.Zero(t, o)
}
