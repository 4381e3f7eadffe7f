// Command profstages splits a CPU (or allocation) profile of the bridge into
// its pipeline stages by the functions on each sample's stack, and prints
// each stage's share and cost per change:
//
//	go run ./bench/cmd/profstages -changes 200000 cpu-single.pprof [allocs-single.pprof]
//
// It reads the pprof protobuf itself (no dependency beyond protowire).
package main

import (
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protowire"
)

// stage is a rule: the first stage whose marker is on a sample's stack
// takes the sample. Markers are substrings of function names.
type stage struct {
	name    string
	markers []string
}

var stages = []stage{
	{"decode: pgoutput/wal2json parse, pgtypes, txn buffer", []string{"sources/pgoutput.(*decoder).Decode", "sources/wal2json.(*decoder).Decode"}},
	{"source: replication receive, status updates, handoff", []string{"pgrepl.(*Source).run"}},
	{"route+encode: Router.Route (subject, native JSON)", []string{"bridge.(*Router).Route"}},
	{"route: telemetry, txn items, source.Read", []string{"bridge.(*Pipeline).route", "bridge.(*Pipeline).runOnce.func1"}},
	{"publish: natsjs toMsg (headers, id)", []string{"natsjs.(*Sink).toMsg", "natsjs.(*Sink).buildMsg"}},
	{"publish: nats.go PublishMsgAsync (encode, buffer)", []string{"jetstream.(*jetStream).PublishMsgAsync"}},
	{"publish: natsjs acker.publish + nats.go PublishMsg (encode, buffer)", []string{"natsjs.(*acker).publish", "nats%2ego.(*Conn).PublishMsg", "nats.go.(*Conn).PublishMsg"}},
	{"publish: waiting for acks (natsjs resolve)", []string{"natsjs.(*write).resolve"}},
	{"publish: rest of natsjs Write", []string{"natsjs.(*Sink).Write"}},
	{"batch: pipeline writer, checkpoint marks", []string{"bridge.(*Pipeline).write"}},
	{"nats.go: acks (PubAck JSON, futures)", []string{"handleAsyncReply"}},
	{"acks: natsjs acker.handle (PubAck parse, match)", []string{"natsjs.(*acker).handle"}},
	{"nats.go: subscription delivery", []string{"nats%2ego.(*Conn).waitForMsgs", "nats.go.(*Conn).waitForMsgs"}},
	{"nats.go: socket read", []string{"nats%2ego.(*Conn).readLoop", "nats.go.(*Conn).readLoop"}},
	{"nats.go: socket write (flusher)", []string{"nats%2ego.(*Conn).flusher", "nats.go.(*Conn).flusher"}},
	{"checkpoint (KV), metrics, http", []string{"bridge/checkpoint.", "bridge.(*Pipeline).runOnce.func2", "bridge.(*Pipeline).runOnce.func3", "prometheus", "net/http."}},
	{"GC (background mark, sweep, scavenge)", []string{"runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge"}},
	{"runtime: scheduler, timers, netpoll, syscalls", []string{"runtime."}},
}

type profile struct {
	types   []string
	samples []sample
	locs    map[uint64][]uint64 // location → function ids (inlined first)
	funcs   map[uint64]int64    // function → name string index
	strs    []string
}

type sample struct {
	locs   []uint64
	values []int64
}

func main() {
	changes := flag.Int("changes", 0, "changes the profile covers: adds a per-change column")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: profstages [-changes N] profile.pprof...")
		os.Exit(2)
	}
	for _, path := range flag.Args() {
		p, err := read(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		p.print(os.Stdout, path, *changes)
	}
}

