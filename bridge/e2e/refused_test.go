package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

// pickySink is a fake of our Sink contract that refuses the change whose
// first column is 3 the first `refuse` times it sees it.
type pickySink struct {
	mu     sync.Mutex
	refuse int
	got    []cdc.Change
}

func (p *pickySink) Connect(context.Context) error { return nil }
func (p *pickySink) Close(context.Context) error   { return nil }
func (p *pickySink) Write(_ context.Context, batch []cdc.Change) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var be sinks.BatchError
	for i, c := range batch {
		if len(c.After) > 0 && c.After[0] == int64(3) && p.refuse > 0 {
			p.refuse--
			be.Fail(i, errors.New("row 3 is not welcome"))
			continue
		}
		if be.Err() == nil {
			p.got = append(p.got, c)
		}
	}
	return be.Err()
}

// TestRefusedChangeReportedWithCount: a change a sink refuses run after
// run is reported with how many times in a row and the last reason; once
// accepted, everything arrives in order and nothing is skipped.
func TestRefusedChangeReportedWithCount(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE p (id bigint PRIMARY KEY)`)
	picky := &pickySink{refuse: 3}
	reg := sinks.NewRegistry()
	require.NoError(t, reg.Register("picky", sinks.Plugin{New: func(config.Decoder, sinks.Env) (sinks.Sink, error) { return picky, nil }}))
	y := fmt.Sprintf(`name: picky
nats: { url: %s }
http: { listen: "" }
sources:
  app:
    type: pgoutput
    config: { dsn: %q, tables: [public.p] }
sinks:
  s: { type: picky }
routes:
  - sinks: [s]
`, e.natsURL(), e.pg.DSN(""))
	p := filepath.Join(e.dir, "picky.yaml")
	require.NoError(t, os.WriteFile(p, []byte(y), 0o644))
	cfg, err := config.Load(p)
	require.NoError(t, err)
	var logs syncBuffer
	a, err := app.New(cfg, app.WithSinks(reg), app.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, a.Start(ctx))
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	require.Eventually(t, func() bool { return a.Pipelines()[0].Ready() }, 60*time.Second, 20*time.Millisecond)
	for i := 1; i <= 5; i++ {
		e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO p VALUES (%d)`, i))
	}
	require.Eventually(t, func() bool {
		picky.mu.Lock()
		defer picky.mu.Unlock()
		seen := map[any]bool{}
		for _, c := range picky.got {
			seen[c.After[0]] = true
		}
		return len(seen) >= 5 // rows before 3 may arrive again on each run
	}, 2*time.Minute, 50*time.Millisecond)
	t.Log(logs.String())
	require.Contains(t, logs.String(), "refused 3 times in a row; last reason:")
	require.Contains(t, logs.String(), "row 3 is not welcome")
	require.NotContains(t, logs.String(), "refused 4 times")
	picky.mu.Lock()
	defer picky.mu.Unlock()
	// A sink without a resume cursor may get changes after the checkpoint
	// again on a restart (at least once): compare first arrivals.
	var ids []string
	seen := map[string]bool{}
	for _, c := range picky.got {
		id := fmt.Sprint(c.After[0])
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	require.Equal(t, "1 2 3 4 5", strings.Join(ids, " "), "every row, in order, none skipped")
}
