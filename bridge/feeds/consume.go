// The reading side of Feeds: the ordered consumer (run, consume) and the
// check for a recreated stream (watch), the window the messages go into
// (ingest, evictLocked), and the waking of the feeds parked in Next.

package feeds

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// run reads the stream until Close, recreating the consumer after errors.
func (fs *Feeds) run(ctx context.Context) {
	defer close(fs.done)
	go fs.watch(ctx)
	for ctx.Err() == nil {
		cctx, cancel := context.WithCancel(ctx)
		fs.mu.Lock()
		fs.restart = cancel
		start, gen := fs.lastSeq+1, fs.gen
		fs.mu.Unlock()
		err := fs.consume(cctx, start, gen)
		cancel()
		if err != nil && ctx.Err() == nil {
			fs.log.Warn("feeds: stream consumer stopped; restarting", "stream", fs.cfg.Stream, "err", err)
			select {
			case <-time.After(250 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}
}

// badLogEvery is how often at most the feeds log a message they did not
// understand.
const badLogEvery = time.Minute

// notUnderstood logs a message decode did not understand (it matches no
// feed): at most once per badLogEvery, with how many there were since the
// last time, as a stream of another format would flood the log otherwise.
func (fs *Feeds) notUnderstood(seq uint64, err error) {
	n := fs.badCount.Add(1)
	now, last := time.Now().UnixNano(), fs.badLogged.Load()
	if now-last < int64(badLogEvery) || !fs.badLogged.CompareAndSwap(last, now) {
		return
	}
	fs.badCount.Add(-n)
	hint := "the feeds read the bridge's native format: serve a stream or route of format native"
	switch {
	case errors.Is(err, errTooLarge):
		hint = "the change's payload is larger than half the feeds' window (Config.WindowBytes; serve.window_bytes in bridge serve): it is not served; raise the window to serve it"
	case errors.Is(err, errObjectGone):
		hint = "the change's payload was too large for one message, and its object is no longer in the object store"
	}
	fs.log.Warn("feeds: message not understood; it matches no feed", "stream", fs.cfg.Stream, "seq", seq, "err", err,
		"hint", hint, "not_understood_since_last_warning", n)
}

// errObjectGone is payloadOf's error for a payload whose object is no
// longer in the object store (or not the change's).
var errObjectGone = errors.New("the payload's object is gone from the object store")

// errTooLarge is payloadOf's error for a payload larger than the feeds
// hold. It wraps errObjectGone: the change matches no feed.
var errTooLarge = fmt.Errorf("too large for the feeds: %w", errObjectGone)

// payloadOf returns a message's payload: its data, or for a change whose
// payload was too large for one message (the sink's large_payload_bucket:
// the header Bridge-Payload-Object names "<bucket>/<object>" and the
// message has no data), the object's bytes. An object that is gone
// (deleted by hand, or the bucket's limits) gives errObjectGone: the change
// matches no feed. Other errors are the server's: the caller reads the
// message again.
func (fs *Feeds) payloadOf(ctx context.Context, h nats.Header, data []byte) ([]byte, error) {
	ref := h.Get(headerPayloadObject)
	if ref == "" {
		return data, nil
	}
	bucket, name, ok := strings.Cut(ref, "/")
	if !ok || bucket == "" || name == "" || name != h.Get(headerMsgID) {
		// The sink stores a payload under its change's id: any other
		// object is not this change's, whoever named it.
		return nil, fmt.Errorf("%s %q is not <bucket>/<the message's id>: %w", headerPayloadObject, ref, errObjectGone)
	}
	var obs jetstream.ObjectStore
	if v, ok := fs.objs.Load(bucket); ok {
		obs = v.(jetstream.ObjectStore)
	} else {
		o, err := fs.js.ObjectStore(ctx, bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("object store %q (%s): %w", bucket, ref, errObjectGone)
		}
		if err != nil {
			return nil, fmt.Errorf("opening object store %q for the payload %s: %w", bucket, ref, err)
		}
		fs.objs.Store(bucket, o)
		obs = o
	}
	info, err := obs.GetInfo(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("%s: %w", ref, errObjectGone)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the payload %s from the object store: %w", ref, err)
	}
	if int64(info.Size) > fs.cfg.WindowBytes/2 {
		// It could not stay in the window (which holds its bytes and an
		// encoding); reading it would only grow the process.
		return nil, fmt.Errorf("%s holds %d bytes, more than half the feeds' window of %d: %w", ref, info.Size, fs.cfg.WindowBytes, errTooLarge)
	}
	b, err := obs.GetBytes(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("%s: %w", ref, errObjectGone)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the payload %s from the object store: %w", ref, err)
	}
	return b, nil
}

// consume reads from start with one ordered consumer until ctx ends.
func (fs *Feeds) consume(ctx context.Context, start, gen uint64) error {
	cons, err := fs.js.OrderedConsumer(ctx, fs.cfg.Stream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start,
	})
	if err != nil {
		return fmt.Errorf("creating ordered consumer on %q at sequence %d: %w", fs.cfg.Stream, start, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return fmt.Errorf("reading stream %q: %w", fs.cfg.Stream, err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	nm := newNames()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return ctx.Err()
			}
			return err
		}
		meta, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("reading metadata of a message on %q: %w", fs.cfg.Stream, err)
		}
		data, perr := fs.payloadOf(ctx, msg.Headers(), msg.Data())
		if perr != nil && !errors.Is(perr, errObjectGone) {
			return fmt.Errorf("message %d of %q: %w", meta.Sequence.Stream, fs.cfg.Stream, perr) // read again
		}
		c, derr := fs.decode(meta.Sequence.Stream, msg.Headers(), data, nm)
		if derr != nil {
			fs.notUnderstood(meta.Sequence.Stream, cmp.Or(perr, derr))
		}
		c.recv = time.Now()
		fs.ingest(c, gen)
	}
}

// watch detects a recreated stream: a new creation time, or a last
// sequence below what was read.
func (fs *Feeds) watch(ctx context.Context) {
	t := time.NewTicker(fs.cfg.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fs.mu.Lock()
		fs.sweepLocked(time.Now(), false)
		fs.mu.Unlock()
		// Sample what was read before asking: the consumer reads on meanwhile.
		fs.mu.RLock()
		read := fs.lastSeq
		fs.mu.RUnlock()
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := fs.stream.Info(ictx)
		cancel()
		if err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				fs.log.Warn("feeds: stream not found", "stream", fs.cfg.Stream)
			}
			continue
		}
		fs.mu.Lock()
		if id := streamID(info); id != fs.streamID || info.State.LastSeq < read {
			fs.log.Warn("feeds: stream recreated; every feed must refetch", "stream", fs.cfg.Stream)
			fs.recreates.Add(1)
			fs.gen++
			fs.resetLocked(id, 1, 0)
			fs.lastSeq = 0
			fs.wakeAllLocked()
			if fs.restart != nil {
				fs.restart()
			}
		}
		fs.mu.Unlock()
	}
}

