package pipeline

// Control messages and the breaks of continuity: a slot lost (on_slot_lost:
// recreate), a checkpoint bucket deleted.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/snapshot"
	"github.com/bridgecdc/bridge/sources"
)

// resyncLostSlot handles a slot lost under on_slot_lost: recreate. It
// publishes a resync control message under a new epoch to every sink the
// source's routes use, then checkpoints the new epoch at LSN 0; the next run
// creates the slot and streams under that epoch. The control message has
// position (0, 0) of the new producer, so it precedes every change of the
// epoch.
//
// A crash between the publish and the checkpoint leaves the old epoch in
// the checkpoint: the next start finds the slot still lost and resyncs
// again under another new epoch, so consumers may see two resync messages,
// never a change of a new epoch without one before it.
func (p *Pipeline) resyncLostSlot(ctx context.Context, st checkpoint.State, rev uint64, lost *sources.SlotLostError) error {
	ctl, err := p.newEpoch(ctx, st, rev, lost.Reason, lost.WALEnd, 0, lost.Database)
	if err != nil {
		return err
	}
	p.ckptLSN.Store(0)
	msg := "replication slot lost: published a resync message; streaming again under a new epoch from a new slot (changes in between are not in the stream)"
	if lost.Keep {
		msg = "the server's history lacks part of the stream: published a resync message; streaming again under a new epoch from the slot's confirmed position (consumers re-read)"
	}
	p.log.Warn(msg, "slot", lost.Slot, "database", lost.Database, "reason", lost.Reason, "detail", lost.Detail, "checkpoint", lost.Checkpoint.String(),
		"wal_end", lost.WALEnd.String(), "old_producer", ctl.OldProducer, "producer", ctl.Producer)
	return nil
}

// newEpoch breaks continuity on purpose: it publishes a resync control
// message (reason; from, the position it names) from st's epoch to a new
// one, then checkpoints the new epoch at lsn over revision rev.
func (p *Pipeline) newEpoch(ctx context.Context, st checkpoint.State, rev uint64, reason string, from, lsn cdc.LSN, database string) (cdc.Control, error) {
	epoch := checkpoint.NewEpoch()
	ctl := cdc.Control{Kind: cdc.ControlResync, Reason: reason, Source: p.source,
		OldProducer: p.bridge + "." + p.source + "." + st.Epoch, Producer: p.bridge + "." + p.source + "." + epoch,
		LSN: from.String(), Time: time.Now().UTC()}
	if err := p.publishControl(ctx, ctl, database); err != nil {
		return ctl, err
	}
	cursors := map[string]string{}
	for _, s := range p.sinks {
		if s.resumer != nil {
			cursors[s.name] = s.resumer.Cursor()
		}
	}
	ns := checkpoint.State{Epoch: epoch, LSN: lsn, Cursors: cursors, UpdatedAt: time.Now().UTC(), Run: p.run, SystemID: st.SystemID,
		Timeline: st.Timeline, Standby: st.Standby, ConfigRev: p.cur.Load().rev, Paused: st.Paused}
	if _, err := p.store.Save(ctx, p.key, ns, rev); err != nil {
		return ctl, fmt.Errorf("saving the new epoch %s: %w", epoch, err)
	}
	return ctl, nil
}

// publishControl writes ctl to every sink controlDests names. At-most-once
// sinks get it too, but their failures are only logged.
func (p *Pipeline) publishControl(ctx context.Context, ctl cdc.Control, database string) error {
	dests, err := p.cur.Load().r.ControlDests(p.source, ctl.Kind)
	if err != nil {
		return fatal{err}
	}
	if len(dests) == 0 {
		p.log.Warn("no route carries this source's changes: the control message goes nowhere", "kind", ctl.Kind)
	}
	c, err := ctl.Change(ctl.Producer, p.source, database)
	if err != nil {
		return fatal{err}
	}
	for _, d := range dests {
		s := p.sinks[d.Sink]
		cc := c
		cc.Subject = d.Subject
		if err := p.writeSink(ctx, s, []cdc.Change{cc}); err != nil {
			if s.amo {
				p.log.Warn("at-most-once sink dropped a control message", "sink", s.name, "kind", ctl.Kind, "err", err)
				continue
			}
			return fmt.Errorf("publishing the %s control message: %w", ctl.Kind, err)
		}
	}
	return nil
}

