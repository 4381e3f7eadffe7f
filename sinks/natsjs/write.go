// Write: a batch published in order and pipelined, message by message or a
// transaction as one atomic batch (a Write as one fast batch: fast.go), and
// each change's outcome from its ack.

package natsjs

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/sinks"
)

// jsErrCodeAtomicDuplicate is the server's JSAtomicPublishContainsDuplicateMessageErr.
const jsErrCodeAtomicDuplicate jetstream.ErrorCode = 10201

// maxAtomic is the largest transaction published as one atomic batch: the
// server's default limit of messages per batch. Larger transactions are
// published message by message (still in order and exactly once, but a
// consumer can see part of one).
const maxAtomic = 1000

// atomicOK reports whether transactions go out as atomic batches: asked for,
// and the stream allows it.
func (s *Sink) atomicOK() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.AtomicTransactions && s.allowAtomic
}

// atomicGroup returns the size of the whole transaction starting at
// batch[i] when it can go as one atomic batch, else 0: it must start at
// ordinal 0, have two to maxAtomic changes, and all be in this batch.
func atomicGroup(batch []cdc.Change, i int, atomic bool) int {
	if !atomic {
		return 0
	}
	c := &batch[i]
	n := int(c.TxSize)
	if c.Seq != 0 || n < 2 || n > maxAtomic || i+n > len(batch) {
		return 0
	}
	for k := 1; k < n; k++ {
		if d := &batch[i+k]; d.CommitLSN != c.CommitLSN || d.Seq != uint32(k) || d.Producer != c.Producer {
			return 0
		}
	}
	return n
}

// jsErrCodeStreamNotMatch is the server's JSStreamNotMatchErr: the subject
// belongs to another stream (acks.go reports it when an ack names one).
const jsErrCodeStreamNotMatch jetstream.ErrorCode = 10060

// jsErrCodeWrongLastMsgID is the server's JSStreamWrongLastMsgIDErrF: the
// stream's last message is not the one Nats-Expected-Last-Msg-Id names.
const jsErrCodeWrongLastMsgID jetstream.ErrorCode = 10070

