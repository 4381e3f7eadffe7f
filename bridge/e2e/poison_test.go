package e2e_test

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
)

// TestPoisonChangeStopsWithClearError: a row larger than the server's
// max_payload stops the pipeline with an error naming the change, and
// nothing at or after it is checkpointed.
func TestPoisonChangeStopsWithClearError(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE big (id int PRIMARY KEY, body text)`)
	cfg, err := config.Load(e.config("poison", ""))
	require.NoError(t, err)
	a, err := app.New(cfg, app.WithLogger(testLogger(t)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, a.Start(ctx))
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	require.Eventually(t, func() bool { return a.Pipelines()[0].Ready() }, 30*time.Second, 20*time.Millisecond)
	e.pg.ExecT(t, `INSERT INTO big VALUES (1, 'small')`, `INSERT INTO big VALUES (2, repeat('x', 2000000))`, `INSERT INTO big VALUES (3, 'after')`)
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the bridge kept running after a change the server refuses for good")
	}
	require.Error(t, err)
	msg := err.Error()
	for _, want := range []string{`source "app"`, "public.big", "max_payload", "dead_letter_subject", "poison.app."} {
		require.Contains(t, msg, want)
	}
	ms := e.messages("CDC_poison")
	require.Len(t, ms, 1, "only the change before the poison one is delivered")
	m := regexp.MustCompile(`poison\.app\.\w+:([0-9A-F]{16}):0`).FindStringSubmatch(msg)
	require.NotNil(t, m, "the error names the change id: %s", msg)
	poison, err := cdc.ParseLSN(m[1])
	require.NoError(t, err)
	// Nothing at or after the refused change was checkpointed or confirmed.
	require.Less(t, uint64(a.Pipelines()[0].Checkpointed()), uint64(poison))
	var confirmed string
	require.NoError(t, e.pg.Conn(t, "").QueryRow(t.Context(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'slot_poison'`).Scan(&confirmed))
	c, err := cdc.ParseLSN(confirmed)
	require.NoError(t, err)
	require.Less(t, uint64(c), uint64(poison))

	// A restart meets the same change again: it was not skipped.
	a2, err := app.New(cfg, app.WithLogger(testLogger(t)))
	require.NoError(t, err)
	require.NoError(t, a2.Start(ctx))
	err = a2.Run(ctx)
	require.Error(t, err)
	require.Contains(t, err.Error(), m[0])
	require.Len(t, e.messages("CDC_poison"), 1)
}

// TestPoisonChangeGoesToDeadLetter: with dead_letter_subject set, the
// refused change is diverted with its reason and the stream goes on.
func TestPoisonChangeGoesToDeadLetter(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE big (id int PRIMARY KEY, body text)`)
	p := e.config("dlq", "")
	y, err := os.ReadFile(p)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, []byte(strings.Replace(string(y), "duplicate_window: 1s", "duplicate_window: 1s\n      dead_letter_subject: cdc.dlq.dead", 1)), 0o644))
	r := e.start(p)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO big VALUES (1, 'small')`, `INSERT INTO big VALUES (2, repeat('x', 2000000))`, `INSERT INTO big VALUES (3, 'after')`)
	ms := e.waitCount("CDC_dlq", 3, 30*time.Second)
	checkOrdered(t, ms)
	require.Equal(t, "cdc.dlq.public.big", ms[0].Subject)
	require.Equal(t, "cdc.dlq.dead", ms[1].Subject)
	require.Contains(t, ms[1].Header.Get("Bridge-Dead-Letter-Reason"), "max_payload")
	require.Equal(t, "cdc.dlq.public.big", ms[1].Header.Get("Bridge-Original-Subject"))
	require.Equal(t, "public.big", ms[1].Header.Get("Bridge-Table"))
	require.Equal(t, float64(3), ms[2].Body["after"].(map[string]any)["id"])
	// Counted for the alert and the console, by source and sink.
	v, ok := metricValue(scrape(t, "http://"+r.app.HTTPAddr()), "bridge_sink_dead_letters_total", map[string]string{"source": "app", "sink": "js"})
	require.True(t, ok, "bridge_sink_dead_letters_total{source=app,sink=js} is exported")
	require.Equal(t, 1.0, v)
}
