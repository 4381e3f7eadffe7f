package bridge

import (
	"context"
	"fmt"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
)

// Resync starts a new epoch for source on the operator's request, while
// the bridge is stopped: it publishes a resync control message (reason
// "operator", with reason text appended when given) to every sink the
// source's routes use, then checkpoints the new epoch at the same LSN. The
// next `bridge run` streams on from the checkpoint under the new producer,
// so consumers see the resync message first and then every change after
// the checkpoint again under new ids. It refuses while a walsender streams
// from the source's slot (a running bridge would be fenced off). Call it
// after Start; it returns the new producer.
func (a *App) Resync(ctx context.Context, source, reason string) (string, error) {
	var p *Pipeline
	for _, q := range a.pipelines {
		if q.source == source {
			p = q
		}
	}
	if p == nil {
		return "", fmt.Errorf("no source named %q in the configuration", source)
	}
	if src, ok := pgSourceOf(source, a.cfg.Sources[source]); ok {
		row, err := statusSlot(ctx, src)
		if err != nil {
			return "", fmt.Errorf("checking slot %q of source %q: %w", src.Slot, source, err)
		}
		if row.Active {
			return "", fmt.Errorf("slot %q of source %q is in use (walsender PID %d): stop the bridge first, then run bridge resync again", src.Slot, source, row.ActivePID)
		}
	}
	st, rev, err := p.store.Load(ctx, p.key)
	if err != nil {
		return "", fmt.Errorf("loading checkpoint %q: %w", p.key, err)
	}
	if rev == 0 {
		return "", fmt.Errorf("source %q has no checkpoint yet: there is nothing to resync", source)
	}
	for _, s := range p.sinks {
		if err := s.sink.Connect(ctx); err != nil {
			return "", fmt.Errorf("connecting sink %q: %w", s.name, err)
		}
	}
	epoch := checkpoint.NewEpoch()
	ctl := cdc.Control{Kind: cdc.ControlResync, Reason: "operator", Source: source,
		OldProducer: p.bridge + "." + source + "." + st.Epoch, Producer: p.bridge + "." + source + "." + epoch,
		LSN: st.LSN.String(), Time: time.Now().UTC()}
	if reason != "" {
		ctl.Reason = "operator: " + reason
	}
	if err := p.publishControl(ctx, ctl, ""); err != nil {
		return "", err
	}
	cursors := map[string]string{}
	for _, s := range p.sinks {
		if s.resumer != nil {
			cursors[s.name] = s.resumer.Cursor()
		}
	}
	ns := checkpoint.State{Epoch: epoch, LSN: st.LSN, Cursors: cursors, UpdatedAt: time.Now().UTC(), Run: p.run, SystemID: st.SystemID}
	if _, err := p.store.Save(ctx, p.key, ns, rev); err != nil {
		return "", fmt.Errorf("saving the new epoch %s: %w", epoch, err)
	}
	return ctl.Producer, nil
}