// Write publishes the batch in order, pipelined: up to max_pending
// messages await their acks at once. It returns when every published change
// is acked or failed, or when ctx ends.
//
// nil means every change is in the stream (a duplicate ack counts: it was
// there already). A *sinks.BatchError lists the changes that are not known
// to be in the stream; every index it does not list was acked. After the
// first failure Write publishes nothing more (the rest fail with a "not
// published" error), but changes already in flight behind the failed one
// may still be stored, leaving a gap; they are reported as delivered if
// and only if their ack arrived. Per-change errors wrap
// sinks.ErrNotConnected when the connection is down (the pipeline calls
// Connect), and are sinks.Permanent when the change can never be stored:
// larger than the server's max_payload or the stream's max_msg_size, an
// invalid subject, or a subject the stream does not bind. Other errors
// (ack timeout, ctx) are worth retrying. A Write on a closed sink fails
// with a Permanent error, one before Connect with ErrNotConnected.
func (s *Sink) Write(ctx context.Context, batch []cdc.Change) error {
	if len(batch) == 0 {
		return nil
	}
	s.mu.Lock()
	nc, js, acks, closed, subjects := s.nc, s.js, s.acks, s.closed, s.subjects
	s.mu.Unlock()
	switch {
	case closed:
		return sinks.Permanent(fmt.Errorf("writing %d changes to stream %q: %w", len(batch), s.cfg.Stream, errClosed))
	case js == nil || !nc.IsConnected():
		return fmt.Errorf("writing %d changes to stream %q: %w", len(batch), s.cfg.Stream, sinks.ErrNotConnected)
	case ctx.Err() != nil:
		return fmt.Errorf("writing %d changes to stream %q: %w", len(batch), s.cfg.Stream, ctx.Err())
	}

	w := &write{s: s, nc: nc, ctx: ctx, batch: batch, acks: acks, aw: acks.begin(len(batch)), msg: make([]*nats.Msg, len(batch)),
		seqs: make([]uint64, len(batch)), group: make([]int, len(batch))}
	defer acks.end(w.aw)
	// The fence (fence.go): each publish expects the stream's last
	// sequence to be the one before it, so nothing another instance stored
	// meanwhile can be overtaken.
	fenced := s.cfg.ExpectLastSequence && !s.fence.isShared()
	var exp uint64 // the stream's last sequence the next publish expects
	if fenced {
		var err error
		if exp, err = s.fence.start(ctx, js, s.cfg.Stream); err != nil {
			err = fmt.Errorf("writing %d changes to stream %q: %w", len(batch), s.cfg.Stream, err)
			for i := range batch {
				w.err.Fail(i, err)
			}
			return w.err.Err()
		}
	}
	synced := exp // the stream's last sequence where the chain stands
	w.redoFenced, w.redoExp = fenced, exp
	stop := len(batch) // first index not published
	var stopErr error  // why, when stopped before a failure of its own
	w.js, w.subjects = js, subjects
	w.limit, w.what = s.msgLimit(nc)
	atomic := s.atomicOK()
	// firstDone resolves the Write's first publish (a message or an atomic
	// batch ending at index end) when fenced, and turns the rest of the
	// Write into a replay when it was stored already.
	firstDone := func(end int) {
		if end != w.firstEnd {
			return
		}
		for w.next <= end {
			w.resolve()
		}
		if w.dups > 0 || len(w.redo) > 0 {
			wasFenced := fenced
			fenced, atomic = false, false // a replay: see fence.go
			s.log.Debug("the Write starts with changes the stream holds already: publishing it message by message, unfenced", "stream", s.cfg.Stream, "first", batch[0].ID())
			w.replayRedo()
			w.aw.failed.Store(false) // the first publish's refusal is handled
			if wasFenced && w.dupMax > synced && end+1 < len(batch) && w.err.Failed == nil {
				// Stored after the point the chain starts from: not a
				// replay of ours but another writer's (a killed or paused
				// instance whose publishes the server applied late). Seen
				// where the server checks duplicates before the expected
				// sequence: atomic and fast batches, clustered streams. A
				// plain publish to an R1 stream is refused by its
				// expectation instead (wrong last sequence: ErrFenced).
				// Publishing the rest unfenced could store what that
				// writer stored beyond the duplicate window: stop, so the
				// next run reads the stream's tail again.
				w.err.Fail(end+1, fmt.Errorf("not publishing %s: the stream stored %s at sequence %d, after sequence %d where this sink's chain stands, so another instance is publishing: %w",
					batch[end+1].ID(), batch[0].ID(), w.dupMax, synced, ErrFenced))
			}
		}
	}
	w.firstEnd = -1
	if fenced || atomic {
		w.firstEnd = 0
		if n := atomicGroup(batch, 0, atomic); n > 0 {
			w.firstEnd = n - 1
		}
	}
	from := 0 // first index the loop below publishes
	// fastRest: a fenced Write's first publish goes alone (a replay shows
	// there), the rest as one fenced fast batch (fence.go).
	fastRest := false
	if !atomic && len(batch) >= fastMin && s.fastOK() {
		if fenced {
			fastRest = true
		} else {
			stop, stopErr = s.writeFast(w, js, 0, false, 0) // fast.go
			from = len(batch)
		}
	}
publish:
	for i := from; i < len(batch); i++ {
		c := &batch[i]
		for i-w.next >= s.cfg.MaxPending { // window full: wait for the oldest ack
			w.resolve()
		}
		if w.err.Failed != nil || w.aw.failed.Load() || ctx.Err() != nil {
			stop = i
			if w.err.Failed == nil && ctx.Err() != nil {
				stopErr = w.ctxErr()
			}
			break
		}
		if n := atomicGroup(batch, i, atomic); n > 0 {
			// A whole transaction as one atomic batch: its messages, then a
			// commit whose ack (awaited like any other) covers them all.
			if fenced && w.plainSince {
				// Only a batch's first message may carry a fence, and only
				// Nats-Expected-Last-Sequence, which a refused publish in
				// flight before it would not stop: another writer's message
				// taking that publish's place lines the sequence up again.
				// After publishes chained on message ids, wait for them (a
				// batch costs the server milliseconds anyway), and publish
				// it only if all of them were stored. After another batch
				// it goes at once: lining up again would take another
				// writer storing exactly as many messages as that batch
				// held, between the two.
				for w.next < i {
					w.resolve()
				}
				if w.err.Failed != nil || w.aw.failed.Load() {
					stop = i
					break
				}
				w.plainSince = false
				if w.dups > 0 {
					// Changes this Write published were in the stream
					// already: another instance stored them since the
					// chain's start (the pipeline skips what the stream
					// held), so the batch's expected sequence, counted
					// from this Write's publishes, is no longer known.
					stop, stopErr = i, fmt.Errorf("the stream held %d of the changes published before it, stored by another instance: %w", w.dups, ErrFenced)
					break
				}
			}
			msgs := make([]*nats.Msg, n)
			bid := nuid.Next()
			for k := range n {
				ph := pubHeaders{batchID: bid, batchSeq: k + 1, commit: k == n-1}
				if fenced && k == 0 { // only a batch's first message may carry it
					ph.expLast = strconv.FormatUint(exp, 10)
				}
				m, ok := w.prepare(i+k, ph)
				if !ok {
					for kk := range k { // its transaction goes all or nothing
						w.err.Fail(i+kk, fmt.Errorf("not publishing %s: change #%d of its transaction was refused: %w", batch[i+kk].ID(), i+k, errSkipped))
					}
					stop = i + k + 1
					break publish
				}
				msgs[k] = m
			}
			if fenced {
				exp += uint64(n)
			}
			for k := range n - 1 {
				if err := nc.PublishMsg(msgs[k]); err != nil {
					for kk := range n {
						w.err.Fail(i+kk, s.publishErr(nc, &batch[i+kk], len(msgs[kk].Data)+natsconn.HeaderSize(msgs[kk].Header), err))
					}
					stop = i + n
					break publish
				}
			}
			w.msg[i+n-1] = msgs[n-1]
			if err := w.publish(i + n - 1); err != nil {
				for kk := range n {
					w.err.Fail(i+kk, s.publishErr(nc, &batch[i+kk], len(msgs[kk].Data)+natsconn.HeaderSize(msgs[kk].Header), err))
				}
				stop = i + n
				break
			}
			w.group[i+n-1] = n
			w.lastID = msgs[n-1].Header.Get(jetstream.MsgIDHeader)
			firstDone(i + n - 1)
			i += n - 1
			continue
		}
		var ph pubHeaders
		switch {
		case !fenced:
		case w.lastID == "": // the Write's first publish: after the stream's last message
			ph.expLast = strconv.FormatUint(exp, 10)
		default: // after the message published just before (fence.go)
			ph.expLastID = w.lastID
		}
		msg, ok := w.prepare(i, ph)
		if !ok {
			stop = i + 1
			break
		}
		if fenced {
			exp++
		}
		w.msg[i] = msg
		w.lastID = msg.Header.Get(jetstream.MsgIDHeader)
		w.plainSince = w.plainSince || ph.expLastID != ""
		if err := w.publish(i); err != nil {
			w.err.Fail(i, s.publishErr(nc, c, len(msg.Data)+natsconn.HeaderSize(msg.Header), err))
			stop = i + 1
			break publish
		}
		firstDone(i)
		if fastRest && i == w.firstEnd && fenced && w.err.Failed == nil && !w.aw.failed.Load() && ctx.Err() == nil {
			stop, stopErr = s.writeFast(w, js, i+1, true, exp) // fast.go
			break
		}
	}
	for w.next < stop {
		w.resolve()
	}
	w.replayRedo()
	first := -1 // first failed index
	if idx := w.err.Indexes(); len(idx) > 0 {
		first = idx[0]
	}
	for i := stop; i < len(batch); i++ {
		if _, failed := w.err.Failed[i]; failed {
			continue // its own reason stands
		}
		id := batch[i].ID()
		switch {
		case stopErr != nil:
			w.err.Fail(i, fmt.Errorf("not publishing %s: %w", id, stopErr))
		case first >= 0:
			w.err.Fail(i, fmt.Errorf("not publishing %s after #%d failed: %w", id, first, errSkipped))
		default: // a failure reported by the client, maybe of an earlier Write
			w.err.Fail(i, fmt.Errorf("not publishing %s: %w", id, errSkipped))
		}
	}
	s.advanceCursor(w)
	s.fence.done(w)
	s.countDead(w)
	return w.err.Err()
}

