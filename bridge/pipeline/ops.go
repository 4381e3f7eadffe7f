package pipeline

// The operator's controls of a running pipeline: pause and resume at a
// transaction boundary, a drain that stops it there (reload, hand-over), a
// router swapped between transactions, an online resync, and the state
// the control plane reports.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/retry"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/bridge/snapshot"
)

// State is what a pipeline is doing.
type State string

// The states of a pipeline.
const (
	// StateStarting: Run has not opened the slot yet.
	StateStarting State = "starting"
	// StateStreaming: a run holds the slot and streams.
	StateStreaming State = "streaming"
	// StateDraining: the run ends at the next transaction boundary (a
	// pause, a drain, a resync).
	StateDraining State = "draining"
	// StatePaused: the operator paused the source (checkpoint.Control);
	// no run holds the slot, which Postgres keeps with the WAL since.
	StatePaused State = "paused"
	// StateRetrying: the last run failed; the next starts after a backoff.
	StateRetrying State = "retrying"
	// StateStandby: another instance streams from the slot; this one
	// takes over when it is free.
	StateStandby State = "standby"
	// StateFenced: another instance saved the checkpoint; this pipeline
	// stopped so that only one writes.
	StateFenced State = "fenced"
	// StateStopped: the pipeline stopped (a fatal error, a drain, the end
	// of the process).
	StateStopped State = "stopped"
	// StateDone: snapshot.mode initial_only finished.
	StateDone State = "done"
)

// Status is a pipeline's state as the control plane reports it.
type Status struct {
	Source string
	State  State
	// Since is when the pipeline entered State.
	Since time.Time
	// LastError is the error that ended the last run, with its fix when
	// one is known; "" when the last run ended cleanly or none ended yet.
	LastError   string
	LastErrorAt time.Time
	// Holder is true while this pipeline holds the source: a run streams
	// from the slot, or the pipeline drained it into the pause it is in.
	// The control plane lets the holder answer for the source.
	Holder bool
	// Epoch and Checkpoint are the producer epoch and the checkpointed
	// LSN as this process last saw them.
	Epoch      string
	Checkpoint cdc.LSN
	// ConfigRev is the configuration revision of the router in effect.
	ConfigRev string
	// Control is the operator's order in effect (Paused, Reason, By, At).
	Control checkpoint.Control
	// Delivered counts the changes delivered by this process.
	Delivered uint64
	// Held are the tables a breaking schema change holds
	// (on_schema_change: pause or dead_letter; docs/schemas.md).
	Held []HeldTable
}

// ops is the pipeline's control state; guarded by mu.
type ops struct {
	mu        sync.Mutex
	state     State
	since     time.Time
	lastErr   string
	lastErrAt time.Time
	holder    bool
	epoch     string
	want      checkpoint.Control // the operator's order, newest revision seen
	stop      bool               // Drain: end at a boundary, then Run returns
	resyncs   []*resyncReq
	endRead   context.CancelFunc // ends the current run's Read; nil outside a run
	changed   chan struct{}      // closed and replaced on every change of the above
	wake      chan struct{}      // wakes Run's waits (paused, backoff)
	runDone   chan struct{}      // closed when Run returns
	doneOnce  sync.Once
}

// resyncReq is an operator's resync waiting for the run loop.
type resyncReq struct {
	reason string
	done   chan resyncResult
}

type resyncResult struct {
	producer string
	err      error
}

// routerRev is a router and the configuration revision it comes from.
type routerRev struct {
	r   *route.Router
	rev string
}

func (o *ops) init() {
	o.state, o.since = StateStarting, time.Now()
	o.changed = make(chan struct{})
	o.wake = make(chan struct{}, 1)
	o.runDone = make(chan struct{})
}

// notify wakes the waiters of a change; o.mu held.
func (o *ops) notify() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// kick ends the current run's Read, so that the run ends at the
// transaction boundary it reached, and wakes Run's waits; o.mu held.
func (o *ops) kick() {
	if o.endRead != nil {
		o.endRead()
		if o.state == StateStreaming {
			o.state, o.since = StateDraining, time.Now()
		}
	}
	select {
	case o.wake <- struct{}{}:
	default:
	}
	o.notify()
}

// setState records s; o.mu not held.
func (p *Pipeline) setState(s State) {
	p.ops.mu.Lock()
	if p.ops.state != s {
		p.ops.state, p.ops.since = s, time.Now()
		p.ops.notify()
	}
	p.ops.mu.Unlock()
}

// endRequested reports whether the current run must end at the next
// transaction boundary.
func (p *Pipeline) endRequested() bool {
	p.ops.mu.Lock()
	defer p.ops.mu.Unlock()
	return p.ops.stop || p.ops.want.Paused || len(p.ops.resyncs) > 0
}

