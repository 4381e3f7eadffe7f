// The decode and backlog phases: a workload loaded behind slots made before
// it, then read to its end by pg_recvlogical, by SQL decoding and by the
// bridge (and the pipe, bench/cmd/pipe).

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

func (r *runner) workload(ctx context.Context, w string, decode, backlog, w2j bool) error {
	o := r.o
	slots := map[string]string{"pgoutput": "bench_" + w + "_pgoutput", "wal2json": "bench_" + w + "_wal2json", "bridge": "bench_" + w + "_bridge",
		"bridge_w2j": "bench_" + w + "_bridge_w2j", "sql": "bench_" + w + "_sql", "pipe": "bench_" + w + "_pipe"}
	// Every consumer gets a slot of its own, made before the load, so each
	// reads the same backlog. For the js phase alone the bridge still runs
	// the single backlog to learn the message size.
	runBridge := backlog || (w == "single" && r.sample == nil && o.jsSize == 0 && o.has("js"))
	if runBridge {
		if err := r.pg.CreateSlot(ctx, slots["bridge"], "pgoutput"); err != nil {
			return err
		}
	}
	runPipe := backlog && o.has("pipe") // the straightforward pipe, on a slot of its own
	if runPipe {
		if err := r.pg.CreateSlot(ctx, slots["pipe"], "pgoutput"); err != nil {
			return err
		}
	}
	// -rounds: the bridge (pgoutput) and the pipe again on slots of their
	// own, made now so that they read the same backlog.
	rounds := 1
	if backlog {
		rounds = max(1, o.rounds)
	}
	for k := 2; k <= rounds; k++ {
		for _, who := range []string{"bridge", "pipe"} {
			if who == "pipe" && !runPipe {
				continue
			}
			if err := r.pg.CreateSlot(ctx, roundName(slots[who], k), "pgoutput"); err != nil {
				return err
			}
		}
	}
	w2jBridge := backlog && w2j // the bridge with its wal2json source too
	if w2jBridge {
		if err := r.pg.CreateSlot(ctx, slots["bridge_w2j"], "wal2json"); err != nil {
			return err
		}
	}
	if decode {
		for _, k := range []string{"pgoutput", "sql"} {
			if err := r.pg.CreateSlot(ctx, slots[k], "pgoutput"); err != nil {
				return err
			}
		}
		if w2j {
			if err := r.pg.CreateSlot(ctx, slots["wal2json"], "wal2json"); err != nil {
				return err
			}
		}
	}
	var load bench.Load
	var err error
	if w == "single" {
		logf("loading %d single-row transactions", o.single)
		load, err = r.pg.LoadSingle(ctx, o.single)
	} else {
		logf("loading %d transactions of %d rows", o.bigTxns, o.bigRows)
		load, err = r.pg.LoadBig(ctx, o.bigTxns, o.bigRows)
	}
	if err != nil {
		return err
	}
	logf("loaded %d changes in %s (WAL end %s)", load.Changes, load.Elapsed.Round(time.Millisecond), load.EndLSN)
	r.res.Loads = append(r.res.Loads, load)
	if decode {
		plugins := []string{"pgoutput"}
		if w2j {
			plugins = append(plugins, "wal2json")
		}
		for _, p := range plugins {
			r.quiet()
			win := bench.StartWindow()
			d, err := r.pg.RecvLogical(ctx, slots[p], p, load.EndLSN, load.Changes)
			if err != nil {
				return err
			}
			other := win.Other(d.Walsender + d.RecvLogical)
			logf("pg_recvlogical %s: %d changes in %s = %.0f changes/s (walsender CPU %s)", p, d.Changes, d.Wall.Round(time.Millisecond), d.Rate(), d.Walsender)
			r.res.Decodes[w] = append(r.res.Decodes[w], Decode{Decode: d, Rate: d.Rate(), Other: other})
			_ = r.pg.DropSlot(ctx, slots[p])
		}
		r.quiet()
		win := bench.StartWindow()
		d, err := r.pg.SQLDecode(ctx, slots["sql"], load.Changes)
		if err != nil {
			return err
		}
		other := win.Other(d.Walsender)
		logf("pg_logical_slot_get_binary_changes: %d changes in %s = %.0f changes/s", d.Changes, d.Wall.Round(time.Millisecond), d.Rate())
		r.res.Decodes[w] = append(r.res.Decodes[w], Decode{Decode: d, Rate: d.Rate(), Other: other})
		_ = r.pg.DropSlot(ctx, slots["sql"])
	}
	for k := 1; k <= rounds; k++ {
		// Odd rounds run the bridge first, even ones the pipe: whichever
		// goes second finds nats-server's memory faulted in already.
		order := []string{"bridge", "pipe"}
		if k%2 == 0 {
			order = []string{"pipe", "bridge"}
		}
		for _, who := range order {
			round := 0
			if rounds > 1 {
				round = k
			}
			switch {
			case who == "bridge" && runBridge:
				b, err := r.bridgeBacklog(ctx, w, "pgoutput", roundName(slots["bridge"], k), load.Changes, round)
				if err != nil {
					return err
				}
				r.res.Backlogs = append(r.res.Backlogs, b)
				_ = r.pg.DropSlot(ctx, roundName(slots["bridge"], k))
			case who == "pipe" && runPipe:
				b, err := r.pipeBacklog(ctx, w, roundName(slots["pipe"], k), load.Changes, round)
				if err != nil {
					return err
				}
				r.res.PipeBacklogs = append(r.res.PipeBacklogs, b)
				_ = r.pg.DropSlot(ctx, roundName(slots["pipe"], k))
			}
		}
	}
	if w2jBridge {
		b, err := r.bridgeBacklog(ctx, w, "wal2json", slots["bridge_w2j"], load.Changes, 0)
		if err != nil {
			return err
		}
		r.res.Backlogs = append(r.res.Backlogs, b)
		_ = r.pg.DropSlot(ctx, slots["bridge_w2j"])
	}
	return nil
}

