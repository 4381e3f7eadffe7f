package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cli"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/internal/pgtest"
	"github.com/bridgecdc/bridge/internal/testpki"
)

// TestSecretsNeverLogged runs the bridge command in-process at debug level
// with every kind of secret the config holds: a Postgres password in the
// DSN (URL and key=value), a NATS token (in nats.token and in a URL), a
// sink's own NATS user and password in its URL, a webhook's Authorization
// header, OTLP headers, and, read from files with ${file:...}, a Postgres
// password, a NATS token, the sink's password and the webhook token. It goes
// through connection failures, a webhook that fails before it accepts, a
// normal run, `bridge validate` of good and broken configs and `bridge
// status`, and checks that no secret reaches the log, the output or an
// error. With the NATS keys that hold or name secrets too: a run over
// mutual TLS as an nkey user (nats.nkey_seed_file, nats.tls.key_file), a
// creds file the server refuses (nats.creds), a nats CLI context holding a
// password (nats.context), a key file that does not fit its certificate.
//
// Serial: t.Setenv of OTEL_EXPORTER_OTLP_HEADERS, which the in-process
// bridge reads, and `bridge run` in-process sets OpenTelemetry's global
// error handler, which the log checks read through.
func TestSecretsNeverLogged(t *testing.T) {
	const (
		pgPassword = "pgPw5ecretQ91x"
		natsToken  = "natsTok5ecretW77q"
		wrongToken = "wrongTok5ecretZ12"
		otlpToken  = "otlpTok5ecretK3z"
		// Read from files.
		pgFilePassword = "pgFi1ePw5ecretM4v"
		sinkPassword   = "sinkPw5ecretR8n"
		hookToken      = "hookTok5ecretJ2c"
		brokenPassword = "brokenPw5ecretY6d"
	)
	secrets := []string{pgPassword, natsToken, wrongToken, otlpToken, pgFilePassword, sinkPassword, hookToken, brokenPassword}
	dir := t.TempDir()
	secretFile := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content+"\n"), 0o600)) // as Docker and Kubernetes secrets often are
		return p
	}
	pgPwFile := secretFile("pg_password", pgFilePassword)
	natsTokenFile := secretFile("nats_token", natsToken)
	sinkPwFile := secretFile("sink_password", sinkPassword)
	hookTokenFile := secretFile("hook_token", hookToken)
	brokenPwFile := secretFile("broken_password", brokenPassword)

	// fileuser authenticates with its password (from a file), so a wrong
	// or untrimmed value would fail; loopback trusts the other roles, whose
	// passwords are sent but not checked.
	pg := pgtest.StartT(t, pgtest.Options{HBA: []string{"host all fileuser 127.0.0.1/32 scram-sha-256"}})
	pg.ExecT(t, fmt.Sprintf(`CREATE ROLE bridgeuser LOGIN SUPERUSER PASSWORD '%s'`, pgPassword),
		fmt.Sprintf(`CREATE ROLE fileuser LOGIN SUPERUSER PASSWORD '%s'`, pgFilePassword),
		`CREATE TABLE items (id int PRIMARY KEY)`)
	badDSN := fmt.Sprintf("postgres://bridgeuser:%s@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", pgPassword, freePort(t))
	kvDSN := fmt.Sprintf("host=127.0.0.1 port=%d user=bridgeuser password=%s dbname=nosuchdb sslmode=disable", pg.Port, pgPassword)
	fileDSN := fmt.Sprintf("postgres://fileuser:${file:%s}@127.0.0.1:%d/postgres?sslmode=disable", pgPwFile, pg.Port)

	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		Authorization: natsToken, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(ns.Shutdown)
	natsAddr := strings.TrimPrefix(ns.ClientURL(), "nats://")

	// The nats_core sink's own server, with a user and password.
	coreNS, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1,
		Users: []*server.User{{Username: "sinkuser", Password: sinkPassword}}, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	coreNS.Start()
	require.True(t, coreNS.ReadyForConnections(10*time.Second))
	t.Cleanup(coreNS.Shutdown)
	coreAddr := strings.TrimPrefix(coreNS.ClientURL(), "nats://")
	coreNC, err := nats.Connect(coreNS.ClientURL(), nats.UserInfo("sinkuser", sinkPassword))
	require.NoError(t, err)
	defer coreNC.Close()
	var coreGot atomic.Int64
	_, err = coreNC.Subscribe("cdc.>", func(*nats.Msg) { coreGot.Add(1) })
	require.NoError(t, err)
	require.NoError(t, coreNC.Flush())

	// The webhook fails twice (the sink logs and retries), then accepts.
	var hookCalls, hookOK atomic.Int64
	var hookAuth atomic.Value
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hookAuth.Store(r.Header.Get("Authorization"))
		if hookCalls.Add(1) <= 2 {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		hookOK.Add(1)
	}))
	t.Cleanup(hook.Close)

	// Traces go to a closed port with a secret header: exports fail.
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer "+otlpToken)
	otlp := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))

	// write writes a config; the sinks other than js (in the file's
	// syntax) and their routes are optional.
	write := func(name, dsn, natsSection string, moreSinks ...string) string {
		sinkNames := []string{"js"}
		for _, m := range moreSinks {
			sinkNames = append(sinkNames, strings.TrimSpace(strings.SplitN(m, ":", 2)[0]))
		}
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
%s
routes:
  - sinks: [%s]
`, filepath.Join(dir, "data"), natsSection, dsn, otlp, strings.Join(moreSinks, "\n"), strings.Join(sinkNames, ", "))
		p := filepath.Join(dir, name+".yaml")
		require.NoError(t, os.WriteFile(p, []byte(y), 0o644))
		return p
	}
	good := fmt.Sprintf("  url: nats://%s\n  token: %s", natsAddr, natsToken)
	fromFiles := fmt.Sprintf("  url: nats://%s\n  token: ${file:%s}", natsAddr, natsTokenFile)
	coreSink := fmt.Sprintf(`  core:
    type: nats_core
    config: { url: "nats://sinkuser:${file:%s}@%s" }`, sinkPwFile, coreAddr)
	hookSink := fmt.Sprintf(`  hook:
    type: webhook
    retry: { initial: 10ms, max: 50ms }
    config: { url: %q, headers: { Authorization: "Bearer ${file:%s}" } }`, hook.URL, hookTokenFile)

	var logs, out syncBuffer
	// run runs `bridge run` in the background until stop returns, then
	// stops it and returns its error. With stop nil it waits for the run to
	// end by itself (a permanent error).
	run := func(cfg string, stop func()) error {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cmd := cli.NewCommand(&out, &logs)
		cmd.SetArgs([]string{"run", "-c", cfg, "--log-level", "debug"})
		done := make(chan error, 1)
		go func() { done <- cmd.ExecuteContext(ctx) }()
		if stop != nil {
			stop()
			cancel()
		}
		select {
		case err := <-done:
			return err
		case <-time.After(60 * time.Second): // a detector of a run that never ends, not a speed limit
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

	dsn := fmt.Sprintf("postgres://bridgeuser:%s@127.0.0.1:%d/postgres?sslmode=disable", pgPassword, pg.Port)
	// A wrong token inside the NATS URL: Start fails.
	err = run(write("badnats", dsn, fmt.Sprintf("  url: nats://%s@%s", wrongToken, natsAddr)), nil)
	require.Error(t, err)
	require.Contains(t, logs.String(), "start failed")
	errs := err.Error()

	// Postgres refuses connections: runs fail and restart.
	require.NoError(t, run(write("badpg", badDSN, good), logged("run ended; restarting")))
	// A key=value DSN to a database that does not exist: the bridge stops
	// (retrying cannot create it), logging the DSN's error. (It is waited
	// for: other lines name nosuchdb before the stop.)
	err = run(write("badkv", kvDSN, good), nil)
	require.ErrorContains(t, err, "3D000")
	require.Contains(t, logs.String(), "nosuchdb")
	errs += "\n" + err.Error()

	// stored waits until the stream holds n messages.
	stored := func(n uint64) {
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
			return err == nil && info.State.Msgs == n
		}, 30*time.Second, 20*time.Millisecond)
	}
	// A normal run, with the token in the URL this time.
	require.NoError(t, run(write("good", dsn, fmt.Sprintf("  url: nats://%s@%s", natsToken, natsAddr)), func() {
		logged("streaming")()
		pg.ExecT(t, `INSERT INTO items SELECT generate_series(1, 5)`)
		stored(5)
	}))
	require.Contains(t, logs.String(), "bridge stopped")

	// A run with every secret read from a file, to every sink; the webhook
	// fails before it accepts.
	require.NoError(t, run(write("files", fileDSN, fromFiles, coreSink, hookSink), func() {
		logged("streaming")()
		pg.ExecT(t, `INSERT INTO items SELECT generate_series(6, 10)`)
		stored(10)
		require.Eventually(t, func() bool { return hookOK.Load() > 0 && coreGot.Load() >= 5 }, 30*time.Second, 20*time.Millisecond,
			"the webhook and the nats_core sink receive the changes")
	}))
	require.Equal(t, "Bearer "+hookToken, hookAuth.Load(), "the webhook's header comes from the file, its newline trimmed")
	require.Contains(t, logs.String(), "503", "the webhook's failures are logged")

	// NATS with TLS and client certificates, as an nkey user; a creds file
	// the server refuses; a nats CLI context holding a password. What the
	// key, seed, creds and context files hold never shows.
	pki := testpki.WriteCerts(t, t.TempDir(), "bridge")
	upub, useed := natsembed.UserT(t)
	nkeySeed := string(useed)
	tlsNS := natsembed.StartT(t, natsembed.Options{TLS: pki.Mutual(serverCert(t, pki, time.Time{})), Nkeys: []*server.NkeyUser{{Nkey: upub}}})
	keyPEM, err := os.ReadFile(pki.ClientKey)
	require.NoError(t, err)
	keyLine := strings.Split(string(keyPEM), "\n")[1] // of the key's base64 body
	credsBytes := natsembed.CredsT(t)
	credsSeed := regexp.MustCompile(`SU[A-Z2-7]{50,}`).FindString(string(credsBytes))
	require.NotEmpty(t, credsSeed)
	const ctxPassword = "ctxPw5ecretH3w"
	ctxFile := secretFile("nats-context.json", fmt.Sprintf(`{"url": "nats://%s", "user": "sinkuser", "password": %q}`, coreAddr, ctxPassword))
	secrets = append(secrets, nkeySeed, keyLine, credsSeed, ctxPassword)

	keys := fmt.Sprintf("  url: %s\n  nkey_seed_file: %s\n  tls: {ca_file: %s, cert_file: %s, key_file: %s}",
		tlsNS.URL(), secretFile("bridge.nk", nkeySeed), pki.CA, pki.ClientCert, pki.ClientKey)
	require.NoError(t, run(write("keys", dsn, keys), func() {
		logged("streaming")()
		pg.ExecT(t, `INSERT INTO items SELECT generate_series(11, 12)`)
		nkeyOpt, err := nats.NkeyOptionFromSeed(filepath.Join(dir, "bridge.nk"))
		require.NoError(t, err)
		waitMsgs(t, tlsNS.URL(), "CDC_secrets", 1, []nats.Option{nkeyOpt, nats.RootCAs(pki.CA), nats.ClientCert(pki.ClientCert, pki.ClientKey)},
			"the bridge streams over mutual TLS as an nkey user")
	}))
	badCreds := fmt.Sprintf("  url: nats://%s\n  creds: %s", natsAddr, secretFile("bridge.creds", string(credsBytes)))
	err = run(write("badcreds", dsn, badCreds), nil)
	require.ErrorContains(t, err, "refused the credentials in nats.creds")
	errs += "\n" + err.Error()
	write("ctx", dsn, "  context: "+ctxFile)
	// A key that is not the certificate's: the error names the files.
	write("badkey", dsn, fmt.Sprintf("  url: %s\n  tls: {ca_file: %s, cert_file: %s, key_file: %s}", tlsNS.URL(), pki.CA, pki.ClientCert, pki.ExpiredClientKey))

	// Configs whose secrets cannot be read, or are not valid values.
	write("missing", fileDSN, fmt.Sprintf("  url: nats://%s\n  token: ${file:%s}", natsAddr, filepath.Join(dir, "missing")))
	write("broken", fmt.Sprintf("host=127.0.0.1 port=notaport user=fileuser password=${file:%s} dbname=x", brokenPwFile),
		fmt.Sprintf("  url: nats://%s\n  user: u\n  password: ${file:%s}", natsAddr, brokenPwFile),
		strings.Replace(coreSink, "@", "@:notaport", 1), strings.Replace(hookSink, "Bearer", "Bearer\\n", 1))

	// validate and status, against good and bad settings.
	for _, cfg := range []string{"good", "files", "badpg", "badkv", "badnats", "missing", "broken", "keys", "badcreds", "ctx", "badkey"} {
		for _, args := range [][]string{{"validate"}, {"status"}, {"status", "-o", "json"}} {
			cmd := cli.NewCommand(&out, &logs)
			cmd.SetArgs(append(args, "-c", filepath.Join(dir, cfg+".yaml")))
			if err := cmd.Execute(); err != nil {
				errs += "\n" + err.Error()
			}
		}
	}
	require.Contains(t, out.String(), "CDC_secrets (sink js): 10 messages")
	require.Contains(t, out.String(), "files.yaml: ok")
	require.Contains(t, out.String(), "keys.yaml: ok")
	require.Contains(t, logs.String()+errs, "does not hold the private key of "+pki.ClientCert, "the mismatched key is reported")
	require.Contains(t, logs.String()+errs, "missing (${file:...}) does not exist", "the missing file is reported")
	require.Contains(t, logs.String()+errs, "sinks.hook.config.headers.Authorization: the value must not contain line breaks", "the broken config is reported")

	all := logs.String() + out.String() + errs
	for _, s := range secrets {
		if i := strings.Index(all, s); i >= 0 {
			t.Errorf("secret %q leaked: ...%s...", s, all[max(0, i-200):min(len(all), i+100)])
		}
	}
	require.Contains(t, all, "xxxxx", "secrets are redacted, not just absent")
	t.Logf("%d bytes of log checked", len(all))
}
