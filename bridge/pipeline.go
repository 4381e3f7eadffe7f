package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sources"
)

// sinkSlot is one configured sink inside a pipeline.
type sinkSlot struct {
	name    string
	sink    sinks.Sink
	cfg     config.Sink
	resumer sinks.Resumer // nil when the sink cannot tell what it holds
	amo     bool          // at-most-once: never holds back the checkpoint
}

// Pipeline streams one source into its sinks: source → router → batches →
// sinks → ack tracker → KV checkpoint → source.Ack (DESIGN.md §4).
type Pipeline struct {
	bridge, source string
	newSource      func() (sources.Source, error)
	sinks          []*sinkSlot
	router         *Router
	store          *checkpoint.Store
	key            string
	interval       time.Duration
	shutdown       time.Duration
	confirmDelay   time.Duration // see confirm.go
	log            *slog.Logger
	run            string

	// Observed by tests and status.
	delivered atomic.Uint64 // changes delivered in this process
	ckptLSN   atomic.Uint64
	ready     atomic.Bool

	tel *pipeTel // telemetry.go: spans and metrics; nil does nothing

	snap *snapMgr // snapshot.go; nil when the source cannot snapshot
}

// Checkpointed returns the last checkpointed LSN.
func (p *Pipeline) Checkpointed() cdc.LSN { return cdc.LSN(p.ckptLSN.Load()) }

// Delivered returns the number of changes delivered since start.
func (p *Pipeline) Delivered() uint64 { return p.delivered.Load() }

// Ready reports whether a run is streaming.
func (p *Pipeline) Ready() bool { return p.ready.Load() }

// fatal marks errors that must stop the pipeline instead of restarting it.
type fatal struct{ err error }

func (f fatal) Error() string { return f.err.Error() }
func (f fatal) Unwrap() error { return f.err }

func isFatal(err error) bool {
	var f fatal
	return errors.As(err, &f) || errors.Is(err, checkpoint.ErrFenced) || sinks.IsPermanent(err) || sources.IsSetup(err)
}

// Run streams until ctx ends or a fatal error. Transient failures end the
// current run and start a new one after a backoff; each run resumes from the
// checkpoint and skips what the sinks already hold.
func (p *Pipeline) Run(ctx context.Context) error {
	var bo Backoff
	var refused refusals // refused.go
	for {
		progressed, err := p.runOnce(ctx)
		p.ready.Store(false)
		p.tel.runEnded(ctx, err)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errSnapshotDone) {
			p.log.Info(err.Error())
			return nil
		}
		if err == nil {
			continue
		}
		if isFatal(err) {
			p.log.Error("pipeline stopped", "err", err)
			return fmt.Errorf("source %q: %w", p.source, err)
		}
		if progressed {
			bo.Reset()
		}
		if id, times := refused.note(err); times > 1 {
			err = refusedAgain(id, times, err)
		}
		d := bo.Next(err)
		p.log.Warn("run ended; restarting", "err", err, "in", d.String(), "attempt", bo.Attempt())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
	}
}

// txnItem is a routed transaction, or a part of a large one, on its way
// to the writer.
type txnItem struct {
	commit  cdc.LSN
	changes []cdc.Change
	dests   [][]int // per change: sink indexes
	last    bool    // the transaction's last part
}

// chunk bounds the changes of a large transaction held at once, and the
// changes of small transactions handed to the writer in one run.
const chunk = 1000

// queueLimit bounds the changes routed and waiting for the writer: a
// batch of max changes and two runs, so that the writer finds its next
// batch ready when a Write returns (a writer waiting for the reader leaves
// the sink idle), and the memory queued depends on the batch size, not on
// the transactions'.
func queueLimit(max int) int64 { return int64(max + 2*chunk) }

// runWeight is what run counts against limit: its changes, at least 1 (a
// commit without routed changes) and at most limit (a run can exceed it,
// and must still go through alone).
func runWeight(run []*txnItem, limit int64) int64 {
	n := 0
	for _, it := range run {
		n += len(it.changes)
	}
	return min(max(int64(n), 1), limit)
}

