// The pipe phase: bench/cmd/pipe, the straightforward pglogrepl →
// JetStream pipe, over the same backlogs and live load as the bridge.

package main

import (
	"context"
	"path/filepath"
	"strings"

	"github.com/bridgecdc/bridge/bench"
)

// startPipe returns a function that starts the pipe binary on slot into
// stream (subjects <subject>.>, created by the pipe), with its checkpoint
// under key name in the bucket pipe_checkpoints and name as its producer,
// logging to pipe-<name>.log in the scratch directory.
func (r *runner) startPipe(name, slot, stream, subject string) func() (*bench.Proc, error) {
	args := []string{"-dsn", r.pg.Server.DSN(""), "-slot", slot, "-publication", bench.Publication,
		"-nats", r.ns.URL(), "-stream", stream, "-prefix", subject,
		"-bucket", "pipe_checkpoints", "-key", name, "-producer", "pipe_" + name}
	return func() (*bench.Proc, error) {
		return bench.StartProc("pipe", r.o.pipeBin, args, filepath.Join(r.work, "pipe-"+name+".log"))
	}
}

// pipeBacklog measures the pipe over workload w's backlog of n changes
// waiting in slot, as bridgeBacklog measures the bridge (round: the same).
func (r *runner) pipeBacklog(ctx context.Context, w, slot string, n, round int) (Backlog, error) {
	b := Backlog{Workload: w, Plugin: "pgoutput", Consumer: "pipe", Changes: n, Round: round}
	name := roundName(w, round)
	stream := "PIPE_" + strings.ToUpper(name)
	logf("pipe: backlog %s, %d changes", name, n)
	if err := r.measureBacklog(ctx, &b, "pipe", slot, stream, r.startPipe(name, slot, stream, "pipe."+name), nil); err != nil {
		return b, err
	}
	bench.DeleteStream(ctx, r.js, stream)
	return b, nil
}
