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

// chunk bounds the changes of a large transaction held at once.
const chunk = 1000

// route routes and encodes t's changes and sends them to the writer; a
// transaction read back from disk goes in parts of chunk changes.
func (p *Pipeline) route(ctx context.Context, t *cdc.Txn, producer string, items chan<- *txnItem) error {
	if t.Rest != nil {
		defer t.Rest.Close()
	}
	send := func(it *txnItem) error {
		p.tel.txn(ctx, t, it) // spans, traceparent headers, counters
		select {
		case items <- it:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	it := &txnItem{commit: t.CommitLSN}
	add := func(cs []cdc.Change) error {
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
	if err := add(t.Changes); err != nil {
		return err
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
			it = &txnItem{commit: t.CommitLSN}
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
		return false, fmt.Errorf("loading checkpoint %q: %w", p.key, err)
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
		return false, fmt.Errorf("opening source: %w", err)
	}
	p.ready.Store(true)

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
	items := make(chan *txnItem, 16) // bounded: a part holds up to `chunk` changes
	var wg sync.WaitGroup
	var readErr, writeErr error

	// Reader: source → router.
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(items)
		for {
			t, err := src.Read(rctx)
			if err != nil {
				if rctx.Err() == nil {
					readErr = err
					cancel()
				}
				return
			}
			if err := p.route(rctx, t, producer, items); err != nil {
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
			return nil
		}
		ns := checkpoint.State{Epoch: st.Epoch, LSN: target, Cursors: m.cursors, UpdatedAt: time.Now().UTC(), Run: p.run, SystemID: st.SystemID}
		nrev, err := p.store.Save(ctx, p.key, ns, rev)
		if err != nil {
			return fmt.Errorf("saving checkpoint %s: %w", target, err)
		}
		rev, lastSaved = nrev, target
		p.ckptLSN.Store(uint64(target))
		// Only now may Postgres forget what comes before it.
		return src.Ack(ctx, target)
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
				if err := save(rctx); err != nil {
					if rctx.Err() == nil {
						ckptErr = err
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
	}, latest)
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
func (p *Pipeline) write(rctx, parent context.Context, items <-chan *txnItem, skip []map[cdc.Pos]struct{}, publish func(mark), start mark) error {
	per := make([][]cdc.Change, len(p.sinks))
	maxN := 1000
	var wait time.Duration
	for _, s := range p.sinks {
		if s.cfg.Batch.MaxChanges > 0 && s.cfg.Batch.MaxChanges < maxN {
			maxN = s.cfg.Batch.MaxChanges
		}
		if s.cfg.Batch.MaxWait > wait {
			wait = s.cfg.Batch.MaxWait
		}
	}
	cursors := start.cursors
	n := 0           // changes buffered
	var done cdc.LSN // last transaction fully buffered
	boundary := true // the buffer ends at a transaction boundary

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
		for _, s := range p.sinks {
			if s.resumer != nil {
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
			if n >= maxN {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if it.last && len(it.changes) == 0 {
			done, boundary = it.commit, true
		}
		return nil
	}

	for {
		var it *txnItem
		var ok bool
		if n == 0 && done == 0 {
			select {
			case it, ok = <-items:
			case <-rctx.Done():
				return nil
			}
		} else {
			select {
			case it, ok = <-items:
			default:
				if wait > 0 {
					t := time.NewTimer(wait)
					select {
					case it, ok = <-items:
					case <-t.C:
					case <-rctx.Done():
					}
					t.Stop()
				}
				if it == nil {
					if err := flush(); err != nil {
						return err
					}
					continue
				}
			}
		}
		if !ok {
			return flush()
		}
		if err := add(it); err != nil {
			return err
		}
	}
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
			return fmt.Errorf("sink %q refused %d of %d changes, first %s (%s.%s at %s): %w",
				s.name, len(idx), len(batch), first.ID(), first.Schema, first.Table, first.CommitLSN, err)
		}
		return fmt.Errorf("writing %d changes to sink %q: %w", len(batch), s.name, err)
	}
	return nil
}
