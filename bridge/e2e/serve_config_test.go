package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cli"
)

// serveYAML is a valid bridge.yaml for `bridge serve` against the NATS
// server at natsURL, with serve keys appended.
func serveYAML(t *testing.T, natsURL, serve string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(p, []byte(fmt.Sprintf(`name: srv
nats: { url: %q }
sources:
  shop: { type: pgoutput, config: { dsn: "postgres://u@127.0.0.1:1/db", slot: bridge_shop } }
sinks:
  main: { type: nats_jetstream, config: { stream: CDC } }
routes:
  - sinks: [main]
serve:
%s`, natsURL, serve)), 0o600))
	return p
}

// TestServeConfigWhere checks serve.where: a condition in YAML is accepted,
// and each bad one is reported by `bridge validate` at its YAML path.
func TestServeConfigWhere(t *testing.T) {
	defer parallel(t)()
	for _, tc := range []struct {
		name, where, want string
	}{
		{"good", `{and: [{eq: [tenant_id, 42]}, {in: [status, [open, paid]]}, {not: {null: deleted_at}}]}`, ""},
		{"operand short of a value", `{and: [{eq: [tenant_id, 42]}, {eq: [status]}]}`, `serve.where.and[1].eq: want ["column", value]`},
		{"unknown condition", `{equals: [tenant_id, 42]}`, `serve.where: unknown condition "equals" (eq, ne, in, contains, lt, lte, gt, gte, null, notnull, and, or, not)`},
		{"two keys", `{eq: [a, 1], ne: [b, 2]}`, `serve.where: want exactly one key (eq, ne, in, contains, lt, lte, gt, gte, null, notnull, and, or, not), got 2`},
		{"empty in", `{or: [{in: [status, []]}]}`, `serve.where.or[0].in[1]: want a non-empty array of values`},
		{"unquoted timestamp", `{gte: [created_at, 2024-01-31]}`, `serve.where.gte[1]: a YAML timestamp: quote it to compare the text Postgres sends, e.g. "2024-01-31"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := serveYAML(t, "nats://127.0.0.1:4222", "  where: "+tc.where+"\n")
			code, _, errs := execCLI(t, "validate", "-c", p)
			if tc.want == "" {
				require.Equal(t, 0, code, errs)
				return
			}
			require.Equal(t, 1, code)
			require.Contains(t, errs, "  "+tc.want+"\n")
		})
	}
}

// TestServeFlagErrors checks that a bad flag value is reported at its key
// with the flag named, before anything is started.
func TestServeFlagErrors(t *testing.T) {
	defer parallel(t)()
	p := serveYAML(t, "nats://127.0.0.1:1", "  max_conns: 50\n")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--max-conns", "0"}, 1, "serve.max_conns: must be > 0, got 0 (set by flag --max-conns)"},
		{[]string{"--tables", "public.orders,orders"}, 1, `serve.tables[1]: must be a schema.table name such as public.orders (globs are not supported), got "orders" (set by flag --tables)`},
		{[]string{"--hold", "-1s"}, 1, "serve.hold: must be > 0, got -1s (set by flag --hold)"},
		{[]string{"--window-bytes", "1000"}, 1, "serve.window_bytes: must be at least 1048576 (1 MiB), got 1000 (set by flag --window-bytes)"},
		{[]string{"--stream", "a.b"}, 1, `serve.stream: "a.b" is not a valid stream name`},
		{[]string{"--where", `{"eq":["a"]}`}, 2, ""},
		{[]string{"--hold", "soon"}, 2, ""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := cli.Execute(append([]string{"serve", "-c", p}, tc.args...), &out, &errb)
			require.Equal(t, tc.code, code, errb.String())
			require.Contains(t, errb.String(), tc.want)
		})
	}
}

// TestServeIgnoresSectionsItDoesNotRead runs `bridge serve` on a host
// that shares bridge.yaml with the bridge but not its database
// credentials: an unset ${...} in sources and broken sinks and routes do
// not stop it (it logs their keys), while `bridge validate` still reports
// them and a problem in the serve section still stops it.
func TestServeIgnoresSectionsItDoesNotRead(t *testing.T) {
	defer parallel(t)()
	e := newFeedsEnv(t, "CDC_loose")
	e.insert(1, 7)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	write := func(serve string) string {
		p := filepath.Join(t.TempDir(), "bridge.yaml")
		require.NoError(t, os.WriteFile(p, []byte(fmt.Sprintf(`name: srv
nats: { url: %q }
sources:
  shop: { type: pgoutput, config: { dsn: "${BRIDGE_TEST_NEVER_SET_DSN}", slot: bridge_shop } }
sinks:
  main: { type: nats_jetstream, config: { stream: "a.b" } }
routes:
  - sinks: [nowhere]
serve:
  listen: %q
  stream: CDC_loose
%s`, e.url, addr, serve)), 0o600))
		return p
	}
	p := write("")

	code, _, errs := execCLI(t, "validate", "-c", p)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "sources.shop.config.dsn: environment variable BRIDGE_TEST_NEVER_SET_DSN is not set")
	require.Contains(t, errs, "routes[0].sinks")

	var stderr syncBuffer
	base := "http://" + addr
	stop := startServeCmd(t, &stderr, base, "-c", p)
	resp, body := get(t, base, url.Values{"token": {"now"}, "timeout": {"1ms"}}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%+v", body)
	resp, body = get(t, base, url.Values{"token": {strings.Split(body.Token, ".")[0] + ".0"}, "timeout": {"5s"}}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%+v", body)
	require.Len(t, changesOf(t, body.Changes), 1, "the row written before serve started")
	require.NoError(t, stop())
	log := stderr.String()
	require.Contains(t, log, "ignoring problems in sections of the configuration that serve does not read")
	for _, key := range []string{"sources.shop.config.dsn", "routes[0].sinks"} {
		require.Contains(t, log, key)
	}

	// A problem in what serve reads stops it, and only that one is printed.
	var out, errb bytes.Buffer
	code = cli.Execute([]string{"serve", "-c", write("  hold: -1s\n")}, &out, &errb)
	require.Equal(t, 1, code, errb.String())
	require.Contains(t, errb.String(), "serve.hold: must be > 0, got -1s")
	require.NotContains(t, errb.String(), "BRIDGE_TEST_NEVER_SET_DSN")
}

// startServeCmd runs `bridge serve` with args, its log to stderr, until
// t ends or stop is called, and returns once base's /readyz answers 200;
// a serve that stops before that fails the test with its error. stop
// ends it and returns what it returned (an error if it did not stop
// within 30 s); it may be called more than once.
func startServeCmd(t *testing.T, stderr io.Writer, base string, args ...string) (stop func() error) {
	t.Helper()
	cmd := cli.NewCommand(io.Discard, stderr)
	cmd.SetArgs(append([]string{"serve"}, args...))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	var once sync.Once
	var stopErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case stopErr = <-done:
			case <-time.After(30 * time.Second):
				stopErr = errors.New("bridge serve did not stop within 30 s of its context ending")
			}
		})
		return stopErr
	}
	t.Cleanup(func() { assert.NoError(t, stop()) })
	exited, stopped := false, error(nil)
	require.Eventually(t, func() bool {
		select {
		case stopped = <-done:
			exited = true
			return true
		default:
		}
		code, _ := httpStatus(t, base+"/readyz")
		return code == http.StatusOK
	}, 60*time.Second, 20*time.Millisecond, "bridge serve not ready within 60 s")
	if exited {
		once.Do(cancel) // reported here, not again at cleanup
		require.FailNow(t, fmt.Sprintf("bridge serve stopped before it was ready: %v", stopped))
	}
	return stop
}