// route routes and encodes t's changes and hands them to emit; a
// transaction read back from disk goes in parts of chunk changes.
func (p *Pipeline) route(ctx context.Context, t *cdc.Txn, producer string, emit func(*txnItem) error) error {
	if t.Rest != nil {
		defer t.Rest.Close()
	}
	send := func(it *txnItem) error {
		p.tel.txn(ctx, t, it) // spans, traceparent headers, counters
		return emit(it)
	}
	newItem := func() *txnItem { return &txnItem{commit: t.CommitLSN} }
	it := newItem()
	// add routes cs, changes read back from disk into a reused buffer, and
	// appends copies of the routed ones to it.
	add := func(cs []cdc.Change) error {
		if it.changes == nil {
			it.changes, it.dests = make([]cdc.Change, 0, chunk), make([][]int, 0, chunk)
		}
		for i := range cs {
			c := &cs[i]
			c.Producer = producer
			dests, ok, err := p.router.Route(c)
			if err != nil {
				return fatal{err}
			}
			if !ok || len(dests) == 0 {
				continue
			}
			it.changes = append(it.changes, *c)
			it.dests = append(it.dests, dests)
		}
		return nil
	}
	// addHeld routes cs, a part of t's changes held in memory, into it, which
	// is empty. When every change is routed, it takes cs in place (no copy;
	// its capacity ends with cs, so an append copies); otherwise it takes
	// copies of the routed ones, and addHeld reports copied.
	addHeld := func(cs []cdc.Change) (copied bool, err error) {
		ds := make([][]int, len(cs))
		all := true
		for i := range cs {
			c := &cs[i]
			c.Producer = producer
			dests, ok, err := p.router.Route(c)
			if err != nil {
				return false, fatal{err}
			}
			if ok && len(dests) > 0 {
				ds[i] = dests
			} else {
				all = false
			}
		}
		if all {
			it.changes, it.dests = cs[:len(cs):len(cs)], ds
			return false, nil
		}
		it.changes, it.dests = make([]cdc.Change, 0, len(cs)), ds[:0]
		for i := range cs {
			if ds[i] != nil {
				it.changes = append(it.changes, cs[i])
				it.dests = append(it.dests, ds[i])
			}
		}
		return true, nil
	}
	// The changes held in memory go in parts of chunk too, so a run never
	// holds more than about chunk changes whatever the transaction's size.
	// A part that was copied is cleared from t once sent, so the GC can
	// free its changes as soon as they are written (startTxn has read t by
	// then: it runs on the first send). A part with nothing routed is not
	// sent. The last part stays in it, for the spilled changes to follow in
	// the same part.
	for from := 0; from < len(t.Changes); {
		to := min(from+chunk, len(t.Changes))
		copied, err := addHeld(t.Changes[from:to]) // it is empty: every part but the last is sent below
		if err != nil {
			return err
		}
		if to < len(t.Changes) && len(it.changes) > 0 {
			if err := send(it); err != nil {
				return err
			}
			if copied {
				clear(t.Changes[from:to])
			}
			it = newItem()
		}
		from = to
	}
	if t.Rest == nil {
		it.last = true
		return send(it)
	}
	buf := make([]cdc.Change, chunk)
	for {
		if len(it.changes) >= chunk {
			if err := send(it); err != nil {
				return err
			}
			it = newItem()
		}
		n, err := t.Rest.Next(buf)
		if aerr := add(buf[:n]); aerr != nil {
			return aerr
		}
		clear(buf[:n])
		if errors.Is(err, io.EOF) {
			it.last = true
			return send(it)
		}
		if err != nil {
			return fmt.Errorf("source %q: %w", p.source, err)
		}
	}
}

// buffered is implemented by sources that can tell how many transactions
// they hold decoded, ready for Read without blocking.
type buffered interface {
	Buffered() int
}

// mark is a checkpointable position: every transaction up to lsn is
// delivered, and cursors are sink positions at or before the first message
// after lsn.
type mark struct {
	lsn     cdc.LSN
	cursors map[string]string
}

