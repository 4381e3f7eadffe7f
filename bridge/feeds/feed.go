package feeds

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// catchUpBudget bounds one read from the stream for a feed behind the
// window, whatever the caller's deadline.
const catchUpBudget = 5 * time.Second

// Change is one change as a feed receives it.
type Change struct {
	// Seq is the change's stream sequence.
	Seq uint64
	// ID is its Nats-Msg-Id: "<producer>:<commit LSN>:<ordinal>".
	ID string
	// Op is the operation delivered: the change's own, or insert for a row
	// moving into the filter and delete for one moving out (Moved says).
	Op cdc.Op
	// Moved is "in" or "out" for an update delivered as insert or delete.
	Moved string
	// Table is "schema.table".
	Table string
	// JSON is the change encoded for the feed's projection (see the package
	// documentation of the wire form). It is shared with every feed of the
	// same projection: do not modify it.
	JSON []byte
	// Received is when this process read the change from the stream (zero
	// when it was read for a feed behind the window); for latency metrics.
	Received time.Time
}

// Batch is what Next returns: whole transactions in commit order.
type Batch struct {
	Changes []Change
	// Token resumes after this batch, here or on another process.
	Token Token
	// UpToDate is true when the feed has read everything this process has
	// read of the stream.
	UpToDate bool
}

// Feed is one filtered feed. Next is called by one goroutine at a time;
// Close may be called concurrently.
type Feed struct {
	fs     *Feeds
	filter *compiled
	stream string
	pos    uint64 // a transaction boundary: everything up to it is delivered

	group   *group // the feeds sharing its filter, under fs.mu
	gi      int    // position in group.feeds, under fs.mu
	waiting bool   // parked in Next; under fs.mu (see parkLocked)
	wake    chan struct{}
	closed  bool
	failed  error // a must-refetch, returned again by every Next
	skip    *skip // what a replay found for it, under fs.mu
	riding  *pass // the replay it waits for, under fs.mu
	lone    bool  // the last replay could not serve it, under fs.mu
}

// Token returns the feed's position: everything up to it has been
// returned by Next.
func (f *Feed) Token() Token {
	f.fs.mu.RLock()
	defer f.fs.mu.RUnlock()
	return Token{Stream: f.stream, Seq: f.pos}
}

// Close removes the feed; a Next in progress returns ErrClosed.
func (f *Feed) Close() {
	fs := f.fs
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f.closed {
		return
	}
	f.closed = true
	fs.releaseLocked(f.filter.proj)
	fs.idx.remove(f)
	delete(fs.feeds, f)
	fs.wakeLocked(f)
}

// Next returns the next batch: one or more whole transactions with changes
// matching the filter, read from the window or, when the feed is behind
// it, from the stream. With nothing to return it waits until a matching
// transaction arrives or ctx ends; then it returns an empty batch with the
// current token, UpToDate, and ctx's error. A feed behind the window may
// return up to a few seconds after ctx's deadline, with what it read from
// the stream (cancelling ctx stops it at once). A *RefetchError
// (ErrMustRefetch) ends the feed: every later Next returns it again.
//
// A Next that returns at ctx's end without changes returns the token the
// feed has reached: every transaction up to it was scanned and none
// matched, so a client may keep it (an SSE keep-alive's id) and resume
// from it anywhere without missing a change.
func (f *Feed) Next(ctx context.Context) (Batch, error) { return f.next(ctx, true) }

// Poll is Next without the wait for new transactions: when the feed has
// read everything there is and nothing matched, it returns at once an
// empty batch with the current token and UpToDate. It still reads what
// exists (from the window or, behind it, from the stream) and waits for
// the consumer when it is starting, bounded by ctx as Next is.
func (f *Feed) Poll(ctx context.Context) (Batch, error) { return f.next(ctx, false) }

