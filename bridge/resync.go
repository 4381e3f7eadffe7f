package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/sources"
)

// controlDest is where a control message goes: a sink and its subject.
type controlDest struct {
	sink    int
	subject string
}

// controlDests returns where source's control messages go. Routes whose
// match lists the control op (ops: [control]) decide alone when there are
// any; otherwise every sink of every route that can carry the source's
// changes gets one copy. Either way a sink gets one message, on the subject
// of the first such route (in config order) that names it, rendered with
// Schema "_control" and Table the control kind; row values render as "_".
func (r *Router) controlDests(source, kind string) ([]controlDest, error) {
	pick := func(explicit bool) ([]controlDest, error) {
		seen := map[int]bool{}
		var out []controlDest
		for _, rt := range r.routes {
			if len(rt.sources) > 0 && !slices.Contains(rt.sources, source) {
				continue
			}
			if slices.Contains(rt.ops, cdc.OpControl) != explicit {
				continue
			}
			d := SubjectData{Source: Token(source), Schema: cdc.ControlSchema, Table: Token(kind), Op: string(cdc.OpControl),
				Prefix: "_", Key: map[string]string{}, Col: map[string]string{}}
			var vars []string
			if rt.perRow {
				for _, m := range rowRef.FindAllStringSubmatch(rt.subject.Root.String(), -1) {
					vars = append(vars, m[1])
				}
			}
			for _, v := range vars {
				d.Key[v], d.Col[v] = "_", "_"
			}
			subj, err := render(rt.subject, d)
			if err != nil {
				return nil, fmt.Errorf("routes[%d].subject for control messages: %w", rt.idx, err)
			}
			for _, s := range rt.sinks {
				if !seen[s] {
					seen[s] = true
					out = append(out, controlDest{sink: s, subject: subj})
				}
			}
		}
		return out, nil
	}
	out, err := pick(true)
	if err != nil || len(out) > 0 {
		return out, err
	}
	return pick(false)
}

// controlChange builds the control message ctl for producer.
func controlChange(producer, source, database string, ctl cdc.Control) (cdc.Change, error) {
	body, err := json.Marshal(ctl)
	if err != nil {
		return cdc.Change{}, fmt.Errorf("encoding %s control message: %w", ctl.Kind, err)
	}
	return cdc.Change{
		Producer: producer, Source: source, Database: database,
		Op: cdc.OpControl, Schema: cdc.ControlSchema, Table: ctl.Kind,
		TxSize: 1, CommitTime: ctl.Time, Content: body, Payload: body,
	}, nil
}

// resync handles a slot lost under on_slot_lost: recreate. It publishes a
// resync control message under a new epoch to every sink the source's
// routes use, then checkpoints the new epoch at LSN 0; the next run creates
// the slot and streams under that epoch. The control message has position
// (0, 0) of the new producer, so it precedes every change of the epoch.
//
// A crash between the publish and the checkpoint leaves the old epoch in
// the checkpoint: the next start finds the slot still lost and resyncs
// again under another new epoch, so consumers may see two resync messages,
// never a change of a new epoch without one before it.
func (p *Pipeline) resync(ctx context.Context, st checkpoint.State, rev uint64, lost *sources.SlotLostError) error {
	epoch := checkpoint.NewEpoch()
	old := p.bridge + "." + p.source + "." + st.Epoch
	producer := p.bridge + "." + p.source + "." + epoch
	ctl := cdc.Control{Kind: cdc.ControlResync, Reason: lost.Reason, Source: p.source, OldProducer: old, Producer: producer,
		LSN: lost.WALEnd.String(), Time: time.Now().UTC()}
	if err := p.publishControl(ctx, ctl, lost.Database); err != nil {
		return err
	}
	cursors := map[string]string{}
	for _, s := range p.sinks {
		if s.resumer != nil {
			cursors[s.name] = s.resumer.Cursor()
		}
	}
	ns := checkpoint.State{Epoch: epoch, Cursors: cursors, UpdatedAt: time.Now().UTC(), Run: p.run, SystemID: st.SystemID}
	if _, err := p.store.Save(ctx, p.key, ns, rev); err != nil {
		return fmt.Errorf("saving the new epoch %s after the resync: %w", epoch, err)
	}
	p.ckptLSN.Store(0)
	p.log.Warn("replication slot lost: published a resync message; streaming again under a new epoch from a new slot (changes in between are not in the stream)",
		"slot", lost.Slot, "database", lost.Database, "reason", lost.Reason, "checkpoint", lost.Checkpoint.String(),
		"wal_end", lost.WALEnd.String(), "old_producer", old, "producer", producer)
	return nil
}

// publishControl writes ctl to every sink controlDests names. At-most-once
// sinks get it too, but their failures are only logged.
func (p *Pipeline) publishControl(ctx context.Context, ctl cdc.Control, database string) error {
	dests, err := p.router.controlDests(p.source, ctl.Kind)
	if err != nil {
		return fatal{err}
	}
	if len(dests) == 0 {
		p.log.Warn("no route carries this source's changes: the control message goes nowhere", "kind", ctl.Kind)
	}
	c, err := controlChange(ctl.Producer, p.source, database, ctl)
	if err != nil {
		return fatal{err}
	}
	for _, d := range dests {
		s := p.sinks[d.sink]
		cc := c
		cc.Subject = d.subject
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
	if p.tel == nil {
		return nil
	}
	g := &p.tel.slot
	g.mu.Lock()
	slot, row, ok, at := g.slot, g.row, g.ok, g.at
	g.mu.Unlock()
	if !ok || at.Before(since) {
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
