// Projections (column sets) and the memory their encodings hold: a
// projection is counted by the feeds using it and dropped once idle for
// ProjectionIdle, their number is bounded by MaxProjections and their
// width by MaxColumns, and every encoding of a change in the window counts
// in WindowBytes, so that neither distinct column sets nor their encodings
// grow memory beyond the window's bound.

package feeds

import (
	"fmt"
	"time"
)

// projectionLocked returns the projection of cols for a feed being
// registered, counting the feed in: an existing one, or a new one when
// fewer than MaxProjections are held once those idle too long (or, at the
// cap, idle at all) are dropped.
func (fs *Feeds) projectionLocked(cols []string) (*projection, error) {
	key := projKey(cols)
	if p := fs.projs[key]; p != nil {
		p.refs++
		return p, nil
	}
	if n := len(fs.projs) - 1; n >= fs.cfg.MaxProjections {
		fs.sweepLocked(time.Now(), true)
		if n := len(fs.projs) - 1; n >= fs.cfg.MaxProjections {
			return nil, fmt.Errorf("%w: %d column sets are in use, the limit (MaxProjections); ask for columns another feed uses, or for all of them", ErrTooManyProjections, n)
		}
	}
	p := &projection{id: fs.nextProj, key: key, cols: map[string]struct{}{}, refs: 1}
	fs.nextProj++
	for _, c := range cols {
		p.cols[c] = struct{}{}
	}
	fs.projs[key] = p
	return p, nil
}

// releaseLocked counts a closed feed out of p.
func (fs *Feeds) releaseLocked(p *projection) {
	if p == nil || p.id == 0 {
		return
	}
	if p.refs--; p.refs == 0 {
		p.idle = time.Now()
	}
}

// sweepLocked drops the projections no feed has used for ProjectionIdle,
// or, with all, every one no feed uses. The encodings they made stay with
// their changes, counted in the window, until the window evicts them; a
// new projection of the same columns has a new id, so none is reused.
func (fs *Feeds) sweepLocked(now time.Time, all bool) {
	for k, p := range fs.projs {
		if p.id != 0 && p.refs == 0 && (all || now.Sub(p.idle) >= fs.cfg.ProjectionIdle) {
			delete(fs.projs, k)
		}
	}
}

// countLocked counts the encodings of t's changes in the window's bytes,
// now and as more are made, until uncountLocked.
func countLocked(t *txn, window interface{ Add(int64) int64 }) {
	for _, c := range t.changes {
		c.mu.Lock()
		if !c.inWindow {
			c.inWindow = true
			window.Add(c.serBytes)
		}
		c.mu.Unlock()
	}
}

// uncountLocked undoes countLocked for t, leaving the window.
func uncountLocked(t *txn, window interface{ Add(int64) int64 }) {
	for _, c := range t.changes {
		c.mu.Lock()
		if c.inWindow {
			c.inWindow = false
			window.Add(-c.serBytes)
		}
		c.mu.Unlock()
	}
}

// dropWindowLocked empties the window (a gap in the stream, the stream
// recreated).
func (fs *Feeds) dropWindowLocked() {
	for _, t := range fs.txs {
		uncountLocked(t, &fs.encBytes)
	}
	fs.txs, fs.bytes, fs.pending, fs.evicted = nil, 0, nil, 0
}

// evictIfOver evicts the window's oldest transactions when encodings made
// since the last message took it past WindowBytes.
func (fs *Feeds) evictIfOver() {
	fs.mu.RLock()
	over := fs.bytes+fs.encBytes.Load() > fs.cfg.WindowBytes
	fs.mu.RUnlock()
	if over {
		fs.mu.Lock()
		fs.evictLocked()
		fs.mu.Unlock()
	}
}