func (f *Feed) next(ctx context.Context, wait bool) (Batch, error) {
	fs := f.fs
	alone := false
	for {
		fs.mu.RLock()
		if f.closed || fs.closed {
			fs.mu.RUnlock()
			return Batch{}, ErrClosed
		}
		if f.failed != nil {
			err := f.failed
			fs.mu.RUnlock()
			return Batch{}, err
		}
		if f.stream != fs.streamID {
			fs.mu.RUnlock()
			return Batch{}, f.fail(&RefetchError{Reason: ReasonStream, Detail: fmt.Sprintf("stream %q was recreated", fs.cfg.Stream)})
		}
		pos, head, have, from := f.pos, fs.head, fs.haveHead, fs.windowFrom
		txs, ch, sk := fs.txs, fs.headCh, f.skip
		fs.mu.RUnlock()
		if sk != nil && (pos < sk.from || pos >= sk.upto) {
			f.dropSkip(sk)
			sk = nil
		}

		switch {
		case !have || (pos > head && pos >= from):
			// The consumer is starting over or behind this token: wait for it.
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return Batch{Token: f.token(pos)}, ctx.Err()
			}
		case sk != nil:
			// What a replay found: only the transactions that concern it.
			out, next, err := f.serveSkip(sk, pos)
			if len(out) > 0 || err == nil {
				f.advance(pos, next)
			}
			if len(out) > 0 {
				return Batch{Changes: out, Token: f.token(next), UpToDate: next == head}, nil
			}
			if err != nil {
				return Batch{}, f.fail(err)
			}
			continue
		case !alone && (pos < from || head-pos > fs.cfg.replayGap):
			// Far behind: share a pass over history with the others.
			ok, lone := fs.ride(ctx, f, pos)
			switch {
			case ok: // served below, even when ctx has ended meanwhile
			case ctx.Err() != nil:
				return Batch{Token: f.token(pos)}, ctx.Err()
			case lone:
				alone = true // no replay can serve it: read on its own
			}
			continue
		case pos < from:
			out, err := f.catchUp(ctx, pos)
			if len(out) > 0 {
				// f.pos is past out: return it whatever ended the read.
				return Batch{Changes: out, Token: f.token(f.pos)}, nil
			}
			if err != nil {
				if errors.Is(err, ErrMustRefetch) {
					return Batch{}, f.fail(err)
				}
				return Batch{Token: f.token(f.pos)}, err
			}
			if ctx.Err() != nil { // progress made, nothing matched: the caller's time is up
				return Batch{Token: f.token(f.pos)}, ctx.Err()
			}
			continue
		}
		out, next, err := f.scan(txs, pos, head)
		if len(out) > 0 || err == nil {
			f.advance(pos, next)
		}
		if len(out) > 0 {
			return Batch{Changes: out, Token: f.token(next), UpToDate: next == head}, nil
		}
		if err != nil {
			return Batch{}, f.fail(err)
		}
		if next != head {
			continue
		}
		if !wait {
			return Batch{Token: f.token(next), UpToDate: true}, nil
		}
		// Nothing new: park until the consumer finds a match or ctx ends.
		fs.mu.Lock()
		if f.closed || fs.closed || f.pos != fs.head || !fs.haveHead || f.stream != fs.streamID {
			fs.mu.Unlock()
			continue
		}
		fs.parkLocked(f)
		wake := f.wake
		fs.mu.Unlock()
		select {
		case <-wake:
			continue
		case <-ctx.Done():
		}
		fs.mu.Lock()
		if f.waiting {
			// Not woken: nothing up to head matched.
			fs.unparkLocked(f)
			if fs.haveHead && f.stream == fs.streamID && fs.head > f.pos {
				f.pos = fs.head
			}
			tok := Token{Stream: f.stream, Seq: f.pos}
			fs.mu.Unlock()
			return Batch{Token: tok, UpToDate: true}, ctx.Err()
		}
		fs.mu.Unlock()
		// Woken as ctx ended: loop once more to deliver what woke it; with
		// ctx done, every wait above returns at once.
	}
}

func (f *Feed) token(seq uint64) Token { return Token{Stream: f.stream, Seq: seq} }

func (f *Feed) fail(err error) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.failed == nil {
		f.failed = err
	}
	return f.failed
}

func (f *Feed) dropSkip(sk *skip) {
	f.fs.mu.Lock()
	if f.skip == sk {
		f.skip = nil
	}
	f.fs.mu.Unlock()
}

func (f *Feed) advance(from, to uint64) {
	f.fs.mu.Lock()
	if f.pos == from {
		f.pos = to
	}
	f.fs.mu.Unlock()
}

// scan matches the window's transactions after pos, up to head. It
// returns the changes of whole transactions up to a transaction boundary
// next, stopping at MaxBatch or before a transaction that breaks the feed
// (err, returned only when no change comes before it).
func (f *Feed) scan(txs []*txn, pos, head uint64) (out []Change, next uint64, err error) {
	i := sort.Search(len(txs), func(i int) bool { return txs[i].last > pos })
	next = pos
	mark := 0
	for ; i < len(txs); i++ {
		t := txs[i]
		if e := t.breaks(f.filter); e != nil {
			out = out[:mark]
			if len(out) > 0 {
				return out, next, nil
			}
			return nil, next, e
		}
		out = f.appendMatches(out, t)
		if t.stableAt != 0 {
			mark, next = len(out), t.stableAt
			if len(out) >= f.fs.cfg.MaxBatch {
				return out, next, nil
			}
		}
	}
	return out[:mark], head, nil
}

func (f *Feed) appendMatches(out []Change, t *txn) []Change {
	for _, c := range t.changes {
		k, ok := f.filter.match(c)
		if !ok {
			continue
		}
		b, made := c.serialise(f.filter.proj, k, &f.fs.encBytes)
		if made {
			f.fs.serialisations.Add(1)
			f.fs.evictIfOver()
		}
		ch := Change{Seq: c.seq, ID: c.id, Op: c.op, Table: c.table, JSON: b, Received: c.recv}
		switch k {
		case kindIn:
			ch.Op, ch.Moved = cdc.OpInsert, "in"
		case kindOut:
			ch.Op, ch.Moved = cdc.OpDelete, "out"
		}
		out = append(out, ch)
	}
	return out
}
