// Command bridgeprof is the bridge binary plus CPU and allocation profiles,
// for the benchmark only (the product has no profiling endpoint). With
// BENCH_CPUPROFILE set it profiles from start until SIGUSR1 or exit and
// writes the profile there; BENCH_MEMPROFILE receives an allocation profile
// at the same moment. BENCH_HEAPPROFILE receives an in-use heap profile
// taken when the live heap was at its largest (sampled every 20 ms, written
// again each time it grows by a tenth), to see what holds peak memory.
// BENCH_TRACE receives an execution trace (runtime/trace) of the window
// BENCH_TRACE_AFTER (default 5s) after start, lasting BENCH_TRACE_FOR
// (default 2s), with the process id appended, for `go tool trace -pprof=sync|net|sched`.
// Otherwise it is `bridge` unchanged.
package main

import (
	"os"
	"os/signal"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/bridgecdc/bridge/bridge/cli"
	_ "github.com/bridgecdc/bridge/plugins"
)

func main() {
	cpuPath, memPath := os.Getenv("BENCH_CPUPROFILE"), os.Getenv("BENCH_MEMPROFILE")
	var cpu *os.File
	if cpuPath != "" {
		f, err := os.Create(cpuPath + ".tmp")
		if err == nil && pprof.StartCPUProfile(f) == nil {
			cpu = f
		}
	}
	stop := sync.OnceFunc(func() {
		if cpu != nil {
			pprof.StopCPUProfile()
			cpu.Close()
			_ = os.Rename(cpuPath+".tmp", cpuPath)
		}
		if memPath != "" {
			if f, err := os.Create(memPath + ".tmp"); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
				_ = os.Rename(memPath+".tmp", memPath)
			}
		}
	})
	if heapPath := os.Getenv("BENCH_HEAPPROFILE"); heapPath != "" {
		go heapPeak(heapPath)
	}
	if tracePath := os.Getenv("BENCH_TRACE"); tracePath != "" {
		go traceWindow(tracePath, envDuration("BENCH_TRACE_AFTER", 5*time.Second), envDuration("BENCH_TRACE_FOR", 2*time.Second))
	}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() { <-usr1; stop() }()
	cli.TuneRuntime() // as bridge.Main does
	code := cli.Execute(os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// heapPeak writes an in-use heap profile to path whenever the live heap
// passes 1.1 × the largest seen at the last write.
func heapPeak(path string) {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	var peak uint64
	for range time.Tick(20 * time.Millisecond) {
		metrics.Read(sample)
		live := sample[0].Value.Uint64()
		if live <= peak+peak/10 {
			continue
		}
		peak = live
		runtime.GC() // the profile shows the heap as of the last GC
		if f, err := os.Create(path + ".tmp"); err == nil {
			_ = pprof.Lookup("heap").WriteTo(f, 0)
			f.Close()
			_ = os.Rename(path+".tmp", path)
		}
	}
}

// traceWindow writes an execution trace of [after, after+dur) to path.
func traceWindow(path string, after, dur time.Duration) {
	path += "." + strconv.Itoa(os.Getpid()) // one per bridge process of a run
	time.Sleep(after)
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return
	}
	if trace.Start(f) != nil {
		f.Close()
		return
	}
	time.Sleep(dur)
	trace.Stop()
	f.Close()
	_ = os.Rename(path+".tmp", path)
}

// envDuration reads a duration from the environment, def when unset or bad.
func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}
