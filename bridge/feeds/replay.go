// Replays: one pass over history for many feeds far behind the head.
//
// A feed behind the window (or far behind the head within it) does not
// read the stream, or scan the window, on its own. It rides a replay: one
// pass from the lowest position among its riders to the head, reading the
// stream once up to the window and the window after it, routing each
// change through an inverted index of the riders' filters as the consumer
// does for waiting feeds. A replay leaves each rider a skip: every
// transaction after its position, up to the pass's end, that matches or
// breaks its filter, each with the transaction boundary after it. Next
// then serves the rider from its skip, touching nothing else, and
// continues from the skip's end as usual.
//
// So when thousands of clients reconnect at once (a restart of bridge
// serve, a load balancer's drain) the stream is read once for all of them
// rather than once each, and each change costs an index lookup rather
// than a test per feed. Riders that ask while a replay runs wait for the
// next one, which starts as soon as it ends: under a storm, few passes
// take everyone.

package feeds

import (
	"context"
	"errors"
	"sort"
	"time"
)

// skip is what a replay found for one feed: every transaction after from
// and up to upto, two transaction boundaries, that matches or breaks the
// feed's filter.
type skip struct {
	from, upto uint64
	hits       []hit
}

// hit is a transaction of a skip and the transaction boundary after it.
type hit struct {
	t        *txn
	boundary uint64
}

// pass is one replay: the riders that asked for it and the channel closed
// when it has run.
type pass struct {
	riders map[*Feed]uint64 // feed → its position when it asked
	done   chan struct{}
}

// rider is one feed in a running pass.
type rider struct {
	f      *Feed
	filter *compiled // the feed's own, for truncations
	pos    uint64
	hits   []hit
	open   int    // hits[open:] have no boundary yet
	upto   uint64 // when frozen: where its skip ends
	frozen bool
	lone   bool // no replay can serve it: it must read on its own
}

// lane runs passes one after the other. Feeds behind the window and feeds
// in it have a lane each, so that a pass reading the stream never holds
// up one that only reads memory.
type lane struct {
	next    *pass // the pass riders join, run when the current one ends
	running bool
	farTurn bool // the stream lane's next pass is for the far riders (turns)
}

// Lanes.
const (
	laneWindow = iota
	laneStream
)

// ride waits until a replay has run for f from pos. It reports whether
// the replay left f a skip to continue from and, when it did not, whether
// f must read on its own (no replay can serve it; else the next one will).
//
// As a catch-up, the wait is bound by ctx's cancellation and by
// catchUpBudget, not by ctx's deadline: a client polling with a short
// timeout, or reconnecting after each answer, would otherwise leave every
// pass before it ends and never make progress.
func (fs *Feeds) ride(parent context.Context, f *Feed, pos uint64) (ok, lone bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), catchUpBudget)
	defer cancel()
	stopOnCancel := context.AfterFunc(parent, func() {
		if errors.Is(parent.Err(), context.Canceled) {
			cancel()
		}
	})
	defer stopOnCancel()
	fs.mu.Lock()
	if fs.closed || f.closed {
		fs.mu.Unlock()
		return false, false
	}
	p := f.riding
	if p == nil {
		ln := &fs.lanes[laneWindow]
		if pos < fs.windowFrom || !fs.haveHead {
			ln = &fs.lanes[laneStream]
		}
		if ln.next == nil {
			ln.next = &pass{riders: map[*Feed]uint64{}, done: make(chan struct{})}
		}
		p = ln.next
		p.riders[f] = pos
		f.riding = p
		if !ln.running {
			ln.running = true
			fs.replayWG.Add(1)
			go fs.replayLoop(ln)
		}
	}
	fs.mu.Unlock()
	select {
	case <-p.done:
	case <-ctx.Done():
		return false, false
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	lone, f.lone = f.lone, false
	return f.skip != nil && f.skip.from <= f.pos && f.skip.upto > f.pos, lone
}

// replayLoop runs ln's passes one after the other until none is left.
func (fs *Feeds) replayLoop(ln *lane) {
	defer fs.replayWG.Done()
	for {
		if ln == &fs.lanes[laneStream] {
			fs.gather(ln)
		}
		fs.mu.Lock()
		p := ln.next
		ln.next = nil
		if p == nil || fs.closed {
			ln.running = false
			fs.mu.Unlock()
			if p != nil {
				fs.finish(p, nil)
			}
			return
		}
		var rs []*rider
		for f, pos := range p.riders {
			if !f.closed && f.pos == pos && f.stream == fs.streamID {
				rs = append(rs, &rider{f: f, filter: f.filter, pos: pos})
			}
		}
		if ln == &fs.lanes[laneStream] {
			rs = fs.turnLocked(ln, rs)
		}
		fs.mu.Unlock()
		fs.replays.Add(1)
		fs.finish(p, fs.replay(fs.replayCtx, rs))
	}
}

