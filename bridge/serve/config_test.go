package serve

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/config"
)

// TestFromConfigWindow: the window keys reach the feeds: serve.window_txns
// and serve.window_bytes (which also bounds the payloads served, half of it).
func TestFromConfigWindow(t *testing.T) {
	_, fc, err := FromConfig(t.Context(), config.Serve{Listen: "127.0.0.1:0", Stream: "CDC", MaxConns: 1, MaxPerClient: 1,
		Hold: time.Second, KeepAlive: time.Second, WriteTimeout: time.Second, MaxLag: 1,
		WindowTxns: 7, WindowBytes: 3 << 20, MaxProjections: 1, MaxColumns: 1, ProjectionIdle: time.Second}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.Equal(t, 7, fc.WindowTxns)
	require.Equal(t, int64(3<<20), fc.WindowBytes)
}
