package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// report prints the tables.
func report(w io.Writer, res *Results, o options) {
	fmt.Fprintf(w, "\n# bridge benchmark, %s\n\n", res.Started.Format(time.RFC3339))
	m := res.Machine
	fmt.Fprintf(w, "machine: %d CPUs, %s, %s RAM, Linux %s; first touch of a fresh page %.1f µs\n", m.CPUs, m.CPUModel, m.MemTotal, m.Kernel, m.FirstTouchNs/1e3)
	fmt.Fprintf(w, "versions: postgres %s, nats-server %s, %s, bridge %s, %s\n",
		res.Versions["postgres"], res.Versions["nats-server"], res.Versions["natscli"], res.Versions["bridge"], res.Versions["go"])
	if src := res.Versions["source"]; src != "" {
		fmt.Fprintf(w, "source: git %s\n", src)
	}
	fmt.Fprintf(w, "command: %s\n", res.Command)
	for _, l := range res.Loads {
		fmt.Fprintf(w, "load %-6s: %d txns x %d rows = %d changes, committed in %s (%.0f changes/s)\n",
			l.Name, l.Txns, l.PerTxn, l.Changes, l.Elapsed.Round(time.Millisecond), float64(l.Changes)/l.Elapsed.Seconds())
	}
	us := func(d time.Duration, n int) string {
		if d == 0 || n == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", float64(d.Microseconds())/float64(n))
	}
	mib := func(b int64) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", float64(b)/(1<<20))
	}

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if len(res.Backlogs) > 0 || len(res.Decodes) > 0 {
		fmt.Fprintf(w, "\n## Backlogs (waiting in the slot before the consumer starts)\n\n")
		fmt.Fprintln(tw, "workload\tconsumer\tchanges\twall s\tchanges/s\tvs decode\tvs JS async\tvs JS best\tbridge µs/chg\twalsender µs/chg\tnats-server µs/chg\tclient µs/chg\tcores\tpeak RSS MiB\tother cores\t")
		for _, wl := range []string{"single", "big"} {
			for _, d := range res.Decodes[wl] {
				name := "pg_recvlogical " + d.Plugin
				if strings.Contains(d.Plugin, "SQL") {
					name = "pg_logical_slot_get_binary_changes"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.0f\t\t\t\t\t%s\t\t%s\t\t\t%.2f\t\n", wl, name, d.Changes, d.Wall.Seconds(), d.Rate,
					us(d.Walsender, d.Changes), us(d.RecvLogical, d.Changes), d.Other)
			}
			for _, b := range res.Backlogs {
				if b.Workload != wl {
					continue
				}
				fmt.Fprintf(tw, "%s\tbridge %s%s\t%d\t%.2f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t\t%.2f\t%s\t%.2f\t\n", wl, b.Plugin, roundLabel(b.Round), b.Changes, b.Wall.Seconds(), b.Rate, ratio(b.VsDecode), ratio(b.VsJSAsync), ratio(b.VsJetStream),
					us(b.Bridge, b.Changes), us(b.Walsender, b.Changes), us(b.NATSServer, b.Changes), b.Cores, mib(b.PeakRSS), b.Other)
			}
			for _, b := range res.PipeBacklogs {
				if b.Workload != wl {
					continue
				}
				fmt.Fprintf(tw, "%s\tpipe %s%s\t%d\t%.2f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t\t%.2f\t%s\t%.2f\t\n", wl, b.Plugin, roundLabel(b.Round), b.Changes, b.Wall.Seconds(), b.Rate, ratio(b.VsDecode), ratio(b.VsJSAsync), ratio(b.VsJetStream),
					us(b.Bridge, b.Changes), us(b.Walsender, b.Changes), us(b.NATSServer, b.Changes), b.Cores, mib(b.PeakRSS), b.Other)
			}
			for _, b := range res.Backlogs {
				if b.Workload == wl && b.VsPipe > 0 {
					fmt.Fprintf(tw, "%s\tbridge ÷ pipe (%s%s)\t\t\t%.2f\t\t\t\t\t\t\t\t\t\t\t\n", wl, b.Plugin, roundLabel(b.Round), b.VsPipe)
				}
			}
			if m, ok := pipeMedians(res, wl); ok {
				fmt.Fprintf(tw, "%s\tmedian of %d rounds: bridge ÷ pipe\t\t\t%.2f\t\t\t\t\t\t%.2f\t\t\t\t\t\n", wl, m.rounds, m.rate, m.natsServer)
			}
		}
		tw.Flush()
	}
	readBack := func(who string, b Backlog) {
		ok := "OK"
		if !b.Verified.OK(b.Changes) || b.StoredAfter != uint64(b.Changes) {
			ok = "FAILED"
		}
		fmt.Fprintf(w, "%s %s %s%s: first message stored %.2fs after start, then %.0f changes/s; mean payload %.0f B + headers %.0f B; read back: %d msgs, %d dup, %d out of order: %s\n",
			who, b.Plugin, b.Workload, roundLabel(b.Round), b.FirstStored.Seconds(), b.SteadyRate, b.Verified.PayloadBytes, b.Verified.HeaderBytes, b.Verified.Msgs, b.Verified.Duplicates, b.Verified.OutOfOrder, ok)
		if b.FirstCount > 0 && b.FirstCount < uint64(b.Changes) {
			fmt.Fprintf(w, "  %s CPU: %.0f ms until %d stored (start-up), then %s µs/chg for the other %d\n",
				who, float64(b.BridgeAtFirst)/1e6, b.FirstCount, us(b.Bridge-b.BridgeAtFirst, b.Changes-int(b.FirstCount)), b.Changes-int(b.FirstCount))
		}
		if ft := res.Machine.FirstTouchNs; ft > 0 && b.Changes > 0 {
			perChg := func(faults int64) string { return fmt.Sprintf("%.2f", float64(faults)*ft/1e3/float64(b.Changes)) }
			fmt.Fprintf(w, "  page faults: %s %d (~%s µs/chg at %.1f µs each), nats-server %d (~%s µs/chg)\n",
				who, b.BridgeFaults, perChg(b.BridgeFaults), ft/1e3, b.NATSServerFaults, perChg(b.NATSServerFaults))
		}
		if b.CPUProfile != "" {
			fmt.Fprintf(w, "  profiles: %s %s\n", b.CPUProfile, b.AllocProfile)
		}
	}
	for _, b := range res.Backlogs {
		readBack("bridge", b)
	}
	for _, b := range res.PipeBacklogs {
		readBack("pipe", b)
	}
	if len(res.JS) > 0 {
		j0 := res.JS[0]
		fmt.Fprintf(w, "\n## JetStream ingest (nats bench js pub, msgs of %d B, Nats-Msg-Id each, %d bridge headers, file storage, R1, at each backlog's size)\n\n", j0.Size, j0.Headers)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "msgs\tmode\tmsgs/s\tnats-server µs/msg\tclient µs/msg\tstored\tother cores\t")
		for _, j := range res.JS {
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%s\t%s\t%d\t%.2f\t\n", j.Msgs, j.Mode, j.Rate, us(j.NATSServer, j.Msgs), us(j.Client, j.Msgs), j.Stored, j.Other)
		}
		tw.Flush()
	}
	if l := res.Live; l != nil {
		fmt.Fprintf(w, "\n## Live: %d changes/s target (%.0f achieved), %d single-row transactions\n\n", l.Rate, l.Achieved, l.Changes)
		ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "latency commit→stored\tp50 ms\tp99 ms\tp99.9 ms\tmax ms\tbridge µs/chg\twalsender µs/chg\tnats-server µs/chg\twriter backend µs/chg\tpeak RSS MiB\tother cores\t")
		fmt.Fprintf(tw, "%d samples\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t\n", l.Latency.N, ms(l.Latency.P50), ms(l.Latency.P99), ms(l.Latency.P999), ms(l.Latency.Max),
			us(l.Bridge, l.Changes), us(l.Walsender, l.Changes), us(l.NATSServer, l.Changes), us(l.Writer, l.Changes), mib(l.PeakRSS), l.Other)
		for i, q := range l.ByQuarter {
			fmt.Fprintf(tw, "quarter %d\t%s\t%s\t%s\t%s\t\t\t\t\t\t\t\n", i+1, ms(q.P50), ms(q.P99), ms(q.P999), ms(q.Max))
		}
		if l.WarmupChanges > 0 {
			q := l.Warmup
			fmt.Fprintf(tw, "warm-up before it (%d, new stream)\t%s\t%s\t%s\t%s\t\t\t\t\t\t\t\n", l.WarmupChanges, ms(q.P50), ms(q.P99), ms(q.P999), ms(q.Max))
		}
		if pl := res.PipeLive; pl != nil {
			fmt.Fprintf(tw, "pipe: %d samples\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t\n", pl.Latency.N, ms(pl.Latency.P50), ms(pl.Latency.P99), ms(pl.Latency.P999), ms(pl.Latency.Max),
				us(pl.Bridge, pl.Changes), us(pl.Walsender, pl.Changes), us(pl.NATSServer, pl.Changes), us(pl.Writer, pl.Changes), mib(pl.PeakRSS), pl.Other)
			if pl.WarmupChanges > 0 {
				q := pl.Warmup
				fmt.Fprintf(tw, "pipe warm-up before it (%d, new stream)\t%s\t%s\t%s\t%s\t\t\t\t\t\t\t\n", pl.WarmupChanges, ms(q.P50), ms(q.P99), ms(q.P999), ms(q.Max))
			}
		}
		tw.Flush()
		ok := "OK"
		if !l.Verified.OK(l.WarmupChanges + l.Changes) {
			ok = "FAILED"
		}
		fmt.Fprintf(w, "read back: %d msgs, %d dup, %d out of order: %s\n", l.Verified.Msgs, l.Verified.Duplicates, l.Verified.OutOfOrder, ok)
		if pl := res.PipeLive; pl != nil {
			ok := "OK"
			if !pl.Verified.OK(pl.WarmupChanges + pl.Changes) {
				ok = "FAILED"
			}
			when := "after"
			if o.livePipeFirst {
				when = "before"
			}
			fmt.Fprintf(w, "pipe, the same load %s the bridge (%.0f changes/s achieved): read back %d msgs, %d dup, %d out of order: %s\n",
				when, pl.Achieved, pl.Verified.Msgs, pl.Verified.Duplicates, pl.Verified.OutOfOrder, ok)
		}
		ft := time.Duration(res.Machine.FirstTouchNs)
		fmt.Fprintf(w, "page faults during the run (each ~%.1f µs here): bridge %d (%s ms), walsender %d (%s ms), nats-server %d (%s ms)\n", res.Machine.FirstTouchNs/1e3,
			l.BridgeFaults, ms(time.Duration(l.BridgeFaults)*ft), l.WalsenderFaults, ms(time.Duration(l.WalsenderFaults)*ft), l.NATSServerFaults, ms(time.Duration(l.NATSServerFaults)*ft))
	}
	if d := res.LiveDecode; d != nil {
		fmt.Fprintf(w, "pg_recvlogical pgoutput following the same live load (%d changes): walsender %s µs/chg, pg_recvlogical %s µs/chg, writer backend %s µs/chg\n",
			d.Changes, us(d.Walsender, d.Changes), us(d.RecvLogical, d.Changes), us(d.Writer, d.Changes))
	}
	fmt.Fprint(w, reportOneBig(res))
	fmt.Fprintf(w, "\nvs decode: the bridge's rate over pg_recvlogical's with the same plugin on the same backlog; vs JS: over nats bench js pub's best async\nmode (what the sink does) and best mode overall, publishing as many messages as the backlog has changes. cores: CPU of bridge + walsender + nats-server per second of wall\ntime; with 2 cores, 2 / (sum of the three µs/chg) is the rate this machine can reach at those costs.\nother cores: CPU the machine spent during a measurement beyond the processes it accounts for (and the\nbenchmark's own polling); above ~0.2 something else shared the cores and the row is suspect.\n")
	if len(res.PipeBacklogs) > 0 || res.PipeLive != nil {
		fmt.Fprintf(w, "pipe: bench/cmd/pipe, the straightforward pglogrepl → JetStream pipe (async publish, message ids, KV checkpoint every\n1s, no fence) on a slot of its own; in its rows the bridge columns (µs/chg, peak RSS) are the pipe process's.\nbridge ÷ pipe: the bridge's rate over the pipe's on the same backlog.\n")
	}
	for _, f := range res.Failures {
		fmt.Fprintf(w, "FAILED: %s\n", f)
	}
	fmt.Fprintln(w)
}

