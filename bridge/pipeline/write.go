package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/snapshot"
	"github.com/bridgecdc/bridge/sinks"
)

// The writer's side: batches of routed changes written to the sinks in
// order, and the marks that say what the checkpoint may cover.

// write batches items and writes them to the sinks in order. rctx ends the
// run; an in-flight Write is allowed to drain for p.shutdown after that.
//
// A batch is written when it holds max_changes changes (the smallest of the
// sinks'), or when nothing more is queued and either the source had nothing
// more at hand when it handed the last run over (see moreComing: a lone
// transaction waits for nothing) or the batch's first change has waited
// max_wait (the largest of the sinks'). While a Write is under way the
// reader queues what follows, so under a steady stream batches grow with
// the rate without any change waiting for company.
//
// skip holds, per sink, the positions of streamed changes the sink holds
// already past the checkpoint; snapSkip the reads of a running snapshot it
// holds (snapshot.Held). Both are left out for that sink.
func (p *Pipeline) write(rctx, parent context.Context, items <-chan []*txnItem, skip []map[cdc.Pos]struct{}, snapSkip []snapshot.Held, publish func(mark), start mark, taken func([]*txnItem)) error {
	per := make([][]cdc.Change, len(p.sinks))
	maxN := p.batchMax()
	var wait time.Duration
	for _, s := range p.sinks {
		if s.batch.MaxWait > wait {
			wait = s.batch.MaxWait
		}
	}
	cursors := start.cursors
	n := 0                // changes buffered
	var firstAt time.Time // when the buffer took its first change
	var done cdc.LSN      // last transaction fully buffered
	doneRev := start.rev  // the configuration revision it was routed by
	boundary := true      // the buffer ends at a transaction boundary
	more := false         // the last run said more was at hand (moreComing)

	flush := func() error {
		if n == 0 && done == 0 {
			return nil
		}
		before := cursors
		for i, s := range p.sinks {
			if len(per[i]) == 0 && done != 0 {
				s.advance(done) // given nothing of done's transaction: it holds its share
			}
		}
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
			s.advance(per[i][len(per[i])-1].CommitLSN)
		}
		if done != 0 {
			for i, s := range p.sinks {
				if s.amo && len(per[i]) > 0 && cdc.LSN(s.written.Load()) < per[i][len(per[i])-1].CommitLSN {
					continue // an at-most-once sink dropped this batch
				}
				s.advance(done) // it holds what it is given of done's transaction and those before
			}
		}
		p.delivered.Add(uint64(n))
		p.obs.Delivered(n, done)
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
			m := mark{lsn: done, cursors: after, rev: doneRev}
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
				if sk := skip[si]; sk != nil && c.MsgID == "" {
					if _, held := sk[c.Pos()]; held {
						delete(sk, c.Pos())
						if len(sk) == 0 {
							skip[si] = nil
						}
						continue
					}
				}
				if sk := snapSkip[si]; sk != nil && sk.Take(c) {
					if len(sk) == 0 {
						snapSkip[si] = nil
					}
					continue
				}
				per[si] = append(per[si], *c)
			}
			n++
			if it.last && j == len(it.changes)-1 {
				// The buffer now holds the whole transaction.
				done, boundary, doneRev = it.commit, true, it.rev
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
			done, boundary, doneRev = it.commit, true, it.rev
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
				// Nothing queued: wait for more only when more is at hand,
				// and only until the oldest buffered change is max_wait old.
				if left := wait - time.Since(firstAt); more && left > 0 {
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
		more = moreComing(run)
		for _, it := range run {
			if err := add(it); err != nil {
				return err
			}
		}
	}
}

// moreComing reports whether the reader handed run over with more of the
// source's changes at hand: it hands a run over when it reaches chunk
// changes or a part of a large transaction (more follows at once), or when
// the source holds nothing more decoded. A run of the last kind ends a burst,
// and a batch waiting for company after it would only wait.
func moreComing(run []*txnItem) bool {
	n := 0
	for _, it := range run {
		n += len(it.changes)
	}
	return n >= chunk || (len(run) > 0 && !run[len(run)-1].last)
}

// batchMax is the writer's batch size: the smallest max_changes of the
// sinks (1000 when none sets one).
func (p *Pipeline) batchMax() int {
	maxN := 0
	for _, s := range p.sinks {
		if m := s.batch.MaxChanges; m > 0 && (maxN == 0 || m < maxN) {
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
	n := int(it.changes[j].TxSize) // 0: a transaction handed over before its commit, larger
	return it.last && j < len(it.changes)-1 && n > 0 && n <= maxWholeTxn
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
	start := time.Now()
	err := s.sink.Write(wctx, batch)
	p.obs.Wrote(s.name, time.Since(start), err)
	if err != nil {
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
