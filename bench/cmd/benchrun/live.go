// The live phase: the bridge (then, with phase pipe, the pipe) following
// writes at a fixed rate, and its latency from commit to stored.

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/bridgecdc/bridge/bench"
)

func (r *runner) live(ctx context.Context) error {
	o := r.o
	if o.has("decode") {
		// The Postgres side of the same live stream with pg_recvlogical as
		// the consumer, for half as long: what the walsender costs per change
		// when every transaction arrives on its own.
		slot := "bench_live_pgoutput"
		if err := r.pg.CreateSlot(ctx, slot, "pgoutput"); err != nil {
			return err
		}
		logf("pg_recvlogical: live, %d changes/s for %s", o.liveRate, o.liveFor/2)
		r.quiet()
		d, err := r.pg.RecvLogicalLive(ctx, slot, func() (int, time.Duration, error) {
			n, _, writer, err := r.pg.WriteAtRate(ctx, o.liveRate, o.liveFor/2)
			return n, writer, err
		})
		if err != nil {
			return err
		}
		r.res.LiveDecode = &d
		_ = r.pg.DropSlot(ctx, slot)
	}
	// The bridge, then the pipe; -live-pipe-first swaps them, so that the
	// pipe meets the nats-server that has not stored anything yet.
	runs := []func(context.Context) error{r.bridgeLive}
	if o.has("pipe") {
		runs = append(runs, r.pipeLive)
		if o.livePipeFirst {
			runs[0], runs[1] = runs[1], runs[0]
		}
	}
	for _, run := range runs {
		if err := run(ctx); err != nil {
			return err
		}
	}
	return nil
}

// pipeLive is the pipe's live run: the same load again, followed by the
// pipe on a slot and stream of its own, into r.res.PipeLive.
func (r *runner) pipeLive(ctx context.Context) error {
	o := r.o
	slot, stream := "bench_live_pipe", "PIPE_LIVE"
	if err := r.pg.CreateSlot(ctx, slot, "pgoutput"); err != nil {
		return err
	}
	defer r.pg.DropSlot(ctx, slot)
	logf("pipe: live, %d changes/s for %s", o.liveRate, o.liveFor)
	l, err := r.measureLive(ctx, "pipe", slot, stream, r.startPipe("live", slot, stream, "pipe.live"), "", "")
	if err != nil {
		return err
	}
	r.res.PipeLive = l
	return nil
}

// bridgeLive is the bridge's live run, on a slot and stream of its own,
// into r.res.Live.
func (r *runner) bridgeLive(ctx context.Context) error {
	o := r.o
	slot := "bench_live_bridge"
	if err := r.pg.CreateSlot(ctx, slot, "pgoutput"); err != nil {
		return err
	}
	defer r.pg.DropSlot(ctx, slot)
	stream := "BENCH_LIVE"
	cfg := bench.BridgeConfig{Name: "bench_live", Slot: slot, Stream: stream, Subject: "bench.live",
		DSN: r.pg.Server.DSN(""), NATSURL: r.ns.URL(), DataDir: filepath.Join(r.work, "data_live")}
	path, err := cfg.Write(r.work)
	if err != nil {
		return err
	}
	logf("bridge: live, %d changes/s for %s", o.liveRate, o.liveFor)
	bin := o.bridgeBin
	env := append([]string(nil), o.bridgeEnv...)
	var cpuProfile string
	if o.profile != "" {
		bin = o.profBin
		_ = os.MkdirAll(o.profile, 0o755)
		cpuProfile = filepath.Join(o.profile, "cpu-live.pprof")
		_ = os.Remove(cpuProfile)
		env = append(env, "BENCH_CPUPROFILE="+cpuProfile, "BENCH_MEMPROFILE="+filepath.Join(o.profile, "allocs-live.pprof"))
	}
	start := func() (*bench.Proc, error) {
		return bench.StartBridge(bin, path, filepath.Join(r.work, "bridge-live.log"), env...)
	}
	l, err := r.measureLive(ctx, "bridge", slot, stream, start, cpuProfile, o.latencyOut)
	if err != nil {
		return err
	}
	r.res.Live = l
	return nil
}

