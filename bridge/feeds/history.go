// Reads of the stream behind the window: a feed's own catch-up (catchUp)
// and a replay's pass for many (fromStream) take the same steps, here in
// one place (readHistory): a catch-up slot, the stream's identity and
// first sequence, a temporary ordered consumer, and the messages grouped
// into whole transactions up to a transaction boundary where the reader
// stops, the window takes over, or MaxScan messages have been read.

package feeds

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// historyRead is one read of the stream: what it is for and what it does
// with what it reads.
type historyRead struct {
	// from is the position (a transaction boundary) the read continues.
	from uint64
	// pull is how many messages the consumer fetches ahead.
	pull int
	// names interns column names; nil interns nothing.
	names *names
	// txn receives each whole transaction read (fragments, which began
	// before from, too: their frag is set).
	txn func(t *txn)
	// boundary is called at each transaction boundary, after the
	// transactions it ends; true stops the read there.
	boundary func(seq uint64) (stop bool)
}

// errGap is a read finding a message missing: deleted by the stream's
// limits while it read.
type errGap struct {
	stream string
	seq    uint64
}

func (e *errGap) Error() string {
	return fmt.Sprintf("stream %q no longer holds sequence %d", e.stream, e.seq)
}

// beginRead takes a catch-up slot (CatchUps bound them) and reads the
// stream's state; release gives the slot back.
func (fs *Feeds) beginRead(ctx context.Context, pos uint64) (info *jetstream.StreamInfo, release func(), err error) {
	select {
	case fs.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	release = func() { <-fs.sem }
	fs.catchUps.Add(1)
	info, err = fs.stream.Info(ctx)
	if err != nil {
		release()
		return nil, nil, fmt.Errorf("reading the state of stream %q to read it after sequence %d: %w", fs.cfg.Stream, pos, err)
	}
	return info, release, nil
}

// readHistory reads the stream after r.from, given its first sequence,
// with a temporary ordered consumer, handing r.txn every transaction and
// r.boundary every transaction boundary, until r.boundary stops it, a
// boundary at or after the window's start, MaxScan messages, ctx's end or
// an error (an *errGap for a missing message).
func (fs *Feeds) readHistory(ctx context.Context, first uint64, r historyRead) error {
	start, seed := readStart(r.from, first)
	it, stop, err := fs.history(ctx, start, r.pull)
	if err != nil {
		return err
	}
	defer stop()
	asm := newAssembler()
	expect, scanned := start, 0
	for {
		msg, err := it.Next()
		if err != nil {
			return fmt.Errorf("reading %q at sequence %d: %w", fs.cfg.Stream, expect, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("reading metadata at sequence %d of %q: %w", expect, fs.cfg.Stream, err)
		}
		seq := meta.Sequence.Stream
		if seq != expect {
			return &errGap{stream: fs.cfg.Stream, seq: expect}
		}
		expect++
		fs.catchUpMsgs.Add(1)
		data, perr := fs.payloadOf(ctx, msg.Headers(), msg.Data())
		if perr != nil && !errors.Is(perr, errObjectGone) {
			return fmt.Errorf("reading %q at sequence %d: %w", fs.cfg.Stream, seq, perr)
		}
		c, derr := fs.decode(seq, msg.Headers(), data, r.names)
		if derr != nil {
			fs.notUnderstood(seq, cmp.Or(perr, derr))
		}
		if seed && seq == start {
			asm.seed(c)
			continue
		}
		scanned++
		if t := asm.add(c); t != nil {
			r.txn(t)
		}
		if len(asm.open) > 0 {
			continue
		}
		// A transaction boundary.
		if r.boundary(seq) {
			return nil
		}
		fs.mu.RLock()
		windowed := fs.haveHead && seq >= fs.windowFrom
		fs.mu.RUnlock()
		if windowed || scanned >= fs.cfg.MaxScan {
			return nil
		}
	}
}

// catchUp reads the stream after pos with a temporary ordered consumer
// until the window can take over, MaxBatch changes are found or MaxScan
// messages are read; it advances f.pos to the boundary reached, past the
// changes it returns, even with an error.
//
// A read from the stream is slow to start (a consumer is created), so it
// is not bound by ctx's deadline, only by its cancellation and by
// catchUpBudget: a short poll on a busy server still makes progress.
func (f *Feed) catchUp(parent context.Context, pos uint64) ([]Change, error) {
	fs := f.fs
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), catchUpBudget)
	defer cancel()
	stopOnCancel := context.AfterFunc(parent, func() {
		if errors.Is(parent.Err(), context.Canceled) {
			cancel()
		}
	})
	defer stopOnCancel()
	info, release, err := fs.beginRead(ctx, pos)
	if err != nil {
		if err == ctx.Err() { // waiting for a slot
			return nil, err
		}
		return nil, fmt.Errorf("feeds: %w", err)
	}
	defer release()
	if streamID(info) != f.stream {
		return nil, &RefetchError{Reason: ReasonStream, Detail: fmt.Sprintf("stream %q was recreated", fs.cfg.Stream)}
	}
	first := info.State.FirstSeq
	if pos+1 < first {
		return nil, &RefetchError{Reason: ReasonGone, Seq: pos + 1,
			Detail: fmt.Sprintf("stream %q starts at sequence %d, the token needs %d", fs.cfg.Stream, first, pos+1)}
	}
	var out, pend []Change
	var brk *RefetchError
	stopped := false // at the boundary after brk
	err = fs.readHistory(ctx, first, historyRead{from: pos, pull: 512,
		txn: func(t *txn) {
			if !t.frag && brk == nil {
				if brk = t.breaks(f.filter); brk == nil {
					pend = f.appendMatches(pend, t)
				}
			}
		},
		boundary: func(seq uint64) bool {
			if brk != nil {
				stopped = true
				return true
			}
			out = append(out, pend...)
			pend = pend[:0]
			f.advance(f.pos, seq)
			return len(out) >= fs.cfg.MaxBatch
		},
	})
	var gap *errGap
	switch {
	case stopped:
		if len(out) > 0 {
			return out, nil
		}
		return nil, brk
	case err == nil:
		return out, nil
	case ctx.Err() != nil:
		if len(out) == 0 && parent.Err() != nil {
			return out, parent.Err()
		}
		return out, nil // the budget is spent: return the progress made
	case errors.As(err, &gap):
		if len(out) > 0 {
			return out, nil
		}
		return nil, &RefetchError{Reason: ReasonGone, Seq: gap.seq, Detail: gap.Error()}
	}
	return out, fmt.Errorf("feeds: %w", err)
}

