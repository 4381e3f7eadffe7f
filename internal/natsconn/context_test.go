package natsconn_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/sinks"
)

// saveContext writes a nats CLI context as `nats context save` does, under
// $XDG_CONFIG_HOME, and returns its file.
func saveContext(t *testing.T, name string, fields map[string]any) string {
	t.Helper()
	dir := filepath.Join(os.Getenv("XDG_CONFIG_HOME"), "nats", "context")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	b, err := json.MarshalIndent(fields, "", "  ")
	require.NoError(t, err)
	f := filepath.Join(dir, name+".json")
	require.NoError(t, os.WriteFile(f, b, 0o600))
	return f
}

// TestResolveContext: nats.context reads a nats CLI context (natscli
// v0.5.0's format) and applies what bridge.yaml does not set; what the
// bridge cannot honour is refused at nats.context, naming the file.
func TestResolveContext(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, "xdg"))
	t.Setenv("CTX_TEST_PASSWORD", "s3cret")
	file := saveContext(t, "prod", map[string]any{
		"description": "production", "url": "tls://nats-1:4222,tls://nats-2:4222",
		"user": "bridge", "password": "env://CTX_TEST_PASSWORD",
		"ca": "~/tls/ca.pem", "cert": "file://$HOME/tls/client.pem", "key": "~/tls/client.key",
		"tls_first": true, "inbox_prefix": "_INBOX_bridge", "color_scheme": "blue", "jetstream_event_prefix": "",
	})

	c, err := natsconn.Resolve("nats", "", config.NATSClient{Context: "prod"})
	require.NoError(t, err)
	assert.Equal(t, "tls://nats-1:4222,tls://nats-2:4222", c.URL)
	assert.Equal(t, "bridge", c.User)
	assert.Equal(t, "s3cret", c.Password)
	assert.Equal(t, config.NATSTLS{CAFile: home + "/tls/ca.pem", CertFile: home + "/tls/client.pem", KeyFile: home + "/tls/client.key", HandshakeFirst: true}, c.TLS)
	assert.Equal(t, "_INBOX_bridge", c.InboxPrefix)
	assert.Equal(t, `ca of nats.context "prod" (`+file+`)`, c.Key("tls.ca_file"))
	assert.Equal(t, `url of nats.context "prod" (`+file+`)`, c.Key("url"))

	// bridge.yaml's keys win: its url, its credentials (all of them), its
	// CA; the context fills the rest.
	c, err = natsconn.Resolve("sinks.main.config", "tls://other:4222", config.NATSClient{Context: "prod", Creds: "/run/secrets/bridge.creds",
		TLS: config.NATSTLS{CAFile: "/etc/ca.pem"}})
	require.NoError(t, err)
	assert.Equal(t, "tls://other:4222", c.URL)
	assert.Equal(t, "/run/secrets/bridge.creds", c.Creds)
	assert.Empty(t, c.User+c.Password)
	assert.Equal(t, "/etc/ca.pem", c.TLS.CAFile)
	assert.Equal(t, home+"/tls/client.pem", c.TLS.CertFile)
	assert.Equal(t, "sinks.main.config.tls.ca_file", c.Key("tls.ca_file"))
	assert.Equal(t, "sinks.main.config.creds", c.Key("creds"))

	// A context file by path; the nats CLI's default URL when it has none.
	other := filepath.Join(home, "ctx.json")
	require.NoError(t, os.WriteFile(other, []byte(`{"creds": "/run/secrets/a.creds", "nkey": ""}`), 0o600))
	c, err = natsconn.Resolve("nats", "", config.NATSClient{Context: other})
	require.NoError(t, err)
	assert.Equal(t, "nats://127.0.0.1:4222", c.URL)
	assert.Equal(t, "/run/secrets/a.creds", c.Creds)

	for _, x := range []struct {
		name   string
		fields map[string]any
		want   string
	}{
		{"domain", map[string]any{"url": "nats://x", "jetstream_domain": "hub"}, `nats.context: nats CLI context "domain" (` + home + `/xdg/nats/context/domain.json) sets jetstream_domain or jetstream_api_prefix, which the bridge does not support`},
		{"socks", map[string]any{"socks_proxy": "socks5://p:1080"}, "sets socks_proxy, which the bridge does not support"},
		{"nsc", map[string]any{"nsc": "nsc://op/acct/user"}, "sets nsc, which the bridge does not support: export the user's credentials (`nsc generate creds`)"},
		{"onepassword", map[string]any{"creds": "op://vault/bridge/creds"}, `creds "op://…" uses the op: scheme, which the bridge does not resolve`},
		{"unsetenv", map[string]any{"token": "env://CTX_TEST_UNSET"}, "token names environment variable CTX_TEST_UNSET (env://), which is not set"},
		{"seedonly", map[string]any{"user_seed": "SUAxxx"}, "sets user_seed without user_jwt"},
	} {
		saveContext(t, x.name, x.fields)
		_, err := natsconn.Resolve("nats", "", config.NATSClient{Context: x.name})
		require.Error(t, err, x.name)
		var fe *config.FieldError
		require.ErrorAs(t, err, &fe)
		assert.Equal(t, "nats.context", fe.Path)
		assert.Contains(t, err.Error(), x.want)
		assert.NotContains(t, err.Error(), "vault/bridge", "a secret's location is not printed")
	}
	_, err = natsconn.Resolve("nats", "", config.NATSClient{Context: "missing"})
	assert.EqualError(t, err, `nats.context: no nats CLI context "missing": `+home+"/xdg/nats/context/missing.json does not exist (`nats context ls` lists the contexts; `nats context save missing --server ...` creates one)")
	require.NoError(t, os.WriteFile(filepath.Join(home, "xdg", "nats", "context", "broken.json"), []byte("{url: x"), 0o600))
	_, err = natsconn.Resolve("nats", "", config.NATSClient{Context: "broken"})
	assert.ErrorContains(t, err, `nats.context: reading nats CLI context "broken": `+home+"/xdg/nats/context/broken.json is not a context's JSON")

	// ~/.config without XDG_CONFIG_HOME.
	t.Setenv("XDG_CONFIG_HOME", "")
	require.NoError(t, os.MkdirAll(filepath.Join(home, ".config", "nats", "context"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(home, ".config", "nats", "context", "dev.json"), []byte(`{"url": "nats://dev:4222", "token": "t0k"}`), 0o600))
	c, err = natsconn.Resolve("nats", "", config.NATSClient{Context: "dev"})
	require.NoError(t, err)
	assert.Equal(t, "nats://dev:4222", c.URL)
	assert.Equal(t, "t0k", c.Token)
}