// replayRedo publishes, message by message, the changes of the atomic
// batches that met messages stored already (only a Write's first publish:
// see resolve); dedupe drops the stored ones. Each message is prepared
// again, as a plain publish's: its size changes with its headers.
//
// When the Write is fenced the redo is too: each message expects the
// stream's last sequence to be where the Write's chain started, moved on by
// the redo's own fresh stores, and is awaited before the next goes. An R1
// stream checks that expectation before its duplicate check, so a stored
// change is answered as a duplicate only while nothing else was stored
// since the chain's start, and a change whose dedupe entry expired is
// refused (ErrFenced) instead of being stored a second time, behind what
// another instance stored meanwhile. Without the fence on the redo a
// zombie paused between the batch's duplicate reply and its redo for
// longer than the duplicate window stored the transaction again at the
// stream's end (TestFenceRedoAfterDuplicateWindow).
func (w *write) replayRedo() {
	if len(w.redo) > 0 && w.s.beforeRedo != nil {
		w.s.beforeRedo()
	}
	for len(w.redo) > 0 && w.err.Failed == nil {
		end := w.redo[0]
		w.redo = w.redo[1:]
		n := w.group[end]
		w.group[end] = 0
		tail := w.redoExp // the stream's last sequence the next message expects
		for k := end - n + 1; k <= end; k++ {
			var ph pubHeaders
			if w.redoFenced {
				ph.expLast = strconv.FormatUint(tail, 10)
			}
			m, ok := w.prepare(k, ph) // !ok: prepare recorded why
			if ok {
				w.msg[k] = m
				if err := w.publish(k); err != nil {
					w.err.Fail(k, w.s.publishErr(w.nc, &w.batch[k], len(m.Data)+natsconn.HeaderSize(m.Header), err))
					ok = false
				}
			}
			if ok && w.redoFenced {
				w.next = k
				dups := w.dups
				w.resolve()
				switch {
				case w.err.Failed != nil:
					ok = false
				case w.dups == dups: // stored fresh: the chain moves on
					tail = w.seqs[k]
				}
			}
			if !ok {
				for kk := k + 1; kk <= end; kk++ { // not published: not stored
					w.err.Fail(kk, fmt.Errorf("not publishing %s after #%d failed: %w", w.batch[kk].ID(), k, errSkipped))
				}
				break
			}
		}
		if w.redoFenced {
			w.next = end + 1
			continue
		}
		for w.next = end - n + 1; w.next <= end; {
			w.resolve()
		}
	}
}

