package natsjs

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrFenced wraps the error of a publish the stream refused because its
// last sequence was not the one the sink expected: another writer stored
// messages since the sink's last one. Either another bridge took over the
// source (this one is a zombie, or a dead one's publishes were still
// arriving) or something else writes to the stream. Not permanent: the
// pipeline restarts the run, which reads the stream's tail again (and stops
// when the checkpoint shows another owner).
var ErrFenced = errors.New("natsjs: fenced: the stream holds messages published after this sink's last one")

// fence keeps the chain of Nats-Expected-Last-Sequence headers (config
// expect_last_sequence).
//
// Every message, or the first message of every atomic batch, carries the
// stream sequence it must follow: the sink's last known sequence plus what
// the Write published before it. The stream then stores it only if nothing
// else was stored in between, so:
//   - publishes of a killed instance that the server applies late (its
//     connection's backlog; atomic batches take milliseconds each) cannot
//     land behind the changes its successor replays: whichever comes second
//     is refused, and a refused successor restarts its run and reads the
//     tail again;
//   - a zombie (paused, then resumed after a standby took over) cannot
//     store anything once the new owner has published: each of its
//     publishes expects its own last sequence;
//   - after a failed publish nothing behind it is stored (no gap).
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
// order.
//
// With fast_batch, a fenced Write publishes its first change as above,
// awaited alone, and the rest as one fast batch (fast.go) whose every
// message carries its expectation: nats-server checks each one as for a
// plain publish, and the batch stops at the first that does not hold.
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
type fence struct {
	mu     sync.Mutex
	last   uint64 // the stream's last sequence as the sink knows it
	synced bool   // last is known
	shared bool   // another writer was seen in the stream: fence off
}

// foundOther records that the stream holds a message another producer
// published (id is its Nats-Msg-Id, maybe empty).
func (f *fence) foundOther(s *Sink, id, subject string) {
	f.mu.Lock()
	first := !f.shared
	f.shared = true
	f.mu.Unlock()
	if first && s.cfg.ExpectLastSequence {
		s.log.Warn("the stream has other writers: publishing without Nats-Expected-Last-Sequence, so only the checkpoint fences a zombie bridge; give each source a stream of its own, or set expect_last_sequence: false to silence this",
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
	if w.err.Failed != nil {
		f.synced = false
		return
	}
	if w.fresh > f.last {
		f.last = w.fresh
	}
}
