// Command benchrun measures the bridge side by side with the limits around
// it, in one run on one machine: a private Postgres (internal/pgtest) and a
// nats-server process, then
//
//   - Postgres' own decode rate: pg_recvlogical (pgoutput, wal2json) over a
//     backlog waiting in a slot, to the WAL end;
//   - JetStream's own ingest rate: `nats bench js pub` (async, fast batch)
//     with a Nats-Msg-Id per message, of the bridge's message size;
//   - the bridge binary over the same backlogs (single-row transactions, big
//     transactions), and live at a fixed rate (latency commit → stored);
//   - the straightforward pipe (bench/cmd/pipe: pglogrepl + jetstream,
//     message ids, KV checkpoint, no fence) over the same backlogs and live
//     load, measured as the bridge is;
//
// with per-process CPU time (bridge, walsender, nats-server) from /proc and
// the bridge's peak RSS; every stream is read back and checked: each change
// stored once, in order. scripts/bench.sh builds the binaries and runs it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bench"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

type options struct {
	quick                    bool
	single, bigTxns, bigRows int
	oneBigRows               int
	jsMsgs, jsSize           int
	liveRate                 int
	liveFor                  time.Duration
	liveWarmup               time.Duration
	pad                      int
	bridgeBin, profBin       string
	pipeBin                  string
	natsBin, natsServerBin   string
	workParent               string
	keep                     bool
	only                     string
	profile                  string
	jsonOut                  string
	latencyOut               string
	poll                     time.Duration
	quietWait                time.Duration
	quietBelow               float64
	bridgeEnv                []string
	rounds                   int
	natsWarmup               int // MiB published into a scratch stream before the backlogs
	livePipeFirst            bool
}

// envInt is the environment variable name as a number, def when it is
// unset; a value that is not a number stops the run, naming it.
func envInt(name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchrun: %s=%q is not a whole number\n", name, s)
		os.Exit(2)
	}
	return v
}

