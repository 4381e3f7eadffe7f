package bench

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// JSMode is one `nats bench js pub` variant.
type JSMode struct {
	Name string   // label in the report
	Args []string // subcommand and its options
}

// JSModes are the publishers measured: asynchronous publishes with the CLI's
// default window (500) and with the bridge's (max_pending 4096), and fast
// batch publishing (ADR-50 fast ingest) with its defaults.
var JSModes = []JSMode{
	{"async window 500", []string{"async", "--batch", "500"}},
	{"async window 4096", []string{"async", "--batch", "4096"}},
	{"fast batch 500", []string{"fast", "--batch", "500"}},
}

// JSRun is the result of one `nats bench js pub` run.
type JSRun struct {
	Mode       string        `json:"mode"`
	Msgs       int           `json:"msgs"`
	Size       int           `json:"size"`
	Headers    int           `json:"headers"` // header fields besides Nats-Msg-Id
	Rate       float64       `json:"msgs_per_s"`
	Stored     uint64        `json:"stored"`
	NATSServer time.Duration `json:"nats_server_cpu_ns"`
	Client     time.Duration `json:"client_cpu_ns"`
	Command    string        `json:"command"`
	Other      float64       `json:"other_cores"` // machine CPU beyond nats-server and the client, in cores
}

var rateRE = regexp.MustCompile(`stats: ([0-9,]+) msgs/sec`)

// RunJSBench publishes msgs messages of size bytes with a unique Nats-Msg-Id
// each (--dedup) and the given headers into a fresh file stream with the
// bridge's default duplicate window, and reads the rate the CLI reports.
func RunJSBench(ctx context.Context, natsBin string, srv *NATSServer, js jetstream.JetStream, m JSMode, msgs, size int, headers map[string][]string, dir string) (JSRun, error) {
	r := JSRun{Mode: m.Name, Msgs: msgs, Size: size}
	stream := "JSBENCH_" + strings.NewReplacer(" ", "_").Replace(m.Name)
	subject := "jsbench." + strings.ToLower(strings.NewReplacer(" ", "_").Replace(m.Name))
	csvPath := filepath.Join(dir, stream+".csv")
	args := []string{"-s", srv.URL(), "--no-context", "bench", "js", "pub"}
	args = append(args, m.Args...)
	args = append(args, "--create", "--purge", "--storage", "file", "--replicas", "1", "--dedup", "--dedupwindow", "2m",
		"--maxbytes", "8GB", "--stream", stream, "--msgs", strconv.Itoa(msgs), "--size", strconv.Itoa(size),
		"--no-progress", "--csv", csvPath)
	keys := make([]string, 0, len(headers))
	for k := range headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.HasPrefix(k, "Nats-") || len(headers[k]) == 0 {
			continue
		}
		args = append(args, "-H", k+":"+headers[k][0])
		r.Headers++
	}
	args = append(args, subject)
	r.Command = "nats " + strings.Join(args, " ")
	before, err := ReadCPU(srv.PID())
	if err != nil {
		return r, err
	}
	cmd := exec.CommandContext(ctx, natsBin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "NATS_CONTEXT=")
	if err := cmd.Run(); err != nil {
		return r, fmt.Errorf("%s: %w\n%s", r.Command, err, out.String())
	}
	after, err := ReadCPU(srv.PID())
	if err != nil {
		return r, err
	}
	r.NATSServer = after.Self - before.Self
	r.Client = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	r.Rate = csvRate(csvPath)
	if r.Rate == 0 {
		if mm := rateRE.FindStringSubmatch(out.String()); mm != nil {
			r.Rate, _ = strconv.ParseFloat(strings.ReplaceAll(mm[1], ",", ""), 64)
		}
	}
	if r.Rate == 0 {
		return r, fmt.Errorf("%s: no rate in its output:\n%s", r.Command, out.String())
	}
	if r.Stored, err = StreamMsgs(ctx, js, stream); err != nil {
		return r, err
	}
	DeleteStream(ctx, js, stream)
	return r, nil
}

// csvRate sums MsgsPerSec over the publisher rows of the CLI's CSV.
func csvRate(path string) float64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) < 2 {
		return 0
	}
	col := -1
	for i, h := range rows[0] {
		if h == "MsgsPerSec" {
			col = i
		}
	}
	if col < 0 {
		return 0
	}
	var sum float64
	for _, row := range rows[1:] {
		if col < len(row) {
			v, _ := strconv.ParseFloat(row[col], 64)
			sum += v
		}
	}
	return sum
}
