package app_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

// TestLoadConfigKVReadsNoSecrets loads the shared configuration as `bridge
// run`, `reload` and every command do (LoadConfig, from a real NATS
// server): an entry that references a file of this machine, or a variable
// config.kv_env does not list, or sets where a source connects, is refused
// at its key, naming the entry and its revision, and the secret appears
// nowhere; one that uses a listed variable loads.
func TestLoadConfigKVReadsNoSecrets(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bridge_config", History: 5})
	require.NoError(t, err)

	dir := t.TempDir()
	secret := filepath.Join(dir, "pg_password")
	require.NoError(t, os.WriteFile(secret, []byte("hunter2-file\n"), 0o600))
	local := filepath.Join(dir, "bridge.yaml")
	require.NoError(t, os.WriteFile(local, []byte(fmt.Sprintf(`name: shop
data_dir: %s
nats: { url: %q }
config: { kv: bridge_config/shop, kv_env: [REGION] }
sources:
  shop:
    config: { dsn: "postgres://app:${file:%s}@db/shop" }
`, filepath.Join(dir, "data"), srv.URL(), secret)), 0o600))
	shared := func(dsn, subject string) []byte {
		block := "{ slot: bridge_shop }"
		if dsn != "" {
			block = fmt.Sprintf("{ dsn: %q }", dsn)
		}
		return fmt.Appendf(nil, `sources:
  shop:
    type: pgoutput
    config: %s
sinks:
  main:
    type: nats_jetstream
    config: { stream: CDC }
routes:
  - sinks: [main]
    subject: %q
`, block, subject)
	}
	opts := append(app.ConfigOptions(), config.WithEnv(func() []string {
		return []string{"PG_PASSWORD=hunter2-env", "REGION=eu"}
	}))
	load := func(doc []byte) (*config.Config, string, error) {
		t.Helper()
		rev, err := kv.Put(ctx, "shop", doc)
		require.NoError(t, err)
		cfg, from, got, err := app.LoadConfig(ctx, local, opts...)
		if err == nil {
			require.Equal(t, rev, got)
		}
		return cfg, from, err
	}

	_, _, err = load(shared("", "x.${file:"+secret+"}.{{.Table}}"))
	require.EqualError(t, err, "routes[0].subject: kv bridge_config/shop revision 1 may not read files (${file:...}): "+
		"whoever can write that entry would read this machine's files through it; set this key in the local file, where ${file:...} works, and leave it out of the entry")

	_, _, err = load(shared("", "x.${PG_PASSWORD}.{{.Table}}"))
	require.EqualError(t, err, "routes[0].subject: kv bridge_config/shop revision 2 may not read environment variable PG_PASSWORD (${PG_PASSWORD}): "+
		"whoever can write that entry would read it on every bridge; set this key in the local file or a BRIDGE_* variable and leave it out of the entry, "+
		"or, if PG_PASSWORD holds no secret, list it in config.kv_env of the local file")

	// Where the source connects is the machine's own: an entry pointing it
	// elsewhere would take the password the local file merges in there.
	_, _, err = load(shared("postgres://app@evil.example/shop", "x.{{.Table}}"))
	require.EqualError(t, err, "sources.shop.config.dsn: kv bridge_config/shop revision 3 sets dsn, where this machine connects, with what credentials, or what it runs or writes: "+
		"whoever can write that entry would send this machine's credentials or data where it chooses on every bridge; set it in each machine's local file and leave it out of the entry")

	// The fix the refusals give: the secret in the local file, under the
	// key the entry leaves out.
	cfg, from, err := load(shared("", "x.${REGION}.{{.Table}}"))
	require.NoError(t, err)
	require.Equal(t, "file "+local+" + kv bridge_config/shop revision 4", from)
	require.Equal(t, "x.eu.{{.Table}}", cfg.Routes[0].Subject, "a variable config.kv_env lists is expanded")
	require.Equal(t, map[string]any{"dsn": "postgres://app:hunter2-file@db/shop", "slot": "bridge_shop"}, cfg.Sources["shop"].Config,
		"the local file's key and the entry's merge")
}