func envDur(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envStr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func main() {
	var o options
	flag.BoolVar(&o.quick, "quick", os.Getenv("BENCH_QUICK") != "", "a ~1 minute run: smaller backlogs, 10s live (explicit sizes still win)")
	flag.IntVar(&o.single, "single", envInt("BENCH_SINGLE", 0), "single-row transactions in the first backlog (default 200000; quick 30000)")
	flag.IntVar(&o.bigTxns, "big-txns", envInt("BENCH_BIG_TXNS", 0), "transactions in the second backlog (default 10; quick 2)")
	flag.IntVar(&o.bigRows, "big-rows", envInt("BENCH_BIG_ROWS", 0), "rows per transaction in the second backlog (default 100000; quick 30000)")
	flag.IntVar(&o.jsMsgs, "js-msgs", envInt("BENCH_JS_MSGS", 0), "messages per nats bench run (default: each backlog's count, -single and -big-txns × -big-rows, so each backlog is compared with JetStream at its own size)")
	flag.IntVar(&o.jsSize, "js-size", envInt("BENCH_JS_SIZE", 0), "payload bytes per nats bench message (default: the bridge's mean payload)")
	flag.IntVar(&o.liveRate, "live-rate", envInt("BENCH_LIVE_RATE", 2000), "live mode: changes per second")
	flag.DurationVar(&o.liveFor, "live-for", envDur("BENCH_LIVE_FOR", 0), "live mode: duration (default 20s; quick 10s)")
	flag.DurationVar(&o.liveWarmup, "live-warmup", envDur("BENCH_LIVE_WARMUP", 5*time.Second), "live mode: write at the rate this long before the measured run, into the same new stream, and report it apart (0: none)")
	flag.IntVar(&o.oneBigRows, "onebig-rows", envInt("BENCH_ONEBIG_ROWS", 0), "onebig phase: rows of the one transaction committed while the bridge follows (default 1000000; quick 200000)")
	flag.IntVar(&o.pad, "pad", envInt("BENCH_PAD", 16), "length of the text column: sets the message size")
	flag.StringVar(&o.bridgeBin, "bridge", os.Getenv("BENCH_BRIDGE"), "bridge binary (default: go build ./cmd/bridge)")
	flag.StringVar(&o.pipeBin, "pipe", os.Getenv("BENCH_PIPE"), "pipe binary for the pipe phase (default: go build ./bench/cmd/pipe)")
	flag.StringVar(&o.profBin, "bridgeprof", os.Getenv("BENCH_BRIDGEPROF"), "profiling bridge binary for -profile (default: go build ./bench/cmd/bridgeprof)")
	flag.StringVar(&o.natsBin, "nats", envStr("BENCH_NATS", "nats"), "nats CLI (natscli v0.5.0)")
	flag.StringVar(&o.natsServerBin, "nats-server", envStr("BENCH_NATS_SERVER", "nats-server"), "nats-server binary")
	flag.StringVar(&o.workParent, "workdir", os.Getenv("BENCH_WORKDIR"), "parent of the run's scratch directory (default: the temp dir)")
	flag.BoolVar(&o.keep, "keep", false, "keep the scratch directory (logs, configs)")
	flag.StringVar(&o.only, "only", envStr("BENCH_ONLY", "decode,js,backlog,live,pipe,onebig"), "phases to run: decode, js, backlog, live, pipe (the pipe beside the bridge in backlog and live), onebig")
	flag.StringVar(&o.profile, "profile", os.Getenv("BENCH_PROFILE"), "directory: run the backlogs with the profiling binary and write CPU and allocation profiles there")
	flag.StringVar(&o.jsonOut, "json", os.Getenv("BENCH_JSON"), "also write the results as JSON to this file")
	flag.StringVar(&o.latencyOut, "latency-dump", "", "live mode: write each change's commit→stored latency in ns, one per line in stream order, to this file (to find when a tail happened)")
	flag.DurationVar(&o.poll, "poll", 10*time.Millisecond, "how often the stream's message count is polled")
	flag.DurationVar(&o.quietWait, "quiet-wait", envDur("BENCH_QUIET_WAIT", 0), "before each measurement wait up to this long for the machine to be idle (see -quiet-below)")
	flag.Float64Var(&o.quietBelow, "quiet-below", 0.25, "idle means less than this many cores busy over a second")
	flag.IntVar(&o.natsWarmup, "nats-warmup", envInt("BENCH_NATS_WARMUP", 64), "backlog phase: MiB published into a scratch stream of the new nats-server (then deleted) before the first backlog, so that round 1 does not pay for the server's first memory (0: none)")
	flag.IntVar(&o.rounds, "rounds", envInt("BENCH_ROUNDS", 1), "backlog phase: run the bridge (pgoutput) and the pipe this many times on each backlog, alternating which goes first, and report each round and the median")
	flag.BoolVar(&o.livePipeFirst, "live-pipe-first", envStr("BENCH_LIVE_PIPE_FIRST", "") != "", "live phase with pipe: run the pipe's live run before the bridge's (each on a new stream; the first meets a nats-server that has stored nothing yet)")
	flag.Func("bridge-env", "K=V added to the bridge process's environment (repeatable), e.g. GOGC=200 or BRIDGE_SINKS__JS__BATCH__MAX_WAIT=5ms", func(v string) error {
		if !strings.Contains(v, "=") {
			return fmt.Errorf("want K=V, got %q", v)
		}
		o.bridgeEnv = append(o.bridgeEnv, v)
		return nil
	})
	flag.Parse()
	if err := o.check(); err != nil {
		printErr(os.Stderr, err)
		os.Exit(2)
	}
	def := func(p *int, full, quick int) {
		if *p == 0 {
			*p = full
			if o.quick {
				*p = quick
			}
		}
	}
	def(&o.single, 200000, 30000)
	def(&o.bigTxns, 10, 2)
	def(&o.bigRows, 100000, 30000)
	def(&o.oneBigRows, 1000000, 200000)
	if o.liveFor == 0 {
		o.liveFor = 20 * time.Second
		if o.quick {
			o.liveFor = 10 * time.Second
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code := 0
	if err := run(ctx, o); err != nil {
		printErr(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// printErr writes err with each of its lines (errors.Join's) prefixed by
// the command's name.
func printErr(w io.Writer, err error) {
	for _, l := range strings.Split(err.Error(), "\n") {
		fmt.Fprintln(w, "benchrun:", l)
	}
}

// check refuses counts that cannot mean anything (0 for the sizes means
// their default), naming the flag and its environment variable.
func (o options) check() error {
	var errs []error
	for _, c := range []struct {
		flag, env string
		v, least  int
	}{
		{"single", "BENCH_SINGLE", o.single, 0},
		{"big-txns", "BENCH_BIG_TXNS", o.bigTxns, 0},
		{"big-rows", "BENCH_BIG_ROWS", o.bigRows, 0},
		{"js-msgs", "BENCH_JS_MSGS", o.jsMsgs, 0},
		{"js-size", "BENCH_JS_SIZE", o.jsSize, 0},
		{"onebig-rows", "BENCH_ONEBIG_ROWS", o.oneBigRows, 0},
		{"live-rate", "BENCH_LIVE_RATE", o.liveRate, 1},
		{"rounds", "BENCH_ROUNDS", o.rounds, 1},
		{"nats-warmup", "BENCH_NATS_WARMUP", o.natsWarmup, 0},
	} {
		if c.v < c.least {
			errs = append(errs, fmt.Errorf("-%s (or %s) must be at least %d, got %d", c.flag, c.env, c.least, c.v))
		}
	}
	return errors.Join(errs...)
}

func (o options) has(phase string) bool {
	for _, p := range strings.Split(o.only, ",") {
		if strings.TrimSpace(p) == phase {
			return true
		}
	}
	return false
}

type runner struct {
	o      options
	work   string
	pg     *bench.PG
	ns     *bench.NATSServer
	js     jetstream.JetStream
	res    *Results
	sample *bench.MsgSample
	size   int
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func run(ctx context.Context, o options) (err error) {
	res := &Results{Started: time.Now().UTC(), Machine: bench.ReadMachine(), Versions: map[string]string{},
		Decodes: map[string][]Decode{}, Command: strings.Join(os.Args, " ")}
	work, err := os.MkdirTemp(o.workParent, "bridge-bench-")
	if err != nil {
		return err
	}
	_ = os.Chmod(work, 0o755) // the postgres OS user must traverse it
	if o.keep {
		logf("scratch directory %s (kept)", work)
	} else {
		defer os.RemoveAll(work)
	}
	if err := resolveBinaries(&o, work); err != nil {
		return err
	}
	if o.has("pipe") && !o.has("backlog") && !o.has("live") {
		logf("phase pipe runs the pipe in the backlog and live phases; neither is in -only %q", o.only)
	}
	r := &runner{o: o, work: work, res: res}

	logf("starting postgres and nats-server")
	if r.pg, err = bench.StartPG(ctx, work, o.pad); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	defer r.pg.Close()
	if r.ns, err = bench.StartNATSServer(ctx, o.natsServerBin, filepath.Join(work, "nats")); err != nil {
		return err
	}
	defer r.ns.Stop()
	nc, js, err := r.ns.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	r.js = js
	res.Versions["postgres"] = r.pg.Version(ctx)
	res.Versions["nats-server"] = nc.ConnectedServerVersion()
	res.Versions["natscli"] = cmdOutput(o.natsBin, "--version")
	res.Versions["bridge"] = cmdOutput(o.bridgeBin, "version")
	res.Versions["go"] = runtime.Version()
	if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
		res.Versions["source"] = strings.TrimSpace(string(out))
	}
	bin, _ := pgtest.BinDir()
	haveW2J := fileExists(filepath.Join(bin, "..", "lib", "wal2json.so"))
	if !haveW2J {
		if out, err := exec.Command(filepath.Join(bin, "pg_config"), "--pkglibdir").Output(); err == nil {
			haveW2J = fileExists(filepath.Join(strings.TrimSpace(string(out)), "wal2json.so"))
		}
	}

	defer func() {
		report(os.Stdout, res, o)
		if o.jsonOut != "" {
			b, _ := json.MarshalIndent(res, "", "  ")
			_ = os.WriteFile(o.jsonOut, b, 0o644)
		}
		if err == nil && len(res.Failures) > 0 {
			err = fmt.Errorf("%d check(s) failed", len(res.Failures))
		}
	}()

	backlog := o.has("backlog")
	decode := o.has("decode")
	if backlog {
		if err := r.warmNATS(ctx, o.natsWarmup); err != nil {
			return err
		}
	}
	if backlog || decode || o.has("js") {
		if err := r.workload(ctx, "single", decode, backlog, haveW2J); err != nil {
			return err
		}
	}
	if o.has("js") {
		if err := r.jetstream(ctx); err != nil {
			return err
		}
	}
	if backlog || decode {
		if err := r.workload(ctx, "big", decode, backlog, haveW2J); err != nil {
			return err
		}
	}
	if o.has("live") {
		if err := r.live(ctx); err != nil {
			return err
		}
	}
	if o.has("onebig") {
		if err := r.oneBig(ctx); err != nil {
			return err
		}
	}
	r.ratios()
	return nil
}

// quiet waits, when asked to (-quiet-wait), until the rest of the machine
// is idle, so that a measurement does not share the cores with other work.
func (r *runner) quiet() {
	if r.o.quietWait <= 0 {
		return
	}
	if busy := bench.WaitQuiet(r.o.quietWait, r.o.quietBelow); busy >= r.o.quietBelow {
		logf("machine still busy (%.2f cores) after waiting %s; measuring anyway", busy, r.o.quietWait)
	}
}

func (r *runner) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	logf("FAIL: %s", msg)
	r.res.Failures = append(r.res.Failures, msg)
}

func resolveBinaries(o *options, work string) error {
	var err error
	for _, b := range []*string{&o.natsBin, &o.natsServerBin} {
		if *b, err = exec.LookPath(*b); err != nil {
			return fmt.Errorf("%w (scripts/bench.sh installs natscli v0.5.0 and nats-server)", err)
		}
	}
	build := func(dst *string, pkg string) error {
		if *dst != "" {
			return nil
		}
		*dst = filepath.Join(work, filepath.Base(pkg))
		logf("go build %s", pkg)
		cmd := exec.Command("go", "build", "-o", *dst, pkg)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		return cmd.Run()
	}
	if err := build(&o.bridgeBin, "./cmd/bridge"); err != nil {
		return err
	}
	if o.profile != "" {
		if err := build(&o.profBin, "./bench/cmd/bridgeprof"); err != nil {
			return err
		}
	}
	if o.has("pipe") {
		if err := build(&o.pipeBin, "./bench/cmd/pipe"); err != nil {
			return err
		}
	}
	return nil
}

func cmdOutput(bin string, args ...string) string {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func waitFile(p string, within time.Duration) {
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if fileExists(p) {
			return
		}
	}
}
