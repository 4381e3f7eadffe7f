package e2e_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sources"
)

// lateSaveSource is the real pgoutput source, except that just before its
// first Open returns it does what the slot's previous owner may do while a
// standby waits for the slot: save the checkpoint once more, after the
// standby loaded it.
type lateSaveSource struct {
	sources.Source
	before func(ctx context.Context) error
}

func (s *lateSaveSource) Open(ctx context.Context, from cdc.LSN) error {
	if err := s.Source.Open(ctx, from); err != nil {
		return err
	}
	return s.before(ctx)
}

// lateSaveEnv starts the servers of a late-save test of bridge name: a
// table items, the bridge's config, its checkpoint key, and a JetStream
// client to save under that key as another run would.
func lateSaveEnv(t *testing.T, name string) (*env, string, string, jetstream.JetStream) {
	t.Helper()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE items (id int PRIMARY KEY, name text)`)
	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return e, e.config(name, ""), checkpoint.Key(name, "app"), js
}

// TestTakeoverAfterALateSave: the slot's previous owner saved the
// checkpoint after this instance loaded it and before the slot became this
// instance's. The new owner must not take that for a fence and stop: it
// starts its run again from the newer checkpoint, streams every change
// once, and checkpoints past it. Before the fix the first save was refused
// ("fenced: another bridge instance owns this source") and the instance
// stopped with nobody streaming the slot (seen in TestZombieIsFenced).
//
// Serial: a takeover.
func TestTakeoverAfterALateSave(t *testing.T) {
	e, cfgPath, key, js := lateSaveEnv(t, "late")

	real, err := sources.Default.Lookup("pgoutput")
	require.NoError(t, err)
	var saved atomic.Int32
	reg := sources.NewRegistry()
	require.NoError(t, reg.Register("pgoutput", sources.Plugin{Config: real.Config, Doc: real.Doc,
		New: func(decode config.Decoder, env sources.Env) (sources.Source, error) {
			s, err := real.New(decode, env)
			if err != nil {
				return nil, err
			}
			return &lateSaveSource{Source: s, before: func(ctx context.Context) error {
				if saved.Load() > 0 {
					return nil
				}
				store, err := checkpoint.Open(ctx, js, "bridge_checkpoints", 1)
				if err != nil {
					return err
				}
				st, rev, err := store.Load(ctx, key)
				if err != nil {
					return err
				}
				st.Run = "previous-owner"
				if _, err := store.Save(ctx, key, st, rev); err != nil {
					return err
				}
				saved.Add(1)
				return nil
			}}, nil
		}}))

	r := e.startWith(cfgPath, app.WithSources(reg))
	waitSlotActive(t, e, "slot_late") // rows before the slot exists are not in it
	for i := 1; i <= 50; i++ {
		e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO items VALUES (%d, 'x')`, i))
	}
	e.waitStored("CDC_late", 50, time.Minute)
	require.Equal(t, int32(1), saved.Load(), "the previous owner's save did not happen")

	// The instance still runs, and its own saves follow the previous
	// owner's: the checkpoint moves past every change.
	store, err := checkpoint.Open(t.Context(), js, "bridge_checkpoints", 1)
	require.NoError(t, err)
	waitCheckpointWhileRunning(t, r, store, key, "checkpoint of this instance after the previous owner's", func(st checkpoint.State) bool {
		return st.Run != "previous-owner" && st.LSN > 0 && len(st.Cursors) > 0
	})
	msgs := e.messages("CDC_late")
	require.Len(t, msgs, 50)
	r.stop(t) // fails the test if the run ended with an error
}

// TestLateSaveAfterTakeoverIsRefused: a save of the run that wrote the
// checkpoint last arrives after the next run streams (held in the network
// through a partition: TestFleetClusterR3 failed once so, when its cut-off
// member's save landed as the link healed). The new run made the
// checkpoint its own before streaming, so that late save is the one
// refused as a fence; the new run streams on and checkpoints every change.
// Before the fix the late save landed at the revision the new run had
// loaded, and the new run's next save was refused: it stopped with nobody
// streaming the source.
func TestLateSaveAfterTakeoverIsRefused(t *testing.T) {
	defer parallel(t)()
	e, cfgPath, key, js := lateSaveEnv(t, "lateafter")

	// The first run streams ten changes and stops: its checkpoint is the
	// last one, at revision rev.
	r := e.start(cfgPath)
	waitSlotActive(t, e, "slot_lateafter")
	for i := 1; i <= 10; i++ {
		e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO items VALUES (%d, 'x')`, i))
	}
	e.waitStored("CDC_lateafter", 10, time.Minute)
	r.stop(t)
	store, err := checkpoint.Open(t.Context(), js, "bridge_checkpoints", 1)
	require.NoError(t, err)
	first, rev, err := store.Load(t.Context(), key)
	require.NoError(t, err)
	require.NotEmpty(t, first.Run)

	// The next run streams; then the first run's late save arrives.
	r = e.start(cfgPath)
	waitReady(t, r)
	waitSlotActive(t, e, "slot_lateafter")
	_, err = store.Save(t.Context(), key, first, rev)
	require.ErrorIs(t, err, checkpoint.ErrFenced, "the first run's late save must be refused once the next run streams")

	for i := 11; i <= 20; i++ {
		e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO items VALUES (%d, 'x')`, i))
	}
	e.waitStored("CDC_lateafter", 20, time.Minute)
	waitCheckpointWhileRunning(t, r, store, key, "checkpoint of the next run past the late save", func(st checkpoint.State) bool {
		return st.Run != first.Run && st.LSN > first.LSN
	})
	ms := e.messages("CDC_lateafter")
	checkOrdered(t, ms)
	require.Len(t, ms, 20)
	r.stop(t) // fails the test if the run ended with an error
}

// waitCheckpointWhileRunning waits up to 30 s for the checkpoint under key
// to satisfy ok, failing the test if the bridge r stops first.
func waitCheckpointWhileRunning(t *testing.T, r *running, store *checkpoint.Store, key, what string, ok func(checkpoint.State) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-r.done:
			t.Fatalf("the bridge stopped while waiting for a %s: %v", what, err)
		default:
		}
		st, _, err := store.Load(t.Context(), key)
		require.NoError(t, err)
		if ok(st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still no %s after 30s: the checkpoint is at %s, run %q", what, st.LSN, st.Run)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
