package pipeline

// Taking the slot over from a stale reader. The slot admits one walsender;
// a standby waits for it (SQLSTATE 55006, retried), and a former owner that
// stalled without closing its connection (a GC pause, a stopped VM, a
// partition, SIGSTOP) keeps its walsender until the server's
// wal_sender_timeout, 60 s by default. Every run that holds the slot
// records its reader (the walsender's PID and start) in the owner record
// (checkpoint.OwnerKey), with its fleet lease, if any. A run that finds
// the slot held by the reader the record names ends that reader
// (sources.Evicter) and opens the slot at once when it knows the owner is
// stale:
//
//   - in a fleet, when this member holds the source's lease and the record
//     is that of a former holder of the same fleet's lease (an earlier
//     epoch): the lease is the authority on who owns a source, and its
//     former holder gave it up before it could pass. A reader of another
//     fleet, or of a bridge outside any fleet, is not this lease's to end;
//   - with checkpoint.owner_timeout set, when the record is a heartbeat
//     (rewritten every owner_timeout/4) that kept one revision for
//     owner_timeout (the owner's own, when longer), as this pipeline saw
//     it on its own clock: nobody compares clocks.
//
// A reader no record names (a bridge of an older version, another client
// of the slot) is never ended. Ending a live owner by mistake loses
// nothing: its checkpoint saves meet the compare-and-set (the run that
// ended it saves first, see runOnce) and its publishes the stream's fence.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/retry"
	"github.com/bridgecdc/bridge/sources"
)

// evictWait bounds ending a stale reader: the server's answer and the
// walsender's exit.
const evictWait = 10 * time.Second

// Lease is a fleet's lease on a source: the fleet's name and the lease's
// epoch, which grows at each change of holder.
type Lease struct {
	Fleet string
	Epoch uint64
}

// owner is what a pipeline knows about taking its slot over; used by the
// run loop's goroutine only, but for the fields set at New.
type owner struct {
	lease   func() (Lease, bool) // Config.Lease
	timeout time.Duration        // Config.OwnerTimeout
	key     string               // checkpoint.OwnerKey

	// The heartbeat as last seen while the slot was held by another
	// reader: its revision, when this pipeline first saw it, and how long
	// it may keep that revision before it is stale.
	rev   uint64
	seen  time.Time
	stale time.Duration
	// denied is set once a refusal to end a reader was logged, until an
	// eviction succeeds: the warning is not repeated at every attempt.
	denied bool
}

// open builds this run's source and opens it after from. When the slot is
// held by another reader that this pipeline may end (mayEvict), it ends it
// and opens a new source once more; evicted reports that. On error no
// source is left open; the error is Open's (a *sources.SlotBusyError when
// the slot stays held).
//
// lineage and end are told to a sources.Lineaged before Open: the lineage
// the checkpoint was recorded under and the stream's end.
func (p *Pipeline) open(ctx context.Context, from cdc.LSN, lineage sources.Lineage, end cdc.LSN) (src sources.Source, evicted bool, err error) {
	if src, err = p.newSource(); err != nil {
		return nil, false, fatal{err}
	}
	if l, ok := src.(sources.Lineaged); ok {
		l.Expect(lineage, end)
	}
	if err = src.Open(ctx, from); err == nil {
		return src, false, nil
	}
	_ = src.Close(context.Background())
	var busy *sources.SlotBusyError
	ev, ok := src.(sources.Evicter)
	if !ok || !errors.As(err, &busy) || busy.Holder.PID == 0 {
		return nil, false, err
	}
	why, may := p.mayEvict(ctx, busy)
	if !may {
		return nil, false, err
	}
	began := time.Now()
	ectx, cancel := context.WithTimeout(ctx, evictWait)
	eerr := ev.Evict(ectx, busy.Holder)
	cancel()
	switch {
	case errors.Is(eerr, sources.ErrEvictDenied):
		if !p.owner.denied {
			p.owner.denied = true
			p.log.Warn("cannot end the stale reader of the slot; waiting for the server to drop it (wal_sender_timeout) as before",
				"slot", busy.Slot, "pid", busy.Holder.PID, "why_stale", why, "err", eerr)
		}
		return nil, false, err
	case eerr != nil:
		p.log.Warn("ending the stale reader of the slot failed; retrying", "slot", busy.Slot, "pid", busy.Holder.PID, "err", eerr)
		return nil, false, err
	}
	p.owner.denied = false
	p.owner.rev, p.owner.seen = 0, time.Time{}
	p.log.Warn("ended the stale reader of the slot to take the source over", "slot", busy.Slot, "database", busy.Database,
		"pid", busy.Holder.PID, "why", why, "took", time.Since(began).Round(time.Millisecond).String())
	if src, err = p.newSource(); err != nil {
		return nil, false, fatal{err}
	}
	if l, ok := src.(sources.Lineaged); ok {
		l.Expect(lineage, end)
	}
	if err = src.Open(ctx, from); err != nil {
		_ = src.Close(context.Background())
		return nil, false, err
	}
	return src, true, nil
}

// delay returns how long Run waits after a run that ended with the
// transient err before the next, on bo's curve, reset first when the run
// progressed or took the slot over from its owner (tookOver: it opened the
// slot after waiting as a standby, and the attempts it spent waiting say
// nothing of this failure, such as the former owner's last publishes
// landing after the run read the stream's tail). A run that found the
// checkpoint moved once the slot was its own starts again at once, and a
// standby watching a heartbeat tries again when it turns stale.
func (o *owner) delay(bo *retry.Backoff, err error, progressed, tookOver bool) time.Duration {
	if progressed || tookOver {
		bo.Reset()
	}
	d := bo.Next(err)
	if moved := (*movedError)(nil); errors.As(err, &moved) {
		d = 0 // the slot was this run's: no reason to wait
	}
	return o.untilStale(d)
}