// roundName is name for round k of -rounds: name itself for the first.
func roundName(name string, k int) string {
	if k <= 1 {
		return name
	}
	return fmt.Sprintf("%s_r%d", name, k)
}

// bridgeBacklog measures the bridge over workload w's backlog of n changes
// waiting in slot; round is its round of -rounds (0: the only one). Each
// round's bridge has a name, data directory and stream of its own.
func (r *runner) bridgeBacklog(ctx context.Context, w, plugin, slot string, n, round int) (Backlog, error) {
	b := Backlog{Workload: w, Plugin: plugin, Changes: n, Round: round}
	name := w
	if plugin != "pgoutput" {
		name = w + "_" + plugin
	}
	name = roundName(name, round)
	stream := "BENCH_" + strings.ToUpper(name)
	cfg := bench.BridgeConfig{Name: "bench_" + name, Slot: slot, Plugin: plugin, Stream: stream, Subject: "bench." + name,
		DSN: r.pg.Server.DSN(""), NATSURL: r.ns.URL(), DataDir: filepath.Join(r.work, "data_"+name)}
	path, err := cfg.Write(r.work)
	if err != nil {
		return b, err
	}
	bin := r.o.bridgeBin
	env := append([]string(nil), r.o.bridgeEnv...)
	if r.o.profile != "" {
		bin = r.o.profBin
		_ = os.MkdirAll(r.o.profile, 0o755)
		b.CPUProfile = filepath.Join(r.o.profile, "cpu-"+name+".pprof")
		b.AllocProfile = filepath.Join(r.o.profile, "allocs-"+name+".pprof")
		_ = os.Remove(b.CPUProfile)
		env = append(env, "BENCH_CPUPROFILE="+b.CPUProfile, "BENCH_MEMPROFILE="+b.AllocProfile,
			"BENCH_HEAPPROFILE="+filepath.Join(r.o.profile, "heap-"+name+".pprof"))
	}
	logf("bridge (%s): backlog %s, %d changes", plugin, name, n)
	start := func() (*bench.Proc, error) {
		return bench.StartBridge(bin, path, filepath.Join(r.work, "bridge-"+name+".log"), env...)
	}
	var beforeStop func(*bench.Proc)
	if r.o.profile != "" {
		beforeStop = func(p *bench.Proc) {
			_ = p.Signal(syscall.SIGUSR1)
			waitFile(b.CPUProfile, 10*time.Second)
		}
	}
	if err := r.measureBacklog(ctx, &b, "bridge", slot, stream, start, beforeStop); err != nil {
		return b, err
	}
	if w == "single" && r.sample == nil {
		s := b.Verified.Sample
		r.sample = &s
		r.size = int(b.Verified.PayloadBytes + 0.5)
	}
	bench.DeleteStream(ctx, r.js, stream)
	return b, nil
}