// TestForSink: a NATS sink without url or context uses the bridge's
// connection, its own keys winning group by group; with its own url it
// uses only its own keys.
func TestForSink(t *testing.T) {
	bridge := sinks.NATSEnv{URL: "tls://nats:4222", NATSClient: config.NATSClient{Creds: "/bridge.creds",
		TLS: config.NATSTLS{CAFile: "/ca.pem", CertFile: "/c.pem", KeyFile: "/c.key"}}}
	c, err := natsconn.ForSink("sinks.s.config", "", config.NATSClient{}, bridge)
	require.NoError(t, err)
	assert.Equal(t, "tls://nats:4222", c.URL)
	assert.Equal(t, "/bridge.creds", c.Creds)
	assert.Equal(t, "/ca.pem", c.TLS.CAFile)
	assert.Equal(t, "nats.creds", c.Key("creds"))

	c, err = natsconn.ForSink("sinks.s.config", "", config.NATSClient{User: "sink", Password: "pw"}, bridge)
	require.NoError(t, err)
	assert.Equal(t, "tls://nats:4222", c.URL)
	assert.Empty(t, c.Creds, "the sink's own credentials replace the bridge's")
	assert.Equal(t, "sink", c.User)
	assert.Equal(t, "/ca.pem", c.TLS.CAFile, "the bridge's TLS still applies")
	assert.Equal(t, "sinks.s.config.user", c.Key("user"))

	c, err = natsconn.ForSink("sinks.s.config", "nats://elsewhere:4222", config.NATSClient{}, bridge)
	require.NoError(t, err)
	assert.Equal(t, "nats://elsewhere:4222", c.URL)
	assert.Empty(t, c.Creds)
	assert.False(t, c.TLS.Enabled(), "nothing of the bridge's goes to another server")

	c, err = natsconn.ForSink("sinks.s.config", "", config.NATSClient{}, sinks.NATSEnv{})
	require.NoError(t, err)
	assert.Equal(t, "nats://127.0.0.1:4222", c.URL)
}