// turnLocked picks the riders of a pass over the stream. A pass reads at
// most MaxScan messages from its lowest rider, so one rider far behind
// (a client resuming from the stream's start, or a forged token at
// sequence 0) would hold back every rider after it, pass after pass,
// until it caught up. Riders near the window (a pass from the lowest of
// them reaches it) and riders far from it take turns: when both wait,
// one pass serves the near ones and the next the far ones. The riders
// left out wake without a skip and board the next pass.
func (fs *Feeds) turnLocked(ln *lane, rs []*rider) []*rider {
	near := rs[:0:0]
	var far []*rider
	for _, r := range rs {
		if r.pos+uint64(fs.cfg.MaxScan) >= fs.windowFrom {
			near = append(near, r)
		} else {
			far = append(far, r)
		}
	}
	if len(near) == 0 || len(far) == 0 {
		return rs
	}
	turn := ln.farTurn
	ln.farTurn = !turn
	if turn {
		return far
	}
	return near
}

// Gathering riders for a pass over the stream.
const (
	gatherQuiet = 20 * time.Millisecond
	gatherMax   = 250 * time.Millisecond
)

// gather waits until no rider has joined ln's next pass for gatherQuiet,
// at most gatherMax: the clients of a storm reconnect within a few hundred
// milliseconds of each other, and those that board one pass over the
// stream share its reads.
func (fs *Feeds) gather(ln *lane) {
	deadline := time.Now().Add(gatherMax)
	last := -1
	for time.Now().Before(deadline) {
		fs.mu.Lock()
		n := 0
		if ln.next != nil {
			n = len(ln.next.riders)
		}
		fs.mu.Unlock()
		if n == last {
			return
		}
		last = n
		select {
		case <-time.After(gatherQuiet):
		case <-fs.replayCtx.Done():
			return
		}
	}
}

// finish hands each rider its skip and wakes the riders of p.
func (fs *Feeds) finish(p *pass, rs []*rider) {
	fs.mu.Lock()
	for _, r := range rs {
		if r.upto > r.pos && r.f.pos == r.pos {
			r.f.skip = &skip{from: r.pos, upto: r.upto, hits: r.hits}
		}
		r.f.lone = r.lone
	}
	for f := range p.riders {
		if f.riding == p {
			f.riding = nil
		}
	}
	fs.mu.Unlock()
	close(p.done)
}

// replay runs one pass for rs: from the stream for those behind the
// window, then from the window up to its head. It sets each rider's upto
// (left at its position when the pass could not serve it: the feed then
// reads on its own and meets the error, if any, itself).
func (fs *Feeds) replay(ctx context.Context, rs []*rider) []*rider {
	if len(rs) == 0 {
		return nil
	}
	ix := newIndex()
	of := map[*Feed]*rider{}
	low := rs[0].pos
	for _, r := range rs {
		shadow := &Feed{filter: &compiled{tables: r.filter.tables, ops: r.filter.ops, where: r.filter.where, proj: r.filter.proj}}
		ix.add(shadow)
		of[shadow] = r
		low = min(low, r.pos)
	}
	rp := &replayer{fs: fs, ix: ix, of: of, rs: rs, active: len(rs)}
	fs.mu.RLock()
	from := fs.windowFrom
	fs.mu.RUnlock()
	cursor := low
	failed := false
	if low < from {
		var err error
		cursor, err = rp.fromStream(ctx, low)
		if failed = err != nil && ctx.Err() == nil; failed {
			fs.log.Warn("feeds: replay for feeds behind the window stopped; they read on their own", "stream", fs.cfg.Stream, "from", low, "reached", cursor, "err", err)
		}
	}
	// The window, from where the stream left off (or from the lowest
	// position of those already in it).
	fs.mu.RLock()
	txs, head, have, from := fs.txs, fs.head, fs.haveHead, fs.windowFrom
	fs.mu.RUnlock()
	for _, r := range rs {
		if !r.frozen && (r.pos < from && cursor < from || !have) {
			// Cannot go on in the window: the next pass takes it on, or,
			// when the stream failed it, its own read.
			rp.freeze(r, max(cursor, r.pos))
			r.lone = failed && r.upto == r.pos
		}
	}
	if have {
		rp.fromWindow(txs, max(cursor, from, low), head)
	}
	for _, r := range rs {
		if !r.frozen {
			rp.freeze(r, max(head, r.pos))
		}
	}
	return rs
}

// replayer routes one pass's transactions to its riders.
type replayer struct {
	fs      *Feeds
	ix      *index
	of      map[*Feed]*rider
	rs      []*rider
	stamp   uint64
	scratch []*group
	open    []*rider // riders with hits awaiting a boundary
	active  int      // riders not frozen
	kept    int64    // bytes of the stream's transactions kept in hits
}