// ingest adds one message, read in order, to the window.
func (fs *Feeds) ingest(c *change, gen uint64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if gen != fs.gen || fs.closed {
		return
	}
	if c.seq != fs.lastSeq+1 {
		// The server moved the consumer past deleted messages: start over
		// at a boundary; feeds behind it find the history gone.
		fs.log.Warn("feeds: stream sequence jumped (messages deleted by the stream's limits?)", "stream", fs.cfg.Stream, "from", fs.lastSeq+1, "to", c.seq)
		fs.gaps.Add(1)
		fs.dropWindowLocked()
		fs.asm = newAssembler()
		fs.haveHead = false
		fs.wakeAllLocked()
	}
	fs.lastSeq = c.seq
	if t := fs.asm.add(c); t != nil && !t.frag {
		fs.pending = append(fs.pending, t)
	}
	if len(fs.asm.open) > 0 {
		return
	}
	// A transaction boundary: no transaction straddles c.seq.
	if !fs.haveHead {
		fs.haveHead, fs.head, fs.windowFrom, fs.pending = true, c.seq, c.seq, nil
		fs.signalLocked()
		return
	}
	prev := fs.head
	fs.head = c.seq
	if n := len(fs.pending); n > 0 {
		fs.pending[n-1].stableAt = c.seq
		for _, t := range fs.pending {
			fs.txs = append(fs.txs, t)
			fs.bytes += int64(t.size)
			countLocked(t, &fs.encBytes)
			fs.dispatchLocked(t, prev)
		}
		clear(fs.pending)
		fs.pending = fs.pending[:0]
	}
	fs.evictLocked()
	fs.signalLocked()
}

