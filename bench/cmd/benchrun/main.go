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
//
// with per-process CPU time (bridge, walsender, nats-server) from /proc and
// the bridge's peak RSS; every stream is read back and checked: each change
// stored once, in order. scripts/bench.sh builds the binaries and runs it.
package main

import (
	"context"
	"encoding/json"
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
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bench"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

type options struct {
	quick                    bool
	single, bigTxns, bigRows int
	jsMsgs, jsSize           int
	liveRate                 int
	liveFor                  time.Duration
	liveWarmup               time.Duration
	pad                      int
	bridgeBin, profBin       string
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
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
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
	flag.IntVar(&o.pad, "pad", envInt("BENCH_PAD", 16), "length of the text column: sets the message size")
	flag.StringVar(&o.bridgeBin, "bridge", os.Getenv("BENCH_BRIDGE"), "bridge binary (default: go build ./cmd/bridge)")
	flag.StringVar(&o.profBin, "bridgeprof", os.Getenv("BENCH_BRIDGEPROF"), "profiling bridge binary for -profile (default: go build ./bench/cmd/bridgeprof)")
	flag.StringVar(&o.natsBin, "nats", envStr("BENCH_NATS", "nats"), "nats CLI (natscli v0.5.0)")
	flag.StringVar(&o.natsServerBin, "nats-server", envStr("BENCH_NATS_SERVER", "nats-server"), "nats-server binary")
	flag.StringVar(&o.workParent, "workdir", os.Getenv("BENCH_WORKDIR"), "parent of the run's scratch directory (default: the temp dir)")
	flag.BoolVar(&o.keep, "keep", false, "keep the scratch directory (logs, configs)")
	flag.StringVar(&o.only, "only", envStr("BENCH_ONLY", "decode,js,backlog,live"), "phases to run: decode, js, backlog, live")
	flag.StringVar(&o.profile, "profile", os.Getenv("BENCH_PROFILE"), "directory: run the backlogs with the profiling binary and write CPU and allocation profiles there")
	flag.StringVar(&o.jsonOut, "json", os.Getenv("BENCH_JSON"), "also write the results as JSON to this file")
	flag.StringVar(&o.latencyOut, "latency-dump", "", "live mode: write each change's commit→stored latency in ns, one per line in stream order, to this file (to find when a tail happened)")
	flag.DurationVar(&o.poll, "poll", 10*time.Millisecond, "how often the stream's message count is polled")
	flag.DurationVar(&o.quietWait, "quiet-wait", envDur("BENCH_QUIET_WAIT", 0), "before each measurement wait up to this long for the machine to be idle (see -quiet-below)")
	flag.Float64Var(&o.quietBelow, "quiet-below", 0.25, "idle means less than this many cores busy over a second")
	flag.Func("bridge-env", "K=V added to the bridge process's environment (repeatable), e.g. GOGC=200 or BRIDGE_SINKS__JS__BATCH__MAX_WAIT=5ms", func(v string) error {
		if !strings.Contains(v, "=") {
			return fmt.Errorf("want K=V, got %q", v)
		}
		o.bridgeEnv = append(o.bridgeEnv, v)
		return nil
	})
	flag.Parse()
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
		fmt.Fprintln(os.Stderr, "benchrun:", err)
		code = 1
	}
	os.Exit(code)
}

func (o options) has(phase string) bool {
	for _, p := range strings.Split(o.only, ",") {
		if strings.TrimSpace(p) == phase {
			return true
		}
	}
	return false
}

// Results is the whole run, also written as JSON.
type Results struct {
	Started  time.Time           `json:"started"`
	Machine  bench.Machine       `json:"machine"`
	Versions map[string]string   `json:"versions"`
	Command  string              `json:"command"`
	Loads    []bench.Load        `json:"loads"`
	Decodes  map[string][]Decode `json:"decodes"` // by workload
	JS       []bench.JSRun       `json:"jetstream"`
	Backlogs []Backlog           `json:"backlogs"`
	Live     *Live               `json:"live,omitempty"`
	// LiveDecode is pg_recvlogical following the live workload.
	LiveDecode *bench.LiveDecode `json:"live_decode,omitempty"`
	Failures   []string          `json:"failures,omitempty"`
}

// Decode is a pg_recvlogical run with its rate.
type Decode struct {
	bench.Decode
	Rate  float64 `json:"changes_per_s"`
	Other float64 `json:"other_cores"` // machine CPU beyond walsender and pg_recvlogical, in cores
}

