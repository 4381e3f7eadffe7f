// Command bridgeprof is the bridge binary plus CPU and allocation profiles,
// for the benchmark only (the product has no profiling endpoint). With
// BENCH_CPUPROFILE set it profiles from start until SIGUSR1 or exit and
// writes the profile there; BENCH_MEMPROFILE receives an allocation profile
// at the same moment. Otherwise it is `bridge` unchanged.
package main

import (
	"os"
	"os/signal"
	"runtime/pprof"
	"sync"
	"syscall"

	"github.com/bridgecdc/bridge/bridge"
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
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() { <-usr1; stop() }()
	code := bridge.Execute(os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
