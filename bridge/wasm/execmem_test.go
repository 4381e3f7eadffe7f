package wasm_test

import (
	"bytes"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/bridgecdc/bridge/bridge/wasm"
	"github.com/bridgecdc/bridge/internal/syncbuf"
	"github.com/bridgecdc/bridge/internal/wasmtest"
)

// TestNoExecutableMemory: in a process that may not map executable memory
// (systemd's MemoryDenyWriteExecute, which deploy/systemd/bridge.service
// sets; here prctl PR_SET_MDWE, the same restriction), wazero's compiler
// panics when it starts. Load runs the module interpreted then, and says
// so; the transform gives the same result. Where executable memory is
// allowed, the module is compiled.
func TestNoExecutableMemory(t *testing.T) {
	if path := os.Getenv("BRIDGE_WASM_MDWE_MODULE"); path != "" {
		// The child: deny executable memory, then load and run.
		require.NoError(t, unix.Prctl(unix.PR_SET_MDWE, unix.PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0),
			"prctl(PR_SET_MDWE) needs Linux 6.3 or later")
		var logs syncbuf.Buffer
		m, err := load(t, wasm.Transform, path, "", func(c *wasm.Config) {
			c.Timeout = time.Minute
			c.Log = slog.New(slog.NewTextHandler(&logs, nil))
		})
		require.NoError(t, err)
		require.True(t, m.Interpreted())
		require.Contains(t, logs.String(), "may not map executable memory")
		body, keep, err := m.Transform(t.Context(), change("paid"), nil)
		require.NoError(t, err)
		require.True(t, keep)
		require.JSONEq(t, `{"event":"order.update","order_id":7,"status":"paid","total_cents":1250}`, string(body))
		return
	}
	t.Parallel()
	path := wasmtest.GoTransform(t)
	m, err := load(t, wasm.Transform, path, "", func(c *wasm.Config) { c.Timeout = time.Minute })
	require.NoError(t, err)
	require.False(t, m.Interpreted(), "executable memory is allowed here: the module is compiled")

	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestNoExecutableMemory$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "BRIDGE_WASM_MDWE_MODULE="+path)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), out.String())
	require.Contains(t, out.String(), "--- PASS: TestNoExecutableMemory", out.String())
}
