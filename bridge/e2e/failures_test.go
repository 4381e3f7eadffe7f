package e2e_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// edit rewrites the config file at path with each old → new replacement,
// failing the test when one is not found.
func edit(t *testing.T, path string, pairs ...string) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s := string(b)
	for i := 0; i < len(pairs); i += 2 {
		require.Contains(t, s, pairs[i], "config %s", path)
		s = strings.ReplaceAll(s, pairs[i], pairs[i+1])
	}
	require.NoError(t, os.WriteFile(path, []byte(s), 0o644))
}

// loggedApp builds the App of the config at path with its log in logs (and
// the test's log).
func loggedApp(t *testing.T, path string, logs *syncBuffer) *app.App {
	t.Helper()
	cfg, err := config.Load(path, app.ConfigOptions()...)
	require.NoError(t, err)
	a, err := app.New(cfg, app.WithLogger(appLogger(t, logs)))
	require.NoError(t, err)
	return a
}

// appLogger logs to logs and the test's log.
func appLogger(t *testing.T, logs *syncBuffer) *slog.Logger {
	tw := &testWriter{t: t}
	t.Cleanup(func() { tw.mu.Lock(); tw.done = true; tw.mu.Unlock() })
	return slog.New(slog.NewTextHandler(io.MultiWriter(logs, tw), nil))
}

// TestPermanentErrorsStopAtOnce: errors that retrying cannot cure stop the
// bridge at once, with the fix, instead of being retried at WARN while
// only /readyz tells: wrong password, no such database, a published table
// that does not exist, replicas on a server that is not clustered (for the
// stream and for the checkpoint bucket). The proof that nothing was
// retried is that no run restarted.
func TestPermanentErrorsStopAtOnce(t *testing.T) {
	defer parallel(t)()
	e := newEnvWith(t, pgtest.Options{HBA: []string{
		"host all alice 127.0.0.1/32 scram-sha-256", "host replication alice 127.0.0.1/32 scram-sha-256",
	}})
	e.pg.ExecT(t, `CREATE ROLE alice LOGIN REPLICATION SUPERUSER PASSWORD 'right'`)
	alice := strings.Replace(e.pg.DSN(""), "postgres://postgres@", "postgres://alice:wrong@", 1)
	for _, c := range []struct {
		name  string
		edits []string // old, new pairs applied to e.config's file
		start bool     // Start fails (before any pipeline runs)
		want  []string
	}{
		{name: "wrong password", edits: []string{e.pg.DSN(""), alice},
			want: []string{"28P01", "fix: password authentication failed: check the user and password"}},
		{name: "no such database", edits: []string{e.pg.DSN(""), e.pg.DSN("nosuchdb")},
			want: []string{"3D000", "the database does not exist"}},
		{name: "published table missing", edits: []string{`message_prefixes: ["app"]`, `message_prefixes: ["app"]` + "\n      tables: [public.nosuch]"},
			want: []string{"nosuch"}},
		{name: "stream replicas without a cluster", edits: []string{"duplicate_window: 1s", "duplicate_window: 1s\n      replicas: 3"},
			want: []string{"replicas > 1 not supported", "fix: the NATS server is not clustered"}},
		{name: "bucket replicas without a cluster", edits: []string{"interval: 200ms", "interval: 200ms\n  replicas: 3\n  bucket: ckpt_r3"}, start: true,
			want: []string{"replicas > 1 not supported", "checkpoint.bucket", "fix: the NATS server is not clustered"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := strings.ReplaceAll(c.name, " ", "")
			path := e.config(name, "")
			edit(t, path, c.edits...)
			var logs syncBuffer
			a := loggedApp(t, path, &logs)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			err := a.Start(ctx)
			if c.start {
				require.Error(t, err)
				a.Close()
			} else {
				require.NoError(t, err)
				done := make(chan error, 1)
				go func() { done <- a.Run(ctx) }()
				select {
				case err = <-done:
				case <-time.After(90 * time.Second): // a detector of retrying forever, not a speed limit
					t.Fatalf("the bridge did not stop; log:\n%s", logs.String())
				}
				require.Error(t, err)
			}
			for _, w := range c.want {
				require.ErrorContains(t, err, w)
			}
			require.NotContains(t, logs.String(), "run ended; restarting", "a permanent error was retried")
			require.NotContains(t, logs.String(), "checkpoint bucket yet; retrying", "a permanent error was retried")
		})
	}
}

// TestTransientErrorsAreRetried: a Postgres or a NATS that is not up yet
// is waited for, each attempt logged with its count and the next delay,
// /readyz answering 503 meanwhile; once it is up, every change arrives
// once.
func TestTransientErrorsAreRetried(t *testing.T) {
	defer parallel(t)()
	readyz := func(addr string) int {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	t.Run("postgres down", func(t *testing.T) {
		e := newEnv(t)
		e.pg.ExecT(t, `CREATE TABLE td (id int PRIMARY KEY)`)
		path := e.config("pgdown", "")
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		edit(t, path, `listen: "127.0.0.1:0"`, fmt.Sprintf("listen: %q", addr))
		require.NoError(t, e.pg.Stop(context.Background(), "fast"))
		var logs syncBuffer
		a := loggedApp(t, path, &logs)
		ctx, cancel := context.WithCancel(context.Background())
		require.NoError(t, a.Start(ctx))
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
		require.Eventually(t, func() bool { return strings.Contains(logs.String(), "attempt=3") }, 60*time.Second, 50*time.Millisecond,
			"the run is retried, each attempt counted")
		require.Contains(t, logs.String(), "run ended; restarting")
		require.Regexp(t, `attempt=\d+ in=\S+`, logs.String(), "each retry says the next delay")
		require.Equal(t, http.StatusServiceUnavailable, readyz(addr))
		require.NoError(t, e.pg.Start(context.Background()))
		require.Eventually(t, func() bool { return a.Pipelines()[0].Ready() }, 60*time.Second, 20*time.Millisecond)
		e.pg.ExecT(t, `INSERT INTO td SELECT generate_series(1, 50)`)
		ms := e.waitCount("CDC_pgdown", 50, 30*time.Second)
		checkOrdered(t, ms)
		require.Eventually(t, func() bool { return readyz(addr) == http.StatusOK }, 30*time.Second, 50*time.Millisecond)
	})
	t.Run("nats down", func(t *testing.T) {
		e := newEnv(t)
		e.pg.ExecT(t, `CREATE TABLE tn (id int PRIMARY KEY)`)
		path := e.config("natsdown", "")
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		edit(t, path, `listen: "127.0.0.1:0"`, fmt.Sprintf("listen: %q", addr))
		e.stopNATS()
		var logs syncBuffer
		a := loggedApp(t, path, &logs)
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan error, 1)
		go func() { started <- a.Start(ctx) }()
		require.Eventually(t, func() bool { return strings.Contains(logs.String(), "attempt=3") }, 60*time.Second, 50*time.Millisecond)
		require.Contains(t, logs.String(), "cannot open the checkpoint bucket yet; retrying")
		require.Equal(t, http.StatusServiceUnavailable, readyz(addr))
		e.startNATS()
		require.NoError(t, <-started)
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
		require.Eventually(t, func() bool { return a.Pipelines()[0].Ready() }, 60*time.Second, 20*time.Millisecond)
		e.pg.ExecT(t, `INSERT INTO tn SELECT generate_series(1, 50)`)
		ms := e.waitCount("CDC_natsdown", 50, 60*time.Second)
		checkOrdered(t, ms)
	})
}