// measureBacklog measures the consumer that start starts (who: "bridge" or
// "pipe") over the backlog of b.Changes changes waiting in slot, into
// stream, and fills b: the time from its start until stream holds every
// change, the CPU of it, the slot's walsender and nats-server, its peak
// RSS, and what reading stream back finds (each change once, in order).
// beforeStop, when not nil, runs just before the consumer is stopped. A
// consumer that stores too few or too many messages is a failure of the
// run (r.fail), not an error; the caller deletes the stream.
func (r *runner) measureBacklog(ctx context.Context, b *Backlog, who, slot, stream string, start func() (*bench.Proc, error), beforeStop func(*bench.Proc)) error {
	w, n := b.Workload, b.Changes
	r.quiet()
	win := bench.StartWindow()
	nsBefore, err := bench.ReadCPU(r.ns.PID())
	if err != nil {
		return err
	}
	p, err := start()
	if err != nil {
		return err
	}
	defer p.Stop(30 * time.Second)
	alive := func() bool { return p.Exited() == nil }
	ws, err := r.pg.WaitSlotPID(ctx, slot, time.Minute, alive)
	if err != nil {
		if e := p.Exited(); e != nil {
			return e
		}
		return err
	}
	within := max(3*time.Minute, time.Duration(n/500)*time.Second)
	at, err := bench.WaitStoredFirst(ctx, r.js, stream, n, within, r.o.poll, p.Exited, func(got uint64) {
		if c, err := bench.ReadCPU(p.PID()); err == nil {
			b.BridgeAtFirst, b.FirstCount = c.Self, got
		}
	})
	if err != nil {
		return err
	}
	b.Wall = at.Sub(p.Start)
	b.Rate = float64(n) / b.Wall.Seconds()
	if c, err := bench.ReadCPU(p.PID()); err == nil {
		b.Bridge, b.BridgeFaults = c.Self, c.Faults
	}
	// The walsender serving the slot now: a source that reconnected early
	// has a later one than the first seen, which exited with little CPU
	// (the wal2json source starts again without numbers-as-text when the
	// installed wal2json does not know it, as Debian 12's 2.5 does not).
	if now := r.pg.SlotPID(ctx, slot); now != 0 && now != ws {
		if c, err := bench.ReadCPU(ws); err == nil {
			b.Walsender = c.Self
		}
		ws = now
	}
	if c, err := bench.ReadCPU(ws); err == nil {
		b.Walsender += c.Self
	}
	if c, err := bench.ReadCPU(r.ns.PID()); err == nil {
		b.NATSServer, b.NATSServerFaults = c.Self-nsBefore.Self, c.Faults-nsBefore.Faults
	}
	b.PeakRSS, _ = bench.PeakRSS(p.PID())
	b.Other = win.Other(b.Bridge + b.Walsender + b.NATSServer)
	b.Cores = float64(b.Bridge+b.Walsender+b.NATSServer) / float64(b.Wall)
	if beforeStop != nil {
		beforeStop(p)
	}
	if err := p.Stop(30 * time.Second); err != nil {
		r.fail("%s %s: stopping: %v", who, w, err)
	}
	logf("%s: %d changes stored %s after start = %.0f changes/s; reading the stream back", who, n, b.Wall.Round(time.Millisecond), b.Rate)
	time.Sleep(500 * time.Millisecond) // anything published late would show now
	b.StoredAfter, _ = bench.StreamMsgs(ctx, r.js, stream)
	v, err := bench.Verify(ctx, r.js, stream, false)
	if err != nil {
		return err
	}
	b.Verified = v
	if !v.First.IsZero() {
		b.FirstStored = v.First.Sub(p.Start)
		if d := v.Last.Sub(v.First); d > 0 {
			b.SteadyRate = float64(v.Msgs-1) / d.Seconds()
		}
	}
	if !v.OK(n) || b.StoredAfter != uint64(n) {
		r.fail("%s %s: stream holds %d messages (want %d): %d duplicates, %d out of order, %d bad ids",
			who, w, b.StoredAfter, n, v.Duplicates, v.OutOfOrder, v.BadIDs)
	}
	return nil
}
