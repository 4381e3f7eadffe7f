package natsjs

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrFenced wraps the error of a publish the stream refused because its
// last message was not the one the sink expected (by sequence or by id):
// another writer stored messages since the sink's last one. Either another bridge took over the
// source (this one is a zombie, or a dead one's publishes were still
// arriving) or something else writes to the stream. Not permanent: the
// pipeline restarts the run, which reads the stream's tail again (and stops
// when the checkpoint shows another owner).
var ErrFenced = errors.New("natsjs: fenced: the stream holds messages published after this sink's last one")

// fence keeps the chain of expectations every publish carries (config
// expect_last_sequence).
//
// Every message names what must be the stream's last message when the
// server stores it, so the stream stores it only if nothing else was stored
// since the message the sink published before it:
//   - the first publish of a Write carries Nats-Expected-Last-Sequence, the
//     sink's last known sequence (as is the first message of an atomic
//     batch, the only one of a batch that may carry it);
//   - every later message of the Write carries Nats-Expected-Last-Msg-Id,
//     the id of the message published just before it (a fast batch's carry
//     their expected sequences instead: the server ends the batch at the
//     first one that does not hold).
//
// A sequence alone would not do after the first: when another writer's
// message takes the slot of a publish of this Write that the stream then
// refuses, the expected sequences of the publishes in flight behind it line
// up again and the stream would store them behind a gap, which the next run
// would fill out of order. A message id cannot line up again: once one
// publish is refused, every later one of the Write is too. The stream checks
// the id after its duplicate check, so a change stored already comes back
// as a duplicate, as without the fence. An atomic batch after other
// publishes of the same Write waits for them first (write.go).
//
// So:
//   - publishes of a killed instance that the server applies late (its
//     connection's backlog; atomic batches take milliseconds each) cannot
//     land behind the changes its successor replays: whichever comes second
//     is refused or is a duplicate, and a refused successor restarts its
//     run and reads the tail again;
//   - a zombie (paused, then resumed after a standby took over) cannot
//     store anything once the new owner has published: each of its
//     publishes expects its own last message. The one exception changes
//     nothing: both publish the same transactions with the same ids from
//     the same position, so a zombie publish that lands exactly where the
//     owner's publish of the same change was about to go is stored there,
//     as the owner's would have been, and the owner's copy comes back as a
//     duplicate or refused, which ends the owner's run;
//   - after a failed publish nothing behind it is stored (no gap), whatever
//     another writer stores meanwhile.
//
// Every message carries a fence, not only a Write's first: a paused
// instance's publishes sit in its client's buffer and reach the server
// only after it resumes, whenever that is.
//
// The chain starts at the stream's last sequence as read by Connect (when
// not started yet, or when Connect created the stream) and by Delivered at
// the start of a run, and is never re-read in the middle of a run: that
// would let a zombie continue. A failed Write unsyncs it, so the next
// Connect, Delivered or Write reads it again (the pipeline ends the run
// after a failed Write; its next run reads the tail anyway).
//
// A Write whose first publish comes back as a duplicate (a replay the
// caller chose to make, e.g. a sink user writing a batch again) publishes
// the rest message by message without expectations: within the duplicate
// window two publishers of the same sequence of ids store it once and in
// order. When that first publish was an atomic batch, the server's reply
// names no sequence, so its changes are republished one by one first,
// each still fenced and awaited (write.go, replayRedo): that is where a
// duplicate stored after the chain's start shows, and the Write stops.
//
// With fast_batch, a fenced Write publishes its first change as above,
// awaited alone, and the rest as one fast batch (fast.go) whose every
// message carries its Nats-Expected-Last-Sequence: nats-server checks each
// one as for a plain publish, and the batch stops at the first that does
// not hold.
//
// The restriction: nothing else may write to the stream (one stream per
// source, as DESIGN.md §4.6 advises). Set expect_last_sequence: false for a
// shared stream.
//
// Delivered notices a shared stream (a message of another producer after
// the checkpoint's cursor, e.g. two sources routed to one stream) and turns
// the fence off for the sink's lifetime with a warning, so such a
// configuration loses the zombie fence instead of failing every run.
// Messages of another epoch of the same bridge and source (sameLineage:
// the epoch before a deleted checkpoint or a resync, snapshot reads) are
// not another producer's: they are this source's history, and an instance
// still publishing them is a zombie, so the fence stays on.
//
// A run may call Delivered more than once before it writes (the stream's
// producer, then a running snapshot's): only the first read of a run
// starts the chain. A later one leaves it where the first put it, so that
// messages stored between the two reads (a killed instance's publishes
// the server applied late), which the first read's result does not list,
// make the run's first publish fail (ErrFenced) instead of being
// published again. A run begins with Connect; a Write ends the reads.
type fence struct {
	mu     sync.Mutex
	last   uint64 // the stream's last sequence as the sink knows it
	synced bool   // last is known
	read   bool   // a Delivered started the chain, and no Connect or Write came since
	shared bool   // another writer was seen in the stream: fence off
}

// newRun forgets that a read started the chain: the next Delivered starts
// it again (Connect, at the start of every run).
func (f *fence) newRun() {
	f.mu.Lock()
	f.read = false
	f.mu.Unlock()
}

// syncRead starts the chain at the stream's last sequence seq as a
// Delivered read it, unless a read of the same run started it already.
func (f *fence) syncRead(seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.read && f.synced {
		return
	}
	f.last, f.synced, f.read = seq, true, true
}

// foundOther records that the stream holds a message another producer
// published (id is its Nats-Msg-Id, maybe empty).
func (f *fence) foundOther(s *Sink, id, subject string) {
	f.mu.Lock()
	first := !f.shared
	f.shared = true
	f.mu.Unlock()
	if first && s.cfg.ExpectLastSequence {
		s.log.Warn("the stream has other writers: publishing without the fence (Nats-Expected-Last-Sequence, Nats-Expected-Last-Msg-Id), so only the checkpoint fences a zombie bridge; give each source a stream of its own, or set expect_last_sequence: false to silence this",
			"stream", s.cfg.Stream, "other_msg_id", id, "subject", subject)
	}
}

// isShared reports whether another writer was seen in the stream.
func (f *fence) isShared() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.shared
}

// start returns the sequence the Write's first publish expects, reading
// the stream's last sequence when the chain is not synced.
func (f *fence) start(ctx context.Context, js jetstream.JetStream, stream string) (uint64, error) {
	f.mu.Lock()
	last, synced := f.last, f.synced
	f.mu.Unlock()
	if synced {
		return last, nil
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("reading the stream's last sequence: %w", err)
	}
	last = st.CachedInfo().State.LastSeq
	f.sync(last)
	return last, nil
}

// sync starts the chain at the stream's last sequence seq.
func (f *fence) sync(seq uint64) {
	f.mu.Lock()
	f.last, f.synced = seq, true
	f.mu.Unlock()
}

// syncIf starts the chain at seq when cond holds.
func (f *fence) syncIf(cond bool, seq uint64) {
	if cond {
		f.sync(seq)
	}
}

// isSynced reports whether the chain has a start.
func (f *fence) isSynced() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.synced
}

// done moves the chain past what Write w stored, or unsyncs it when w
// failed (the next Write reads the stream's last sequence again).
func (f *fence) done(w *write) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.read = false
	if w.err.Failed != nil {
		f.synced = false
		return
	}
	if w.fresh > f.last {
		f.last = w.fresh
	}
}