// add routes t: each rider after whose position t lies and whose filter t
// matches or breaks gets a hit.
func (rp *replayer) add(t *txn) (kept bool) {
	hitOne := func(r *rider) {
		if r.frozen || r.pos >= t.first || (len(r.hits) > 0 && r.hits[len(r.hits)-1].t == t) {
			return
		}
		if r.open == len(r.hits) {
			rp.open = append(rp.open, r)
		}
		r.hits = append(r.hits, hit{t: t})
		kept = true
	}
	if t.brk != "" {
		for _, r := range rp.rs {
			hitOne(r)
		}
		return kept
	}
	for _, tb := range t.truncs {
		for _, r := range rp.rs {
			if r.filter.hasTable(tb) {
				hitOne(r)
			}
		}
	}
	for _, c := range t.changes {
		rp.stamp++
		rp.scratch = rp.ix.candidates(c, rp.stamp, rp.scratch[:0])
		for _, g := range rp.scratch {
			if !g.matches(c) {
				continue
			}
			for _, sh := range g.feeds {
				hitOne(rp.of[sh])
			}
		}
	}
	clear(rp.scratch)
	return kept
}

// boundary closes the hits awaiting one at b, a transaction boundary, and
// freezes the riders holding a full batch's worth.
func (rp *replayer) boundary(b uint64) {
	for _, r := range rp.open {
		for i := r.open; i < len(r.hits); i++ {
			r.hits[i].boundary = b
		}
		r.open = len(r.hits)
		if !r.frozen && len(r.hits) >= rp.fs.cfg.MaxBatch {
			rp.freeze(r, b)
		}
	}
	clear(rp.open)
	rp.open = rp.open[:0]
}

// freeze ends r's part in the pass at upto, a boundary at or after the
// last of its hits that has one; later hits are dropped.
func (rp *replayer) freeze(r *rider, upto uint64) {
	if r.frozen {
		return
	}
	r.frozen, r.upto = true, upto
	r.hits = r.hits[:r.open]
	rp.active--
}

// fromWindow routes the window's transactions after cursor up to head.
func (rp *replayer) fromWindow(txs []*txn, cursor, head uint64) {
	i := sort.Search(len(txs), func(i int) bool { return txs[i].last > cursor })
	for ; i < len(txs) && txs[i].last <= head; i++ {
		t := txs[i]
		rp.add(t)
		if t.stableAt != 0 {
			rp.boundary(t.stableAt)
			if rp.active == 0 {
				return
			}
		}
	}
}

// backfill adds kept, the transactions a replay read after clean up to
// cursor (both boundaries), in front of the window when they join it: the
// window then serves the positions they cover from memory, and feeds
// reconnecting there later read nothing from the stream. What does not
// fit in the window's bounds is left out, oldest first; nothing is added
// when the window moved past cursor or started over meanwhile.
func (fs *Feeds) backfill(kept []*txn, clean, cursor, gen uint64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	w := fs.windowFrom
	if fs.closed || fs.gen != gen || !fs.haveHead || w > cursor || w <= clean {
		return
	}
	// Up to the window's start, where a run of kept must end.
	n := sort.Search(len(kept), func(i int) bool { return kept[i].last > w })
	if n == 0 || kept[n-1].stableAt != w {
		return
	}
	// The newest part that fits, starting right after a boundary.
	var bytes, fits int64
	start, from := n, w
	for i := n - 1; i >= 0; i-- {
		bytes += int64(kept[i].size)
		if n-i+len(fs.txs) > fs.cfg.WindowTxns || fs.bytes+fs.encBytes.Load()+bytes > fs.cfg.WindowBytes {
			break
		}
		switch {
		case i == 0:
			start, from, fits = 0, clean, bytes
		case kept[i-1].stableAt != 0:
			start, from, fits = i, kept[i-1].stableAt, bytes
		}
	}
	if start == n {
		return
	}
	txs := make([]*txn, 0, n-start+len(fs.txs)+len(fs.txs)/4)
	txs = append(append(txs, kept[start:n]...), fs.txs...)
	for _, t := range kept[start:n] {
		countLocked(t, &fs.encBytes) // what feeds reading behind the window encoded
	}
	fs.txs, fs.bytes, fs.windowFrom, fs.evicted = txs, fs.bytes+fits, from, 0
	fs.backfills.Add(1)
}

// serveSkip returns the changes of sk's transactions after pos up to a
// boundary next, stopping at MaxBatch or before a transaction that breaks
// the feed (err, returned only when no change comes before it). Having
// returned everything, next is sk.upto.
func (f *Feed) serveSkip(sk *skip, pos uint64) (out []Change, next uint64, err error) {
	hs := sk.hits
	i := sort.Search(len(hs), func(i int) bool { return hs[i].t.last > pos })
	next = pos
	for ; i < len(hs); i++ {
		h := hs[i]
		if e := h.t.breaks(f.filter); e != nil {
			if len(out) > 0 {
				return out, next, nil
			}
			return nil, next, e
		}
		out = f.appendMatches(out, h.t)
		if i+1 == len(hs) || hs[i+1].boundary != h.boundary {
			next = h.boundary
			if len(out) >= f.fs.cfg.MaxBatch {
				return out, next, nil
			}
		}
	}
	return out, sk.upto, nil
}
