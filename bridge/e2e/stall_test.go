package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/internal/pgtest"
	"github.com/bridgecdc/bridge/sinks"
)

// gateSink is a fake of our own Sink contract: Write blocks while the gate
// is closed, then records what it got.
type gateSink struct {
	mu   sync.Mutex
	open chan struct{}
	got  []cdc.Change
}

func (g *gateSink) Connect(context.Context) error { return nil }
func (g *gateSink) Close(context.Context) error   { return nil }
func (g *gateSink) Write(ctx context.Context, batch []cdc.Change) error {
	select {
	case <-g.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	g.mu.Lock()
	g.got = append(g.got, batch...)
	g.mu.Unlock()
	return nil
}

func (g *gateSink) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.got)
}

// TestKeepalivesWhileSinkStalls stalls the sink for three times
// wal_sender_timeout and twice receive_timeout: the walsender must not time
// out and the source must not take the connection for lost (same backend
// PID, no new run), and afterwards every change arrives once. Once with
// single-row transactions (the source waits to hand over decoded
// transactions), once with one transaction of 5,000 rows (handed over while
// it arrives: the decoder waits in the middle of it).
//
// Serial: its 6 s stall must outlast wal_sender_timeout and receive_timeout
// by the margins it names, with the keepalives answered in time.
func TestKeepalivesWhileSinkStalls(t *testing.T) {
	t.Run("single-row transactions", func(t *testing.T) {
		testKeepalivesWhileSinkStalls(t, 200, func(pg *pgtest.Server) {
			for i := 0; i < 200; i++ {
				pg.ExecT(t, fmt.Sprintf(`INSERT INTO s (v) VALUES ('%d')`, i))
			}
		})
	})
	t.Run("one large transaction", func(t *testing.T) {
		testKeepalivesWhileSinkStalls(t, 5000, func(pg *pgtest.Server) {
			pg.ExecT(t, `INSERT INTO s (v) SELECT i::text FROM generate_series(1, 5000) i`)
		})
	})
}

func testKeepalivesWhileSinkStalls(t *testing.T, n int, load func(*pgtest.Server)) {
	pg := pgtest.StartT(t, pgtest.Options{Settings: map[string]string{"wal_sender_timeout": "2s"}})
	e := &env{t: t, pg: pg, dir: t.TempDir()}
	e.nsOpts.Host, e.nsOpts.Port, e.nsOpts.StoreDir = "127.0.0.1", natsembed.Ports(t, 1)[0], filepath.Join(e.dir, "nats")
	e.startNATS()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = e.ns.Shutdown(ctx)
	})
	pg.ExecT(t, `CREATE TABLE s (id serial PRIMARY KEY, v text)`)

	gate := &gateSink{open: make(chan struct{})}
	reg := sinks.NewRegistry()
	require.NoError(t, reg.Register("gate", sinks.Plugin{New: func(config.Decoder, sinks.Env) (sinks.Sink, error) { return gate, nil }}))
	y := fmt.Sprintf(`name: stall
nats: { url: %s }
http: { listen: "" }
sources:
  app:
    type: pgoutput
    config: { dsn: %q, status_interval: 500ms, receive_timeout: 3s, buffer: 2 }
sinks:
  g: { type: gate, batch: { max_changes: 10 } }
routes:
  - sinks: [g]
`, e.natsURL(), pg.DSN(""))
	p := filepath.Join(e.dir, "stall.yaml")
	require.NoError(t, os.WriteFile(p, []byte(y), 0o644))
	cfg, err := config.Load(p)
	require.NoError(t, err)
	a, err := app.New(cfg, app.WithSinks(reg), app.WithLogger(testLogger(t)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, a.Start(ctx))
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	require.Eventually(t, func() bool { return a.Pipelines()[0].Ready() }, 30*time.Second, 20*time.Millisecond)

	walsender := func() int {
		var pid int
		_ = pg.Conn(t, "").QueryRow(t.Context(), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'bridge_app'`).Scan(&pid)
		return pid
	}
	pid := walsender()
	require.NotZero(t, pid)
	load(pg)
	time.Sleep(6 * time.Second) // 3 × wal_sender_timeout, 2 × receive_timeout with the sink stalled
	require.Equal(t, pid, walsender(), "the walsender was replaced: keepalives were not answered while the sink stalled")
	require.Zero(t, gate.count())
	close(gate.open)
	require.Eventually(t, func() bool { return gate.count() >= n }, 30*time.Second, 20*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, n, gate.count())
	require.Equal(t, pid, walsender())
}
