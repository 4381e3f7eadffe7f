package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/pgslot"
	"github.com/bridgecdc/bridge/bridge/retry"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/bridge/schema"
	"github.com/bridgecdc/bridge/bridge/snapshot"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sources"
)

// Sink is one configured sink of a pipeline.
type Sink struct {
	Name  string
	Sink  sinks.Sink
	Batch config.Batch // the sink's batch keys; the pipeline batches by the smallest max_changes and largest max_wait
}

// Config is what a Pipeline is built from.
type Config struct {
	// Bridge and Source name the producer: <Bridge>.<Source>.<epoch>.
	Bridge, Source string
	// NewSource returns a fresh source for each run (no network I/O).
	NewSource func() (sources.Source, error)
	// Sinks are the sinks the Router's indexes refer to.
	Sinks  []Sink
	Router *route.Router
	// ConfigRev is the configuration revision Router comes from, recorded
	// with each checkpoint (SetRouter replaces both).
	ConfigRev string
	// Store keeps the checkpoint under checkpoint.Key(Bridge, Source).
	Store *checkpoint.Store
	// Interval is how often the checkpoint is saved; ConfirmDelay how long
	// a checkpointed position waits before Postgres is told (checkpoint.*).
	Interval, ConfirmDelay time.Duration
	// Shutdown bounds each goodbye: the last Write, checkpoint and Close.
	Shutdown time.Duration
	// Run is this process's run id, recorded with each checkpoint.
	Run string
	// Snapshots is the source's snapshot runtime; nil when it cannot
	// snapshot.
	Snapshots *snapshot.Manager
	// Schemas is the schema registry (config schemas); nil when off.
	Schemas *schema.Registry
	// Slot is the slot poller's gauge, read to stop a run whose slot was
	// lost; nil when nothing polls the slot.
	Slot *pgslot.Gauge
	// Observer is told what the pipeline does (traces, metrics); nil for
	// none.
	Observer Observer
	// Lease, in a fleet, reports whether this instance holds the source's
	// lease now, and which. A run that opens the slot records it with its
	// reader (checkpoint.OwnerKey); a run that finds the slot held by the
	// reader of a former holder of the lease (the same fleet, an earlier
	// epoch) ends that reader and opens the slot at once (takeover.go).
	// nil outside a fleet.
	Lease func() (Lease, bool)
	// OwnerTimeout, when positive (checkpoint.owner_timeout), makes each
	// run keep a heartbeat of its own while it holds the slot
	// (checkpoint.OwnerKey, rewritten every OwnerTimeout/4), and lets a
	// run that finds the slot held by the reader a heartbeat names end
	// that reader once the heartbeat kept one revision for OwnerTimeout
	// (or the owner's own, when longer).
	OwnerTimeout time.Duration
	Log          *slog.Logger
}

// Observer is told what a pipeline does, for traces and metrics. Routed is
// called by the pipeline's reader goroutine, Delivered and Wrote by its
// writer, RunEnded after both have stopped; the calls of one goroutine are
// sequential, those of the reader and the writer concurrent. Each must be
// cheap: it runs on the data path.
type Observer interface {
	// Routed is told of the routed changes of a transaction, or of a part
	// of a large one (t is the whole transaction as the source emitted it;
	// last marks its last part), before they go to the writer. It may set
	// the changes' Headers (trace context), nothing else.
	Routed(t *cdc.Txn, commit cdc.LSN, changes []cdc.Change, last bool)
	// Delivered is told that the next n routed changes were written to
	// every sink, and every transaction up to done (0: none) in full.
	Delivered(n int, done cdc.LSN)
	// Wrote is told of one Write of a batch to the sink named sink: how
	// long it took and its error (nil: all delivered).
	Wrote(sink string, d time.Duration, err error)
	// RunEnded is told that a run ended with err (nil: without error);
	// fatal when the pipeline stops.
	RunEnded(ctx context.Context, err error, fatal bool)
}

