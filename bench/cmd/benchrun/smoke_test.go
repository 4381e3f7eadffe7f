package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs the whole benchmark at a small size: every phase (decode,
// js, backlog, live, pipe) against its private Postgres, a nats-server
// process, natscli, the bridge binary and the pipe (bench/cmd/pipe), as
// ./scripts/bench.sh does. It asserts what the benchmark verifies (every
// change stored once, in order, in each backlog and in the live run, the
// bridge's and the pipe's) and that every phase produced its rows. It
// asserts no speed: figures of so small a run mean nothing. It runs two
// rounds of the backlogs (-rounds), so the repeated runs are covered too.
func TestSmoke(t *testing.T) {
	tools := benchTools(t)
	dir := t.TempDir()
	bridgeBin := filepath.Join(dir, "bridge")
	goCmd(t, "", "build", "-o", bridgeBin, "github.com/bridgecdc/bridge/cmd/bridge")
	pipeBin := filepath.Join(dir, "pipe")
	goCmd(t, "", "build", "-o", pipeBin, "github.com/bridgecdc/bridge/bench/cmd/pipe")
	out := filepath.Join(dir, "results.json")
	o := options{
		single: 300, bigTxns: 2, bigRows: 1500, liveRate: 500, liveFor: 2 * time.Second, liveWarmup: time.Second, pad: 16,
		bridgeBin: bridgeBin, pipeBin: pipeBin, natsBin: tools.nats, natsServerBin: tools.natsServer, // scratch in the temp dir, which the postgres OS user can reach
		only: "decode,js,backlog,live,pipe", jsonOut: out, poll: 10 * time.Millisecond, rounds: 2, natsWarmup: 1,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := run(ctx, o); err != nil {
		t.Fatalf("benchmark run: %v", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Failures) > 0 {
		t.Fatalf("failures: %v", res.Failures)
	}
	if res.Machine.FirstTouchNs <= 0 {
		t.Errorf("first-touch cost not measured: %v", res.Machine.FirstTouchNs)
	}
	want := map[string]int{"single": 300, "big": 3000}
	for _, w := range []string{"single", "big"} {
		plugins := map[string]bool{}
		for _, d := range res.Decodes[w] {
			plugins[d.Plugin] = true
			if d.Changes != want[w] || d.Rate <= 0 {
				t.Errorf("decode %s %s: %d changes at %.0f/s, want %d", w, d.Plugin, d.Changes, d.Rate, want[w])
			}
		}
		if !plugins["pgoutput"] || !plugins["wal2json"] {
			t.Errorf("decode %s: plugins %v, want pgoutput and wal2json", w, plugins)
		}
	}
	sizes := map[int]bool{}
	for _, j := range res.JS {
		sizes[j.Msgs] = true
		if j.Stored != uint64(j.Msgs) || j.Rate <= 0 {
			t.Errorf("nats bench %s: %d of %d stored, %.0f msgs/s", j.Mode, j.Stored, j.Msgs, j.Rate)
		}
	}
	if !sizes[300] || !sizes[3000] {
		t.Errorf("nats bench sizes %v, want each backlog's (300, 3000)", sizes)
	}
	got := map[string]bool{}
	for _, bl := range res.Backlogs {
		got[bl.Workload+"/"+bl.Plugin] = true
		v := bl.Verified
		if bl.Changes != want[bl.Workload] || v.Msgs != bl.Changes || v.Duplicates+v.OutOfOrder+v.BadIDs != 0 || bl.StoredAfter != uint64(bl.Changes) {
			t.Errorf("backlog %s/%s: %d changes, read back %+v, %d stored after the stop", bl.Workload, bl.Plugin, bl.Changes, v, bl.StoredAfter)
		}
		if bl.VsDecode <= 0 || bl.VsJetStream <= 0 || bl.Bridge <= 0 || bl.NATSServer <= 0 {
			t.Errorf("backlog %s/%s: ratios %.2f/%.2f, CPU bridge %s nats-server %s", bl.Workload, bl.Plugin, bl.VsDecode, bl.VsJetStream, bl.Bridge, bl.NATSServer)
		}
	}
	for _, k := range []string{"single/pgoutput", "single/wal2json", "big/pgoutput", "big/wal2json"} {
		if !got[k] {
			t.Errorf("no backlog row %s (have %v)", k, got)
		}
	}
	pipes := map[string]bool{}
	for _, bl := range res.PipeBacklogs {
		pipes[bl.Workload] = true
		v := bl.Verified
		if bl.Consumer != "pipe" || bl.Changes != want[bl.Workload] || v.Msgs != bl.Changes || v.Duplicates+v.OutOfOrder+v.BadIDs != 0 || bl.StoredAfter != uint64(bl.Changes) {
			t.Errorf("pipe backlog %s (%q): %d changes, read back %+v, %d stored after the stop", bl.Workload, bl.Consumer, bl.Changes, v, bl.StoredAfter)
		}
		if bl.Rate <= 0 || bl.Bridge <= 0 || bl.NATSServer <= 0 || bl.PeakRSS <= 0 || v.PayloadBytes <= 0 || v.HeaderBytes <= 0 {
			t.Errorf("pipe backlog %s: %.0f changes/s, CPU pipe %s nats-server %s, RSS %d, message %.0f + %.0f B",
				bl.Workload, bl.Rate, bl.Bridge, bl.NATSServer, bl.PeakRSS, v.PayloadBytes, v.HeaderBytes)
		}
	}
	if !pipes["single"] || !pipes["big"] {
		t.Errorf("pipe backlogs %v, want single and big", pipes)
	}
	// -rounds 2: the bridge (pgoutput) and the pipe twice on each backlog,
	// each round's bridge against that round's pipe, and a median.
	rounds := map[string]int{}
	for _, bl := range res.Backlogs {
		if bl.Plugin != "pgoutput" {
			if bl.Round != 0 {
				t.Errorf("backlog %s/%s: round %d, want 0 (not repeated)", bl.Workload, bl.Plugin, bl.Round)
			}
			continue
		}
		rounds[bl.Workload+"/bridge"] |= 1 << bl.Round
		if bl.VsPipe <= 0 {
			t.Errorf("backlog %s round %d: no bridge ÷ pipe ratio", bl.Workload, bl.Round)
		}
		for _, p := range res.PipeBacklogs {
			if p.Workload == bl.Workload && p.Round == bl.Round && math.Abs(bl.VsPipe-bl.Rate/p.Rate) > 1e-9 {
				t.Errorf("backlog %s round %d: bridge ÷ pipe %.3f, want %.3f (that round's pipe)", bl.Workload, bl.Round, bl.VsPipe, bl.Rate/p.Rate)
			}
		}
	}
	for _, bl := range res.PipeBacklogs {
		rounds[bl.Workload+"/pipe"] |= 1 << bl.Round
	}
	for _, k := range []string{"single/bridge", "single/pipe", "big/bridge", "big/pipe"} {
		if rounds[k] != 1<<1|1<<2 {
			t.Errorf("%s: rounds %b, want 1 and 2", k, rounds[k])
		}
	}
	for _, w := range []string{"single", "big"} {
		if m, ok := pipeMedians(&res, w); !ok || m.rounds != 2 || m.rate <= 0 || m.natsServer <= 0 {
			t.Errorf("%s: median over rounds %+v (%v)", w, m, ok)
		}
	}
	checkLive := func(who string, l *Live) {
		t.Helper()
		if l == nil {
			t.Fatalf("no %s live result", who)
		}
		if l.WarmupChanges != 500 || l.Changes != 1000 || l.Verified.Msgs != 1500 || l.Verified.Duplicates+l.Verified.OutOfOrder+l.Verified.BadIDs != 0 {
			t.Errorf("%s live: %d warm-up + %d changes, read back %+v", who, l.WarmupChanges, l.Changes, l.Verified)
		}
		if l.Latency.N != 1000 || l.Warmup.N != 500 || len(l.ByQuarter) != 4 || l.Latency.P50 <= 0 {
			t.Errorf("%s live latencies: measured %+v, warm-up %+v, %d quarters", who, l.Latency, l.Warmup, len(l.ByQuarter))
		}
	}
	checkLive("bridge", res.Live)
	checkLive("pipe", res.PipeLive)
}

type tools struct{ nats, natsServer string }

// benchTools finds or installs what scripts/benchtools.sh installs, where
// it does: natscli v0.5.0 and the nats-server version go.mod pins, with go
// install into $BENCH_TOOLS or ${XDG_CACHE_HOME:-~/.cache}/bridge-bench/bin
// (kept between runs; scripts/test.sh installs them before the tests).
func benchTools(t *testing.T) tools {
	t.Helper()
	bin := os.Getenv("BENCH_TOOLS")
	if bin == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		bin = filepath.Join(cache, "bridge-bench", "bin")
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(goCmd(t, "", "list", "-m", "-f", "{{.Version}}", "github.com/nats-io/nats-server/v2"))
	tl := tools{nats: filepath.Join(bin, "nats"), natsServer: filepath.Join(bin, "nats-server-"+version)}
	if _, err := os.Stat(tl.nats); err != nil {
		t.Logf("installing natscli v0.5.0 into %s", bin)
		goCmd(t, bin, "install", "github.com/nats-io/natscli/nats@v0.5.0")
	}
	if _, err := os.Stat(tl.natsServer); err != nil {
		t.Logf("installing nats-server %s into %s", version, bin)
		tmp := t.TempDir()
		goCmd(t, tmp, "install", "github.com/nats-io/nats-server/v2@"+version)
		if err := os.Rename(filepath.Join(tmp, "nats-server"), tl.natsServer); err != nil {
			t.Fatal(err)
		}
	}
	return tl
}

// goCmd runs the go command (with GOBIN set when gobin is not empty) and
// returns its standard output.
func goCmd(t *testing.T, gobin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	if gobin != "" {
		cmd.Env = append(os.Environ(), "GOBIN="+gobin)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}
