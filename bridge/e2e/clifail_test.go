package e2e_test

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestCLIFailuresSayWhy runs the failure paths of every subcommand as a
// user would and checks that each prints its error once, on stderr, as a
// "bridge: ..." line that says what is wrong and what to do (or which
// --help to read), with exit status 2 for usage errors and 1 for failures.
// Some paths need a real Postgres and NATS, or a bridge running; none may
// start a server of its own.
func TestCLIFailuresSayWhy(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id int PRIMARY KEY)`, `CREATE TABLE nokey (v int)`)
	cfg := e.config("clifail", "")
	// A config with the embedded NATS server, and no bridge running.
	emb := e.config("cliemb", "")
	embPort := freePort(t)
	edit(t, emb, "  url: "+e.natsURL(), fmt.Sprintf("  embedded: { port: %d }", embPort))
	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "CDC_clifail", Subjects: []string{"cdc.clifail.>"}})
	require.NoError(t, err)
	// A port something listens on.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()

	for _, c := range []struct {
		name string
		args []string
		code int
		want []string // each must appear on stderr
	}{
		{"unknown command", []string{"rn"}, 2, []string{`unknown command "rn"`, `did you mean "run"?`, "see 'bridge --help'"}},
		{"unknown flag", []string{"run", "--bogus"}, 2, []string{"unknown flag: --bogus", "see 'bridge run --help'"}},
		{"extra argument", []string{"validate", "extra"}, 2, []string{`"bridge validate" takes no arguments, got "extra"`}},
		{"missing config", []string{"run", "-c", "/nonexistent/bridge.yaml"}, 1, []string{"/nonexistent/bridge.yaml: no such file", "-c"}},
		{"status output", []string{"status", "-c", cfg, "-o", "yaml"}, 2, []string{"--output must be text or json", "see 'bridge status --help'"}},
		{"plugins argument", []string{"plugins", "x"}, 2, []string{"takes no arguments"}},
		{"version argument", []string{"version", "x"}, 2, []string{"takes no arguments"}},
		{"serve where", []string{"serve", "-c", cfg, "--where", "{bad"}, 2, []string{"--where:", "see 'bridge serve --help'"}},
		{"serve stream", []string{"serve", "-c", cfg, "--stream", "NOPE"}, 1, []string{"serve.stream", "NOPE"}},
		{"serve listen", []string{"serve", "-c", cfg, "--stream", "CDC_clifail", "--listen", busy.Addr().String()}, 1,
			[]string{"serve.listen", busy.Addr().String(), "address already in use", "choose another address"}},
		{"serve without a bridge", []string{"serve", "-c", emb}, 1, []string{"start `bridge run` with this config first, or set nats.url"}},
		{"snapshot progress", []string{"snapshot", "-c", cfg, "--progress", "fancy"}, 2, []string{"--progress must be auto, bar, plain or none"}},
		{"snapshot bare unknown table", []string{"snapshot", "-c", cfg, "--tables", "nosuch"}, 1, []string{"snapshot of source app refused", "public.nosuch"}},
		{"snapshot unknown table", []string{"snapshot", "-c", cfg, "--tables", "public.nosuch"}, 1, []string{"snapshot of source app refused", "public.nosuch"}},
		{"snapshot table without key", []string{"snapshot", "-c", cfg, "--tables", "public.nokey", "--wait=false"}, 1, []string{"refused", "nokey"}},
		{"snapshot source", []string{"snapshot", "-c", cfg, "--source", "nosuch"}, 2, []string{`--source "nosuch" is not in the config`}},
		{"snapshot without a bridge", []string{"snapshot", "-c", emb, "--tables", "public.orders"}, 1,
			[]string{"the snapshot request goes through NATS", "start `bridge run` with this config first"}},
		{"resync source", []string{"resync", "-c", cfg, "--source", "nosuch"}, 2, []string{`--source "nosuch" is not in the configuration`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errs := execCLI(t, c.args...)
			require.Equal(t, c.code, code, "stdout: %s\nstderr: %s", out, errs)
			require.True(t, strings.HasPrefix(errs, "bridge: "), "stderr starts with 'bridge: ': %q", errs)
			for _, w := range c.want {
				require.Contains(t, errs, w)
			}
			first := strings.SplitN(errs, "\n", 2)[0]
			require.Equal(t, 1, strings.Count(errs, first), "printed once: %q", errs)
		})
	}
	// None of them started the embedded server.
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", embPort))
	require.NoError(t, err, "a helper command left a server on the embedded port")
	ln.Close()
}
