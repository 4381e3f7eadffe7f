// What a run records, also written as JSON (-json), and the ratios that
// relate the bridge's rates to the limits around it.

package main

import (
	"strings"
	"time"

	"github.com/bridgecdc/bridge/bench"
)

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
	// PipeBacklogs is the pipe (bench/cmd/pipe) over the same backlogs
	// (phase pipe), measured as the bridge is.
	PipeBacklogs []Backlog `json:"pipe_backlogs,omitempty"`
	Live         *Live     `json:"live,omitempty"`
	// PipeLive is the pipe following the same live load after the bridge
	// (before it with -live-pipe-first), on a slot and stream of its own
	// (phase pipe).
	PipeLive *Live   `json:"pipe_live,omitempty"`
	OneBig   *OneBig `json:"onebig,omitempty"`
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

// Backlog is the bridge, or the pipe, over one backlog. In a row of the
// pipe (Consumer "pipe") the bridge_* figures are the pipe process's.
type Backlog struct {
	Workload    string        `json:"workload"`
	Plugin      string        `json:"plugin"`             // the bridge's source: pgoutput or wal2json
	Consumer    string        `json:"consumer,omitempty"` // "pipe" for the pipe; "" for the bridge
	Changes     int           `json:"changes"`
	Round       int           `json:"round,omitempty"` // its round of -rounds, from 1; 0 when there is one
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
	VsPipe           float64        `json:"ratio_to_pipe,omitempty"`         // the bridge's rate over the pipe's on the same backlog (pgoutput rows)
	Cores            float64        `json:"cores"`                           // bridge + walsender + nats-server CPU / wall
	CPUProfile       string         `json:"cpu_profile,omitempty"`
	AllocProfile     string         `json:"alloc_profile,omitempty"`
	Other            float64        `json:"other_cores"` // machine CPU beyond bridge, walsender and nats-server, in cores
}

// Live is the bridge (or, in Results.PipeLive, the pipe, whose figures
// then fill the bridge_* fields) streaming at a fixed rate.
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

// ratios relates each backlog, the bridge's and the pipe's, to the decode
// rate of the same workload and plugin and to the best JetStream ingest
// rate at the backlog's size (the nats bench runs whose message count is
// nearest its change count), and the bridge's pgoutput rate to the pipe's.
func (r *runner) ratios() {
	for i := range r.res.Backlogs {
		b := &r.res.Backlogs[i]
		r.backlogRatios(b)
		for _, p := range r.res.PipeBacklogs {
			if p.Workload == b.Workload && p.Plugin == b.Plugin && p.Round == b.Round && p.Rate > 0 {
				b.VsPipe = b.Rate / p.Rate
			}
		}
	}
	for i := range r.res.PipeBacklogs {
		r.backlogRatios(&r.res.PipeBacklogs[i])
	}
}

func (r *runner) backlogRatios(b *Backlog) {
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