// ratio prints a ratio, "-" when there was nothing to relate to (its
// phase was not run).
func ratio(r float64) string {
	if r == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", r)
}

// roundLabel is " #k" for round k of -rounds, "" when there is one.
func roundLabel(k int) string {
	if k == 0 {
		return ""
	}
	return fmt.Sprintf(" #%d", k)
}

// pipeMedian is the median over -rounds of the bridge's (pgoutput) rate
// and nats-server CPU per change over the pipe's, round by round.
type pipeMedian struct {
	rounds           int
	rate, natsServer float64
}

// pipeMedians is workload wl's pipeMedian, false without two rounds or more.
func pipeMedians(res *Results, wl string) (pipeMedian, bool) {
	var rates, ns []float64
	for _, b := range res.Backlogs {
		if b.Workload != wl || b.Round == 0 || b.VsPipe == 0 {
			continue
		}
		rates = append(rates, b.VsPipe)
		for _, p := range res.PipeBacklogs {
			if p.Workload == wl && p.Round == b.Round && p.NATSServer > 0 {
				ns = append(ns, float64(b.NATSServer)/float64(p.NATSServer))
			}
		}
	}
	if len(rates) < 2 {
		return pipeMedian{}, false
	}
	return pipeMedian{rounds: len(rates), rate: median(rates), natsServer: median(ns)}, true
}

// median of xs (the mean of the middle two for an even count), 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}
