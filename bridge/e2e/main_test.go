package e2e_test

import (
	"flag"
	"os"
	"testing"

	"github.com/bridgecdc/bridge/examples/plugins/exampleplugins"
)

// TestMain hands -parallel to the package's gate (sched_test.go) and
// removes the example plugins the tests built.
func TestMain(m *testing.M) {
	flag.Parse()
	takeParallelFlag()
	code := m.Run()
	exampleplugins.Cleanup()
	os.Exit(code)
}