func read(path string) (*profile, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if zr, err := gzip.NewReader(bytes.NewReader(raw)); err == nil {
		if raw, err = io.ReadAll(zr); err != nil {
			return nil, err
		}
	}
	p := &profile{locs: map[uint64][]uint64{}, funcs: map[uint64]int64{}}
	var typeIdx []int64
	err = fields(raw, func(num protowire.Number, v []byte, u uint64) {
		switch num {
		case 1: // sample_type
			_ = fields(v, func(n protowire.Number, _ []byte, u uint64) {
				if n == 1 {
					typeIdx = append(typeIdx, int64(u))
				}
			})
		case 2: // sample
			var s sample
			_ = fields(v, func(n protowire.Number, b []byte, u uint64) {
				switch n {
				case 1:
					if b != nil {
						s.locs = append(s.locs, packed(b)...)
					} else {
						s.locs = append(s.locs, u)
					}
				case 2:
					if b != nil {
						for _, x := range packed(b) {
							s.values = append(s.values, int64(x))
						}
					} else {
						s.values = append(s.values, int64(u))
					}
				}
			})
			p.samples = append(p.samples, s)
		case 4: // location
			var id uint64
			var fns []uint64
			_ = fields(v, func(n protowire.Number, b []byte, u uint64) {
				switch n {
				case 1:
					id = u
				case 4:
					_ = fields(b, func(n protowire.Number, _ []byte, u uint64) {
						if n == 1 {
							fns = append(fns, u)
						}
					})
				}
			})
			p.locs[id] = fns
		case 5: // function
			var id uint64
			var name int64
			_ = fields(v, func(n protowire.Number, _ []byte, u uint64) {
				switch n {
				case 1:
					id = u
				case 2:
					name = int64(u)
				}
			})
			p.funcs[id] = name
		case 6:
			p.strs = append(p.strs, string(v))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, i := range typeIdx {
		p.types = append(p.types, p.strs[i])
	}
	return p, nil
}

// fields calls f for each field of a message: bytes fields with v, varints with u.
func fields(b []byte, f func(protowire.Number, []byte, uint64)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch typ {
		case protowire.VarintType:
			u, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			f(num, nil, u)
			b = b[n:]
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			f(num, v, 0)
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}

func packed(b []byte) []uint64 {
	var out []uint64
	for len(b) > 0 {
		u, n := protowire.ConsumeVarint(b)
		if n < 0 {
			break
		}
		out = append(out, u)
		b = b[n:]
	}
	return out
}

func (p *profile) stack(s sample) []string {
	var names []string
	for _, l := range s.locs {
		for _, fn := range p.locs[l] {
			names = append(names, p.strs[p.funcs[fn]])
		}
	}
	return names
}

func classify(names []string) string {
	for _, st := range stages {
		for _, m := range st.markers {
			for _, n := range names {
				if strings.Contains(n, m) {
					return st.name
				}
			}
		}
	}
	return "other"
}

func (p *profile) print(w io.Writer, path string, changes int) {
	// CPU profiles: "samples", "cpu" (ns). Allocation profiles:
	// alloc_objects, alloc_space, inuse_objects, inuse_space.
	col, unit := -1, ""
	for i, t := range p.types {
		switch t {
		case "cpu":
			col, unit = i, "cpu"
		case "alloc_space":
			if col < 0 {
				col, unit = i, "alloc"
			}
		}
	}
	if col < 0 {
		fmt.Fprintf(w, "%s: no cpu or alloc_space samples (types %v)\n", path, p.types)
		return
	}
	by := map[string]int64{}
	var total int64
	for _, s := range p.samples {
		if col >= len(s.values) {
			continue
		}
		v := s.values[col]
		by[classify(p.stack(s))] += v
		total += v
	}
	names := make([]string, 0, len(by))
	for n := range by {
		names = append(names, n)
	}
	order := map[string]int{}
	for i, st := range stages {
		order[st.name] = i
	}
	order["other"] = len(stages)
	sort.Slice(names, func(i, j int) bool { return order[names[i]] < order[names[j]] })
	fmt.Fprintf(w, "\n%s (%s)\n", path, unit)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if unit == "cpu" {
		fmt.Fprintln(tw, "stage\tCPU s\tshare\tµs/change\t")
	} else {
		fmt.Fprintln(tw, "stage\tallocated MiB\tshare\tbytes/change\t")
	}
	for _, n := range append(names, "total") {
		v := by[n]
		if n == "total" {
			v = total
		}
		per := "-"
		if changes > 0 {
			if unit == "cpu" {
				per = fmt.Sprintf("%.2f", float64(v)/1e3/float64(changes))
			} else {
				per = fmt.Sprintf("%.0f", float64(v)/float64(changes))
			}
		}
		amount := fmt.Sprintf("%.2f", float64(v)/1e9)
		if unit != "cpu" {
			amount = fmt.Sprintf("%.1f", float64(v)/(1<<20))
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t%s\t\n", n, amount, 100*float64(v)/float64(max(total, 1)), per)
	}
	tw.Flush()
}
