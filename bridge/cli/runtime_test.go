package cli_test

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/bridgecdc/bridge/bridge/cli"
)

// TestTuneRuntime: GOGC goes to DefaultGOGC unless the environment sets it,
// and then it is left as the runtime read it.
func TestTuneRuntime(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	t.Setenv("AUTOMEMLIMIT", "off") // no memory limit from this test's cgroup

	old, had := os.LookupEnv("GOGC")
	os.Unsetenv("GOGC")
	t.Cleanup(func() {
		if had {
			os.Setenv("GOGC", old)
		}
	})
	cli.TuneRuntime()
	assert.Equal(t, cli.DefaultGOGC, debug.SetGCPercent(100), "GOGC unset")

	t.Setenv("GOGC", "77")
	debug.SetGCPercent(77) // as the runtime does at start
	cli.TuneRuntime()
	assert.Equal(t, 77, debug.SetGCPercent(100), "GOGC set: left alone")
}
