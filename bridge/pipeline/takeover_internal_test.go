package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/retry"
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
// revision for owner_timeout (the owner's, when longer) as this pipeline
// saw it; a new revision, a record of another reader, a record that is no
// heartbeat, or none, is no reason.
func TestMayEvictJudgesTheOwnersHeartbeat(t *testing.T) {
	store := storeT(t)
	const timeout = 400 * time.Millisecond
	p := New(Config{Bridge: "b", Source: "s", Store: store, OwnerTimeout: timeout, Shutdown: 5 * time.Second})
	key := checkpoint.OwnerKey("b", "s")
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	busy := &sources.SlotBusyError{Slot: "slot", Holder: sources.SlotReader{PID: 42, Started: started}}
	// require.Never may return while a call of its condition is under
	// way: the calls are serialised, and each pipeline has its own.
	var mu sync.Mutex
	mayOf := func(p *Pipeline) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			_, ok := p.mayEvict(t.Context(), busy)
			return ok
		}
	}
	may := mayOf(p)
	set := func(o checkpoint.Owner) {
		_, err := store.SetOwner(t.Context(), key, o)
		require.NoError(t, err)
	}
	beat := checkpoint.Owner{Run: "r1", PID: 42, Started: started, TimeoutMS: timeout.Milliseconds()}

	require.False(t, may(), "no record: not known to be a bridge")
	set(beat)
	seen := time.Now()
	require.False(t, may(), "a heartbeat just seen")
	require.Eventually(t, may, 10*time.Second, 20*time.Millisecond, "a heartbeat unchanged for owner_timeout is stale")
	require.GreaterOrEqual(t, time.Since(seen), timeout)
	mu.Lock()
	why, _ := p.mayEvict(t.Context(), busy)
	mu.Unlock()
	require.Contains(t, why, "run r1")
	require.Contains(t, why, "checkpoint.owner_timeout 400ms")

	set(beat)
	require.False(t, may(), "a new revision: the owner lives")

	longer := beat
	longer.TimeoutMS = (3 * timeout).Milliseconds()
	set(longer)
	seen = time.Now()
	require.Eventually(t, may, 10*time.Second, 20*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(seen), 3*timeout, "the owner's longer owner_timeout applies")

	for _, o := range []checkpoint.Owner{
		{Run: "r2", PID: 43, Started: started, TimeoutMS: 400},                // another walsender
		{Run: "r2", PID: 42, Started: started.Add(time.Hour), TimeoutMS: 400}, // the PID reused by another process
		{Run: "r2", PID: 42, Started: started, Fleet: "f", Epoch: 1},          // a fleet member's record: not a heartbeat
	} {
		set(o)
		require.Never(t, may, 3*timeout, 20*time.Millisecond, "%+v is no stale heartbeat of %+v", o, busy.Holder)
	}

	// Off: never.
	off := mayOf(New(Config{Bridge: "b", Source: "s", Store: store, Shutdown: 5 * time.Second}))
	set(beat)
	require.Never(t, off, 3*timeout, 20*time.Millisecond)
}