// sinkSlot is one configured sink inside a pipeline.
type sinkSlot struct {
	name    string
	sink    sinks.Sink
	batch   config.Batch
	resumer sinks.Resumer // nil when the sink cannot tell what it holds
	amo     bool          // at-most-once: never holds back the checkpoint
	// written is the commit LSN of the newest change the sink accepted,
	// or of the last transaction the writer finished while the sink had
	// nothing to write (see SinkWritten).
	written atomic.Uint64
}

// Pipeline streams one source into its sinks: source → router → batches →
// sinks → ack tracker → KV checkpoint → source.Ack (DESIGN.md §4).
type Pipeline struct {
	bridge, source string
	newSource      func() (sources.Source, error)
	sinks          []*sinkSlot
	store          *checkpoint.Store
	key            string
	ctlKey         string // the operator's order: checkpoint.ControlKey
	owner          owner  // ending a stale reader of the slot: takeover.go
	interval       time.Duration
	shutdown       time.Duration
	confirmDelay   time.Duration // see confirm.go
	log            *slog.Logger
	run            string
	obs            Observer
	slot           *pgslot.Gauge

	// Observed by tests and status.
	delivered atomic.Uint64 // changes delivered in this process
	ckptLSN   atomic.Uint64
	ready     atomic.Bool

	snap *snapshot.Manager // nil when the source cannot snapshot

	// schemas is the schema registry (nil: schemas off); trk follows the
	// tables' shapes during one run, read by its reader goroutine only.
	schemas *schema.Registry
	trk     *schema.Tracker
	// holdsRun: the tables' holds by dead_letter routes during one run
	// (its reader's); holds what status and metrics read of them.
	holdsRun map[holdKey]*tableHold
	holds    schemaHolds

	// The router in effect and the one to take at the next transaction
	// boundary (SetRouter); see ops.go for the operator's controls.
	cur, pending atomic.Pointer[routerRev]
	ops          ops
}

