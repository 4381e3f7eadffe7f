package cli

import (
	"os"
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
