package bridge_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge"
	"github.com/bridgecdc/bridge/config"
)

func execCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := bridge.Execute(args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestExampleConfigIsValid loads and fully validates the annotated
// bridge.yaml at the repository root, plugin blocks and routes included.
func TestExampleConfigIsValid(t *testing.T) {
	code, out, errs := execCLI(t, "validate", "-c", "../bridge.yaml")
	require.Equal(t, 0, code, "stderr: %s", errs)
	require.Contains(t, out, "ok (1 sources, 1 sinks, 2 routes)")
	cfg, err := config.Load("../bridge.yaml", config.WithEnv(func() []string { return nil }))
	require.NoError(t, err)
	require.Equal(t, "shop", cfg.Name)
	_, err = bridge.New(cfg)
	require.NoError(t, err)
}

func TestValidateListsEveryError(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(p, []byte(`name: bad
sources:
  shop:
    type: pgoutput
    config: { dsn: "postgres://u:s3cret@h/db", slot: "Bad-Slot", tabels: [x] }
  other:
    type: mysql
sinks:
  main:
    type: nats_jetstrem
  js:
    type: nats_jetstream
    config: { subjcet: x }
routes:
  - sinks: [mian]
    subject: "cdc.{{.Source"
  - sinks: [js]
    format: avro
`), 0o644))
	code, _, errs := execCLI(t, "validate", "-c", p)
	require.Equal(t, 1, code)
	for _, want := range []string{
		`sources.other.type: unknown source type "mysql" (compiled in: pgoutput, wal2json)`,
		`sinks.main.type: unknown sink type "nats_jetstrem" (compiled in: nats_core, nats_jetstream, webhook)`,
		`sources.shop.config.tabels`,
		`sources.shop.config.slot: "Bad-Slot" is not a valid slot name`,
		`sinks.js.config.subjcet`,
		`sinks.js.config.stream`,
		`routes[0].sinks[0]`,
		`routes[0].subject`,
		`routes[1].format: unknown format "avro"`,
	} {
		require.Contains(t, errs, want)
	}
	require.NotContains(t, errs, "s3cret", "a secret was printed")
}

func TestPluginsListsKeys(t *testing.T) {
	code, out, _ := execCLI(t, "plugins")
	require.Equal(t, 0, code)
	for _, want := range []string{"pgoutput", "nats_jetstream", "dsn (string)", "slot (string", "duplicate_window (duration, default 2m0s)", "formats: cloudevents, debezium, native", "wal2json", "nats_core", "webhook"} {
		require.Contains(t, out, want)
	}
}

func TestVersionAndUsage(t *testing.T) {
	code, out, _ := execCLI(t, "version")
	require.Equal(t, 0, code)
	require.True(t, strings.HasPrefix(out, "bridge "))
	code, _, _ = execCLI(t, "run", "--no-such-flag")
	require.Equal(t, 2, code)
}