// slotLostWhileRunning reports, from the slot poller's last reading (taken
// after since), a slot that was dropped or invalidated while this run
// streams; the next run's Open then applies on_slot_lost. Nil when the poll
// is older than since, failed, or found the slot well.
func (p *Pipeline) slotLostWhileRunning(since time.Time) error {
	if p.slot == nil {
		return nil
	}
	last, ok := p.slot.Last()
	slot, row := last.Slot, last.Row
	if !ok || last.At.Before(since) {
		return nil
	}
	switch {
	case !row.Exists:
		return errSlotLost{fmt.Errorf("replication slot %q was dropped while the bridge streamed from it", slot)}
	case row.WALStatus == "lost":
		return errSlotLost{fmt.Errorf("replication slot %q was invalidated (wal_status = lost) while the bridge streamed from it", slot)}
	}
	return nil
}

// errSlotLost ends a run so that the next Open applies on_slot_lost.
type errSlotLost struct{ err error }

func (e errSlotLost) Error() string { return e.err.Error() + "; restarting to apply on_slot_lost" }
func (e errSlotLost) Unwrap() error { return e.err }

// bucketGone turns a checkpoint failure into a fatal error when the bucket
// was deleted under the bridge: retrying cannot bring the checkpoint back,
// and going on would start a new epoch without consumers being told.
func (p *Pipeline) bucketGone(err error) error {
	if err == nil || errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrNoServers) || errors.Is(err, context.Canceled) {
		return err // NATS is away, not the bucket: do not wait on one more round trip
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if !p.store.Gone(ctx) {
		return err
	}
	return fatal{fmt.Errorf("checkpoint bucket %q was deleted under the bridge, so the checkpoint of source %q is gone (%w); "+
		"to go on, restart the bridge: it recreates the bucket and starts a new epoch at the slot's confirmed position, "+
		"so consumers may receive changes since the last checkpoint again, under new message ids", p.store.Bucket(), p.source, err)}
}

// snapHeld returns the snapshot.HeldFunc of a run: it fills held, by sink
// index, with the reads of the running snapshot each sink holds (positions
// with their destination, so fan-out routes are told apart), which the
// writer leaves out for that sink. A sink that cannot tell (no
// sinks.Resumer) gets every row read again; an at-most-once sink is never
// asked.
func (p *Pipeline) snapHeld(held []snapshot.Held) snapshot.HeldFunc {
	return func(ctx context.Context, producer string, from map[string]string) error {
		for i, s := range p.sinks {
			if s.amo || s.resumer == nil {
				continue
			}
			d, err := s.resumer.Delivered(ctx, producer, from[s.name])
			if err != nil {
				return fmt.Errorf("sink %q: %w", s.name, err)
			}
			if len(d) > 0 {
				p.log.Info("sink already holds rows of the running snapshot; they will not be sent to it again", "sink", s.name,
					"snapshot_producer", producer, "rows", len(d), "scan_from", from[s.name])
				held[i] = d
			}
		}
		return nil
	}
}

// Resync starts a new epoch on the operator's request, while no run
// streams: it publishes a resync control message (reason "operator", with
// reason appended when given) to every sink the source's routes use, then
// checkpoints the new epoch at the same LSN, and returns the new producer.
// The next run streams on from the checkpoint under it, so consumers see
// the resync message first and then every change after the checkpoint
// again under new ids.
func (p *Pipeline) Resync(ctx context.Context, reason string) (string, error) {
	st, rev, err := p.store.Load(ctx, p.key)
	if err != nil {
		return "", fmt.Errorf("loading checkpoint %q: %w", p.key, err)
	}
	if rev == 0 {
		return "", fmt.Errorf("source %q has no checkpoint yet: there is nothing to resync", p.source)
	}
	for _, s := range p.sinks {
		if err := s.sink.Connect(ctx); err != nil {
			return "", fmt.Errorf("connecting sink %q: %w", s.name, err)
		}
	}
	ctl, err := p.newEpoch(ctx, st, rev, operatorReason(reason), st.LSN, st.LSN, "")
	if err != nil {
		return "", err
	}
	return ctl.Producer, nil
}
