package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// The reader's side: routing a transaction and handing it to the writer in
// bounded parts.

// txnItem is a routed transaction, or a part of a large one, on its way
// to the writer.
type txnItem struct {
	commit  cdc.LSN
	changes []cdc.Change
	dests   [][]int // per change: sink indexes
	last    bool    // the transaction's last part
	rev     string  // the configuration revision of the router that routed it
}

// preEvents are the schema change events to publish before a change, and
// their sinks.
type preEvents struct {
	changes []cdc.Change
	dests   [][]int
}

// chunk bounds the changes of a large transaction held at once, and the
// changes of small transactions handed to the writer in one run.
const chunk = 1000

// queueLimit bounds the changes routed and waiting for the writer: a
// batch of max changes and two runs, so that the writer finds its next
// batch ready when a Write returns (a writer waiting for the reader leaves
// the sink idle), and the memory queued depends on the batch size, not on
// the transactions'.
func queueLimit(max int) int64 { return int64(max + 2*chunk) }

// runWeight is what run counts against limit: its changes, at least 1 (a
// commit without routed changes) and at most limit (a run can exceed it,
// and must still go through alone).
func runWeight(run []*txnItem, limit int64) int64 {
	n := 0
	for _, it := range run {
		n += len(it.changes)
	}
	return min(max(int64(n), 1), limit)
}

