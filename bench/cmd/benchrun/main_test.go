package main

import (
	"strings"
	"testing"
	"time"

	"github.com/bridgecdc/bridge/bench"
)

// TestJSCounts runs nats bench at each backlog's size unless -js-msgs
// says otherwise.
func TestJSCounts(t *testing.T) {
	for _, tc := range []struct {
		o    options
		want []int
	}{
		{options{single: 200000, bigTxns: 10, bigRows: 100000}, []int{200000, 1000000}},
		{options{single: 60000, bigTxns: 2, bigRows: 30000}, []int{60000}},
		{options{single: 200000, bigTxns: 10, bigRows: 100000, jsMsgs: 5000}, []int{5000}},
	} {
		got := tc.o.jsCounts()
		if len(got) != len(tc.want) {
			t.Fatalf("%+v: got %v, want %v", tc.o, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("%+v: got %v, want %v", tc.o, got, tc.want)
			}
		}
	}
}

// TestRatiosSameSize relates each backlog to the nats bench runs of its
// own size: the big backlog to the 1M runs, the single one to the 200k ones.
func TestRatiosSameSize(t *testing.T) {
	res := &Results{
		JS: []bench.JSRun{
			{Mode: "async window 4096", Msgs: 200000, Rate: 100000},
			{Mode: "fast batch 500", Msgs: 200000, Rate: 200000},
			{Mode: "async window 4096", Msgs: 1000000, Rate: 50000},
			{Mode: "fast batch 500", Msgs: 1000000, Rate: 80000},
		},
		Backlogs: []Backlog{
			{Workload: "single", Plugin: "pgoutput", Changes: 200000, Rate: 40000},
			{Workload: "big", Plugin: "pgoutput", Changes: 1000000, Rate: 40000},
		},
	}
	r := &runner{res: res}
	r.ratios()
	for _, tc := range []struct {
		b           Backlog
		msgs        int
		async, best float64
	}{
		{res.Backlogs[0], 200000, 0.4, 0.2},
		{res.Backlogs[1], 1000000, 0.8, 0.5},
	} {
		if tc.b.JSMsgs != tc.msgs || tc.b.VsJSAsync != tc.async || tc.b.VsJetStream != tc.best {
			t.Errorf("%s: compared with %d msgs, async %.2f, best %.2f; want %d, %.2f, %.2f",
				tc.b.Workload, tc.b.JSMsgs, tc.b.VsJSAsync, tc.b.VsJetStream, tc.msgs, tc.async, tc.best)
		}
	}
}

func TestLiveWarmupApart(t *testing.T) {
	// 10 warm-up changes stalled 40 ms, then 100 at 2 ms, the last
	// quarter's at 3 ms.
	var lat []time.Duration
	for i := 0; i < 10; i++ {
		lat = append(lat, 40*time.Millisecond)
	}
	for i := 0; i < 100; i++ {
		d := 2 * time.Millisecond
		if i >= 75 {
			d = 3 * time.Millisecond
		}
		lat = append(lat, d)
	}
	l := &Live{Changes: 100, WarmupChanges: 10}
	if err := l.summarize(lat); err != nil {
		t.Fatal(err)
	}
	if l.Warmup.N != 10 || l.Warmup.Max != 40*time.Millisecond {
		t.Errorf("warm-up = %+v, want 10 changes at 40ms", l.Warmup)
	}
	if l.Latency.N != 100 || l.Latency.Max != 3*time.Millisecond || l.Latency.P50 != 2*time.Millisecond {
		t.Errorf("measured = %+v, want 100 changes, p50 2ms, max 3ms", l.Latency)
	}
	if len(l.ByQuarter) != 4 || l.ByQuarter[2].Max != 2*time.Millisecond || l.ByQuarter[3].P50 != 3*time.Millisecond {
		t.Errorf("quarters = %+v", l.ByQuarter)
	}
	// Without a warm-up everything is measured.
	l = &Live{Changes: 110}
	if err := l.summarize(lat); err != nil {
		t.Fatal(err)
	}
	if l.Warmup.N != 0 || l.Latency.Max != 40*time.Millisecond {
		t.Errorf("no warm-up: warm-up %+v, measured %+v", l.Warmup, l.Latency)
	}
	// A count that does not add up is an error, not a figure.
	if err := (&Live{Changes: 100, WarmupChanges: 5}).summarize(lat); err == nil {
		t.Error("110 latencies for 105 changes: no error")
	}
}

// TestCheckRefusesMeaninglessCounts: -rounds 0 or a negative size is an
// error naming the flag and its variable, not a quiet default.
func TestCheckRefusesMeaninglessCounts(t *testing.T) {
	ok := options{rounds: 1, liveRate: 2000}
	if err := ok.check(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	for _, tc := range []struct {
		o    options
		want string
	}{
		{options{rounds: 0, liveRate: 2000}, "-rounds (or BENCH_ROUNDS) must be at least 1, got 0"},
		{options{rounds: -2, liveRate: 2000}, "-rounds (or BENCH_ROUNDS) must be at least 1, got -2"},
		{options{rounds: 1, liveRate: 0}, "-live-rate (or BENCH_LIVE_RATE) must be at least 1, got 0"},
		{options{rounds: 1, liveRate: 1, single: -5}, "-single (or BENCH_SINGLE) must be at least 0, got -5"},
		{options{rounds: 1, liveRate: 1, natsWarmup: -1}, "-nats-warmup (or BENCH_NATS_WARMUP) must be at least 0, got -1"},
	} {
		err := tc.o.check()
		if err == nil || err.Error() != tc.want {
			t.Errorf("%+v: got %v, want %q", tc.o, err, tc.want)
		}
	}
}

// TestPrintErrPrefixesEachLine: every line of a joined error names the
// command, not only the first.
func TestPrintErrPrefixesEachLine(t *testing.T) {
	var out strings.Builder
	printErr(&out, options{rounds: 0, liveRate: 0}.check())
	want := "benchrun: -live-rate (or BENCH_LIVE_RATE) must be at least 1, got 0\nbenchrun: -rounds (or BENCH_ROUNDS) must be at least 1, got 0\n"
	if out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}

// TestReportWithoutComparisons: a backlog run without the decode and
// JetStream phases prints "-" in their ratio columns, not 0.00.
func TestReportWithoutComparisons(t *testing.T) {
	res := &Results{Backlogs: []Backlog{{Workload: "single", Plugin: "pgoutput", Changes: 1000, Rate: 5000, Wall: time.Second}}}
	var out strings.Builder
	report(&out, res, options{})
	var row string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "bridge pgoutput") && row == "" {
			row = l // the table's row, before the read-back lines
		}
	}
	if row == "" {
		t.Fatalf("no bridge row in:\n%s", out.String())
	}
	// workload, "bridge pgoutput", changes, wall, rate, then the ratios
	// to decode, JS async and JS best.
	f := strings.Fields(row)
	if len(f) < 9 || f[6] != "-" || f[7] != "-" || f[8] != "-" {
		t.Errorf("the ratio columns must read -, got %q", row)
	}
}