// Backlog is the bridge over one backlog.
type Backlog struct {
	Workload    string        `json:"workload"`
	Plugin      string        `json:"plugin"` // the bridge's source: pgoutput or wal2json
	Changes     int           `json:"changes"`
	Wall        time.Duration `json:"wall_ns"`         // process start → the stream holds all
	FirstStored time.Duration `json:"first_stored_ns"` // process start → first message stored
	Rate        float64       `json:"changes_per_s"`   // Changes / Wall
	SteadyRate  float64       `json:"steady_changes_per_s"`
	Bridge      time.Duration `json:"bridge_cpu_ns"`
	// BridgeAtFirst is the bridge's CPU when the benchmark first saw a
	// message stored (FirstCount of them): its start-up (config, connects,
	// stream and bucket checks, the slot) plus those first messages.
	// Bridge − BridgeAtFirst over Changes − FirstCount is its CPU per change
	// once streaming.
	BridgeAtFirst time.Duration `json:"bridge_cpu_at_first_ns"`
	FirstCount    uint64        `json:"first_count"`
	Walsender     time.Duration `json:"walsender_cpu_ns"`
	NATSServer    time.Duration `json:"nats_server_cpu_ns"`
	// Page faults during the backlog: each costs the faulting process about
	// the machine's first_touch_ns_per_page, inside its CPU time.
	BridgeFaults     int64          `json:"bridge_page_faults"`
	NATSServerFaults int64          `json:"nats_server_page_faults"`
	PeakRSS          int64          `json:"bridge_peak_rss_bytes"`
	Verified         bench.Verified `json:"verified"`
	StoredAfter      uint64         `json:"stored_after_stop"`
	VsDecode         float64        `json:"ratio_to_decode"`                 // to pg_recvlogical with the same plugin
	VsJetStream      float64        `json:"ratio_to_jetstream_ingest"`       // the best nats bench mode
	VsJSAsync        float64        `json:"ratio_to_jetstream_async_ingest"` // the best async mode (what the sink uses)
	JSMsgs           int            `json:"jetstream_msgs"`                  // the size of the nats bench runs the two ratios use
	Cores            float64        `json:"cores"`                           // bridge + walsender + nats-server CPU / wall
	CPUProfile       string         `json:"cpu_profile,omitempty"`
	AllocProfile     string         `json:"alloc_profile,omitempty"`
	Other            float64        `json:"other_cores"` // machine CPU beyond bridge, walsender and nats-server, in cores
}

// Live is the bridge streaming at a fixed rate.
type Live struct {
	Rate     int               `json:"target_changes_per_s"`
	Changes  int               `json:"changes"`
	Achieved float64           `json:"achieved_changes_per_s"`
	Latency  bench.Percentiles `json:"latency_commit_to_stored"`
	// The warm-up: the first changes of a new stream, written at the same
	// rate before the measured run and reported apart from it. A new
	// stream's first block makes nats-server grow into new memory twice
	// (its 1 MiB block buffer becomes 4 MiB, then 8 MiB), which stalls it
	// for the page faults that costs (docs/performance.md).
	WarmupChanges int               `json:"warmup_changes"`
	Warmup        bench.Percentiles `json:"latency_warmup"`
	// ByQuarter splits the run in four by commit order: a latency that
	// grows from one to the next means the bridge falls behind the rate.
	ByQuarter  []bench.Percentiles `json:"latency_by_quarter"`
	Bridge     time.Duration       `json:"bridge_cpu_ns"`
	Walsender  time.Duration       `json:"walsender_cpu_ns"`
	NATSServer time.Duration       `json:"nats_server_cpu_ns"`
	PeakRSS    int64               `json:"bridge_peak_rss_bytes"`
	Verified   bench.Verified      `json:"verified"`
	Writer     time.Duration       `json:"writer_backend_cpu_ns"`
	// Page faults during the run, per process: each stalls its thread for
	// about the machine's first_touch_ns_per_page.
	BridgeFaults     int64   `json:"bridge_page_faults"`
	WalsenderFaults  int64   `json:"walsender_page_faults"`
	NATSServerFaults int64   `json:"nats_server_page_faults"`
	CPUProfile       string  `json:"cpu_profile,omitempty"`
	Other            float64 `json:"other_cores"` // machine CPU beyond bridge, walsender, nats-server, writer and benchrun
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
	r.ratios()
	return nil
}

