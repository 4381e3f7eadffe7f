// The js phase: JetStream's own ingest rate, `nats bench js pub` in each mode
// at each backlog's size.

package main

import (
	"context"

	"github.com/bridgecdc/bridge/bench"
)

func (r *runner) jetstream(ctx context.Context) error {
	size := r.o.jsSize
	var headers map[string][]string
	if r.sample != nil {
		headers = r.sample.Header
		if size == 0 {
			size = r.size
		}
	}
	if size == 0 {
		size = 300
	}
	for _, n := range r.o.jsCounts() {
		for _, m := range bench.JSModes {
			logf("nats bench js pub %s: %d messages of %d bytes", m.Name, n, size)
			r.quiet()
			win := bench.StartWindow()
			jr, err := bench.RunJSBench(ctx, r.o.natsBin, r.ns, r.js, m, n, size, headers, r.work)
			if err != nil {
				return err
			}
			jr.Other = win.Other(jr.NATSServer + jr.Client)
			logf("  %.0f msgs/s, stored %d", jr.Rate, jr.Stored)
			if jr.Stored != uint64(jr.Msgs) {
				r.fail("nats bench %s: stream holds %d messages, want %d", m.Name, jr.Stored, jr.Msgs)
			}
			r.res.JS = append(r.res.JS, jr)
		}
	}
	return nil
}

// jsCounts is how many messages each nats bench run publishes: -js-msgs
// when given, else each backlog's change count. nats-server's cost per
// message grows with the stream and its duplicate window (at 1M messages
// `nats bench js pub async` spends a third more per message than at 200k
// here), so a backlog is compared with JetStream ingesting as many.
func (o options) jsCounts() []int {
	if o.jsMsgs > 0 {
		return []int{o.jsMsgs}
	}
	if big := o.bigTxns * o.bigRows; big != o.single {
		return []int{o.single, big}
	}
	return []int{o.single}
}