// write is the state of one Write.
type write struct {
	s     *Sink
	nc    *nats.Conn
	ctx   context.Context
	batch []cdc.Change
	acks  *acker
	aw    *ackWait    // acks.go: this Write's acks
	msg   []*nats.Msg // per change: its message once published with an ack awaited
	group []int       // at the commit's index: the size of its atomic batch
	redo  []int       // commit indexes of atomic batches to republish
	// redoFenced: the redo carries the fence, starting at the stream's
	// last sequence redoExp (replayRedo).
	redoFenced bool
	redoExp    uint64
	seqs       []uint64 // stream sequence of each acked change
	dups       int
	// dupMax is the highest stream sequence of the stored originals of
	// changes acked as duplicates.
	dupMax uint64
	fresh  uint64 // highest sequence of a change stored (not a duplicate) by this Write
	next   int    // next index to resolve
	// firstEnd is the last index of the Write's first publish while that
	// publish is awaited alone (fence.go), else -1.
	firstEnd int
	// lastID is the Nats-Msg-Id of the message published last, "" before
	// the first: the next fenced publish expects it as the stream's last.
	lastID string
	// plainSince: a publish chained on lastID went out since the Write
	// last waited for its acks, so an atomic batch must wait (write).
	plainSince bool
	err        sinks.BatchError
	dead       []int // indexes of the changes diverted to the dead-letter subject

	// For prepare (msg.go).
	js        jetstream.JetStream
	subjects  []string // the stream's subjects as known to this Write
	refreshed bool     // the stream was read again for an unbound subject
	okSubject string   // the last subject found valid and bound to the stream
	limit     int      // the largest message the server and the stream accept; 0: unknown
	what      string   // which limit that is
}

// publish publishes w.msg[i], as prepare assembled it, with its ack
// awaited.
func (w *write) publish(i int) error {
	err := w.acks.publish(w.aw, i, w.msg[i])
	if err == nil && w.s.afterPublish != nil {
		w.s.afterPublish(i)
	}
	return err
}

// resolve waits for the ack of change w.next (unless it was not published
// with an ack awaited) and records the outcome. Once ctx has ended it only
// takes acks that have arrived already.
func (w *write) resolve() {
	i := w.next
	w.next++
	r, published, err := w.acks.wait(w.ctx, w.aw, i, w.s.cfg.AckTimeout)
	if !published {
		return
	}
	m := w.msg[i]
	if err == nil {
		err = r.err
	} else if w.ctx.Err() != nil {
		w.failGroup(i, fmt.Errorf("waiting for the ack of %s: %w", w.batch[i].ID(), w.ctxErr()))
		return
	}
	if err != nil {
		var apiErr *jetstream.APIError
		if w.group[i] > 1 && errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeAtomicDuplicate && i == w.firstEnd {
			w.redo = append(w.redo, i) // see Write: republished one by one
			return
		}
		w.failGroup(i, w.s.publishErr(w.nc, &w.batch[i], len(m.Data)+natsconn.HeaderSize(m.Header), err))
		return
	}
	if w.group[i] == 0 {
		w.s.recycle(m) // acked; nothing reads it any more
		w.msg[i] = nil
	}
	n := max(w.group[i], 1)
	for k := range n { // an atomic batch's ack is its last message's
		w.seqs[i-k] = r.seq - uint64(k)
	}
	if r.dup {
		w.dups++
		w.dupMax = max(w.dupMax, r.seq) // the sequence of the stored original
	} else {
		w.fresh = max(w.fresh, r.seq)
	}
}

