// Command neighbour keeps part of the machine busy, for the benchmark's
// control runs: run `nats bench` beside it to see what sharing the cores
// costs JetStream when nothing of the bridge runs. With -mem 0 it spins on
// registers (CPU only); with -mem N it streams through N MiB, evicting the
// caches as a decoder and an encoder moving changes do.
//
//	go run ./bench/cmd/neighbour -cores 0.8 -mem 256 &
//	./scripts/bench.sh -only js -single 20000 -js-msgs 1000000
//
// -cores is a setpoint, not a measurement: the sleeps between busy
// stretches overshoot, so read the process's CPU time (ps, /proc) for what
// it used. It runs until killed.
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"time"
)

func main() {
	cores := flag.Float64("cores", 0.8, "cores to keep busy (setpoint)")
	mem := flag.Int("mem", 0, "MiB to stream through while busy; 0 spins on registers")
	period := flag.Duration("period", 2*time.Millisecond, "length of one busy+idle cycle per goroutine")
	flag.Parse()
	if *cores <= 0 || *mem < 0 {
		fmt.Fprintln(os.Stderr, "neighbour: -cores must be > 0 and -mem >= 0")
		os.Exit(2)
	}
	buf := make([]byte, *mem<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	n := int(math.Ceil(*cores))
	busy := time.Duration(float64(*period) * *cores / float64(n))
	for range n {
		go spin(buf, busy, *period-busy)
	}
	select {}
}

// spin alternates busy (reading buf a cache line at a time, from places
// its own reads choose, or counting when buf is empty) and idle stretches.
func spin(buf []byte, busy, idle time.Duration) {
	runtime.LockOSThread()
	x := 0
	for {
		start := time.Now()
		for time.Since(start) < busy {
			if len(buf) == 0 {
				x++
				continue
			}
			for range 4096 {
				x += int(buf[(x*64)%len(buf)]) + 1
			}
		}
		time.Sleep(idle)
	}
}