// setWant records the operator's order c unless a newer one is known, and
// ends the current run at a boundary when c pauses.
func (p *Pipeline) setWant(c checkpoint.Control) {
	p.ops.mu.Lock()
	defer p.ops.mu.Unlock()
	if c.Revision < p.ops.want.Revision {
		return
	}
	was := p.ops.want.Paused
	p.ops.want = c
	switch {
	case c.Paused && !was:
		p.log.Info("source paused by the operator: the run ends at the next transaction boundary", "by", c.By, "reason", c.Reason)
		p.ops.kick()
	case !c.Paused && was:
		p.log.Info("source resumed by the operator", "by", c.By)
		p.ops.kick()
	default:
		p.ops.notify()
	}
}

// Status returns the pipeline's state.
func (p *Pipeline) Status() Status {
	p.ops.mu.Lock()
	st := Status{Source: p.source, State: p.ops.state, Since: p.ops.since, LastError: p.ops.lastErr, LastErrorAt: p.ops.lastErrAt,
		Holder: p.ops.holder, Epoch: p.ops.epoch, Control: p.ops.want}
	p.ops.mu.Unlock()
	st.Checkpoint = p.Checkpointed()
	st.Delivered = p.Delivered()
	st.Held = p.held(st.Control)
	if cur := p.cur.Load(); cur != nil {
		st.ConfigRev = cur.rev
	}
	return st
}

// waitFor waits until ok (called with o.mu held) holds or ctx ends, and
// returns the status then.
func (p *Pipeline) waitFor(ctx context.Context, ok func() bool) (Status, error) {
	for {
		p.ops.mu.Lock()
		done, ch := ok(), p.ops.changed
		p.ops.mu.Unlock()
		if done {
			return p.Status(), nil
		}
		select {
		case <-ctx.Done():
			return p.Status(), ctx.Err()
		case <-ch:
		case <-p.ops.runDone:
			return p.Status(), errors.New("the pipeline stopped")
		}
	}
}

// Pause records the operator's pause of the source in the checkpoint
// bucket (checkpoint.ControlKey: every instance honours it, a restarted
// one too), ends the current run at the next transaction boundary with a
// last checkpoint, and closes the replication connection; the slot is
// kept, and Postgres retains the WAL written meanwhile. It returns once
// the pipeline is paused, or when ctx ends (the pause stays recorded and
// takes effect at the boundary). by names who asks, for the record.
func (p *Pipeline) Pause(ctx context.Context, reason, by string) (Status, error) {
	c := checkpoint.Control{Paused: true, Reason: reason, By: by, At: time.Now().UTC()}
	if err := p.store.SetControl(ctx, p.ctlKey, c); err != nil {
		return p.Status(), err
	}
	c, err := p.store.LoadControl(ctx, p.ctlKey) // its revision
	if err != nil {
		return p.Status(), err
	}
	p.setWant(c)
	return p.waitFor(ctx, func() bool {
		s := p.ops.state
		return s == StatePaused || s == StateStopped || s == StateFenced || s == StateDone
	})
}

// Resume clears the operator's pause in the checkpoint bucket and returns
// once a run streams again (or fails: the status says why), or when ctx
// ends (the source resumes anyway).
func (p *Pipeline) Resume(ctx context.Context, by string) (Status, error) {
	c := checkpoint.Control{Paused: false, By: by, At: time.Now().UTC()}
	if err := p.store.SetControl(ctx, p.ctlKey, c); err != nil {
		return p.Status(), err
	}
	c, err := p.store.LoadControl(ctx, p.ctlKey)
	if err != nil {
		return p.Status(), err
	}
	p.setWant(c)
	return p.waitFor(ctx, func() bool {
		switch p.ops.state {
		case StateStreaming, StateRetrying, StateStandby, StateStopped, StateFenced, StateDone:
			return true
		}
		return false
	})
}

// ResyncOnline starts a new epoch on the operator's request while the
// pipeline runs: the current run ends at a transaction boundary with a
// last checkpoint, and, still holding the slot, the pipeline publishes a
// resync control message under a new epoch and checkpoints that epoch at
// the same LSN (see Resync); the next run streams on under it. A paused
// pipeline does the same without a run and stays paused. It returns the
// new producer.
func (p *Pipeline) ResyncOnline(ctx context.Context, reason string) (string, error) {
	req := &resyncReq{reason: reason, done: make(chan resyncResult, 1)}
	p.ops.mu.Lock()
	p.ops.resyncs = append(p.ops.resyncs, req)
	p.ops.kick()
	p.ops.mu.Unlock()
	select {
	case r := <-req.done:
		return r.producer, r.err
	case <-p.ops.runDone:
		return "", errors.New("the pipeline stopped before the resync")
	case <-ctx.Done():
		return "", fmt.Errorf("waiting for the resync of source %q (it is done at the next transaction boundary): %w", p.source, ctx.Err())
	}
}

