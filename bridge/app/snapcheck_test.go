package app_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/pgtest"
	_ "github.com/bridgecdc/bridge/sinks/natscore" // the sink type of the config
	"github.com/bridgecdc/bridge/sources"
)

// countingSnap is the real pgoutput source, counting the snapshot checks
// under way at once (each holds a connection to the database).
type countingSnap struct {
	sources.Source
	inflight, most *atomic.Int32
}

func (c countingSnap) SnapshotOptions() sources.SnapshotOptions {
	return c.Source.(sources.Snapshotter).SnapshotOptions()
}

func (c countingSnap) ReadChunk(ctx context.Context, t sources.SnapshotTable, after []string, limit int, id string) (*sources.Chunk, error) {
	return c.Source.(sources.Snapshotter).ReadChunk(ctx, t, after, limit, id)
}

func (c countingSnap) SnapshotTables(ctx context.Context, names []string) ([]sources.SnapshotTable, error) {
	n := c.inflight.Add(1)
	defer c.inflight.Add(-1)
	for {
		m := c.most.Load()
		if n <= m || c.most.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(20 * time.Millisecond)
	return c.Source.(sources.Snapshotter).SnapshotTables(ctx, names)
}

// TestSnapshotChecksOneAtATime: snapshot requests (the control plane's,
// any NATS user allowed to ask) are checked one at a time, each opening
// its connection to the database in turn: a burst of them waits in line
// instead of taking the database's connections (max_connections), and
// each is answered.
func TestSnapshotChecksOneAtATime(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{})
	pg.ExecT(t, `CREATE TABLE t (id int PRIMARY KEY)`, `CREATE PUBLICATION p FOR TABLE t`)
	real, err := sources.Default.Lookup("pgoutput")
	require.NoError(t, err)
	var inflight, most atomic.Int32
	reg := sources.NewRegistry()
	require.NoError(t, reg.Register("pgoutput", sources.Plugin{Config: real.Config, Doc: real.Doc,
		New: func(decode config.Decoder, env sources.Env) (sources.Source, error) {
			s, err := real.New(decode, env)
			if err != nil {
				return nil, err
			}
			return countingSnap{Source: s, inflight: &inflight, most: &most}, nil
		}}))
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte(fmt.Sprintf(`name: c
sources:
  app: { type: pgoutput, config: { dsn: %q, slot: s, publication: p, create_publication: false } }
sinks:
  main: { type: nats_core }
routes:
  - sinks: [main]
`, pg.DSN(""))), 0o644))
	cfg, err := config.Load(path)
	require.NoError(t, err)
	a, err := app.New(cfg, app.WithSources(reg))
	require.NoError(t, err)

	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range errs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			_, errs[i] = a.CheckSnapshot(ctx, "app", []string{"public.t"}, "")
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int32(1), most.Load(), "one check at a time")
}
