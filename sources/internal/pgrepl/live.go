package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// Large transactions are handed over while they arrive.
//
// Postgres sends a transaction's changes only after it committed, between a
// begin that carries the start of the commit record and a commit that
// carries its end. The identity of a transaction of up to StreamAfter
// changes is the end of its commit record (known at its commit), as it
// always was. A larger one is handed to the pipeline as soon as its
// (StreamAfter+1)-th change arrives, with the identity start of commit
// record + 1 (known at its begin), and its changes follow through Rest as
// they are decoded: its first message is published about as soon as
// Postgres starts sending it, and memory does not grow with it.
//
// The two kinds of identity never collide: a record boundary (a commit
// end) is 8-byte aligned, a record start + 1 is odd (the identity of a
// non-transactional message is its start + 1 as well, and records have
// distinct starts). Both order a transaction after every transaction that
// committed before it and before every one that committed after it, so
// positions keep commit order. Which kind a transaction gets depends only
// on its number of changes, so a replay after a crash gives it the same
// identity, and the sinks' resume scan finds what they already hold.
//
// Confirming start + 1 to Postgres after such a transaction is delivered
// is exact as well: Postgres skips a transaction whose commit record
// starts before the confirmed position, and sends every later one.
//
// Changes handed over before the commit arrives carry TxSize 0 (not known
// yet). The last change is held back until the commit, so it carries the
// transaction's size.

// StreamAfter is the number of changes after which a transaction is handed
// over while it arrives. It equals JetStream's default limit of messages in
// an atomic batch: a transaction that could be published atomically is
// always handed over whole. It is a constant, not a setting: the identity
// of a transaction depends on it.
const StreamAfter = 1000

// livePart is how many changes go to the reader at once, and liveParts how
// many parts may wait for it: what a live transaction holds in memory
// beyond what the pipeline has taken.
const (
	livePart  = 256
	liveParts = 4
)

// errTxnCut ends a live transaction whose commit never came: the stream
// began another transaction (not reachable from Postgres), or decoding failed.
var errTxnCut = errors.New("the replication stream ended a transaction before its commit")

// errSourceStopped ends a live transaction when the receive loop stops
// (the connection failed or the source was closed) before its commit.
var errSourceStopped = errors.New("the replication connection ended before the transaction's commit arrived")

// liveHooks connect a live transaction's writer to the receive loop.
type liveHooks struct {
	ctx   context.Context
	done  <-chan struct{} // closed when the receive loop ends
	every time.Duration   // how often stall runs while the reader is behind
	stall func() error    // reports to the server while the loop waits
}

// Stream lets the buffer hand over transactions of more than StreamAfter
// changes while they arrive. The receive loop calls it before decoding:
// while the pipeline is behind, the decoder's Add waits, calling stall
// every interval (the loop's status report, so the server keeps the
// connection); it stops waiting when ctx ends. done is closed when the
// receive loop ends, which ends a live transaction's Rest with an error.
// A buffer Stream was not called on hands over whole transactions only.
func (b *TxnBuffer) Stream(ctx context.Context, done <-chan struct{}, every time.Duration, stall func() error) {
	b.streamOn = true
	b.hooks = liveHooks{ctx: ctx, done: done, every: every, stall: stall}
}

// Begin starts transaction t (its Xid and CommitTime are read when it is
// handed over), whose commit record starts at final (0: not known; the
// transaction is then never handed over before its commit). What the
// buffer held is dropped.
func (b *TxnBuffer) Begin(t *cdc.Txn, final cdc.LSN) {
	b.Discard()
	b.head, b.final = t, final
}

// startLive hands the transaction over at its (StreamAfter+1)-th change c.
func (b *TxnBuffer) startLive(c cdc.Change) (*cdc.Txn, error) {
	id := b.final + 1
	h := b.head
	t := &cdc.Txn{Xid: h.Xid, CommitLSN: id, CommitTime: h.CommitTime}
	for i := range b.mem {
		m := &b.mem[i]
		m.CommitLSN, m.Seq, m.TxSize, m.Xid, m.CommitTime = id, uint32(i), 0, h.Xid, h.CommitTime
	}
	t.Changes = b.mem
	it := &liveIter{parts: make(chan []cdc.Change, liveParts), stop: make(chan struct{}), src: b.hooks.done}
	if b.f != nil {
		// Some of the first changes went to disk (large values): they are
		// read back first.
		if err := b.w.Flush(); err != nil {
			b.Discard()
			return nil, fmt.Errorf("spilling a large transaction: %w", err)
		}
		if _, err := b.f.Seek(0, io.SeekStart); err != nil {
			b.Discard()
			return nil, fmt.Errorf("reading back a spilled transaction: %w", err)
		}
		it.head = &spillIter{f: b.f, rels: b.rels, recs: b.n - uint32(len(b.mem)), next: uint32(len(b.mem)), txSize: 0,
			commit: id, xid: h.Xid, at: h.CommitTime}
		b.f, b.w = nil, nil // the iterator owns the file now
	}
	t.Rest = it
	w := &liveWriter{hooks: b.hooks, it: it, id: id, xid: h.Xid, at: h.CommitTime, n: b.n,
		part: make([]cdc.Change, 0, livePart)}
	b.mem, b.bytes, b.rels, b.relx = nil, 0, nil, nil
	b.live = w
	if err := w.add(c); err != nil {
		return nil, err
	}
	return t, nil
}