// takeResync returns the oldest pending resync request and forgets it;
// nil when there is none.
func (p *Pipeline) takeResync() *resyncReq {
	p.ops.mu.Lock()
	defer p.ops.mu.Unlock()
	if len(p.ops.resyncs) == 0 {
		return nil
	}
	r := p.ops.resyncs[0]
	p.ops.resyncs = p.ops.resyncs[1:]
	return r
}

// operatorReason is the reason of an operator's resync message.
func operatorReason(reason string) string {
	if reason == "" {
		return "operator"
	}
	return "operator: " + reason
}

// Drain ends the pipeline at the next transaction boundary: the current
// run writes what it read, saves a last checkpoint and closes the
// replication connection, and Run returns nil. It waits for that until
// ctx ends. Drain is how a reload rebuilds a pipeline, and how a source is
// handed to another process: the checkpoint it leaves is where the next
// owner starts.
func (p *Pipeline) Drain(ctx context.Context) error {
	p.ops.mu.Lock()
	p.ops.stop = true
	p.ops.kick()
	p.ops.mu.Unlock()
	select {
	case <-p.ops.runDone:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("draining source %q: %w", p.source, ctx.Err())
	}
}

// Done is closed when Run has returned.
func (p *Pipeline) Done() <-chan struct{} { return p.ops.runDone }

// SetRouter makes the pipeline route with r, from configuration revision
// rev, from the next transaction on: the reader swaps routers between two
// transactions, so every change of a transaction goes by one router.
func (p *Pipeline) SetRouter(r *route.Router, rev string) {
	p.pending.Store(&routerRev{r: r, rev: rev})
}

// router returns the router in effect, taking a pending one first; only
// the reader (or the run loop between runs) calls it.
func (p *Pipeline) takeRouter() *routerRev {
	if u := p.pending.Swap(nil); u != nil {
		p.cur.Store(u)
		p.ops.mu.Lock()
		p.ops.notify()
		p.ops.mu.Unlock()
		return u
	}
	return p.cur.Load()
}

// stopState returns the state a pipeline stopping with err ends in.
func stopState(err error) State {
	switch {
	case err == nil:
		return StateStopped
	case errors.Is(err, snapshot.ErrDone):
		return StateDone
	case errors.Is(err, checkpoint.ErrFenced):
		return StateFenced
	}
	return StateStopped
}

// retryState returns the state of a pipeline whose run ended with the
// transient err: standby when another walsender holds the slot.
func retryState(err error) State {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" {
		return StateStandby
	}
	return StateRetrying
}

// runEnded records how a run ended.
func (p *Pipeline) runEnded(err error, s State) {
	p.ops.mu.Lock()
	defer p.ops.mu.Unlock()
	if err != nil {
		p.ops.lastErr, p.ops.lastErrAt = retry.Explain(err).Error(), time.Now()
	}
	if p.ops.state != s {
		p.ops.state, p.ops.since = s, time.Now()
	}
	p.ops.notify()
}

// setHolder records whether this pipeline holds the source.
func (p *Pipeline) setHolder(h bool) {
	p.ops.mu.Lock()
	p.ops.holder = h
	p.ops.mu.Unlock()
}

// watchControl follows the operator's order for the source until ctx
// ends, restarting the watch when it fails (NATS away).
func (p *Pipeline) watchControl(ctx context.Context) {
	for ctx.Err() == nil {
		ch, err := p.store.WatchControl(ctx, p.ctlKey, func(err error) {
			p.log.Warn("the operator's order for this source does not decode; ignoring it", "err", err)
		})
		if err == nil {
			for c := range ch {
				p.setWant(c)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// waitUnpaused returns once the operator's order lets a run start (nil),
// the pipeline must stop (errStop), or ctx ends. While paused it serves
// resync requests without a run.
func (p *Pipeline) waitUnpaused(ctx context.Context) error {
	first := true
	for {
		p.ops.mu.Lock()
		paused, stop, want := p.ops.want.Paused, p.ops.stop, p.ops.want
		p.ops.mu.Unlock()
		if stop {
			return errStop
		}
		if !paused {
			return nil
		}
		if first {
			p.setState(StatePaused)
			p.log.Info("paused: no run holds the slot until the source is resumed (Postgres keeps the WAL meanwhile)", "by", want.By, "reason", want.Reason)
			first = false
		}
		for r := p.takeResync(); r != nil; r = p.takeResync() {
			producer, err := p.Resync(ctx, r.reason)
			r.done <- resyncResult{producer, err}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.ops.wake:
		}
	}
}

// errStop ends Run after a Drain.
var errStop = errors.New("drained")