func (r *runner) workload(ctx context.Context, w string, decode, backlog, w2j bool) error {
	o := r.o
	slots := map[string]string{"pgoutput": "bench_" + w + "_pgoutput", "wal2json": "bench_" + w + "_wal2json", "bridge": "bench_" + w + "_bridge",
		"bridge_w2j": "bench_" + w + "_bridge_w2j", "sql": "bench_" + w + "_sql"}
	// Every consumer gets a slot of its own, made before the load, so each
	// reads the same backlog. For the js phase alone the bridge still runs
	// the single backlog to learn the message size.
	runBridge := backlog || (w == "single" && r.sample == nil && o.jsSize == 0 && o.has("js"))
	if runBridge {
		if err := r.pg.CreateSlot(ctx, slots["bridge"], "pgoutput"); err != nil {
			return err
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
	if runBridge {
		b, err := r.bridgeBacklog(ctx, w, "pgoutput", slots["bridge"], load.Changes)
		if err != nil {
			return err
		}
		r.res.Backlogs = append(r.res.Backlogs, b)
		_ = r.pg.DropSlot(ctx, slots["bridge"])
	}
	if w2jBridge {
		b, err := r.bridgeBacklog(ctx, w, "wal2json", slots["bridge_w2j"], load.Changes)
		if err != nil {
			return err
		}
		r.res.Backlogs = append(r.res.Backlogs, b)
		_ = r.pg.DropSlot(ctx, slots["bridge_w2j"])
	}
	return nil
}

func (r *runner) bridgeBacklog(ctx context.Context, w, plugin, slot string, n int) (Backlog, error) {
	b := Backlog{Workload: w, Plugin: plugin, Changes: n}
	name := w
	if plugin != "pgoutput" {
		name = w + "_" + plugin
	}
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
	r.quiet()
	win := bench.StartWindow()
	nsBefore, err := bench.ReadCPU(r.ns.PID())
	if err != nil {
		return b, err
	}
	logf("bridge (%s): backlog %s, %d changes", plugin, w, n)
	p, err := bench.StartBridge(bin, path, filepath.Join(r.work, "bridge-"+w+".log"), env...)
	if err != nil {
		return b, err
	}
	defer p.Stop(30 * time.Second)
	alive := func() bool { return p.Exited() == nil }
	ws, err := r.pg.WaitSlotPID(ctx, slot, time.Minute, alive)
	if err != nil {
		if e := p.Exited(); e != nil {
			return b, e
		}
		return b, err
	}
	within := max(3*time.Minute, time.Duration(n/500)*time.Second)
	at, err := bench.WaitStoredFirst(ctx, r.js, stream, n, within, r.o.poll, p.Exited, func(got uint64) {
		if c, err := bench.ReadCPU(p.PID()); err == nil {
			b.BridgeAtFirst, b.FirstCount = c.Self, got
		}
	})
	if err != nil {
		return b, err
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
	if r.o.profile != "" {
		_ = p.Signal(syscall.SIGUSR1)
		waitFile(b.CPUProfile, 10*time.Second)
	}
	if err := p.Stop(30 * time.Second); err != nil {
		r.fail("bridge %s: stopping: %v", w, err)
	}
	logf("bridge: %d changes stored %s after start = %.0f changes/s; reading the stream back", n, b.Wall.Round(time.Millisecond), b.Rate)
	time.Sleep(500 * time.Millisecond) // anything published late would show now
	b.StoredAfter, _ = bench.StreamMsgs(ctx, r.js, stream)
	v, err := bench.Verify(ctx, r.js, stream, false)
	if err != nil {
		return b, err
	}
	b.Verified = v
	if !v.First.IsZero() {
		b.FirstStored = v.First.Sub(p.Start)
		if d := v.Last.Sub(v.First); d > 0 {
			b.SteadyRate = float64(v.Msgs-1) / d.Seconds()
		}
	}
	if !v.OK(n) || b.StoredAfter != uint64(n) {
		r.fail("bridge %s: stream holds %d messages (want %d): %d duplicates, %d out of order, %d bad ids",
			w, b.StoredAfter, n, v.Duplicates, v.OutOfOrder, v.BadIDs)
	}
	if w == "single" && r.sample == nil {
		s := v.Sample
		r.sample = &s
		r.size = int(v.PayloadBytes + 0.5)
	}
	bench.DeleteStream(ctx, r.js, stream)
	return b, nil
}

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
	p, err := bench.StartBridge(bin, path, filepath.Join(r.work, "bridge-live.log"), env...)
	if err != nil {
		return err
	}
	defer p.Stop(30 * time.Second)
	ws, err := r.pg.WaitSlotPID(ctx, slot, time.Minute, func() bool { return p.Exited() == nil })
	if err != nil {
		if e := p.Exited(); e != nil {
			return e
		}
		return err
	}
	time.Sleep(time.Second) // past the start-up
	r.quiet()
	warm := 0
	if o.liveWarmup > 0 {
		logf("bridge: live warm-up, %d changes/s for %s into the new stream (reported apart)", o.liveRate, o.liveWarmup)
		if warm, _, _, err = r.pg.WriteAtRate(ctx, o.liveRate, o.liveWarmup); err != nil {
			return err
		}
	}
	win := bench.StartWindow()
	self0, _ := bench.ReadCPU(os.Getpid())
	b0, _ := bench.ReadCPU(p.PID())
	w0, _ := bench.ReadCPU(ws)
	n0, _ := bench.ReadCPU(r.ns.PID())
	n, took, writer, err := r.pg.WriteAtRate(ctx, o.liveRate, o.liveFor)
	if err != nil {
		return err
	}
	if _, err := bench.WaitStored(ctx, r.js, stream, warm+n, time.Minute, r.o.poll, p.Exited); err != nil {
		return err
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
		r.fail("bridge live: stopping: %v", err)
	}
	v, err := bench.Verify(ctx, r.js, stream, true)
	if err != nil {
		return err
	}
	l.Verified = v
	all := v.Latencies
	if err := l.summarize(all); err != nil {
		return err
	}
	if f := r.o.latencyOut; f != "" {
		var sb strings.Builder
		for _, x := range all { // warm-up first: the stream from its first message
			fmt.Fprintln(&sb, x.Nanoseconds())
		}
		if err := os.WriteFile(f, []byte(sb.String()), 0o644); err != nil {
			r.fail("live: writing -latency-dump: %v", err)
		}
	}
	if !v.OK(warm + n) {
		r.fail("bridge live: stream holds %d messages (want %d): %d duplicates, %d out of order, %d bad ids",
			v.Msgs, n, v.Duplicates, v.OutOfOrder, v.BadIDs)
	}
	logf("live: %d changes, latency p50 %s p99 %s p99.9 %s (warm-up, %d changes: p99 %s, max %s)", n, l.Latency.P50, l.Latency.P99, l.Latency.P999,
		warm, l.Warmup.P99, l.Warmup.Max)
	r.res.Live = l
	bench.DeleteStream(ctx, r.js, stream)
	return nil
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

// ratios relates each backlog to the decode rate of the same workload and
// plugin and to the best JetStream ingest rate at the backlog's size (the
// nats bench runs whose message count is nearest its change count).
func (r *runner) ratios() {
	for i := range r.res.Backlogs {
		b := &r.res.Backlogs[i]
		for _, d := range r.res.Decodes[b.Workload] {
			if d.Plugin == b.Plugin {
				b.VsDecode = b.Rate / d.Rate
			}
		}
		var bestJS, bestAsync float64
		b.JSMsgs = nearestJS(r.res.JS, b.Changes)
		for _, j := range r.res.JS {
			if j.Msgs != b.JSMsgs {
				continue
			}
			bestJS = max(bestJS, j.Rate)
			if strings.HasPrefix(j.Mode, "async") {
				bestAsync = max(bestAsync, j.Rate)
			}
		}
		if bestJS > 0 {
			b.VsJetStream = b.Rate / bestJS
		}
		if bestAsync > 0 {
			b.VsJSAsync = b.Rate / bestAsync
		}
	}
}

// nearestJS is the message count of the nats bench runs nearest n.
func nearestJS(js []bench.JSRun, n int) int {
	best := 0
	for _, j := range js {
		if best == 0 || abs(j.Msgs-n) < abs(best-n) {
			best = j.Msgs
		}
	}
	return best
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
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
				fmt.Fprintf(tw, "%s\tbridge %s\t%d\t%.2f\t%.0f\t%.2f\t%.2f\t%.2f\t%s\t%s\t%s\t\t%.2f\t%s\t%.2f\t\n", wl, b.Plugin, b.Changes, b.Wall.Seconds(), b.Rate, b.VsDecode, b.VsJSAsync, b.VsJetStream,
					us(b.Bridge, b.Changes), us(b.Walsender, b.Changes), us(b.NATSServer, b.Changes), b.Cores, mib(b.PeakRSS), b.Other)
			}
		}
		tw.Flush()
	}
	for _, b := range res.Backlogs {
		ok := "OK"
		if !b.Verified.OK(b.Changes) || b.StoredAfter != uint64(b.Changes) {
			ok = "FAILED"
		}
		fmt.Fprintf(w, "bridge %s %s: first message stored %.2fs after start, then %.0f changes/s; mean payload %.0f B + headers %.0f B; read back: %d msgs, %d dup, %d out of order: %s\n",
			b.Plugin, b.Workload, b.FirstStored.Seconds(), b.SteadyRate, b.Verified.PayloadBytes, b.Verified.HeaderBytes, b.Verified.Msgs, b.Verified.Duplicates, b.Verified.OutOfOrder, ok)
		if b.FirstCount > 0 && b.FirstCount < uint64(b.Changes) {
			fmt.Fprintf(w, "  bridge CPU: %.0f ms until %d stored (start-up), then %s µs/chg for the other %d\n",
				float64(b.BridgeAtFirst)/1e6, b.FirstCount, us(b.Bridge-b.BridgeAtFirst, b.Changes-int(b.FirstCount)), b.Changes-int(b.FirstCount))
		}
		if ft := res.Machine.FirstTouchNs; ft > 0 && b.Changes > 0 {
			perChg := func(faults int64) string { return fmt.Sprintf("%.2f", float64(faults)*ft/1e3/float64(b.Changes)) }
			fmt.Fprintf(w, "  page faults: bridge %d (~%s µs/chg at %.1f µs each), nats-server %d (~%s µs/chg)\n",
				b.BridgeFaults, perChg(b.BridgeFaults), ft/1e3, b.NATSServerFaults, perChg(b.NATSServerFaults))
		}
		if b.CPUProfile != "" {
			fmt.Fprintf(w, "  profiles: %s %s\n", b.CPUProfile, b.AllocProfile)
		}
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
		tw.Flush()
		ok := "OK"
		if !l.Verified.OK(l.WarmupChanges + l.Changes) {
			ok = "FAILED"
		}
		fmt.Fprintf(w, "read back: %d msgs, %d dup, %d out of order: %s\n", l.Verified.Msgs, l.Verified.Duplicates, l.Verified.OutOfOrder, ok)
		ft := time.Duration(res.Machine.FirstTouchNs)
		fmt.Fprintf(w, "page faults during the run (each ~%.1f µs here): bridge %d (%s ms), walsender %d (%s ms), nats-server %d (%s ms)\n", res.Machine.FirstTouchNs/1e3,
			l.BridgeFaults, ms(time.Duration(l.BridgeFaults)*ft), l.WalsenderFaults, ms(time.Duration(l.WalsenderFaults)*ft), l.NATSServerFaults, ms(time.Duration(l.NATSServerFaults)*ft))
	}
	if d := res.LiveDecode; d != nil {
		fmt.Fprintf(w, "pg_recvlogical pgoutput following the same live load (%d changes): walsender %s µs/chg, pg_recvlogical %s µs/chg, writer backend %s µs/chg\n",
			d.Changes, us(d.Walsender, d.Changes), us(d.RecvLogical, d.Changes), us(d.Writer, d.Changes))
	}
	fmt.Fprintf(w, "\nvs decode: the bridge's rate over pg_recvlogical's with the same plugin on the same backlog; vs JS: over nats bench js pub's best async\nmode (what the sink does) and best mode overall, publishing as many messages as the backlog has changes. cores: CPU of bridge + walsender + nats-server per second of wall\ntime; with 2 cores, 2 / (sum of the three µs/chg) is the rate this machine can reach at those costs.\nother cores: CPU the machine spent during a measurement beyond the processes it accounts for (and the\nbenchmark's own polling); above ~0.2 something else shared the cores and the row is suspect.\n")
	for _, f := range res.Failures {
		fmt.Fprintf(w, "FAILED: %s\n", f)
	}
	fmt.Fprintln(w)
}
