package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWithDocument layers a KV document over the file: its keys win, maps
// merge key by key, lists are replaced, env variables still win, and its
// strings are interpolated.
func TestWithDocument(t *testing.T) {
	doc := `
sinks:
  other: { type: nats_core }
routes:
  - sinks: [other]
    subject: "x.${TENANT}.{{.Table}}"
checkpoint: { interval: 3s }
`
	cfg, err := loadYAML(t, base+"config: { kv: bridge_config/shop }\n",
		WithDocument("kv bridge_config/shop", []byte(doc)), environ("TENANT=t1", "BRIDGE_CHECKPOINT__INTERVAL=5s"))
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
