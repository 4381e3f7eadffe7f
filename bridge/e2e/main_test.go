package e2e_test

import (
	"os"
	"testing"

	"github.com/bridgecdc/bridge/examples/plugins/exampleplugins"
)

// TestMain removes the example plugins the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	exampleplugins.Cleanup()
	os.Exit(code)
}
