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
`))
		require.NoError(t, err)
		assert.Equal(t, HTTP{Listen: ":9090", MaxCheckpointAge: defaultHTTP.MaxCheckpointAge,
			TLS:   ServerTLS{CertFile: "/tls/crt.pem", KeyFile: "/tls/key.pem", ClientCAFile: "/tls/ca.pem"},
			Token: "m3tricsT0ken", AllowPublic: true}, cfg.HTTP)
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
