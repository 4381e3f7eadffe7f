package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cli"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// lockedBuffer is a bytes.Buffer safe for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSecretsNeverLogged runs the bridge command in-process at debug level
// with a Postgres password in the DSN, a NATS token, OTLP headers and NATS
// credentials in a URL, through connection failures and a normal run, and
// checks that no secret reaches the log or the output of status.
func TestSecretsNeverLogged(t *testing.T) {
	const (
		pgPassword = "pgPw5ecretQ91x"
		natsToken  = "natsTok5ecretW77q"
		wrongToken = "wrongTok5ecretZ12"
		otlpToken  = "otlpTok5ecretK3z"
	)
	secrets := []string{pgPassword, natsToken, wrongToken, otlpToken}
	pg := pgtest.StartT(t, pgtest.Options{})
	// pg_hba trusts loopback, so the password is sent but not checked.
	pg.ExecT(t, fmt.Sprintf(`CREATE ROLE bridgeuser LOGIN SUPERUSER PASSWORD '%s'`, pgPassword),
		`CREATE TABLE items (id int PRIMARY KEY)`)
	dsn := fmt.Sprintf("postgres://bridgeuser:%s@127.0.0.1:%d/postgres?sslmode=disable", pgPassword, pg.Port)
	badDSN := fmt.Sprintf("postgres://bridgeuser:%s@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", pgPassword, freePort(t))
	kvDSN := fmt.Sprintf("host=127.0.0.1 port=%d user=bridgeuser password=%s dbname=nosuchdb sslmode=disable", pg.Port, pgPassword)

	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		Authorization: natsToken, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(ns.Shutdown)
	natsAddr := strings.TrimPrefix(ns.ClientURL(), "nats://")

	// Traces go to a closed port with a secret header: exports fail.
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer "+otlpToken)
	otlp := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))

	dir := t.TempDir()
	write := func(name, dsn, natsSection string) string {
		y := fmt.Sprintf(`name: secrets
data_dir: %s
nats:
%s
sources:
  app:
    type: pgoutput
    config: { dsn: %q, slot: slot_secrets, publication: pub_secrets }
checkpoint: { interval: 200ms }
http: { listen: "127.0.0.1:0" }
telemetry:
  tracing: { endpoint: %q }
  metrics: { slot_poll_interval: 100ms }
sinks:
  js:
    type: nats_jetstream
    config: { stream: CDC_secrets, subjects: ["cdc.>"] }
routes:
  - sinks: [js]
`, filepath.Join(dir, "data"), natsSection, dsn, otlp)
		p := filepath.Join(dir, name+".yaml")
		require.NoError(t, os.WriteFile(p, []byte(y), 0o644))
		return p
	}
	good := fmt.Sprintf("  url: nats://%s\n  token: %s", natsAddr, natsToken)

	var logs, out lockedBuffer
	// run runs `bridge run` in the background until stop returns, then
	// stops it and returns its error.
	run := func(cfg string, stop func()) error {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cmd := cli.NewCommand(&out, &logs)
		cmd.SetArgs([]string{"run", "-c", cfg, "--log-level", "debug"})
		done := make(chan error, 1)
		go func() { done <- cmd.ExecuteContext(ctx) }()
		stop()
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			t.Fatal("bridge run did not stop")
			return nil
		}
	}
	logged := func(substr string) func() {
		return func() {
			require.Eventually(t, func() bool { return strings.Contains(logs.String(), substr) }, 30*time.Second, 20*time.Millisecond,
				"waiting for %q in the log", substr)
		}
	}

	// A wrong token inside the NATS URL: Start fails.
	err = run(write("badnats", dsn, fmt.Sprintf("  url: nats://%s@%s", wrongToken, natsAddr)), logged("start failed"))
	require.Error(t, err)

	// Postgres refuses connections: runs fail and restart.
	require.NoError(t, run(write("badpg", badDSN, good), logged("run ended; restarting")))
	// A key=value DSN to a database that does not exist: the bridge stops
	// (retrying cannot create it), logging the DSN's error.
	require.Error(t, run(write("badkv", kvDSN, good), logged("nosuchdb")))
	require.Contains(t, logs.String(), "3D000")

	// A normal run, with the token in the URL this time.
	require.NoError(t, run(write("good", dsn, fmt.Sprintf("  url: nats://%s@%s", natsToken, natsAddr)), func() {
		logged("streaming")()
		pg.ExecT(t, `INSERT INTO items SELECT generate_series(1, 5)`)
		nc, err := nats.Connect(ns.ClientURL(), nats.Token(natsToken))
		require.NoError(t, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			s, err := js.Stream(t.Context(), "CDC_secrets")
			if err != nil {
				return false
			}
			info, err := s.Info(t.Context())
			return err == nil && info.State.Msgs == 5
		}, 30*time.Second, 20*time.Millisecond)
	}))
	require.Contains(t, logs.String(), "bridge stopped")

	// status, against good and bad settings.
	for _, cfg := range []string{"good", "badpg", "badkv", "badnats"} {
		cmd := cli.NewCommand(&out, &logs)
		cmd.SetArgs([]string{"status", "-c", filepath.Join(dir, cfg+".yaml")})
		_ = cmd.Execute()
		cmd.SetArgs([]string{"status", "-o", "json", "-c", filepath.Join(dir, cfg+".yaml")})
		_ = cmd.Execute()
	}
	require.Contains(t, out.String(), "CDC_secrets (sink js): 5 messages")

	all := logs.String() + out.String()
	for _, s := range secrets {
		if i := strings.Index(all, s); i >= 0 {
			t.Errorf("secret %q leaked: ...%s...", s, all[max(0, i-200):min(len(all), i+100)])
		}
	}
	require.Contains(t, all, "xxxxx", "secrets are redacted, not just absent")
	t.Logf("%d bytes of log checked", len(all))
}
