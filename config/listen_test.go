package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestIsLoopback checks which listen addresses count as reachable only
// from this machine.
func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "127.1.2.3:1": true, "[::1]:8080": true, "localhost:80": true, "LOCALHOST:80": true,
		":8080": false, "0.0.0.0:8080": false, "[::]:8080": false, "10.0.0.5:8080": false, "bridge.svc:8080": false,
		"127.0.0.1": false, "": false,
	} {
		assert.Equal(t, want, IsLoopback(addr), addr)
	}
}

// TestHTTPSection checks the http section's TLS, token and the refusal to
// serve /metrics beyond loopback without protection or an explicit opt-in.
func TestHTTPSection(t *testing.T) {
	t.Run("every key", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, `
http:
  listen: ":9090"
  tls: {cert_file: /tls/crt.pem, key_file: /tls/key.pem, client_ca_file: /tls/ca.pem}
  token: m3tricsT0ken
  allow_public: true
  console: false
  allowed_hosts: [bridge.internal, .corp.example, 10.0.0.5, "::1"]
`))
		require.NoError(t, err)
		assert.Equal(t, HTTP{Listen: ":9090", MaxCheckpointAge: defaultHTTP.MaxCheckpointAge,
			TLS:   ServerTLS{CertFile: "/tls/crt.pem", KeyFile: "/tls/key.pem", ClientCAFile: "/tls/ca.pem"},
			Token: "m3tricsT0ken", AllowPublic: true, AllowedHosts: []string{"bridge.internal", ".corp.example", "10.0.0.5", "::1"}}, cfg.HTTP)
	})
	const public = `http.listen: ":8080" serves /metrics to every machine that can reach it: set http.token (a bearer token Prometheus sends) or http.tls.client_ca_file (mutual TLS), listen on 127.0.0.1, or set http.allow_public: true to serve it openly`
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"loopback", "listen: 127.0.0.1:8080", nil},
		{"off", `listen: ""`, nil},
		{"every interface", `listen: ":8080"`, []string{public}},
		{"TLS alone authenticates nobody", "listen: \":8080\"\n  tls: {cert_file: /c, key_file: /k}", []string{public}},
		{"token", "listen: \":8080\"\n  token: t0k", nil},
		{"mutual TLS", "listen: \":8080\"\n  tls: {cert_file: /c, key_file: /k, client_ca_file: /ca}", nil},
		{"opt-in", "listen: \":8080\"\n  allow_public: true", nil},
		{"no port", "listen: 0.0.0.0", []string{`http.listen: must be host:port such as 127.0.0.1:8080, or "" to turn the server off, got "0.0.0.0"`}},
		{"cert without key", "tls: {cert_file: /c}", []string{"http.tls.key_file: must be set with cert_file: the private key of the certificate"}},
		{"allowed hosts", "allowed_hosts: [bridge.internal, http://bridge.internal, \"bridge.internal:8080\", \"*.example.com\", \"a b\", bridge.internal/console, \"\"]", []string{
			`http.allowed_hosts[1]: must be a host name such as bridge.internal, .example.com for a domain and the names below it, or an IP address, without scheme, port or path; got "http://bridge.internal"`,
			`http.allowed_hosts[2]: must be a host name such as bridge.internal, .example.com for a domain and the names below it, or an IP address, without scheme, port or path; got "bridge.internal:8080"`,
			`http.allowed_hosts[3]: must be a host name such as bridge.internal, .example.com for a domain and the names below it, or an IP address, without scheme, port or path; got "*.example.com"`,
			`http.allowed_hosts[4]: must be a host name such as bridge.internal, .example.com for a domain and the names below it, or an IP address, without scheme, port or path; got "a b"`,
			`http.allowed_hosts[5]: must be a host name such as bridge.internal, .example.com for a domain and the names below it, or an IP address, without scheme, port or path; got "bridge.internal/console"`,
			`http.allowed_hosts[6]: must be a host name such as bridge.internal, .example.com for a domain and the names below it, or an IP address, without scheme, port or path; got ""`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadYAML(t, withBase(t, "http:\n  "+tc.yaml+"\n"))
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			assert.Equal(t, tc.want, problems(t, err))
		})
	}
	t.Run("set by the environment", func(t *testing.T) {
		_, err := loadYAML(t, base, environ("BRIDGE_HTTP__LISTEN=0.0.0.0:8080"))
		assert.Equal(t, []string{`http.listen: "0.0.0.0:8080" serves /metrics to every machine that can reach it: set http.token (a bearer token Prometheus sends) or http.tls.client_ca_file (mutual TLS), listen on 127.0.0.1, or set http.allow_public: true to serve it openly (set by environment variable BRIDGE_HTTP__LISTEN)`}, problems(t, err))
		_, err = loadYAML(t, base, environ("BRIDGE_HTTP__LISTEN=0.0.0.0:8080", "BRIDGE_HTTP__ALLOW_PUBLIC=true"))
		require.NoError(t, err)
	})
}
