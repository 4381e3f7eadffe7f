package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestValidateNATS: the shape of the nats section: the client keys, and
// the embedded server, which serves no TLS, authenticates with a user or
// a token only, and is reachable beyond loopback only with one of them.
func TestValidateNATS(t *testing.T) {
	url := map[string]any{"nats.url": "tls://nats.internal:4222"}
	with := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	merge := func(a, b map[string]any) map[string]any {
		m := map[string]any{}
		for k, v := range a {
			m[k] = v
		}
		for k, v := range b {
			m[k] = v
		}
		return m
	}
	for _, c := range []struct {
		name string
		set  map[string]any
		want []string
	}{
		{"creds and an nkey seed", merge(url, with("nats.creds", "/a.creds", "nats.nkey_seed_file", "/a.nk")),
			[]string{"nats.nkey_seed_file: set creds or nkey_seed_file, not both: a .creds file holds its own nkey seed"}},
		{"cert without key", merge(url, with("nats.tls.cert_file", "/c.crt")),
			[]string{"nats.tls.key_file: must be set with cert_file: the private key of the client certificate"}},
		{"key without cert", merge(url, with("nats.tls.key_file", "/c.key")),
			[]string{"nats.tls.cert_file: must be set with key_file: the client certificate of the private key"}},
		{"insecure with a CA", merge(url, with("nats.tls.ca_file", "/ca.crt", "nats.tls.insecure_skip_verify", true)),
			[]string{"nats.tls.insecure_skip_verify: turns off the verification tls.ca_file is for: remove one of them"}},
		{"ping interval below 100ms", merge(url, with("nats.ping_interval", "10ms")),
			[]string{"nats.ping_interval: must be at least 100ms (0 is the default, 3s), got 10ms"}},
		{"negative pings outstanding", merge(url, with("nats.max_pings_outstanding", -1)),
			[]string{"nats.max_pings_outstanding: must be at least 1 (0 is the default, 3), got -1"}},
		{"context that is a path but no json", with("nats.context", "../ctx"),
			[]string{`nats.context: must be the name of a nats CLI context (as ` + "`nats context ls`" + ` lists it) or the path of its .json file, got "../ctx"`}},
		{"embedded with tls", with("nats.tls.ca_file", "/ca.crt"),
			[]string{"nats.tls: applies to nats.url or nats.context, which are empty: the embedded server serves no TLS (it listens on loopback); set nats.url to a NATS server with TLS, or remove nats.tls"}},
		{"embedded with creds", with("nats.creds", "/a.creds"),
			[]string{"nats.creds: applies to nats.url or nats.context, which are empty: the embedded server authenticates with nats.user and password or nats.token; set one of those, or set nats.url"}},
		{"embedded on every interface without auth", with("nats.embedded.host", "0.0.0.0"),
			[]string{`nats.embedded.host: "0.0.0.0" lets other machines reach the embedded NATS server, which holds every change: set nats.user and nats.password (or nats.token), which it then requires of every client, or listen on 127.0.0.1`}},
		{"embedded on a LAN address with a user but no password", with("nats.embedded.host", "10.1.2.3", "nats.user", "bridge"),
			[]string{`nats.password: must be set: nats.embedded.host "10.1.2.3" lets other machines reach the embedded NATS server, which requires nats.user and this password of every client`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := loadYAML(t, base, WithOverrides(c.set))
			assert.Equal(t, c.want, problems(t, err))
		})
	}
	for _, c := range []struct {
		name string
		set  map[string]any
	}{
		{"embedded on loopback without auth", with("nats.embedded.host", "127.0.0.1")},
		{"embedded on localhost without auth", with("nats.embedded.host", "localhost")},
		{"embedded on ::1 without auth", with("nats.embedded.host", "::1")},
		{"embedded on every interface with a user", with("nats.embedded.host", "0.0.0.0", "nats.user", "bridge", "nats.password", "s3cret")},
		{"embedded on every interface with a token", with("nats.embedded.host", "::", "nats.token", "s3cret")},
		{"a context gives the URL: no embedded server", with("nats.context", "prod", "nats.tls.ca_file", "/ca.crt", "nats.creds", "/a.creds")},
		{"a context file", with("nats.context", "/etc/bridge/nats-context.json")},
		{"tls on a server", merge(url, with("nats.tls.ca_file", "/ca.crt", "nats.tls.cert_file", "/c.crt", "nats.tls.key_file", "/c.key",
			"nats.tls.server_name", "nats.internal", "nats.tls.handshake_first", true, "nats.nkey_seed_file", "/u.nk"))},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := loadYAML(t, base, WithOverrides(c.set))
			require.NoError(t, err)
		})
	}
}

func TestNATSRunsEmbedded(t *testing.T) {
	for _, tc := range []struct {
		n    NATS
		want bool
	}{
		{NATS{}, true},
		{NATS{URL: "nats://127.0.0.1:4222"}, false},
		{NATS{NATSClient: NATSClient{Context: "prod"}}, false},
		{NATS{URL: "nats://h:4222", NATSClient: NATSClient{Context: "prod"}}, false},
	} {
		require.Equal(t, tc.want, tc.n.RunsEmbedded(), "%+v", tc.n)
	}
}