// dispatchLocked wakes the waiting feeds t matches or breaks. t lies
// after prev, the previous boundary; a waiting feed was woken by every
// earlier transaction that concerned it, so nothing up to prev does: its
// position moves to prev and its Next reads only the new transactions.
func (fs *Feeds) dispatchLocked(t *txn, prev uint64) {
	if len(fs.waiting) == 0 {
		return
	}
	wake := func(f *Feed) {
		if f.waiting && f.pos < prev && f.stream == fs.streamID {
			f.pos = prev
		}
		fs.wakeLocked(f)
	}
	if t.brk != "" {
		for f := range fs.waiting {
			wake(f)
		}
		return
	}
	for _, tb := range t.truncs {
		for f := range fs.waiting {
			if f.filter.hasTable(tb) {
				wake(f)
			}
		}
	}
	for _, c := range t.changes {
		fs.stamp++
		fs.scratch = fs.idx.candidates(c, fs.stamp, fs.scratch[:0])
		for _, g := range fs.scratch {
			if g.nwait == 0 || !g.matches(c) {
				continue
			}
			for _, f := range g.feeds { // waking leaves g.feeds as it is
				if f.waiting {
					wake(f)
				}
			}
		}
	}
	clear(fs.scratch)
}

func (fs *Feeds) wakeLocked(f *Feed) {
	if f.waiting {
		fs.unparkLocked(f)
		close(f.wake)
	}
}

// parkLocked marks f as waiting in Next for a matching transaction.
func (fs *Feeds) parkLocked(f *Feed) {
	f.waiting = true
	f.wake = make(chan struct{})
	fs.waiting[f] = struct{}{}
	if f.group != nil {
		f.group.nwait++
	}
}

// unparkLocked undoes parkLocked; f.wake is left to the caller.
func (fs *Feeds) unparkLocked(f *Feed) {
	f.waiting = false
	delete(fs.waiting, f)
	if f.group != nil {
		f.group.nwait--
	}
}

func (fs *Feeds) wakeAllLocked() {
	for f := range fs.waiting {
		fs.wakeLocked(f)
	}
}

func (fs *Feeds) evictLocked() {
	n := 0
	for n < len(fs.txs) && (len(fs.txs)-n > fs.cfg.WindowTxns || fs.bytes+fs.encBytes.Load() > fs.cfg.WindowBytes) {
		fs.bytes -= int64(fs.txs[n].size)
		uncountLocked(fs.txs[n], &fs.encBytes)
		fs.windowFrom = fs.txs[n].last
		n++
	}
	if n == 0 {
		return
	}
	// Reslice, and copy once the evicted part is as long as the rest, so
	// that evicted transactions become garbage at an amortised cost of one
	// copy per transaction (copying at every eviction, as a full window
	// evicts one transaction per message, cost the whole window each
	// time). Readers hold their own slices; nothing they can see is
	// overwritten, as appends go past the end of every slice handed out.
	fs.txs = fs.txs[n:]
	if fs.evicted += n; fs.evicted >= len(fs.txs) {
		fs.txs = append(make([]*txn, 0, len(fs.txs)+len(fs.txs)/4), fs.txs...)
		fs.evicted = 0
	}
}