// measureLive starts the consumer that start starts (who: "bridge" or
// "pipe") on slot, writes the warm-up and then the measured run at
// -live-rate while it follows into stream, and returns the CPU of it, the
// walsender, nats-server and the writer's backend over the measured run and
// every change's latency from commit to stored, read back from stream
// (which it then deletes). With cpuProfile the consumer is sent SIGUSR1
// before it stops, to write that profile; with dump every latency is
// written there (-latency-dump).
func (r *runner) measureLive(ctx context.Context, who, slot, stream string, start func() (*bench.Proc, error), cpuProfile, dump string) (*Live, error) {
	o := r.o
	p, err := start()
	if err != nil {
		return nil, err
	}
	defer p.Stop(30 * time.Second)
	ws, err := r.pg.WaitSlotPID(ctx, slot, time.Minute, func() bool { return p.Exited() == nil })
	if err != nil {
		if e := p.Exited(); e != nil {
			return nil, e
		}
		return nil, err
	}
	time.Sleep(time.Second) // past the start-up
	r.quiet()
	warm := 0
	if o.liveWarmup > 0 {
		logf("%s: live warm-up, %d changes/s for %s into the new stream (reported apart)", who, o.liveRate, o.liveWarmup)
		if warm, _, _, err = r.pg.WriteAtRate(ctx, o.liveRate, o.liveWarmup); err != nil {
			return nil, err
		}
	}
	win := bench.StartWindow()
	self0, _ := bench.ReadCPU(os.Getpid())
	b0, _ := bench.ReadCPU(p.PID())
	w0, _ := bench.ReadCPU(ws)
	n0, _ := bench.ReadCPU(r.ns.PID())
	n, took, writer, err := r.pg.WriteAtRate(ctx, o.liveRate, o.liveFor)
	if err != nil {
		return nil, err
	}
	if _, err := bench.WaitStored(ctx, r.js, stream, warm+n, time.Minute, r.o.poll, p.Exited); err != nil {
		return nil, err
	}
	l := &Live{Rate: o.liveRate, Changes: n, Achieved: float64(n) / took.Seconds(), WarmupChanges: warm}
	b1, _ := bench.ReadCPU(p.PID())
	w1, _ := bench.ReadCPU(ws)
	n1, _ := bench.ReadCPU(r.ns.PID())
	self1, _ := bench.ReadCPU(os.Getpid())
	l.Bridge, l.Walsender, l.NATSServer, l.Writer = b1.Self-b0.Self, w1.Self-w0.Self, n1.Self-n0.Self, writer
	l.BridgeFaults, l.WalsenderFaults, l.NATSServerFaults = b1.Faults-b0.Faults, w1.Faults-w0.Faults, n1.Faults-n0.Faults
	l.Other = win.Other(l.Bridge + l.Walsender + l.NATSServer + l.Writer + self1.Self - self0.Self)
	l.PeakRSS, _ = bench.PeakRSS(p.PID())
	if cpuProfile != "" {
		_ = p.Signal(syscall.SIGUSR1) // the profile covers start-up and the whole live run
		waitFile(cpuProfile, 10*time.Second)
		l.CPUProfile = cpuProfile
	}
	if err := p.Stop(30 * time.Second); err != nil {
		r.fail("%s live: stopping: %v", who, err)
	}
	v, err := bench.Verify(ctx, r.js, stream, true)
	if err != nil {
		return nil, err
	}
	l.Verified = v
	all := v.Latencies
	if err := l.summarize(all); err != nil {
		return nil, fmt.Errorf("%s %w", who, err)
	}
	if f := dump; f != "" {
		var sb strings.Builder
		for _, x := range all { // warm-up first: the stream from its first message
			fmt.Fprintln(&sb, x.Nanoseconds())
		}
		if err := os.WriteFile(f, []byte(sb.String()), 0o644); err != nil {
			r.fail("live: writing -latency-dump: %v", err)
		}
	}
	if !v.OK(warm + n) {
		r.fail("%s live: stream holds %d messages (want %d): %d duplicates, %d out of order, %d bad ids",
			who, v.Msgs, warm+n, v.Duplicates, v.OutOfOrder, v.BadIDs)
	}
	logf("%s live: %d changes, latency p50 %s p99 %s p99.9 %s (warm-up, %d changes: p99 %s, max %s)", who, n, l.Latency.P50, l.Latency.P99, l.Latency.P999,
		warm, l.Warmup.P99, l.Warmup.Max)
	bench.DeleteStream(ctx, r.js, stream)
	return l, nil
}

// summarize sets l's latency figures from every change's latency in
// stream (commit) order: the first l.WarmupChanges are the warm-up, the
// next l.Changes the measured run, split in quarters too.
func (l *Live) summarize(lat []time.Duration) error {
	warm := l.WarmupChanges
	if len(lat) != warm+l.Changes {
		return fmt.Errorf("live: %d latencies read back for %d changes (%d warm-up)", len(lat), warm+l.Changes, warm)
	}
	l.Warmup = bench.Percentiles{}
	if warm > 0 {
		l.Warmup = bench.Percentile(lat[:warm])
	}
	run := lat[warm:]
	l.Latency = bench.Percentile(run)
	l.ByQuarter = l.ByQuarter[:0]
	for q := 0; q < 4; q++ {
		lo, hi := q*len(run)/4, (q+1)*len(run)/4
		l.ByQuarter = append(l.ByQuarter, bench.Percentile(run[lo:hi]))
	}
	return nil
}
