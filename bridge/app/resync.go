package app

import (
	"context"
	"fmt"

	"github.com/bridgecdc/bridge/bridge/pgslot"
	"github.com/bridgecdc/bridge/bridge/pipeline"
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
	var p *pipeline.Pipeline
	for _, q := range a.pipelines {
		if q.Source() == source {
			p = q
		}
	}
	if p == nil {
		return "", fmt.Errorf("no source named %q in the configuration", source)
	}
	if src, ok := pgslot.SourceOf(source, a.cfg.Sources[source]); ok {
		row, err := pgslot.ReadOnce(ctx, src, "bridge:status")
		if err != nil {
			return "", fmt.Errorf("checking slot %q of source %q: %w", src.Slot, source, err)
		}
		if row.Active {
			return "", fmt.Errorf("slot %q of source %q is in use (walsender PID %d): stop the bridge first, then run bridge resync again", src.Slot, source, row.ActivePID)
		}
	}
	return p.Resync(ctx, reason)
}