// untilStale returns d, or less when the owner's heartbeat this pipeline
// watches turns stale before d has passed: the next attempt then comes
// when it does, not up to a backoff later.
func (o *owner) untilStale(d time.Duration) time.Duration {
	if o.rev == 0 || o.seen.IsZero() || o.stale <= 0 {
		return d
	}
	return max(0, min(d, time.Until(o.seen.Add(o.stale))))
}

// movedError ends a run that found, once the slot was its own, that the
// checkpoint had moved since it loaded it: the slot's previous owner saved
// it last, up to its last moment. The next run starts at once from the
// newer checkpoint, without the backoff of a failure.
type movedError struct {
	key      string
	from, to uint64 // revisions
}

func (e *movedError) Error() string {
	return fmt.Sprintf("checkpoint %q moved from revision %d to %d while this run opened the slot (the slot's previous owner saved it last); starting again from it",
		e.key, e.from, e.to)
}

// mayEvict decides whether this run may end busy's holder, and says why:
// the owner record must name the holder, and be a former holder's of the
// lease this member holds, or a heartbeat silent for owner_timeout.
func (p *Pipeline) mayEvict(ctx context.Context, busy *sources.SlotBusyError) (string, bool) {
	if p.owner.lease == nil && p.owner.timeout <= 0 {
		return "", false
	}
	lctx, cancel := context.WithTimeout(ctx, p.shutdown)
	o, err := p.store.LoadOwner(lctx, p.owner.key)
	cancel()
	if err != nil {
		p.log.Debug("cannot read the owner record", "key", p.owner.key, "err", err)
		return "", false
	}
	if o.Revision == 0 || !(sources.SlotReader{PID: o.PID, Started: o.Started}).Same(busy.Holder) {
		// No record, or one of another reader: the holder is not known
		// to be a bridge of this source (an older version, a client of
		// the operator's); only the server's timeout ends it.
		p.owner.rev, p.owner.seen = 0, time.Time{}
		return "", false
	}
	if p.owner.lease != nil {
		if l, held := p.owner.lease(); held && o.Fleet == l.Fleet && o.Epoch != 0 && o.Epoch < l.Epoch {
			return fmt.Sprintf("this member holds the source's lease in fleet %s at epoch %d; the slot's reader is that of run %s, which held it at epoch %d",
				l.Fleet, l.Epoch, o.Run, o.Epoch), true
		}
	}
	if p.owner.timeout <= 0 || o.TimeoutMS <= 0 {
		p.owner.rev, p.owner.seen = 0, time.Time{}
		return "", false // not a heartbeat, or not asked to judge one
	}
	now := time.Now()
	timeout := max(p.owner.timeout, time.Duration(o.TimeoutMS)*time.Millisecond)
	p.owner.stale = timeout
	if o.Revision != p.owner.rev {
		p.owner.rev, p.owner.seen = o.Revision, now
		return "", false
	}
	silent := now.Sub(p.owner.seen)
	if silent < timeout {
		return "", false
	}
	return fmt.Sprintf("its owner's heartbeat (run %s, written %s) has not changed for %s (checkpoint.owner_timeout %s)",
		o.Run, o.At.Format(time.RFC3339Nano), silent.Round(time.Millisecond), timeout), true
}

// beat keeps this run's owner record while it holds the slot, when the
// source names its reader and the run holds a fleet lease or owner_timeout
// is set: it writes it now, then, with owner_timeout, every owner_timeout/4
// (a heartbeat), until the function returned is called, which stops it and
// deletes the record (at the last revision written, bounded by the
// shutdown timeout). Call that once the slot is let go.
func (p *Pipeline) beat(ctx context.Context, src sources.Source) (stop func()) {
	ev, ok := src.(sources.Evicter)
	var l Lease
	held := false
	if p.owner.lease != nil {
		l, held = p.owner.lease()
	}
	if !ok || ev.Reader().PID == 0 || (p.owner.timeout <= 0 && !held) {
		return func() {}
	}
	r := ev.Reader()
	rec := checkpoint.Owner{Run: p.run, PID: r.PID, Started: r.Started, TimeoutMS: p.owner.timeout.Milliseconds()}
	if held {
		rec.Fleet, rec.Epoch = l.Fleet, l.Epoch
	}
	every := p.owner.timeout / 4
	var last atomic.Uint64
	failing := false
	put := func(ctx context.Context) {
		d := every
		if d <= 0 {
			d = p.shutdown
		}
		wctx, cancel := context.WithTimeout(ctx, d)
		rev, err := p.store.SetOwner(wctx, p.owner.key, rec)
		cancel()
		switch {
		case err == nil:
			last.Store(rev)
			failing = false
		case ctx.Err() == nil && !failing:
			failing = true
			p.log.Warn("writing the owner record failed: another instance cannot tell that this one holds the slot (with owner_timeout, it may take the source over if the record stays unchanged)",
				"key", p.owner.key, "err", err)
		}
	}
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	put(bctx)
	var wg sync.WaitGroup
	if every > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-bctx.Done():
					return
				case <-t.C:
					put(bctx)
				}
			}
		}()
	}
	return func() {
		cancel()
		wg.Wait()
		if rev := last.Load(); rev != 0 {
			dctx, dcancel := context.WithTimeout(context.Background(), p.shutdown)
			if err := p.store.DeleteOwner(dctx, p.owner.key, rev); err != nil {
				p.log.Debug("deleting the owner record failed", "key", p.owner.key, "err", err)
			}
			dcancel()
		}
	}
}
