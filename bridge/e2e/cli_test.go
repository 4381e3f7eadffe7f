package e2e_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/cli"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

func execCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Execute(args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestExampleConfigIsValid loads and fully validates the annotated
// bridge.yaml at the repository root, plugin blocks and routes included.
func TestExampleConfigIsValid(t *testing.T) {
	defer parallel(t)()
	code, out, errs := execCLI(t, "validate", "-c", "../../bridge.yaml")
	require.Equal(t, 0, code, "stderr: %s", errs)
	require.Contains(t, out, "ok (1 sources, 1 sinks, 2 routes)")
	cfg, err := config.Load("../../bridge.yaml", config.WithEnv(func() []string { return nil }))
	require.NoError(t, err)
	require.Equal(t, "shop", cfg.Name)
	_, err = app.New(cfg)
	require.NoError(t, err)
}

func TestValidateListsEveryError(t *testing.T) {
	defer parallel(t)()
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
	// In the order of the file, framework and plugin problems alike (on one
	// line, by path).
	at := 0
	for _, want := range []string{
		`sources.shop.config.slot: "Bad-Slot" is not a valid slot name`,
		`sources.shop.config.tabels`,
		`sources.other.type: unknown source type "mysql" (compiled in: pgoutput, wal2json)`,
		`sinks.main.type: unknown sink type "nats_jetstrem" (compiled in: nats_core, nats_jetstream, nats_kv, plugin, webhook)`,
		`sinks.js.config.stream`,
		`sinks.js.config.subjcet`,
		`routes[0].sinks[0]`,
		`routes[0].subject`,
		`routes[1].format: unknown format "avro"`,
	} {
		i := strings.Index(errs, want)
		require.GreaterOrEqual(t, i, 0, "missing %q in:\n%s", want, errs)
		require.Greater(t, i, at, "%q out of the file's order in:\n%s", want, errs)
		at = i
	}
	require.NotContains(t, errs, "s3cret", "a secret was printed")
}

func TestPluginsListsKeys(t *testing.T) {
	defer parallel(t)()
	code, out, _ := execCLI(t, "plugins")
	require.Equal(t, 0, code)
	for _, want := range []string{"pgoutput", "nats_jetstream", "dsn (string)", "slot (string", "duplicate_window (duration, default 2m0s)", "formats: cloudevents, debezium, native", "wal2json", "nats_core", "webhook", "(framework) batch.max_changes (int, default 4096)"} {
		require.Contains(t, out, want)
	}
}

// TestSinkTypesBatchDefaults: a config loaded for the bridge gives each sink
// its type's batch defaults (nats_jetstream: 4096 changes, nats_core the
// framework's 1000) unless the config sets them, also for the types of a
// custom registry.
func TestSinkTypesBatchDefaults(t *testing.T) {
	defer parallel(t)()
	p := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(p, []byte(`
name: shop
sources:
  shop: { type: pgoutput, config: { dsn: "postgres://db/shop", slot: s } }
sinks:
  js: { type: nats_jetstream, config: { stream: CDC } }
  jsset: { type: nats_jetstream, batch: { max_changes: 500 }, config: { stream: CDC2 } }
  core: { type: nats_core }
routes:
  - sinks: [js, jsset, core]
`), 0o600))
	noEnv := config.WithEnv(func() []string { return nil })
	cfg, err := config.Load(p, append(app.ConfigOptions(), noEnv)...)
	require.NoError(t, err)
	require.Equal(t, 4096, cfg.Sinks["js"].Batch.MaxChanges)
	require.Equal(t, 500, cfg.Sinks["jsset"].Batch.MaxChanges)
	require.Equal(t, 1000, cfg.Sinks["core"].Batch.MaxChanges)
	require.Equal(t, time.Millisecond, cfg.Sinks["js"].Batch.MaxWait)

	reg := sinks.NewRegistry()
	require.NoError(t, reg.Register("nats_core", sinks.Plugin{Batch: config.Batch{MaxChanges: 7, MaxWait: time.Second}}))
	cfg, err = config.Load(p, append(app.ConfigOptions(app.WithSinks(reg)), noEnv)...)
	require.NoError(t, err)
	require.Equal(t, config.Batch{MaxChanges: 7, MaxWait: time.Second}, cfg.Sinks["core"].Batch)
	require.Equal(t, 1000, cfg.Sinks["js"].Batch.MaxChanges, "a type the registry does not have gets the framework's")
}

func TestVersionAndUsage(t *testing.T) {
	defer parallel(t)()
	code, out, _ := execCLI(t, "version")
	require.Equal(t, 0, code)
	require.True(t, strings.HasPrefix(out, "bridge "))
	code, _, _ = execCLI(t, "run", "--no-such-flag")
	require.Equal(t, 2, code)
}