// route routes and encodes t's changes and hands them to emit; a
// transaction read back from disk goes in parts of chunk changes.
func (p *Pipeline) route(ctx context.Context, rr *routerRev, t *cdc.Txn, producer string, emit func(*txnItem) error) error {
	if t.Rest != nil {
		defer t.Rest.Close()
		// A transaction still arriving makes Next wait for the source: the
		// end of the run interrupts it.
		defer context.AfterFunc(ctx, func() { t.Rest.Close() })()
	}
	fan := rr.r.Fanout()
	trk := p.trk
	send := func(it *txnItem) error {
		if fan {
			groupByDest(it)
		}
		p.obs.Routed(t, it.commit, it.changes, it.last) // spans, traceparent headers, counters
		return emit(it)
	}
	newItem := func() *txnItem { return &txnItem{commit: t.CommitLSN, rev: rr.rev} }
	it := newItem()
	// each appends c's destinations to it (a router with continue routes).
	each := func(c *cdc.Change) error {
		_, err := rr.r.Each(c, func(d *cdc.Change, sinks []int) error {
			if len(sinks) > 0 {
				it.changes = append(it.changes, *d)
				it.dests = append(it.dests, sinks)
			}
			return nil
		})
		if err != nil {
			return fatal{err}
		}
		return nil
	}
	// add routes cs, changes read back from disk into a reused buffer, and
	// appends copies of the routed ones to it.
	add := func(cs []cdc.Change) error {
		if it.changes == nil {
			it.changes, it.dests = make([]cdc.Change, 0, chunk), make([][]int, 0, chunk)
		}
		for i := range cs {
			c := &cs[i]
			c.Producer = producer
			evs, eds, err := p.schemaStep(ctx, trk, rr, c)
			if err != nil {
				return err
			}
			it.changes, it.dests = append(it.changes, evs...), append(it.dests, eds...)
			if fan {
				if err := each(c); err != nil {
					return err
				}
				continue
			}
			dests, ok, err := rr.r.Route(c)
			if err != nil {
				return fatal{err}
			}
			if !ok || len(dests) == 0 {
				continue
			}
			it.changes = append(it.changes, *c)
			it.dests = append(it.dests, dests)
		}
		return nil
	}
	// addHeld routes cs, a part of t's changes held in memory, into it, which
	// is empty. When every change is routed, it takes cs in place (no copy;
	// its capacity ends with cs, so an append copies); otherwise it takes
	// copies of the routed ones, and addHeld reports copied.
	addHeld := func(cs []cdc.Change) (copied bool, err error) {
		if fan {
			it.changes, it.dests = make([]cdc.Change, 0, len(cs)), make([][]int, 0, len(cs))
			for i := range cs {
				cs[i].Producer = producer
				evs, eds, err := p.schemaStep(ctx, trk, rr, &cs[i])
				if err != nil {
					return false, err
				}
				it.changes, it.dests = append(it.changes, evs...), append(it.dests, eds...)
				if err := each(&cs[i]); err != nil {
					return false, err
				}
			}
			return true, nil
		}
		ds := make([][]int, len(cs))
		all := true
		var pre map[int]preEvents // schema change events to publish before cs[i]
		for i := range cs {
			c := &cs[i]
			c.Producer = producer
			evs, eds, err := p.schemaStep(ctx, trk, rr, c)
			if err != nil {
				return false, err
			}
			if len(evs) > 0 {
				if pre == nil {
					pre = map[int]preEvents{}
				}
				pre[i] = preEvents{evs, eds}
				all = false
			}
			dests, ok, err := rr.r.Route(c)
			if err != nil {
				return false, fatal{err}
			}
			if ok && len(dests) > 0 {
				ds[i] = dests
			} else {
				all = false
			}
		}
		if all {
			it.changes, it.dests = cs[:len(cs):len(cs)], ds
			return false, nil
		}
		if pre != nil {
			it.changes, it.dests = make([]cdc.Change, 0, len(cs)+len(pre)), make([][]int, 0, len(cs)+len(pre))
		} else {
			it.changes, it.dests = make([]cdc.Change, 0, len(cs)), ds[:0]
		}
		for i := range cs {
			if e, ok := pre[i]; ok {
				it.changes = append(it.changes, e.changes...)
				it.dests = append(it.dests, e.dests...)
			}
			if ds[i] != nil {
				it.changes = append(it.changes, cs[i])
				it.dests = append(it.dests, ds[i])
			}
		}
		return true, nil
	}
	// The changes held in memory go in parts of chunk too, so a run never
	// holds more than about chunk changes whatever the transaction's size.
	// A part that was copied is cleared from t once sent, so the GC can
	// free its changes as soon as they are written (startTxn has read t by
	// then: it runs on the first send). A part with nothing routed is not
	// sent. The last part stays in it, for the spilled changes to follow in
	// the same part.
	for from := 0; from < len(t.Changes); {
		to := min(from+chunk, len(t.Changes))
		copied, err := addHeld(t.Changes[from:to]) // it is empty: every part but the last is sent below
		if err != nil {
			return err
		}
		if to < len(t.Changes) && len(it.changes) > 0 {
			if err := send(it); err != nil {
				return err
			}
			if copied {
				clear(t.Changes[from:to])
			}
			it = newItem()
		}
		from = to
	}
	if t.Rest == nil {
		it.last = true
		return send(it)
	}
	if pi, ok := t.Rest.(cdc.PartIter); ok {
		// A transaction still arriving: each part the source decoded
		// becomes an item as it is (no copy when every change is routed).
		for {
			part, err := pi.NextPart()
			if len(part) > 0 {
				if len(it.changes) > 0 {
					if err := send(it); err != nil {
						return err
					}
					it = newItem()
				}
				if _, aerr := addHeld(part); aerr != nil {
					return aerr
				}
			}
			if errors.Is(err, io.EOF) {
				it.last = true
				return send(it)
			}
			if err != nil {
				return fmt.Errorf("source %q: %w", p.source, err)
			}
		}
	}
	buf := make([]cdc.Change, chunk)
	for {
		if len(it.changes) >= chunk {
			if err := send(it); err != nil {
				return err
			}
			it = newItem()
		}
		n, err := t.Rest.Next(buf)
		if aerr := add(buf[:n]); aerr != nil {
			return aerr
		}
		clear(buf[:n])
		if errors.Is(err, io.EOF) {
			it.last = true
			return send(it)
		}
		if err != nil {
			return fmt.Errorf("source %q: %w", p.source, err)
		}
	}
}

// groupByDest orders it's changes by destination (cdc.Change.Dest, in
// the order the destinations first appear), keeping each destination's
// changes in commit order: a transaction a route publishes whole stays
// contiguous for a sink that publishes transactions atomically, instead of
// interleaving with another route's copies of it. A route's schema change
// events (Dest "<name>~schema") and tombstones ("<name>~tombstone") stay
// with its changes, before or after the change each goes with.
func groupByDest(it *txnItem) {
	group := func(c *cdc.Change) string {
		if i := strings.IndexByte(c.Dest, '~'); i >= 0 { // route names hold no '~'
			return c.Dest[:i]
		}
		return c.Dest
	}
	var order []string
	seen := map[string]bool{}
	for i := range it.changes {
		if d := group(&it.changes[i]); !seen[d] {
			seen[d] = true
			order = append(order, d)
		}
	}
	if len(order) < 2 {
		return
	}
	cs := make([]cdc.Change, 0, len(it.changes))
	ds := make([][]int, 0, len(it.dests))
	for _, d := range order {
		for i := range it.changes {
			if group(&it.changes[i]) == d {
				cs = append(cs, it.changes[i])
				ds = append(ds, it.dests[i])
			}
		}
	}
	it.changes, it.dests = cs, ds
}
