package pluginsink_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/examples/plugins/exampleplugins"
	"github.com/bridgecdc/bridge/examples/plugins/go-sink/filesink"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sinks/pluginsink"
	"github.com/bridgecdc/bridge/sinks/pluginsink/pluginv1"
	"github.com/bridgecdc/bridge/sinks/sinktest"
)

// compiled is go-sink's code (package filesink) compiled into the bridge:
// the same work as the plugins, called in process, without gRPC.
type compiled struct{ fs *filesink.Sink }

func (c compiled) Connect(ctx context.Context) error {
	r, err := c.fs.Connect(ctx, &pluginv1.ConnectRequest{})
	if err == nil && r.GetError() != nil {
		err = fmt.Errorf("%s", r.GetError().GetMessage())
	}
	return err
}

func (c compiled) Write(ctx context.Context, batch []cdc.Change) error {
	req := &pluginv1.WriteRequest{Changes: make([]*pluginv1.Change, len(batch))}
	for i := range batch {
		ch := &batch[i]
		req.Changes[i] = &pluginv1.Change{
			Id: ch.ID(), Subject: ch.Subject, Payload: ch.Payload, Headers: ch.Headers,
			Producer: ch.Producer, CommitLsn: uint64(ch.CommitLSN), Seq: ch.Seq,
			Schema: ch.Schema, Table: ch.Table, Op: string(ch.Op), CommitTimeUs: ch.CommitTime.UnixMicro(),
		}
	}
	r, err := c.fs.Write(ctx, req)
	if err == nil && r.GetError() != nil {
		err = fmt.Errorf("%s", r.GetError().GetMessage())
	}
	return err
}

func (c compiled) Close(ctx context.Context) error {
	_, err := c.fs.Close(ctx, &pluginv1.CloseRequest{})
	return err
}

// benchDir is where the benchmark's files go: a tmpfs when there is one,
// so that fsync costs nothing and what is measured is the sink's own work.
func benchDir(b *testing.B) string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "bridge-plugin-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	return b.TempDir()
}

// selfCPU returns the CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU returns the CPU time the threads of process pid have used
// (Linux: /proc/<pid>/task/*/schedstat, in nanoseconds), or 0.
func procCPU(pid int) time.Duration {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum time.Duration
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if ns, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64); err == nil {
			sum += time.Duration(ns)
		}
	}
	return sum
}

// BenchmarkPerChange measures what delivering one change costs through the
// example file sink (examples/plugins): compiled into the bridge, and as an
// out-of-process plugin in Go, Python and TypeScript, in batches of 1, 100
// and 1000 changes (the pipeline's default max_changes), one Write at a
// time as the pipeline calls it. The file is on tmpfs (/dev/shm), so fsync
// is free: the figures are the sink's CPU and the trip to the plugin, not
// a disk. One op is one change; ns/op is the wall time per change (what
// the pipeline waits), cpu-ns/change the CPU time per change of the
// bridge's side and the plugin's process together (steadier than wall time
// on a busy machine), plugin-cpu-ns/change the plugin's part of it. The
// plugins are built first (scripts/deps.sh installs what they need):
//
//	nice go test -run '^$' -bench BenchmarkPerChange -benchtime 2s ./sinks/pluginsink/
//
// docs/plugins.md has the figures.
func BenchmarkPerChange(b *testing.B) {
	payloadSize := 0
	changes := sinktest.Changes(1000, "shop.main.e1")
	for _, c := range changes {
		payloadSize += len(c.Payload)
	}
	b.Logf("payloads of %d bytes on average", payloadSize/len(changes))
	for _, kind := range append([]string{"compiled"}, exampleplugins.Languages...) {
		for _, size := range []int{1, 100, 1000} {
			b.Run(fmt.Sprintf("%s/batch=%d", kind, size), func(b *testing.B) {
				path := filepath.Join(benchDir(b), "out.jsonl")
				// dedupe: false, so the same changes can be written again
				// and again at the same cost.
				pidFile := filepath.Join(filepath.Dir(path), "pid")
				block := map[string]any{"path": path, "dedupe": false, "pid_file": pidFile}
				var s sinks.Sink
				if kind == "compiled" {
					fs := filesink.New()
					cfg := []byte(fmt.Sprintf(`{"path": %q, "dedupe": false}`, path))
					if r, err := fs.Configure(b.Context(), &pluginv1.ConfigureRequest{ConfigJson: cfg}); err != nil || len(r.GetFieldErrors()) > 0 {
						b.Fatal(err, r.GetFieldErrors())
					}
					s = compiled{fs}
				} else {
					exe, err := exampleplugins.Build(kind)
					if err != nil {
						b.Fatal(err)
					}
					sum, err := pluginsink.FileSHA256(exe)
					if err != nil {
						b.Fatal(err)
					}
					cfg := pluginsink.DefaultConfig()
					cfg.Command, cfg.SHA256, cfg.Config = exe, sum, block
					ps, err := pluginsink.Start(cfg, sinks.Env{Name: "bench"})
					if err != nil {
						b.Fatal(err)
					}
					s = ps
				}
				b.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_ = s.Close(ctx)
				})
				if err := s.Connect(b.Context()); err != nil {
					b.Fatal(err)
				}
				// Warm up: the first Writes of a plugin load its code paths
				// (Node's JIT, Python's imports).
				for range 20 {
					if err := s.Write(b.Context(), changes[:size]); err != nil {
						b.Fatal(err)
					}
				}
				pid := 0
				if kind != "compiled" {
					raw, err := os.ReadFile(pidFile)
					if err != nil {
						b.Fatal(err)
					}
					pid, _ = strconv.Atoi(strings.TrimSpace(string(raw)))
				}
				b.SetBytes(int64(payloadSize / len(changes)))
				b.ResetTimer()
				cpu0, plugin0 := selfCPU(), procCPU(pid)
				for done := 0; done < b.N; done += size {
					n := min(size, b.N-done)
					if err := s.Write(b.Context(), changes[:n]); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				plugin := procCPU(pid) - plugin0
				b.ReportMetric(float64((selfCPU()-cpu0+plugin).Nanoseconds())/float64(b.N), "cpu-ns/change")
				if pid != 0 {
					b.ReportMetric(float64(plugin.Nanoseconds())/float64(b.N), "plugin-cpu-ns/change")
				}
			})
		}
	}
}