// TestMayEvictAFormerLeaseHolder: in a fleet, the member holding the
// source's lease ends at once the reader that the owner record names as a
// former holder's of the same fleet's lease (an earlier epoch); not one of
// the same epoch, of another fleet or of a bridge outside any fleet, and
// nothing while it does not hold the lease.
func TestMayEvictAFormerLeaseHolder(t *testing.T) {
	store := storeT(t)
	key := checkpoint.OwnerKey("b", "s")
	holder := sources.SlotReader{PID: 42, Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	busy := &sources.SlotBusyError{Slot: "slot", Holder: holder}
	lease, held := Lease{Fleet: "f", Epoch: 3}, true
	p := New(Config{Bridge: "b", Source: "s", Store: store, Shutdown: 5 * time.Second,
		Lease: func() (Lease, bool) { return lease, held }})
	for _, c := range []struct {
		rec  checkpoint.Owner
		want bool
	}{
		{checkpoint.Owner{Run: "r1", PID: 42, Started: holder.Started, Fleet: "f", Epoch: 2}, true},
		{checkpoint.Owner{Run: "r1", PID: 42, Fleet: "f", Epoch: 1}, true}, // no start time known: the PID decides
		{checkpoint.Owner{Run: "r1", PID: 43, Fleet: "f", Epoch: 2}, false},
		{checkpoint.Owner{Run: "r1", PID: 42, Fleet: "f", Epoch: 3}, false},
		{checkpoint.Owner{Run: "r1", PID: 42, Fleet: "g", Epoch: 2}, false},
		{checkpoint.Owner{Run: "r1", PID: 42, TimeoutMS: 1000}, false},
	} {
		_, err := store.SetOwner(t.Context(), key, c.rec)
		require.NoError(t, err)
		why, ok := p.mayEvict(t.Context(), busy)
		require.Equal(t, c.want, ok, "%+v", c.rec)
		if ok {
			require.Contains(t, why, "fleet f at epoch 3")
			require.Contains(t, why, "run r1")
		}
	}
	_, err := store.SetOwner(t.Context(), key, checkpoint.Owner{Run: "r1", PID: 42, Fleet: "f", Epoch: 2})
	require.NoError(t, err)
	held = false
	_, ok := p.mayEvict(t.Context(), busy)
	require.False(t, ok, "a member that does not hold the lease")
}

// readerSource is a source that names its reader, for beat.
type readerSource struct {
	sources.Source
	r sources.SlotReader
}

func (s readerSource) Reader() sources.SlotReader                      { return s.r }
func (s readerSource) Evict(context.Context, sources.SlotReader) error { return nil }
func (s readerSource) Open(context.Context, cdc.LSN) error             { return nil }

// TestOwnerRecordWhileHolding: a run holding the slot writes the owner
// record at once naming its reader; with owner_timeout it rewrites it every
// owner_timeout/4 (a heartbeat); in a fleet it records the lease; it
// deletes it when it lets the slot go; with neither, it writes nothing.
func TestOwnerRecordWhileHolding(t *testing.T) {
	store := storeT(t)
	key := checkpoint.OwnerKey("b", "s")
	r := sources.SlotReader{PID: 7, Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	load := func() checkpoint.Owner {
		o, err := store.LoadOwner(t.Context(), key)
		require.NoError(t, err)
		return o
	}

	p := New(Config{Bridge: "b", Source: "s", Store: store, Run: "me", OwnerTimeout: time.Second, Shutdown: 5 * time.Second})
	stop := p.beat(t.Context(), readerSource{r: r})
	o := load()
	require.Equal(t, "me", o.Run)
	require.Equal(t, 7, o.PID)
	require.True(t, o.Started.Equal(r.Started))
	require.Equal(t, int64(1000), o.TimeoutMS)
	require.Empty(t, o.Fleet)
	first := o.Revision
	require.Eventually(t, func() bool { return load().Revision >= first+2 }, 5*time.Second, 20*time.Millisecond,
		"the heartbeat is rewritten every owner_timeout/4")
	stop()
	require.Zero(t, load(), "deleted once the slot is let go")

	// A fleet member without owner_timeout: its lease, written once.
	p = New(Config{Bridge: "b", Source: "s", Store: store, Run: "me", Shutdown: 5 * time.Second,
		Lease: func() (Lease, bool) { return Lease{Fleet: "f", Epoch: 4}, true }})
	stop = p.beat(t.Context(), readerSource{r: r})
	o = load()
	require.Equal(t, "f", o.Fleet)
	require.Equal(t, uint64(4), o.Epoch)
	require.Zero(t, o.TimeoutMS, "not a heartbeat")
	require.Never(t, func() bool { return load().Revision != o.Revision }, 500*time.Millisecond, 20*time.Millisecond)
	stop()
	require.Zero(t, load())

	// Neither: nothing written.
	p = New(Config{Bridge: "b", Source: "s", Store: store, Run: "me", Shutdown: 5 * time.Second,
		Lease: func() (Lease, bool) { return Lease{}, false }})
	p.beat(t.Context(), readerSource{r: r})()
	require.Zero(t, load())
}

// TestUntilStale: a standby watching a heartbeat tries again when the
// heartbeat turns stale if that comes before its backoff ends; otherwise,
// or when it watches none, the backoff stands.
func TestUntilStale(t *testing.T) {
	var o owner
	require.Equal(t, 2*time.Second, o.untilStale(2*time.Second), "watching nothing")
	o.rev, o.seen, o.stale = 7, time.Now(), 5*time.Second
	require.Equal(t, 2*time.Second, o.untilStale(2*time.Second), "stale later than the backoff")
	o.seen = time.Now().Add(-4 * time.Second)
	d := o.untilStale(2 * time.Second)
	require.Greater(t, d, time.Duration(0))
	require.LessOrEqual(t, d, time.Second, "stale within a second: tried then")
	o.seen = time.Now().Add(-time.Minute)
	require.Zero(t, o.untilStale(2*time.Second), "stale already")
}

// TestDelayAfterTakeover: a standby's attempts at a held slot stay on the
// short curve (≤ 2 s); the first failure of the run that then takes the
// slot over starts the long curve afresh (≤ 1 s) instead of where the
// standby's count left it (15–30 s); a run that found the checkpoint moved
// starts again at once.
func TestDelayAfterTakeover(t *testing.T) {
	busy := fmt.Errorf("opening source: %w", &sources.SlotBusyError{Slot: "s", Err: &pgconn.PgError{Code: "55006"}})
	other := errors.New("natsjs: fenced: the stream holds messages published after this sink's last one")
	var o owner
	wait := func(bo *retry.Backoff) {
		for range 20 {
			require.LessOrEqual(t, o.delay(bo, busy, false, false), 2*time.Second, "a standby retries on the short curve")
		}
	}
	var bo retry.Backoff
	wait(&bo)
	require.GreaterOrEqual(t, o.delay(&bo, other, false, false), 15*time.Second, "without the reset: where the count left it")

	bo = retry.Backoff{}
	wait(&bo)
	require.LessOrEqual(t, o.delay(&bo, other, false, true), time.Second, "taken over: the curve starts afresh")
	require.Equal(t, 1, bo.Attempt())

	bo = retry.Backoff{}
	wait(&bo)
	require.Zero(t, o.delay(&bo, &movedError{key: "k", from: 1, to: 2}, false, true), "moved: at once")
	require.LessOrEqual(t, o.delay(&bo, other, true, false), time.Second, "progress resets the curve")
}