func (p *Pipeline) runOnce(ctx context.Context) (progressed bool, err error) {
	st, rev, err := p.store.Load(ctx, p.key)
	if err != nil {
		return false, p.bucketGone(fmt.Errorf("loading checkpoint %q: %w", p.key, err))
	}
	if rev == 0 {
		// First start: the epoch must be durable before anything is
		// published under it.
		st = checkpoint.State{Epoch: checkpoint.NewEpoch(), Run: p.run, UpdatedAt: time.Now().UTC()}
		if err := p.snap.scheduleInitial(ctx, st.Epoch); err != nil {
			return false, err
		}
		if rev, err = p.store.Save(ctx, p.key, st, 0); err != nil {
			return false, fmt.Errorf("creating checkpoint %q: %w", p.key, err)
		}
		p.log.Info("new epoch", "epoch", st.Epoch)
	}
	p.ckptLSN.Store(uint64(st.LSN))
	producer := p.bridge + "." + p.source + "." + st.Epoch

	// Sinks: connect, then learn what they already hold past the checkpoint.
	skip := make([]map[cdc.Pos]struct{}, len(p.sinks))
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
				p.log.Info("sink already holds changes past the checkpoint; they will not be sent again", "sink", s.name, "count", len(d))
				skip[i] = d
			}
		}
	}

	src, err := p.newSource()
	if err != nil {
		return false, fatal{err}
	}
	if err := src.Open(ctx, st.LSN); err != nil {
		_ = src.Close(context.Background())
		if lost := (*sources.SlotLostError)(nil); errors.As(err, &lost) {
			return false, p.resync(ctx, st, rev, lost) // resync.go; nil: the next run streams the new epoch
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
		return false, fmt.Errorf("checkpoint %q moved from revision %d to %d while this run opened the slot (the slot's previous owner saved it last); starting again from it", p.key, rev, now)
	}
	p.ready.Store(true)
	opened := time.Now()

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Snapshots: chunks between watermarks join the stream (snapshot.go).
	wrapped, stopSnap, err := p.snap.wrap(rctx, src, producer, st.Epoch, p.snapHeld(st.Cursors))
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
		buf, _ := src.(buffered)
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
			t, err := src.Read(rctx)
			if err == nil {
				err = p.route(rctx, t, producer, emit)
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
	latest := mark{lsn: st.LSN, cursors: st.Cursors}
	ckptDone := make(chan struct{})
	var ckptErr error
	var lastSaved = st.LSN
	cf := &confirmer{delay: p.confirmDelay}
	save := func(ctx context.Context) error {
		markMu.Lock()
		m := latest
		markMu.Unlock()
		target := m.lsn
		if idler, ok := src.(sources.Idler); ok {
			if safe, after, ok := idler.Idle(); ok && m.lsn >= after && safe > target {
				target = safe
			}
		}
		if target <= lastSaved {
			return cf.ack(ctx, src, time.Now()) // a delayed confirmation may be due
		}
		ns := checkpoint.State{Epoch: st.Epoch, LSN: target, Cursors: m.cursors, UpdatedAt: time.Now().UTC(), Run: p.run, SystemID: st.SystemID}
		nrev, err := p.store.Save(ctx, p.key, ns, rev) // a lost reply is no fence: see Save
		if err != nil {
			return fmt.Errorf("saving checkpoint %s: %w", target, err)
		}
		rev, lastSaved = nrev, target
		p.ckptLSN.Store(uint64(target))
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
				err := p.slotLostWhileRunning(opened) // resync.go
				if err == nil {
					err = save(rctx)
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
	writeErr = p.write(rctx, ctx, items, skip, func(m mark) {
		markMu.Lock()
		latest = m
		markMu.Unlock()
		progressed = true
	}, latest, func(run []*txnItem) { queued.Release(runWeight(run, limit)) })
	cancel()
	wg.Wait()
	<-ckptDone

	// Goodbye: final checkpoint and status, each bounded.
	fctx, fcancel := context.WithTimeout(context.Background(), p.shutdown)
	if err := save(fctx); err != nil && ckptErr == nil && !errors.Is(err, context.Canceled) {
		ckptErr = err
	}
	fcancel()
	cctx, ccancel := context.WithTimeout(context.Background(), p.shutdown)
	_ = src.Close(cctx)
	ccancel()

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

// write batches items and writes them to the sinks in order. rctx ends the
// run; an in-flight Write is allowed to drain for p.shutdown after that.
//
// A batch is written when it holds max_changes changes (the smallest of the
// sinks'), or when its first change has waited max_wait (the largest of the
// sinks') and nothing more is queued, so under a steady stream no change
// waits much longer than max_wait.
func (p *Pipeline) write(rctx, parent context.Context, items <-chan []*txnItem, skip []map[cdc.Pos]struct{}, publish func(mark), start mark, taken func([]*txnItem)) error {
	per := make([][]cdc.Change, len(p.sinks))
	maxN := p.batchMax()
	var wait time.Duration
	for _, s := range p.sinks {
		if s.cfg.Batch.MaxWait > wait {
			wait = s.cfg.Batch.MaxWait
		}
	}
	cursors := start.cursors
	n := 0                // changes buffered
	var firstAt time.Time // when the buffer took its first change
	var done cdc.LSN      // last transaction fully buffered
	boundary := true      // the buffer ends at a transaction boundary

	flush := func() error {
		if n == 0 && done == 0 {
			return nil
		}
		before := cursors
		for i, s := range p.sinks {
			if len(per[i]) == 0 {
				continue
			}
			if err := p.writeSink(rctx, s, per[i]); err != nil {
				if s.amo {
					p.log.Warn("at-most-once sink dropped a batch", "sink", s.name, "changes", len(per[i]), "err", err)
					if errors.Is(err, sinks.ErrNotConnected) {
						cctx, ccancel := context.WithTimeout(rctx, time.Second)
						_ = s.sink.Connect(cctx) // bounded: it never holds back the others
						ccancel()
					}
					continue
				}
				return err
			}
		}
		p.delivered.Add(uint64(n))
		p.tel.delivered(n, done)
		after := make(map[string]string, len(p.sinks))
		for i, s := range p.sinks {
			switch {
			case s.resumer == nil:
			case len(per[i]) == 0:
				// Nothing written (all held already, or not routed here):
				// the sink's cursor may be an earlier run's, past changes
				// this checkpoint does not cover yet. Keep the last one.
				if c, ok := cursors[s.name]; ok {
					after[s.name] = c
				}
			default:
				after[s.name] = s.resumer.Cursor()
			}
		}
		cursors = after
		if done != 0 {
			m := mark{lsn: done, cursors: after}
			if !boundary {
				m.cursors = before
			}
			publish(m)
		}
		for i := range per {
			per[i] = per[i][:0]
		}
		n, done = 0, 0
		return nil
	}

	add := func(it *txnItem) error {
		for j := range it.changes {
			c := &it.changes[j]
			for _, si := range it.dests[j] {
				if sk := skip[si]; sk != nil {
					if _, held := sk[c.Pos()]; held {
						delete(sk, c.Pos())
						if len(sk) == 0 {
							skip[si] = nil
						}
						continue
					}
				}
				per[si] = append(per[si], *c)
			}
			n++
			if it.last && j == len(it.changes)-1 {
				// The buffer now holds the whole transaction.
				done, boundary = it.commit, true
			} else {
				boundary = false
			}
			if n >= maxN && !wholeTxnPending(it, j) {
				if err := flush(); err != nil {
					return err
				}
				firstAt = time.Now() // what follows starts a new batch
			}
		}
		if it.last && len(it.changes) == 0 {
			done, boundary = it.commit, true
		}
		return nil
	}

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		var run []*txnItem
		var ok, timedOut bool
		if n == 0 && done == 0 {
			select {
			case run, ok = <-items:
			case <-rctx.Done():
				return nil
			}
			firstAt = time.Now()
		} else {
			select {
			case run, ok = <-items:
			default:
				// Nothing queued: wait for more only until the oldest
				// buffered change is max_wait old.
				if left := wait - time.Since(firstAt); left > 0 {
					timer.Reset(left)
					select {
					case run, ok = <-items:
					case <-timer.C:
						timedOut = true
					case <-rctx.Done():
						timedOut = true
					}
					timer.Stop()
				} else {
					timedOut = true
				}
			}
		}
		if timedOut {
			if err := flush(); err != nil {
				return err
			}
			continue
		}
		if !ok {
			return flush()
		}
		if taken != nil {
			taken(run)
		}
		for _, it := range run {
			if err := add(it); err != nil {
				return err
			}
		}
	}
}

// batchMax is the writer's batch size: the smallest max_changes of the
// sinks (1000 when none sets one).
func (p *Pipeline) batchMax() int {
	maxN := 0
	for _, s := range p.sinks {
		if m := s.cfg.Batch.MaxChanges; m > 0 && (maxN == 0 || m < maxN) {
			maxN = m
		}
	}
	if maxN == 0 {
		maxN = 1000
	}
	return maxN
}

// maxWholeTxn is the largest transaction the writer keeps in one batch
// even past max_changes: JetStream's default limit of messages per atomic
// batch, so a sink publishing transactions atomically gets each whole.
const maxWholeTxn = 1000

// wholeTxnPending reports whether change j of it is not its transaction's
// last and the transaction, of at most maxWholeTxn changes, arrived whole
// in it: the batch is then not cut before its end.
func wholeTxnPending(it *txnItem, j int) bool {
	return it.last && j < len(it.changes)-1 && int(it.changes[j].TxSize) <= maxWholeTxn
}

// writeSink writes one batch. A failure ends the run: the next run resumes
// from the checkpoint and skips what the sink already holds, so a retry never
// duplicates and never reorders what follows a gap.
func (p *Pipeline) writeSink(rctx context.Context, s *sinkSlot, batch []cdc.Change) error {
	// A Write already under way may finish after a shutdown began, bounded.
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := context.AfterFunc(rctx, func() {
		time.AfterFunc(p.shutdown, cancel)
	})
	defer stop()
	if err := s.sink.Write(wctx, batch); err != nil {
		var be *sinks.BatchError
		if errors.As(err, &be) {
			idx := be.Indexes()
			first := batch[idx[0]]
			return &refusedError{id: first.ID(), err: fmt.Errorf("sink %q refused %d of %d changes, first %s (%s.%s at %s): %w",
				s.name, len(idx), len(batch), first.ID(), first.Schema, first.Table, first.CommitLSN, err)}
		}
		return fmt.Errorf("writing %d changes to sink %q: %w", len(batch), s.name, err)
	}
	return nil
}
