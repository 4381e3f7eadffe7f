package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bridgecdc/bridge/bridge/fleet"
	"github.com/bridgecdc/bridge/bridge/pipeline"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

// Fleet mode (`bridge run --fleet <name>`): the App runs only the sources
// whose lease it holds in the fleet's bucket (bridge/fleet), starting and
// stopping their runners as the leases come and go.

// fleetState is the App's part in a fleet.
type fleetState struct {
	name   string
	lease  time.Duration
	member *fleet.Member
	done   chan struct{} // closed when the member's Run returned
}

// WithFleet makes the App a member of fleet name: it shares the sources of
// its configuration with the other members, each source streamed by one
// member at a time under a lease of lease (fleet.DefaultLease when zero).
func WithFleet(name string, lease time.Duration) Option {
	return func(a *App) {
		if name != "" {
			a.fleet = &fleetState{name: name, lease: lease}
		}
	}
}

// Fleet returns the fleet the App is a member of ("" outside a fleet) and
// the sources it holds a lease on.
func (a *App) Fleet() (string, []string) {
	if a.fleet == nil {
		return "", nil
	}
	if a.fleet.member == nil {
		return a.fleet.name, []string{}
	}
	return a.fleet.name, a.fleet.member.Held()
}

// startFleetMode is Start's end in fleet mode: no runner is built until
// the member holds its lease.
func (a *App) startFleetMode(ctx context.Context, ne sinks.NATSEnv) error {
	a.ne = ne
	a.mu.Lock()
	if a.runners == nil {
		a.runners = map[string]*runner{}
	}
	a.mu.Unlock()
	m, err := fleet.Open(ctx, a.js, fleet.Options{
		Fleet: a.fleet.name, Member: a.run, Lease: a.fleet.lease, Replicas: a.cfg.Checkpoint.Replicas,
		Sources: func() []string {
			a.mu.Lock()
			defer a.mu.Unlock()
			return sortedKeys(a.current().Sources)
		},
		Log: a.log,
	}, fleetRunner{a})
	if err != nil {
		return err
	}
	a.fleet.member = m
	return nil
}

// runFleet takes part in the fleet under ctx (Run's).
func (a *App) runFleet(ctx context.Context) {
	if a.fleet == nil || a.fleet.member == nil {
		return
	}
	a.fleet.done = make(chan struct{})
	lease := a.fleet.lease
	if lease <= 0 {
		lease = fleet.DefaultLease
	}
	a.log.Info("fleet member", "fleet", a.fleet.name, "member", a.run, "bucket", fleet.Bucket(a.fleet.name), "lease", lease.String())
	go func() {
		defer close(a.fleet.done)
		_ = a.fleet.member.Run(ctx)
	}()
}

// waitFleet waits until the member has released its leases and left.
func (a *App) waitFleet() {
	if a.fleet != nil && a.fleet.done != nil {
		<-a.fleet.done
	}
}

// fleetRunner is the App as fleet.Runner sees it.
type fleetRunner struct{ a *App }

// Start builds source's runner from the configuration in effect and starts
// it under Run's context.
func (f fleetRunner) Start(ctx context.Context, source string) error {
	a := f.a
	a.reloading.Lock() // a reload and a start do not interleave
	defer a.reloading.Unlock()
	if a.runCtx == nil || a.runCtx.Err() != nil {
		return errors.New("the bridge is stopping")
	}
	a.mu.Lock()
	cfg, rev := a.current(), a.rev
	_, running := a.runners[source]
	a.mu.Unlock()
	if running {
		return nil
	}
	if _, ok := cfg.Sources[source]; !ok {
		return fmt.Errorf("source %q is not in the configuration in effect (revision %s)", source, rev)
	}
	r, err := a.buildRunner(ctx, cfg, rev, source)
	if err != nil {
		return fmt.Errorf("building source %q: %w", source, err)
	}
	r.show(a)
	a.mu.Lock()
	a.runners[source] = r
	a.mu.Unlock()
	r.start(a, a.runCtx, cfg, a.runnerEnded)
	return nil
}

// Stop stops source's runner: drained at a transaction boundary (its
// checkpoint saved) within ctx when drain, else cancelled at once, before
// waiting for a reload under way.
func (f fleetRunner) Stop(ctx context.Context, source string, drain bool) {
	a := f.a
	a.mu.Lock()
	r := a.runners[source]
	a.mu.Unlock()
	if r == nil {
		return
	}
	began := time.Now()
	if !drain {
		r.removed.Store(true)
		if r.cancel != nil {
			r.cancel()
		}
		<-r.done // the pipeline's goodbye (last writes, checkpoint, closing the slot) is bounded by shutdown.timeout
		a.log.Info("fleet: source stopped", "source", source, "drained", false, "took", time.Since(began).Round(time.Millisecond).String())
	}
	a.reloading.Lock()
	defer a.reloading.Unlock()
	a.mu.Lock()
	cur := a.runners[source]
	a.mu.Unlock()
	if cur != r {
		return // a reload or another stop dealt with it
	}
	r.stop(ctx, a)
	a.mu.Lock()
	if a.runners[source] == r {
		delete(a.runners, source)
	}
	a.mu.Unlock()
	if drain {
		a.log.Info("fleet: source stopped", "source", source, "drained", true, "checkpoint", r.p.Checkpointed().String(), "took", time.Since(began).Round(time.Millisecond).String())
	}
}

// lease is, in a fleet, source's pipeline.Config.Lease: whether this
// member holds the source's lease, and at which epoch. Its holder may end
// the reader of the slot that a former holder left behind (a member that
// stalled without closing its connection). Outside a fleet it is nil.
func (a *App) lease(source string) func() (pipeline.Lease, bool) {
	if a.fleet == nil {
		return nil
	}
	f := a.fleet
	return func() (pipeline.Lease, bool) {
		if f.member == nil {
			return pipeline.Lease{}, false
		}
		epoch, ok := f.member.Holding(source)
		return pipeline.Lease{Fleet: f.name, Epoch: epoch}, ok
	}
}

// checkFleet refuses a fleet on an embedded NATS server: the members must
// share one.
func (a *App) checkFleet(cfg *config.Config) error {
	if a.fleet == nil || cfg.NATS.URL != "" || cfg.NATS.Context != "" {
		return nil
	}
	return &config.FieldError{Path: "nats.url", Msg: fmt.Sprintf("fleet %s needs nats.url (or nats.context): the members share their leases on one NATS server (or cluster), not each on an embedded one", a.fleet.name)}
}
