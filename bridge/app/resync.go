package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/bridgecdc/bridge/bridge/pgslot"
	"github.com/bridgecdc/bridge/bridge/telemetry"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

// Resync starts a new epoch for source on the operator's request, while
// the bridge is stopped: it publishes a resync control message (reason
// "operator", with reason text appended when given) to every sink the
// source's routes use, then checkpoints the new epoch at the same LSN. The
// next `bridge run` streams on from the checkpoint under the new producer,
// so consumers see the resync message first and then every change after
// the checkpoint again under new ids. It returns the new producer.
//
// Resync is used instead of Start, and Close after it. It starts no
// listener. It refuses, before anything else, while a walsender streams
// from the source's slot or the embedded NATS server of a running bridge
// answers: a running bridge would be fenced off. With nats.url empty it
// starts the embedded server on its store for the time of the command,
// since no bridge runs it.
func (a *App) Resync(ctx context.Context, source, reason string) (string, error) {
	if _, ok := a.cfg.Sources[source]; !ok {
		return "", fmt.Errorf("no source named %q in the configuration (sources: %v)", source, sortedKeys(a.cfg.Sources))
	}
	if src, ok := pgslot.SourceOf(source, a.cfg.Sources[source]); ok {
		row, err := pgslot.ReadOnce(ctx, src, "bridge:resync")
		if err != nil {
			return "", fmt.Errorf("checking slot %q of source %q: %w", src.Slot, source, err)
		}
		if row.Active {
			return "", fmt.Errorf("slot %q of source %q is in use (walsender PID %d): stop the bridge first, then run bridge resync again", src.Slot, source, row.ActivePID)
		}
	}
	if a.cfg.NATS.RunsEmbedded() {
		e := a.cfg.NATS.Embedded
		fallback := "nats://" + net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
		if url, err := natsembed.Running(a.cfg.DataDir, fallback); err == nil {
			return "", fmt.Errorf("a bridge is running (its embedded NATS server answers at %s): stop it first, then run bridge resync again", url)
		} else if !errors.Is(err, natsembed.ErrNotRunning) {
			return "", err
		}
	}
	a.metrics = telemetry.NewMetrics()
	ne, err := a.startNATS(true)
	if err != nil {
		return "", err
	}
	store, js, err := a.tryCheckpoints(ctx, ne)
	if err != nil {
		return "", err
	}
	if err := a.buildPipelines(ctx, js, store, ne, source); err != nil {
		return "", err
	}
	return a.runners[source].p.Resync(ctx, reason)
}
