// The onebig phase: one large transaction committed while the bridge
// follows, from COMMIT to its first and last message stored.

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/bridgecdc/bridge/bench"
)

// OneBig is one transaction of Rows inserted rows, committed while the
// bridge (pgoutput) follows the database.
type OneBig struct {
	Rows int `json:"rows"`
	// Commit is how long the INSERT and its COMMIT took in Postgres.
	Commit time.Duration `json:"commit_ns"`
	// First and All run from COMMIT returning to the first and the last
	// message stored (the server's stored timestamps).
	First time.Duration `json:"first_stored_ns"`
	All   time.Duration `json:"all_stored_ns"`
	// JSAlone is Rows at the best nats bench rate measured at this run's
	// message count and size (0: the js phase did not run).
	JSAlone  time.Duration  `json:"jetstream_alone_ns"`
	Bridge   time.Duration  `json:"bridge_cpu_ns"` // from COMMIT to the last message
	PeakRSS  int64          `json:"bridge_peak_rss_bytes"`
	Verified bench.Verified `json:"verified"`
}

func (r *runner) oneBig(ctx context.Context) error {
	o := r.o
	slot := "bench_onebig_bridge"
	if err := r.pg.CreateSlot(ctx, slot, "pgoutput"); err != nil {
		return err
	}
	defer r.pg.DropSlot(ctx, slot)
	stream := "BENCH_ONEBIG"
	cfg := bench.BridgeConfig{Name: "bench_onebig", Slot: slot, Stream: stream, Subject: "bench.onebig",
		DSN: r.pg.Server.DSN(""), NATSURL: r.ns.URL(), DataDir: filepath.Join(r.work, "data_onebig")}
	path, err := cfg.Write(r.work)
	if err != nil {
		return err
	}
	p, err := bench.StartBridge(o.bridgeBin, path, filepath.Join(r.work, "bridge-onebig.log"), o.bridgeEnv...)
	if err != nil {
		return err
	}
	defer p.Stop(30 * time.Second)
	if _, err := r.pg.WaitSlotPID(ctx, slot, time.Minute, func() bool { return p.Exited() == nil }); err != nil {
		if e := p.Exited(); e != nil {
			return e
		}
		return err
	}
	time.Sleep(time.Second) // past the start-up
	r.quiet()
	logf("bridge: one transaction of %d rows, committed while it follows", o.oneBigRows)
	b0, _ := bench.ReadCPU(p.PID())
	load, err := r.pg.LoadBig(ctx, 1, o.oneBigRows)
	if err != nil {
		return err
	}
	committed := time.Now()
	res := &OneBig{Rows: o.oneBigRows, Commit: load.Elapsed}
	within := max(3*time.Minute, time.Duration(o.oneBigRows/500)*time.Second)
	if _, err := bench.WaitStored(ctx, r.js, stream, o.oneBigRows, within, o.poll, p.Exited); err != nil {
		return err
	}
	b1, _ := bench.ReadCPU(p.PID())
	res.Bridge = b1.Self - b0.Self
	res.PeakRSS, _ = bench.PeakRSS(p.PID())
	if err := p.Stop(30 * time.Second); err != nil {
		r.fail("bridge onebig: stopping: %v", err)
	}
	v, err := bench.Verify(ctx, r.js, stream, false)
	if err != nil {
		return err
	}
	res.Verified = v
	if !v.OK(o.oneBigRows) {
		r.fail("bridge onebig: stream holds %d messages (want %d): %d duplicates, %d out of order, %d bad ids",
			v.Msgs, o.oneBigRows, v.Duplicates, v.OutOfOrder, v.BadIDs)
	}
	// The load's elapsed time ends when COMMIT returned, up to the
	// afterLoad bookkeeping, which is short beside these times.
	res.First, res.All = v.First.Sub(committed), v.Last.Sub(committed)
	best := 0.0
	for _, j := range r.res.JS {
		if j.Msgs == o.oneBigRows && j.Rate > best {
			best = j.Rate
		}
	}
	if best > 0 {
		res.JSAlone = time.Duration(float64(o.oneBigRows) / best * float64(time.Second))
	}
	logf("onebig: %d rows committed in %s; first message stored %s after COMMIT, all %s after (JetStream alone: %s); bridge CPU %s, peak RSS %d MiB",
		res.Rows, res.Commit.Round(time.Millisecond), res.First.Round(time.Millisecond), res.All.Round(time.Millisecond),
		res.JSAlone.Round(time.Millisecond), res.Bridge.Round(time.Millisecond), res.PeakRSS>>20)
	r.res.OneBig = res
	bench.DeleteStream(ctx, r.js, stream)
	return nil
}

// reportOneBig prints the onebig phase.
func reportOneBig(res *Results) string {
	b := res.OneBig
	if b == nil {
		return ""
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000) }
	s := fmt.Sprintf("\n## One transaction of %d rows committed while the bridge follows\n\n"+
		"COMMIT took %s; first message stored %s after COMMIT returned, the last %s after; bridge CPU %s (%.1f µs/chg), peak RSS %.0f MiB; read back: %d msgs, %d dup, %d out of order\n",
		b.Rows, ms(b.Commit), ms(b.First), ms(b.All), ms(b.Bridge), float64(b.Bridge.Nanoseconds())/1e3/float64(b.Rows), float64(b.PeakRSS)/(1<<20),
		b.Verified.Msgs, b.Verified.Duplicates, b.Verified.OutOfOrder)
	if b.JSAlone > 0 {
		s += fmt.Sprintf("JetStream alone (best nats bench mode, %d messages of the same size): %s; all stored / that = %.2f\n", b.Rows, ms(b.JSAlone), b.All.Seconds()/b.JSAlone.Seconds())
	}
	return s
}