// failGroup records err for change i and, when i commits an atomic batch,
// for every change of that batch: none of them is known to be stored.
func (w *write) failGroup(i int, err error) {
	n := max(w.group[i], 1)
	for k := n - 1; k >= 1; k-- {
		w.err.Fail(i-k, fmt.Errorf("not stored: the atomic batch of its transaction failed: %w", err))
	}
	w.err.Fail(i, err)
}

// ctxErr is ctx's error, also wrapping sinks.ErrNotConnected when the
// connection is down (a Write blocked by a dead server).
func (w *write) ctxErr() error {
	err := w.ctx.Err()
	if err == nil {
		err = context.Canceled
	}
	if !w.nc.IsConnected() {
		return fmt.Errorf("%w: %w", sinks.ErrNotConnected, err)
	}
	return err
}

// publishErr classifies a publish failure of c.
func (s *Sink) publishErr(nc *nats.Conn, c *cdc.Change, size int, err error) error {
	doing := fmt.Sprintf("publishing %s to %q", c.ID(), c.Subject)
	var apiErr *jetstream.APIError
	errors.As(err, &apiErr)
	switch denied := natsconn.PermissionDenied(nc, err); {
	case denied != nil: // the ack never came: the server refused a permission
		return fmt.Errorf("%s: %w", doing, denied)
	case errors.Is(err, nats.ErrMaxPayload):
		return sinks.Permanent(fmt.Errorf("%s: the message is %d bytes, over the server's max_payload of %d: %w",
			doing, size, nc.MaxPayload(), err))
	case apiErr != nil && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return sinks.Permanent(fmt.Errorf("%s: the message is %d bytes, over stream %q's max_msg_size: %w", doing, size, s.cfg.Stream, err))
	case apiErr != nil && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant ||
		apiErr.ErrorCode == jsErrCodeWrongLastMsgID):
		return fmt.Errorf("%s: %w: %w", doing, ErrFenced, err)
	case apiErr != nil && apiErr.ErrorCode == jsErrCodeAtomicDuplicate:
		return fmt.Errorf("%s: its atomic batch holds changes stream %q has already (a replay the tail check missed); the next run reads the tail again: %w", doing, s.cfg.Stream, err)
	case apiErr != nil && apiErr.ErrorCode == jsErrCodeStreamNotMatch:
		return sinks.Permanent(fmt.Errorf("%s: the subject belongs to another stream than %q: %w", doing, s.cfg.Stream, err))
	case errors.Is(err, nats.ErrHeadersNotSupported), errors.Is(err, nats.ErrBadSubject):
		return sinks.Permanent(fmt.Errorf("%s: %w", doing, err))
	case isConnErr(err) || !nc.IsConnected():
		return fmt.Errorf("%s: %w: %w", doing, sinks.ErrNotConnected, err)
	}
	return fmt.Errorf("%s: %w", doing, err)
}

// isConnErr reports errors that mean the connection, or JetStream behind
// it, is unavailable.
func isConnErr(err error) bool {
	for _, e := range []error{
		nats.ErrConnectionClosed, nats.ErrDisconnected, nats.ErrReconnectBufExceeded,
		nats.ErrConnectionDraining, nats.ErrConnectionReconnecting, nats.ErrNoServers,
		nats.ErrNoResponders, nats.ErrStaleConnection, nats.ErrTimeout,
		jetstream.ErrNoStreamResponse, jetstream.ErrJetStreamNotEnabled,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// countDead adds to the sink's dead-letter count the changes w diverted
// that were stored (not failed).
func (s *Sink) countDead(w *write) {
	if len(w.dead) == 0 {
		return
	}
	n := uint64(0)
	for _, i := range w.dead {
		if _, failed := w.err.Failed[i]; !failed {
			n++
		}
	}
	s.dead.Add(n)
}

// DeadLetters implements sinks.DeadLetterCounter.
func (s *Sink) DeadLetters() uint64 { return s.dead.Load() }