// fromStream reads the stream after low for a replay and routes what it
// reads, until a boundary at or after the window's start, MaxScan
// messages, WindowBytes of kept transactions or an error; it returns the
// last boundary reached. Riders it cannot serve (the history they need is
// gone, the stream was recreated) are frozen where they are.
func (rp *replayer) fromStream(ctx context.Context, low uint64) (uint64, error) {
	fs := rp.fs
	info, release, err := fs.beginRead(ctx, low)
	if err != nil {
		return low, err
	}
	defer release()
	fs.mu.RLock()
	same, gen := streamID(info) == fs.streamID, fs.gen
	// Keep everything read, to add to the window, when it should fit.
	free := int64(fs.cfg.WindowTxns - len(fs.txs))
	perMsg := int64(1024)
	if n := fs.head - fs.windowFrom; fs.haveHead && n > 0 && fs.bytes > 0 {
		perMsg = max(fs.bytes/int64(n), 1)
	}
	want := int64(fs.windowFrom - low)
	keepAll := fs.haveHead && want <= free && want*perMsg <= fs.cfg.WindowBytes-fs.bytes
	fs.mu.RUnlock()
	if !same {
		return low, errors.New("the stream was recreated")
	}
	first := info.State.FirstSeq
	if low+1 < first {
		low = ^uint64(0)
		for _, r := range rp.rs {
			if r.pos+1 < first {
				rp.freeze(r, r.pos) // gone: its own read reports it
				r.lone = true
			} else {
				low = min(low, r.pos)
			}
		}
		if rp.active == 0 {
			return 0, nil
		}
	}
	cursor := low
	// kept holds every transaction read when keepAll, each ending a run
	// marked with the boundary after it (stableAt), as in the window;
	// clean is the first boundary after which none began before low.
	var kept []*txn
	var keptBytes int64
	clean, fragOpen := low, false
	err = fs.readHistory(ctx, first, historyRead{from: low, pull: 1024, names: newNames(),
		txn: func(t *txn) {
			if t.frag {
				fragOpen = true
				return
			}
			if rp.add(t) && !keepAll {
				rp.kept += int64(t.size)
			}
			if keepAll {
				kept = append(kept, t)
				keptBytes += int64(t.size)
				rp.kept = keptBytes
			}
		},
		boundary: func(seq uint64) bool {
			cursor = seq
			rp.boundary(seq)
			if fragOpen {
				// Only what follows can go into the window.
				kept, keptBytes, clean, fragOpen = kept[:0], 0, seq, false
			}
			if n := len(kept); n > 0 && kept[n-1].stableAt == 0 {
				kept[n-1].stableAt = seq
			}
			return rp.kept >= fs.cfg.WindowBytes || rp.active == 0
		},
	})
	if err != nil {
		// Riders past cursor meet the error (a gap) on their own.
		return cursor, err
	}
	if keepAll {
		fs.backfill(kept, clean, cursor, gen)
	}
	return cursor, nil
}

// readStart is where a read from the stream after pos starts, given the
// stream's first sequence: at pos itself when it is still held (seed), to
// learn the producer of the transaction it ends, else after it.
func readStart(pos, first uint64) (start uint64, seed bool) {
	if pos >= 1 && pos >= first {
		return pos, true
	}
	return pos + 1, false
}

// history reads the stream from start with a temporary ordered consumer,
// pulling up to pull messages ahead, until ctx ends or stop is called.
func (fs *Feeds) history(ctx context.Context, start uint64, pull int) (it jetstream.MessagesContext, stop func(), err error) {
	cctx, cancel := context.WithCancel(ctx)
	cons, err := fs.js.OrderedConsumer(cctx, fs.cfg.Stream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start,
	})
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("creating a consumer on %q at sequence %d: %w", fs.cfg.Stream, start, err)
	}
	it, err = cons.Messages(jetstream.PullMaxMessages(pull))
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("reading %q from sequence %d: %w", fs.cfg.Stream, start, err)
	}
	undo := context.AfterFunc(cctx, it.Stop)
	return it, func() { undo(); it.Stop(); cancel() }, nil
}