// liveWriter feeds a live transaction's Rest from the receive loop.
type liveWriter struct {
	hooks liveHooks
	it    *liveIter
	id    cdc.LSN
	xid   uint32
	at    time.Time
	n     uint32 // changes so far
	hold  cdc.Change
	held  bool
	part  []cdc.Change
}

// add takes the next change; the one before it goes into the part.
func (w *liveWriter) add(c cdc.Change) error {
	c.CommitLSN, c.Seq, c.TxSize, c.Xid, c.CommitTime = w.id, w.n, 0, w.xid, w.at
	w.n++
	if w.held {
		w.part = append(w.part, w.hold)
		if len(w.part) >= livePart {
			if err := w.send(); err != nil {
				return err
			}
		}
	}
	w.hold, w.held = c, true
	return nil
}

// finish ends the transaction at its commit: the last change gets the size.
func (w *liveWriter) finish() error {
	if w.held {
		w.hold.TxSize = w.n
		w.part = append(w.part, w.hold)
		w.held = false
	}
	err := w.send()
	if err != nil {
		w.it.end(err)
		return err
	}
	w.it.end(nil)
	return nil
}

// abort ends the transaction with err for its reader.
func (w *liveWriter) abort(err error) { w.it.end(err) }

// send hands the part to the reader, waiting while it is behind.
func (w *liveWriter) send() error {
	if len(w.part) == 0 {
		return nil
	}
	p := w.part
	w.part = make([]cdc.Change, 0, livePart)
	select {
	case w.it.parts <- p:
		return nil
	case <-w.it.stop:
		return nil // the reader gave the transaction up
	default:
	}
	tick := time.NewTicker(w.hooks.every)
	defer tick.Stop()
	for {
		select {
		case w.it.parts <- p:
			return nil
		case <-w.it.stop:
			return nil
		case <-w.hooks.ctx.Done():
			return w.hooks.ctx.Err()
		case <-tick.C:
			if err := w.hooks.stall(); err != nil {
				return err
			}
		}
	}
}

// liveIter is the Rest of a live transaction: what was spilled before it
// was handed over, then the parts as the receive loop decodes them.
type liveIter struct {
	mu    sync.Mutex // guards head: Close may run beside Next
	head  *spillIter
	parts chan []cdc.Change // closed at the end (err set before)
	err   error
	ended bool // writer side: parts is closed
	cur   []cdc.Change
	src   <-chan struct{}
	stop  chan struct{} // closed by Close
	once  sync.Once
}

// errIterClosed is what Next returns after Close.
var errIterClosed = errors.New("reading a transaction after its reader closed it")

// end closes parts, with err for the reader (nil: the commit arrived).
// Called from the writer's goroutine only.
func (it *liveIter) end(err error) {
	if it.ended {
		return
	}
	it.ended = true
	it.err = err
	close(it.parts)
}

// Next implements cdc.ChangeIter: it waits for the receive loop.
func (it *liveIter) Next(dst []cdc.Change) (int, error) {
	if n, done, err := it.readHead(dst); !done {
		return n, err
	}
	for len(it.cur) == 0 {
		var p []cdc.Change
		var ok bool
		select {
		case p, ok = <-it.parts:
		case <-it.stop:
			return 0, errIterClosed
		case <-it.src:
			select {
			case p, ok = <-it.parts:
			default:
				return 0, errSourceStopped
			}
		}
		if !ok {
			if it.err != nil {
				return 0, it.err
			}
			return 0, io.EOF
		}
		it.cur = p
	}
	n := copy(dst, it.cur)
	clear(it.cur[:n])
	it.cur = it.cur[n:]
	return n, nil
}

// NextPart implements cdc.PartIter: the parts the receive loop decoded go
// to the caller as they are (what was spilled before the hand-over is read
// into new slices).
func (it *liveIter) NextPart() ([]cdc.Change, error) {
	buf := make([]cdc.Change, livePart)
	if n, done, err := it.readHead(buf); !done {
		return buf[:n], err
	}
	if len(it.cur) > 0 { // what Next left of a part
		p := it.cur
		it.cur = nil
		return p, nil
	}
	select {
	case p, ok := <-it.parts:
		return it.part(p, ok)
	case <-it.stop:
		return nil, errIterClosed
	case <-it.src:
		select {
		case p, ok := <-it.parts:
			return it.part(p, ok)
		default:
			return nil, errSourceStopped
		}
	}
}

// part is NextPart's result for a receive from parts.
func (it *liveIter) part(p []cdc.Change, ok bool) ([]cdc.Change, error) {
	if !ok {
		if it.err != nil {
			return nil, it.err
		}
		return nil, io.EOF
	}
	return p, nil
}

// readHead reads the spilled head; done when there is none (left).
func (it *liveIter) readHead(dst []cdc.Change) (n int, done bool, err error) {
	it.mu.Lock()
	defer it.mu.Unlock()
	select {
	case <-it.stop:
		return 0, false, errIterClosed
	default:
	}
	if it.head == nil {
		return 0, true, nil
	}
	n, err = it.head.Next(dst)
	if n > 0 || !errors.Is(err, io.EOF) {
		return n, false, err
	}
	it.head = nil
	return 0, true, nil
}

// Close implements cdc.ChangeIter: the writer drops what follows. It may
// run beside Next, which then returns an error.
func (it *liveIter) Close() error {
	it.once.Do(func() { close(it.stop) })
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.head != nil {
		it.head.Close()
		it.head = nil
	}
	return nil
}
