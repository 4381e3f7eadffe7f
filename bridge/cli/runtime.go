package cli

import (
	"os"
	"runtime"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// DefaultGOGC is the garbage collector's target heap growth TuneRuntime
// sets when the GOGC environment variable is not set.
//
// The bridge's live heap is small (tens of MiB: the changes in flight and
// queued) and nearly all it allocates is short-lived, so at Go's default
// of 100 the collector runs often and costs 1–1.5 µs of the 8–10 µs the
// bridge spends per change (docs/performance.md). At 200 it runs half as
// often, for about a third more peak RSS.
const DefaultGOGC = 200

// TuneRuntime sets the Go runtime for a long-running stream; Main calls it
// once, first. It sets, unless the environment already does:
//   - GOGC to DefaultGOGC;
//   - GOMEMLIMIT to 90% of the memory limit of the process's cgroup when
//     it has one (a container's limit), so the collector works harder near
//     the limit rather than let the process be killed. AUTOMEMLIMIT=off
//     leaves it unset; AUTOMEMLIMIT=0.8 takes another share.
//
// It changes process-wide state: call it from main, not from a library.
func TuneRuntime() {
	if _, ok := os.LookupEnv("GOGC"); !ok {
		debug.SetGCPercent(DefaultGOGC)
	}
	_, _ = memlimit.Set(memlimit.WithProvider(memlimit.FromCgroup)) // no cgroup limit: left unset
}

// SmallMachineCPUs is the most CPUs a process may use (runtime.GOMAXPROCS's
// default: the machine's, or its container's CPU limit) for which `bridge
// run` schedules its goroutines on one (procsFor).
const SmallMachineCPUs = 2

// procsFor returns the GOMAXPROCS `bridge run` sets, 0 to leave the
// runtime's: 1 when the environment does not set GOMAXPROCS, the process
// may use at most SmallMachineCPUs CPUs (cpus), and NATS is not embedded
// (an in-process nats-server would share the one).
//
// On such a machine the bridge shares the cores with its walsender and
// usually nats-server. With two Ps its goroutines (replication reader,
// router, writer, the NATS client's) wake each other across the cores,
// and the runtime's idle Ps spin and poll for work on cores the others
// need. On the benchmark's 2-CPU VM one P cost the bridge 3.7–4.5 µs per
// change of big backlogs against 4.9–6.9 with two, and single-row
// backlogs fell less often into their slow state (docs/performance.md).
// One P carries 150–200k changes/s of the bridge's own work, more than one
// slot's walsender delivers on such a machine.
func procsFor(envSet bool, cpus int, embeddedNATS bool) int {
	if envSet || embeddedNATS || cpus > SmallMachineCPUs || cpus <= 1 {
		return 0
	}
	return 1
}

// TuneProcs applies procsFor to the process (see there) and returns the
// GOMAXPROCS it set, 0 when it left the runtime's, and the CPUs the
// process may use. `bridge run` calls it once the configuration says
// whether NATS is embedded.
func TuneProcs(embeddedNATS bool) (set, cpus int) {
	_, envSet := os.LookupEnv("GOMAXPROCS")
	cpus = runtime.GOMAXPROCS(0)
	if set = procsFor(envSet, cpus, embeddedNATS); set > 0 {
		runtime.GOMAXPROCS(set)
	}
	return set, cpus
}