// New builds the pipeline of cfg; it does no I/O.
func New(cfg Config) *Pipeline {
	p := &Pipeline{
		bridge: cfg.Bridge, source: cfg.Source, newSource: cfg.NewSource,
		store: cfg.Store, key: checkpoint.Key(cfg.Bridge, cfg.Source), ctlKey: checkpoint.ControlKey(cfg.Bridge, cfg.Source), interval: cfg.Interval,
		shutdown: cfg.Shutdown, confirmDelay: cfg.ConfirmDelay, log: cfg.Log, run: cfg.Run,
		obs: cfg.Observer, slot: cfg.Slot, snap: cfg.Snapshots, schemas: cfg.Schemas,
		owner: owner{lease: cfg.Lease, timeout: cfg.OwnerTimeout, key: checkpoint.OwnerKey(cfg.Bridge, cfg.Source)},
	}
	if p.obs == nil {
		p.obs = nopObserver{}
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.cur.Store(&routerRev{r: cfg.Router, rev: cfg.ConfigRev})
	p.ops.init()
	for _, s := range cfg.Sinks {
		slot := &sinkSlot{name: s.Name, sink: s.Sink, batch: s.Batch}
		if r, ok := s.Sink.(sinks.Resumer); ok {
			slot.resumer = r
		}
		if amo, ok := s.Sink.(sinks.AtMostOnce); ok && amo.AtMostOnce() {
			slot.amo = true
		}
		if kind, why := sinks.Guarantee(s.Sink); kind == "at least once" {
			p.log.Warn("sink delivers at least once: "+why, "sink", s.Name)
		}
		p.sinks = append(p.sinks, slot)
	}
	return p
}

// nopObserver observes nothing.
type nopObserver struct{}

func (nopObserver) Routed(*cdc.Txn, cdc.LSN, []cdc.Change, bool) {}
func (nopObserver) Delivered(int, cdc.LSN)                       {}
func (nopObserver) Wrote(string, time.Duration, error)           {}
func (nopObserver) RunEnded(context.Context, error, bool)        {}

// Source returns the name of the pipeline's source.
func (p *Pipeline) Source() string { return p.source }

// Checkpointed returns the last checkpointed LSN.
func (p *Pipeline) Checkpointed() cdc.LSN { return cdc.LSN(p.ckptLSN.Load()) }

// Delivered returns the number of changes delivered since start.
func (p *Pipeline) Delivered() uint64 { return p.delivered.Load() }

// SinkWritten returns, per sink name, the commit LSN up to which the sink
// holds what the routes give it (the transaction at that LSN may be there
// in part), as written by this process; 0 before its first write. Postgres
// is acknowledged only what every sink but the at-most-once ones holds, so
// the sink with the lowest value is the one holding the slot back: slow,
// or failing (its Writes fail, and the writer retries it and stops there).
func (p *Pipeline) SinkWritten() map[string]cdc.LSN {
	out := make(map[string]cdc.LSN, len(p.sinks))
	for _, s := range p.sinks {
		out[s.name] = cdc.LSN(s.written.Load())
	}
	return out
}

// SinkDeadLetters returns, per name of a sink that diverts changes to a
// dead-letter subject (sinks.DeadLetterCounter), how many it has stored
// there since the pipeline was built.
func (p *Pipeline) SinkDeadLetters() map[string]uint64 {
	out := map[string]uint64{}
	for _, s := range p.sinks {
		if d, ok := s.sink.(sinks.DeadLetterCounter); ok {
			out[s.name] = d.DeadLetters()
		}
	}
	return out
}

// advance raises s's written LSN to lsn.
func (s *sinkSlot) advance(lsn cdc.LSN) {
	for {
		cur := s.written.Load()
		if uint64(lsn) <= cur || s.written.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

// Ready reports whether a run is streaming.
func (p *Pipeline) Ready() bool { return p.ready.Load() }

// fatal marks errors that must stop the pipeline instead of restarting it.
type fatal struct{ err error }

func (f fatal) Error() string { return f.err.Error() }
func (f fatal) Unwrap() error { return f.err }

// isFatal reports whether err stops the pipeline: marked fatal here, or
// permanent by retry.Permanent (the one place that decides).
func isFatal(err error) bool {
	var f fatal
	if errors.As(err, &f) {
		return true
	}
	_, permanent := retry.Permanent(err)
	return permanent
}

// Run streams until ctx ends, a fatal error, or a Drain. Transient
// failures end the current run and start a new one after a backoff; each
// run resumes from the checkpoint and skips what the sinks already hold.
// Before each run it reads the operator's order (checkpoint.ControlKey)
// and waits while the source is paused; it follows the order while it runs.
// Run is called once.
func (p *Pipeline) Run(ctx context.Context) error {
	defer p.ops.doneOnce.Do(func() { close(p.ops.runDone) })
	wctx, wcancel := context.WithCancel(ctx)
	var watching sync.WaitGroup
	watching.Add(1)
	go func() { defer watching.Done(); p.watchControl(wctx) }()
	defer func() { wcancel(); watching.Wait() }()

	var bo retry.Backoff
	var refused refusals // refused.go
	standby := false     // the last run found the slot held by another reader
	for {
		// The order as recorded now is authoritative at each run's start;
		// the watch follows it while the run streams.
		c, err := p.store.LoadControl(ctx, p.ctlKey)
		if err == nil {
			p.setWant(c)
			err = p.waitUnpaused(ctx) // ops.go
		} else {
			err = p.bucketGone(fmt.Errorf("reading the operator's order for source %q: %w", p.source, err))
		}
		if errors.Is(err, errStop) || ctx.Err() != nil {
			p.runEnded(nil, StateStopped)
			return nil
		}
		var progressed bool
		if err == nil {
			progressed, err = p.runOnce(ctx)
		}
		opened := p.ready.Swap(false) // the run held the slot
		p.obs.RunEnded(ctx, err, isFatal(err))
		if ctx.Err() != nil {
			p.runEnded(nil, StateStopped)
			return nil
		}
		if errors.Is(err, snapshot.ErrDone) {
			p.log.Info(err.Error())
			p.runEnded(nil, StateDone)
			return nil
		}
		if err == nil {
			standby = false
			continue // ended at a transaction boundary: a pause, a drain, a resync
		}
		if isFatal(err) {
			err = retry.Explain(err)
			p.log.Error("pipeline stopped: retrying cannot help", "err", err)
			p.runEnded(err, stopState(err))
			return fmt.Errorf("source %q: %w", p.source, err)
		}
		if id, times := refused.note(err); times > 1 {
			err = refusedAgain(id, times, err)
		}
		d := p.owner.delay(&bo, err, progressed, opened && standby) // takeover.go
		standby = retryState(err) == StateStandby
		p.runEnded(err, retryState(err))
		p.log.Warn("run ended; restarting", "err", err, "attempt", bo.Attempt(), "in", d.String())
		select {
		case <-ctx.Done():
			p.runEnded(nil, StateStopped)
			return nil
		case <-time.After(d):
		case <-p.ops.wake: // a pause, a resync or a drain does not wait for the backoff
		}
	}
}

// mark is a checkpointable position: every transaction up to lsn is
// delivered, and cursors are sink positions at or before the first message
// after lsn.
type mark struct {
	lsn     cdc.LSN
	cursors map[string]string
	rev     string // the configuration revision of the router that routed it
}

func (p *Pipeline) runOnce(ctx context.Context) (progressed bool, err error) {
	p.setHolder(false) // until this run opens the slot
	st, rev, err := p.store.Load(ctx, p.key)
	if err != nil {
		return false, p.bucketGone(fmt.Errorf("loading checkpoint %q: %w", p.key, err))
	}
	if rev == 0 {
		// First start: the epoch must be durable before anything is
		// published under it.
		st = checkpoint.State{Epoch: checkpoint.NewEpoch(), Run: p.run, UpdatedAt: time.Now().UTC()}
		if err := p.snap.ScheduleInitial(ctx, st.Epoch); err != nil {
			return false, err
		}
		if rev, err = p.store.Save(ctx, p.key, st, 0); err != nil {
			return false, fmt.Errorf("creating checkpoint %q: %w", p.key, err)
		}
		p.log.Info("new epoch", "epoch", st.Epoch)
	}
	p.ckptLSN.Store(uint64(st.LSN))
	producer := p.bridge + "." + p.source + "." + st.Epoch
	p.trk = nil
	if p.schemas != nil {
		// A new run replays from the checkpoint: the tracker starts afresh
		// from the registry (schema.Tracker).
		p.trk = p.newTracker()
		p.loadHolds(ctx)
	}
	p.holdsRun = map[holdKey]*tableHold{}

	// Sinks: connect, then learn what they already hold past the checkpoint.
	skip := make([]map[cdc.Pos]struct{}, len(p.sinks))
	type heldPast struct {
		sink string
		n    int
	}
	var held []heldPast // logged once the slot is this run's
	for i, s := range p.sinks {
		if err := s.sink.Connect(ctx); err != nil {
			return false, fmt.Errorf("connecting sink %q: %w", s.name, err)
		}
		if s.resumer != nil {
			d, err := s.resumer.Delivered(ctx, producer, st.Cursors[s.name])
			if err != nil {
				return false, fmt.Errorf("reading what sink %q holds after the checkpoint: %w", s.name, err)
			}
			if len(d) > 0 {
				held = append(held, heldPast{s.name, len(d)})
				skip[i] = d
			}
		}
	}

	// The stream's end: the checkpoint, or past it what a sink holds. A
	// source that knows its server's history refuses to stream on from a
	// point a failover left out of it (sources.Lineaged).
	end := st.LSN
	endPos := cdc.Pos{LSN: st.LSN, Seq: math.MaxUint32} // the last change published: the checkpoint covers whole transactions
	for _, d := range skip {
		for pos := range d {
			end = max(end, pos.LSN)
			if endPos.Less(pos) {
				endPos = cdc.Pos{LSN: pos.LSN, Seq: pos.Seq}
			}
		}
	}
	p.log.Debug("run resumes", "checkpoint", st.LSN.String(), "cursors", st.Cursors, "end", end.String(), "producer", producer)
	if p.trk != nil {
		p.trk.ResumeAt(st.LSN, endPos) // up to end, the registry has what was published
	}
	lineage := sources.Lineage{SystemID: st.SystemID, Timeline: st.Timeline, Standby: st.Standby}
	src, evicted, err := p.open(ctx, st.LSN, lineage, end) // takeover.go: a stale reader of the slot may be ended
	if err != nil {
		if lost := (*sources.SlotLostError)(nil); errors.As(err, &lost) {
			return false, p.resyncLostSlot(ctx, st, rev, lost) // control.go; nil: the next run streams the new epoch
		}
		return false, fmt.Errorf("opening source: %w", err)
	}
	// The slot is this run's now: Postgres streams it to one connection
	// at a time. The checkpoint was loaded before, though, and a standby
	// waits for the slot with what it loaded first: the slot's previous
	// owner may have saved after that, up to its last moment. Saving over
	// that revision would be refused as a fence and stop the instance that
	// now owns the slot, so start again from the newer checkpoint.
	if _, now, err := p.store.Load(ctx, p.key); err != nil || now != rev {
		_ = src.Close(context.Background())
		if err != nil {
			return false, p.bucketGone(fmt.Errorf("loading checkpoint %q: %w", p.key, err))
		}
		return false, &movedError{key: p.key, from: rev, to: now} // takeover.go: the next run starts at once
	}
	if l, ok := src.(sources.Lineaged); ok {
		// Recorded with every checkpoint this run saves.
		cur := l.Lineage()
		if cur != lineage && lineage != (sources.Lineage{}) {
			p.log.Info("the source's server lineage changed since the checkpoint", "from", lineage, "to", cur)
		}
		st.SystemID, st.Timeline, st.Standby = cur.SystemID, cur.Timeline, cur.Standby
	}
	if st.Paused || evicted || st.Run != p.run {
		// The checkpoint becomes this run's before anything streams: the
		// source was paused, and this run resumes it; or another run wrote
		// it last (the slot's previous owner, or an instance this one took
		// over from), and a save of that run may still arrive: held in the
		// network through a partition, or from the slot's previous reader
		// that this run ended and that wakes up. At the revision it loaded,
		// that save would land, and this run's next one be refused as a
		// fence. A revision of this run's makes that late save the fence.
		st.Paused, st.Run, st.UpdatedAt = false, p.run, time.Now().UTC()
		next, err := p.store.Save(ctx, p.key, st, rev)
		if err != nil {
			_ = src.Close(context.Background())
			if errors.Is(err, checkpoint.ErrFenced) {
				// The late save came first: start again from it, as
				// when the checkpoint moved while the slot was opened.
				if _, now, lerr := p.store.Load(ctx, p.key); lerr == nil {
					return false, &movedError{key: p.key, from: rev, to: now}
				}
			}
			return false, fmt.Errorf("saving checkpoint %q as this run's: %w", p.key, err)
		}
		rev = next
	}
	for _, h := range held { // once per run that owns the slot, not at every attempt of a standby
		p.log.Info("sink already holds changes past the checkpoint; they will not be sent again", "sink", h.sink, "count", h.n)
	}
	defer p.beat(ctx, src)() // takeover.go: the owner record (a heartbeat with owner_timeout), until the slot is let go
	p.ready.Store(true)
	p.ops.mu.Lock()
	p.ops.holder, p.ops.epoch = true, st.Epoch
	p.ops.mu.Unlock()
	p.setState(StateStreaming)
	opened := time.Now()
	// rctx ends the run: a failure of the writer or the checkpointer
	// cancels it, and everything of the run stops, the reader too.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A clean end at a transaction boundary (a pause, a drain, a resync)
	// cancels readCtx: the reader stops between two transactions and the
	// writer writes what it has.
	readCtx, endRead := context.WithCancel(rctx)
	defer endRead()
	p.ops.mu.Lock()
	p.ops.endRead = endRead
	if p.ops.stop || p.ops.want.Paused || len(p.ops.resyncs) > 0 {
		endRead() // asked before the run could hear it
	}
	p.ops.mu.Unlock()
	defer func() {
		p.ops.mu.Lock()
		p.ops.endRead = nil
		p.ops.mu.Unlock()
	}()
	var atBoundary atomic.Bool // the reader stopped at a boundary on request

	// Snapshots: chunks between watermarks join the stream (snapshot.go).
	snapSkip := make([]snapshot.Held, len(p.sinks)) // per sink: reads it holds already
	wrapped, stopSnap, err := p.snap.Wrap(rctx, src, producer, st.Epoch, st.Cursors, p.snapHeld(snapSkip))
	if err != nil {
		_ = src.Close(context.Background())
		return false, err
	}
	src = wrapped
	defer stopSnap()
	// Bounded by changes, not runs: a run holds from one to about 2×chunk
	// changes (small transactions handed over together, or a part of a
	// large one), and the memory queued must not depend on which.
	limit := queueLimit(p.batchMax())
	items := make(chan []*txnItem, limit)
	queued := semaphore.NewWeighted(limit)
	var wg sync.WaitGroup
	var readErr, writeErr error

	// Reader: source → router. Transactions the source holds decoded
	// already go to the writer together: one hand-off per run, not per
	// transaction.
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(items)
		buf, _ := src.(sources.Buffered)
		var run []*txnItem
		n := 0 // changes in run
		handOver := func() error {
			if len(run) == 0 {
				return nil
			}
			if err := queued.Acquire(rctx, runWeight(run, limit)); err != nil {
				return err
			}
			items <- run // never blocks: a run weighs at least 1
			run, n = nil, 0
			return nil
		}
		emit := func(it *txnItem) error {
			run = append(run, it)
			n += len(it.changes)
			if n >= chunk || !it.last {
				return handOver()
			}
			return nil
		}
		for {
			if readCtx.Err() != nil && rctx.Err() == nil {
				// Asked to end (ops.go): here, between two transactions.
				if err := handOver(); err != nil {
					if rctx.Err() == nil {
						readErr = err
						cancel()
					}
					return
				}
				atBoundary.Store(true)
				return
			}
			t, err := src.Read(readCtx)
			if err != nil && readCtx.Err() != nil && rctx.Err() == nil {
				continue // interrupted while waiting for a transaction: end above
			}
			if err == nil {
				rr := p.takeRouter() // a new router applies from this transaction on
				err = p.route(rctx, rr, t, producer, emit)
				if errors.Is(err, errHeld) {
					// Paused before t for a breaking schema change
					// (schema.go): end here, as at a boundary; t is read
					// again when the source is resumed.
					if err = handOver(); err == nil {
						atBoundary.Store(true)
						return
					}
				}
				if err != nil && isFatal(err) && rctx.Err() == nil {
					// A change that no retry can route (a subject reading
					// a column its table lacks, a filter's error, an event
					// that cannot be encoded): the run stops at it, not at
					// the batch it would have joined. What was routed
					// before it goes to the writer, which writes and
					// checkpoints it, and the run ends with this error
					// once the writer is done (nothing of t's but parts of
					// a large transaction handed over already is written).
					if herr := handOver(); herr == nil {
						readErr = err
						return
					}
				}
				if err == nil && (buf == nil || buf.Buffered() == 0) {
					err = handOver()
				}
			}
			if err != nil {
				if rctx.Err() == nil {
					readErr = err
					cancel()
				}
				return
			}
		}
	}()

	// Checkpointer.
	var markMu sync.Mutex
	latest := mark{lsn: st.LSN, cursors: st.Cursors, rev: p.cur.Load().rev}
	ckptDone := make(chan struct{})
	var ckptErr error
	var lastSaved = st.LSN
	saved := st // the state last saved
	cf := &confirmer{delay: p.confirmDelay}
	// save checkpoints the latest mark; paused (the run's last save before
	// a pause) records the pause, and is written even without progress.
	save := func(ctx context.Context, paused bool) error {
		markMu.Lock()
		m := latest
		markMu.Unlock()
		target := m.lsn
		if idler, ok := src.(sources.Idler); ok {
			if safe, after, ok := idler.Idle(); ok && m.lsn >= after && safe > target {
				target = safe
			}
		}
		if target <= lastSaved && !paused {
			return cf.ack(ctx, src, time.Now()) // a delayed confirmation may be due
		}
		if target < lastSaved {
			target = lastSaved
		}
		ns := checkpoint.State{Epoch: st.Epoch, LSN: target, Cursors: m.cursors, UpdatedAt: time.Now().UTC(), Run: p.run, SystemID: st.SystemID,
			Timeline: st.Timeline, Standby: st.Standby, ConfigRev: m.rev, Paused: paused}
		nrev, err := p.store.Save(ctx, p.key, ns, rev) // a lost reply is no fence: see Save
		if err != nil {
			return fmt.Errorf("saving checkpoint %s: %w", target, err)
		}
		rev, lastSaved, saved = nrev, target, ns
		p.ckptLSN.Store(uint64(target))
		p.log.Debug("checkpoint saved", "lsn", target.String(), "mark", m.lsn.String(), "cursors", m.cursors, "revision", nrev)
		if sc, ok := src.(snapshot.Checkpointer); ok {
			// Snapshot progress follows the checkpoint, with its cursors.
			if err := sc.Checkpointed(ctx, target, m.cursors); err != nil {
				return fmt.Errorf("saving snapshot progress at checkpoint %s: %w", target, err)
			}
		}
		// Only now may Postgres forget what comes before it (or, with
		// confirm_delay, once the checkpoint is that old).
		cf.add(target, time.Now())
		return cf.ack(ctx, src, time.Now())
	}
	go func() {
		defer close(ckptDone)
		t := time.NewTicker(p.interval)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-t.C:
				err := p.slotLostWhileRunning(opened) // control.go
				if err == nil {
					err = save(rctx, false)
				}
				if err != nil {
					if rctx.Err() == nil {
						ckptErr = p.bucketGone(err)
						cancel()
					}
					return
				}
			}
		}
	}()

	// Writer: batches → sinks → marks. It runs in this goroutine so that a
	// shutdown can drain it with its own deadline.
	writeErr = p.write(rctx, ctx, items, skip, snapSkip, func(m mark) {
		markMu.Lock()
		latest = m
		markMu.Unlock()
		progressed = true
	}, latest, func(run []*txnItem) { queued.Release(runWeight(run, limit)) })
	cancel()
	wg.Wait()
	<-ckptDone

	// Goodbye: final checkpoint and status, each bounded.
	clean := atBoundary.Load() && readErr == nil && writeErr == nil && ckptErr == nil
	p.ops.mu.Lock()
	pausing := clean && p.ops.want.Paused
	p.ops.mu.Unlock()
	fctx, fcancel := context.WithTimeout(context.Background(), p.shutdown)
	if err := save(fctx, pausing); err != nil && ckptErr == nil && !errors.Is(err, context.Canceled) {
		ckptErr = err
	}
	fcancel()
	if clean && ckptErr == nil {
		// Still holding the slot, so that no standby streams meanwhile.
		// One per run: another one needs the new revision, and the next
		// run, ending at once, serves it.
		if r := p.takeResync(); r != nil {
			rctx, rcancel := context.WithTimeout(ctx, p.shutdown+10*time.Second)
			ctl, err := p.newEpoch(rctx, saved, rev, operatorReason(r.reason), saved.LSN, saved.LSN, "")
			rcancel()
			if err != nil {
				ckptErr = fmt.Errorf("operator resync: %w", err)
			} else {
				p.log.Warn("operator resync: published a resync message; streaming on under a new epoch",
					"old_producer", ctl.OldProducer, "producer", ctl.Producer, "lsn", saved.LSN.String())
			}
			r.done <- resyncResult{producer: ctl.Producer, err: err}
		}
	}
	cctx, ccancel := context.WithTimeout(context.Background(), p.shutdown)
	_ = src.Close(cctx)
	ccancel()
	p.setHolder(pausing && ckptErr == nil) // a pause drained here leaves this pipeline the holder

	switch {
	case ckptErr != nil:
		return progressed, ckptErr
	case writeErr != nil:
		return progressed, writeErr
	case readErr != nil:
		return progressed, readErr
	}
	return progressed, nil
}
