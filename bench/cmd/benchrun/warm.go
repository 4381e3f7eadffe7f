package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bench"
)

// warmNATS publishes mb MiB into a scratch file stream of the new
// nats-server and deletes it, before the backlogs: the server's first
// stream grows its block buffers and dedupe map in memory new to the
// process, and on a VM where a page fault costs 10–15 µs that cost fell on
// whichever consumer went first (round 1 of -rounds). Warmed, the rounds
// compare like with like, as against a nats-server that has been running.
// The live phase alone (-only live) is not warmed: its target is a new
// server's.
func (r *runner) warmNATS(ctx context.Context, mb int) error {
	if mb <= 0 {
		return nil
	}
	const stream, size = "BENCH_WARMUP", 512
	if _, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"benchwarmup.>"}, Storage: jetstream.FileStorage}); err != nil {
		return fmt.Errorf("warming nats-server: creating stream %s: %w", stream, err)
	}
	before, _ := bench.ReadCPU(r.ns.PID())
	start := time.Now()
	n := mb << 20 / size
	data := make([]byte, size)
	for i := range n {
		m := &nats.Msg{Subject: "benchwarmup.t", Data: data, Header: nats.Header{}}
		m.Header.Set(jetstream.MsgIDHeader, "warm:"+strconv.Itoa(i))
		for {
			_, err := r.js.PublishMsgAsync(m)
			if err == nil {
				break
			}
			// A busy server (its CPU shared, or limited) lets the window
			// fill for longer than the client's stall wait: wait for the
			// acks, then publish the message again.
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return fmt.Errorf("warming nats-server: publishing message %d of %d: %w", i+1, n, err)
			}
			if err := r.warmAcked(ctx); err != nil {
				return err
			}
		}
	}
	if err := r.warmAcked(ctx); err != nil {
		return err
	}
	if err := r.js.DeleteStream(ctx, stream); err != nil {
		return fmt.Errorf("warming nats-server: deleting stream %s: %w", stream, err)
	}
	after, _ := bench.ReadCPU(r.ns.PID())
	logf("warmed nats-server: %d messages (%d MiB) into a scratch stream in %s, %d page faults",
		n, mb, time.Since(start).Round(time.Millisecond), after.Faults-before.Faults)
	return nil
}

// warmAcked waits up to two minutes for every warm-up message published to
// be acknowledged.
func (r *runner) warmAcked(ctx context.Context) error {
	select {
	case <-r.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("warming nats-server: %d messages not acknowledged after 2m", r.js.PublishAsyncPending())
	}
}
