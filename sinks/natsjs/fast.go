package natsjs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/bridgecdc/bridge/internal/natsconn"
)

// fastMin is the smallest Write sent as a fast batch: a fast batch waits
// for the ack of its first message and then for the commit's, two round
// trips, so small (live) batches go message by message.
const fastMin = 64

// fastFlow is how many messages the server stores between two flow acks.
const fastFlow = 250

// fastOK reports whether Writes go out as fast batches: asked for, and the
// stream allows it.
func (s *Sink) fastOK() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.FastBatch && s.allowBatch
}

// writeFast publishes w.batch[from:] as one fast-ingest batch (ADR-50):
// every message but the last with AddMsg, which blocks only when the server
// is more than two flow acks behind, then the last with CommitMsg, whose ack
// covers the batch. With gap detection on ("fail"), a flow ack for batch
// sequence k means its messages 1..k are stored; on a failure every change
// after the last flow ack is reported failed (not known to be stored), so
// the pipeline resumes through Delivered and dedupe as for any failure.
// The server drops duplicates by Nats-Msg-Id inside a fast batch as in a
// plain publish.
//
// When fenced, change i carries Nats-Expected-Last-Sequence exp+(i-from),
// which nats-server checks for every message of a fast batch as for a plain
// publish: the batch stops at the first message that does not follow the
// stream's last one (another writer stored something, or a duplicate broke
// the chain), and that and everything after it is reported failed. Write
// sends a fenced Write's first change alone and awaits it before (fence.go).
// The server reports a refusal at once, but orbit.go v0.4.0 does not wake a
// publish stalled on flow control for it, so a refused fenced batch may
// take up to ack_timeout to fail.
//
// It returns the first index not published and, when it stopped for a
// reason of its own (ctx), that reason.
func (s *Sink) writeFast(w *write, js jetstream.JetStream, from int, fenced bool, exp uint64) (int, error) {
	batch := w.batch
	var asyncMu sync.Mutex
	var asyncErr error // the first error the server reported on the batch's control channel
	fp, err := jetstreamext.NewFastPublisher(js,
		jetstreamext.FastPublishFlowControl{Flow: fastFlow, MaxOutstandingAcks: 2, AckTimeout: s.cfg.AckTimeout},
		jetstreamext.WithFastPublisherErrorHandler(func(err error) {
			asyncMu.Lock()
			if asyncErr == nil {
				asyncErr = err
			}
			asyncMu.Unlock()
		}))
	if err != nil {
		return from, fmt.Errorf("starting a fast batch on stream %q: %w", s.cfg.Stream, err)
	}
	// withServer adds what the server reported, so that publishErr sees a
	// fence refusal (wrong last sequence) behind a closed batch or a timeout.
	withServer := func(err error) error {
		asyncMu.Lock()
		defer asyncMu.Unlock()
		if asyncErr == nil || errors.Is(err, asyncErr) {
			return err
		}
		return fmt.Errorf("%w (the server reported: %w)", err, asyncErr)
	}
	msgs := make([]*nats.Msg, 0, len(batch)-from)
	var acked uint64 // batch sequences 1..acked (changes from..from+acked-1) are stored
	// failFrom reports every change from the last flow ack up to i as not
	// known to be stored, i itself with err.
	failFrom := func(i int, err error) {
		for k := from + int(acked); k < i; k++ {
			w.err.Fail(k, fmt.Errorf("not known to be stored: the fast batch failed at %s: %w", batch[i].ID(), err))
		}
		w.err.Fail(i, err)
	}
	// abandon ends a batch left without its commit (the server would drop
	// it after a timeout; what it stored stays stored): an end-of-batch
	// commit not waited for, which also drops the ack subscription.
	abandon := func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, _ = fp.Close(ctx)
	}
	for i := from; i < len(batch); i++ {
		if w.ctx.Err() != nil {
			err := w.ctxErr()
			if i > from+int(acked) {
				failFrom(i-1, fmt.Errorf("waiting for the fast batch's acks: %w", err))
			}
			if i > from {
				abandon()
			}
			return i, err
		}
		ph := pubHeaders{}
		if fenced {
			ph.expLast = strconv.FormatUint(exp+uint64(i-from), 10)
		}
		m, ok := w.prepare(i, ph)
		if !ok { // refused; prepare recorded why
			if i > from+int(acked) {
				failFrom(i-1, fmt.Errorf("not known to be stored: change #%d of the fast batch was refused: %w", i, errSkipped))
			}
			if i > from {
				abandon()
			}
			return i + 1, nil
		}
		msgs = append(msgs, m)
		if i == len(batch)-1 {
			ack, err := fp.CommitMsg(w.ctx, m)
			if err != nil {
				failFrom(i, s.publishErr(w.nc, &batch[i], len(m.Data)+natsconn.HeaderSize(m.Header), withServer(fmt.Errorf("committing the fast batch: %w", err))))
				return i + 1, nil
			}
			if n := len(batch) - from; ack.BatchSize < uint64(n) {
				// The server ended the batch early, at the first message it
				// refused (a fence that did not hold, a limit): its first
				// BatchSize messages were taken (stored or duplicates), the
				// rest not, though the commit's ack reports no error.
				end := from + int(ack.BatchSize)
				cause := withServer(fmt.Errorf("the fast batch ended after %d of its %d messages", ack.BatchSize, n))
				w.err.Fail(end, s.publishErr(w.nc, &batch[end], len(msgs[end-from].Data)+natsconn.HeaderSize(msgs[end-from].Header), cause))
				for k := end + 1; k < len(batch); k++ {
					w.err.Fail(k, fmt.Errorf("not stored: the fast batch ended at %s: %w", batch[end].ID(), errSkipped))
				}
				if end > from && ack.Sequence > 0 {
					w.seqs[end-1] = ack.Sequence
				}
				return len(batch), nil
			}
			if ack.Sequence > 0 {
				w.seqs[i] = ack.Sequence // the highest stored; 0 when all were duplicates
				w.fresh = max(w.fresh, ack.Sequence)
			}
			if ack.Sequence == 0 || (fenced && ack.Sequence != exp+uint64(len(batch)-from)) {
				w.dups++ // not every change was stored fresh
			}
			for _, m := range msgs {
				s.recycle(m)
			}
			return len(batch), nil
		}
		a, err := fp.AddMsg(m)
		if err != nil {
			failFrom(i, s.publishErr(w.nc, &batch[i], len(m.Data)+natsconn.HeaderSize(m.Header), withServer(err)))
			return i + 1, nil
		}
		acked = max(acked, a.AckSequence)
	}
	return len(batch), nil
}
