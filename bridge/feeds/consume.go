// The reading side of Feeds: the ordered consumer (run, consume) and the
// check for a recreated stream (watch), the window the messages go into
// (ingest, evictLocked), and the waking of the feeds parked in Next.

package feeds

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// badLogEvery is how often at most consume logs a message it did not
// understand.
const badLogEvery = time.Minute

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
	// Messages not understood are logged at most once a minute, with how
	// many there were: a stream of another format would flood the log.
	var bad int
	var badLogged time.Time
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
		c, derr := fs.decode(meta.Sequence.Stream, msg.Headers(), msg.Data(), nm)
		if derr != nil {
			bad++
			if now := time.Now(); now.Sub(badLogged) >= badLogEvery {
				fs.log.Warn("feeds: message not understood; it matches no feed (the feeds read the bridge's native format: serve a stream or route of format native)",
					"stream", fs.cfg.Stream, "seq", meta.Sequence.Stream, "err", derr, "not_understood_since_last_warning", bad)
				bad, badLogged = 0, now
			}
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
