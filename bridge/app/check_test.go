package app_test

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
	_ "github.com/bridgecdc/bridge/sources/pgoutput" // the source type of the config
)

// closeCounting counts the instances built and closed.
type closeCounting struct{ closed *atomic.Int32 }

func (closeCounting) Connect(context.Context) error             { return nil }
func (closeCounting) Write(context.Context, []cdc.Change) error { return nil }
func (c closeCounting) Close(context.Context) error             { c.closed.Add(1); return nil }

// TestCheckClosesThrowawaySinks: app.New builds one instance of each sink
// to check its block, and closes it again: a sink that starts something
// when built (a plugin's process) leaves nothing running.
func TestCheckClosesThrowawaySinks(t *testing.T) {
	var built, closed atomic.Int32
	reg := sinks.NewRegistry()
	require.NoError(t, reg.Register("counting", sinks.Plugin{Config: struct{}{}, Doc: "counts",
		New: func(config.Decoder, sinks.Env) (sinks.Sink, error) {
			built.Add(1)
			return closeCounting{closed: &closed}, nil
		}}))
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`name: c
sources:
  app: { type: pgoutput, config: { dsn: "postgres://localhost/x", slot: s, publication: p } }
sinks:
  a: { type: counting }
  b: { type: counting }
routes:
  - sinks: [a, b]
`), 0o644))
	cfg, err := config.Load(path)
	require.NoError(t, err)
	_, err = app.New(cfg, app.WithSinks(reg))
	require.NoError(t, err)
	require.Equal(t, int32(2), built.Load())
	require.Equal(t, int32(2), closed.Load(), "each throwaway sink is closed")
}
