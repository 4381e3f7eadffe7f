package config

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestServeSection decodes a full serve section, and checks the defaults
// of an absent one.
func TestServeSection(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		cfg, err := loadYAML(t, base)
		require.NoError(t, err)
		assert.Equal(t, defaultServe, cfg.Serve)
	})
	t.Run("every key", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, `
serve:
  listen: ":9000"
  stream: CDC_shop
  where: {and: [{eq: [tenant_id, 42]}, {in: [status, [open, paid]]}]}
  tables: [public.orders, public.items]
  max_conns: 50
  max_per_client: 5
  client_header: X-Client-Id
  hold: 30s
  keep_alive: 5s
  write_timeout: 2s
  max_lag: 500
  window_txns: 1000
  window_bytes: 8388608
  max_projections: 50
  max_columns: 8
  projection_idle: 10s
  token_secret: a-resume-token-secret-of-32-bytes-or-more
  tls: {cert_file: /tls/crt.pem, key_file: /tls/key.pem, client_ca_file: /tls/ca.pem}
  auth:
    mode: jwt
    jwks_url: https://idp.example.com/jwks.json
    issuer: https://idp.example.com/
    audience: bridge
    leeway: 5s
    tables_claim: tables
    where: {eq: [tenant_id, "{{.claims.tenant_id}}"]}
    query_token: true
    scope_claim: scp
  max_header_bytes: 8192
  max_query_bytes: 4096
  max_filter_depth: 4
  read_header_timeout: 3s
  idle_timeout: 1m
  allowed_hosts: [feeds.example.com]
`))
		require.NoError(t, err)
		assert.Equal(t, Serve{
			Listen: ":9000", Stream: "CDC_shop",
			Where: map[string]any{"and": []any{
				map[string]any{"eq": []any{"tenant_id", 42}},
				map[string]any{"in": []any{"status", []any{"open", "paid"}}},
			}},
			Tables:   []string{"public.orders", "public.items"},
			MaxConns: 50, MaxPerClient: 5, ClientHeader: "X-Client-Id",
			Hold: 30 * time.Second, KeepAlive: 5 * time.Second, WriteTimeout: 2 * time.Second,
			MaxLag: 500, WindowTxns: 1000, WindowBytes: 8 << 20, MaxProjections: 50, MaxColumns: 8, ProjectionIdle: 10 * time.Second,
			TokenSecret: "a-resume-token-secret-of-32-bytes-or-more",
			TLS:         ServerTLS{CertFile: "/tls/crt.pem", KeyFile: "/tls/key.pem", ClientCAFile: "/tls/ca.pem"},
			Auth: ServeAuth{
				Mode: "jwt", JWKSURL: "https://idp.example.com/jwks.json", Issuer: "https://idp.example.com/", Audience: "bridge",
				Leeway: 5 * time.Second, TablesClaim: "tables", QueryToken: true, ScopeClaim: "scp",
				Where: map[string]any{"eq": []any{"tenant_id", "{{.claims.tenant_id}}"}},
			},
			MaxHeaderBytes: 8192, MaxQueryBytes: 4096, MaxFilterDepth: 4,
			ReadHeaderTimeout: 3 * time.Second, IdleTimeout: time.Minute,
			AllowedHosts: []string{"feeds.example.com"},
		}, cfg.Serve)
	})
	t.Run("environment", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, "serve: {max_conns: 50}"), environ("BRIDGE_SERVE__MAX_CONNS=7", "BRIDGE_SERVE__HOLD=1m"))
		require.NoError(t, err)
		assert.Equal(t, 7, cfg.Serve.MaxConns)
		assert.Equal(t, time.Minute, cfg.Serve.Hold)
	})
	t.Run("overrides win over the file", func(t *testing.T) {
		// How `bridge serve` passes the flags given on its command line.
		cfg, err := loadYAML(t, withBase(t, "serve: {max_conns: 50, max_per_client: 5, tables: [public.a, public.b]}"),
			WithOverrides(map[string]any{"serve.max_conns": 3, "serve.tables": []any{"public.c"}}))
		require.NoError(t, err)
		assert.Equal(t, 3, cfg.Serve.MaxConns)
		assert.Equal(t, 5, cfg.Serve.MaxPerClient, "a key without an override keeps the file's value")
		assert.Equal(t, []string{"public.c"}, cfg.Serve.Tables, "a list is replaced whole")
	})
}

// TestServeValidation checks that each bad key of the serve section is
// reported at its YAML path with the fix.
func TestServeValidation(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"listen without port", "listen: localhost", []string{`serve.listen: must be host:port such as 127.0.0.1:8090, or :8090 for every interface, got "localhost"`}},
		{"listen empty", `listen: ""`, []string{`serve.listen: must be host:port such as 127.0.0.1:8090, or :8090 for every interface, got ""`}},
		{"stream empty", `stream: ""`, []string{"serve.stream: must be set: the stream the nats_jetstream sink writes"}},
		{"stream with a dot", "stream: cdc.shop", []string{`serve.stream: "cdc.shop" is not a valid stream name: no spaces, '.', '*', '>', '/' or '\', at most 255 bytes`}},
		{"table without schema", "tables: [public.orders, orders]", []string{`serve.tables[1]: must be a schema.table name such as public.orders (globs are not supported), got "orders"`}},
		{"table glob", "tables: [public.*]", []string{`serve.tables[0]: must be a schema.table name such as public.orders (globs are not supported), got "public.*"`}},
		{"tables not a list", "tables: public.orders", []string{"serve.tables: expected a list, got a string"}},
		{"max_conns zero", "max_conns: 0", []string{"serve.max_conns: must be > 0, got 0"}},
		{"max_conns text", "max_conns: many", []string{"serve.max_conns: expected an integer, got a string"}},
		{"max_per_client negative", "max_per_client: -1", []string{"serve.max_per_client: must be > 0, got -1"}},
		{"client_header with a space", `client_header: "X Client"`, []string{`serve.client_header: must be an HTTP header name such as X-Client-Id, or empty for the remote IP, got "X Client"`}},
		{"hold zero", "hold: 0s", []string{"serve.hold: must be > 0, got 0s"}},
		{"hold without unit", "hold: 20", []string{`serve.hold: expected a duration such as "50ms" or "2s", got an integer`}},
		{"keep_alive negative", "keep_alive: -1s", []string{"serve.keep_alive: must be > 0, got -1s"}},
		{"write_timeout bad unit", "write_timeout: 10 seconds", []string{`serve.write_timeout: time: unknown unit " seconds" in duration "10 seconds"`}},
		{"max_lag zero", "max_lag: 0", []string{"serve.max_lag: must be > 0, got 0"}},
		{"max_lag negative", "max_lag: -5", []string{"serve.max_lag: expected a non-negative integer, got a negative one"}},
		{"window_txns zero", "window_txns: 0", []string{"serve.window_txns: must be > 0, got 0"}},
		{"window_bytes small", "window_bytes: 65536", []string{"serve.window_bytes: must be at least 1048576 (1 MiB), got 65536"}},
		{"where not a mapping", `where: "tenant_id = 42"`, []string{"serve.where: expected a mapping, got a string"}},
		{"unknown key", "max_conn: 5", []string{"serve.max_conn: unknown key (known: allowed_hosts, auth, client_header, hold, idle_timeout, keep_alive, listen, max_columns, max_conns, max_filter_depth, max_header_bytes, max_lag, max_per_client, max_projections, max_query_bytes, projection_idle, read_header_timeout, route, stream, tables, tls, token_secret, where, window_bytes, window_txns, write_timeout)"}},
		{"max_projections zero", "max_projections: 0", []string{"serve.max_projections: must be > 0, got 0"}},
		{"max_columns negative", "max_columns: -1", []string{"serve.max_columns: must be > 0, got -1"}},
		{"projection_idle zero", "projection_idle: 0s", []string{"serve.projection_idle: must be > 0, got 0s"}},
		{"token_secret short", "token_secret: short", []string{"serve.token_secret: must be at least 32 bytes (256 bits), got 5; generate one with `openssl rand -base64 48`"}},
		{"several at once", "max_conns: 0\n  hold: 0s", []string{"serve.hold: must be > 0, got 0s", "serve.max_conns: must be > 0, got 0"}},
		{"max_header_bytes too small", "max_header_bytes: 100", []string{"serve.max_header_bytes: must be >= 4096, got 100"}},
		{"max_query_bytes zero", "max_query_bytes: 0", []string{"serve.max_query_bytes: must be > 0, got 0"}},
		{"max_filter_depth zero", "max_filter_depth: 0", []string{"serve.max_filter_depth: must be > 0, got 0"}},
		{"read_header_timeout zero", "read_header_timeout: 0s", []string{"serve.read_header_timeout: must be > 0, got 0s"}},
		{"idle_timeout negative", "idle_timeout: -1s", []string{"serve.idle_timeout: must be > 0, got -1s"}},
		{"tls cert without key", "tls: {cert_file: /c.pem}", []string{"serve.tls.key_file: must be set with cert_file: the private key of the certificate"}},
		{"tls key without cert", "tls: {key_file: /k.pem}", []string{"serve.tls.cert_file: must be set with key_file: the certificate of the private key"}},
		{"allowed host with a port", "allowed_hosts: [feeds.internal, \"feeds.internal:8090\"]", []string{`serve.allowed_hosts[1]: must be a host name such as bridge.internal, .example.com for a domain and the names below it, or an IP address, without scheme, port or path; got "feeds.internal:8090"`}},
		{"tls client CA alone", "tls: {client_ca_file: /ca.pem}", []string{"serve.tls.client_ca_file: needs cert_file and key_file: mutual TLS is served over TLS"}},
		{"auth mode unknown", "auth: {mode: oauth}", []string{`serve.auth.mode: must be one of jwt, proxy, none, got "oauth"`}},
		{"jwt without a key", "auth: {mode: jwt}", []string{"serve.auth.mode: jwt needs a key to verify tokens: set serve.auth.hs256_secret, jwks_file or jwks_url"}},
		{"two keys", "auth: {hs256_secret: " + strings.Repeat("s", 32) + ", jwks_file: /j.json}", []string{"serve.auth: set one of hs256_secret, jwks_file and jwks_url, got 2"}},
		{"short secret, not printed", "auth: {hs256_secret: tooShortSecret}", []string{"serve.auth.hs256_secret: must be at least 32 bytes (256 bits) for HS256, got 14; generate one with `openssl rand -base64 48`"}},
		{"key with mode none", "auth: {mode: none, jwks_file: /j.json}", []string{`serve.auth.jwks_file: is used only with serve.auth.mode: jwt, got mode "none"`}},
		{"jwks_url plain http", "auth: {jwks_url: http://idp.example.com/jwks}", []string{`serve.auth.jwks_url: must be https: keys fetched over plain http could be replaced on the way (http is accepted only on loopback), got "http://idp.example.com/jwks"`}},
		{"jwks_url not a URL", "auth: {jwks_url: idp.example.com}", []string{`serve.auth.jwks_url: must be an https URL such as https://idp.example.com/.well-known/jwks.json, got "idp.example.com"`}},
		{"leeway too large", "auth: {jwks_file: /j.json, leeway: 1h}", []string{"serve.auth.leeway: must be between 0s and 5m0s, got 1h0m0s"}},
		{"proxy without header", "auth: {mode: proxy}", []string{"serve.client_header: must be set with serve.auth.mode: proxy: the header the authenticating proxy sets"}},
		{"claims without jwt", "auth: {tables_claim: tables, where: {eq: [t, 1]}, query_token: true}", []string{
			"serve.auth.query_token: needs JWT authentication (serve.auth.hs256_secret, jwks_file or jwks_url)",
			"serve.auth.tables_claim: needs JWT authentication (serve.auth.hs256_secret, jwks_file or jwks_url)",
			"serve.auth.where: needs JWT authentication (serve.auth.hs256_secret, jwks_file or jwks_url); use serve.where for a condition without claims",
		}},
		{"query token in clear", "listen: \":8090\"\n  auth: {jwks_file: /j.json, query_token: true}", []string{"serve.auth.query_token: needs serve.tls, or serve.listen on loopback behind a TLS-terminating proxy: a token in the URL would cross the network in clear"}},
		{"proxy header on every interface", "listen: \":8090\"\n  client_header: X-User", []string{`serve.client_header: "X-User" would be trusted from every client that reaches serve.listen ":8090", and any of them can send it: listen on 127.0.0.1 behind the proxy on the same host (a sidecar), or require the proxy's certificate with serve.tls.client_ca_file (mutual TLS)`}},
		{"proxy header beyond loopback, TLS without client certificates", "listen: 10.0.0.5:8090\n  client_header: X-User\n  tls: {cert_file: /c, key_file: /k}", []string{`serve.client_header: "X-User" would be trusted from every client that reaches serve.listen "10.0.0.5:8090", and any of them can send it: listen on 127.0.0.1 behind the proxy on the same host (a sidecar), or require the proxy's certificate with serve.tls.client_ca_file (mutual TLS)`}},
		{"scope header without proxy", "auth: {scope_header: X-Scopes}", []string{"serve.auth.scope_header: needs serve.auth.mode: proxy (serve.client_header): with JWTs the scopes come from serve.auth.scope_claim"}},
		{"scope header is the client header", "client_header: X-User\n  auth: {scope_header: x-user}", []string{`serve.auth.scope_header: must differ from serve.client_header ("X-User"): one names the caller, the other its scopes`}},
		{"scope header not a header", "client_header: X-User\n  auth: {scope_header: \"X Scopes\"}", []string{`serve.auth.scope_header: must be an HTTP header name such as X-Auth-Request-Groups, got "X Scopes"`}},
		{"public without auth", "listen: 0.0.0.0:8090", []string{`serve.listen: "0.0.0.0:8090" can be reached from other machines and serve.auth is not set: anyone who reaches it reads every row. Set serve.auth.hs256_secret or jwks_url (JWT), serve.client_header behind an authenticating proxy, listen on 127.0.0.1, or set serve.auth.mode: none to serve without authentication`}},
		{"every interface without auth", `listen: ":8090"`, []string{`serve.listen: ":8090" can be reached from other machines and serve.auth is not set: anyone who reaches it reads every row. Set serve.auth.hs256_secret or jwks_url (JWT), serve.client_header behind an authenticating proxy, listen on 127.0.0.1, or set serve.auth.mode: none to serve without authentication`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadYAML(t, withBase(t, "serve:\n  "+tt.yaml+"\n"))
			assert.Equal(t, tt.want, problems(t, err))
		})
	}
	t.Run("accepted", func(t *testing.T) {
		for _, y := range []string{
			"listen: 127.0.0.1:8090",                  // loopback needs nothing
			"listen: \"[::1]:8090\"",                  // nor IPv6 loopback
			"listen: localhost:8090",                  // nor localhost
			"listen: \":8090\"\n  auth: {mode: none}", // the explicit opt-in
			"listen: 127.0.0.1:8090\n  client_header: X-User\n  auth: {scope_header: X-Scopes}",                     // behind a proxy on the same host
			"listen: \":8090\"\n  client_header: X-User\n  tls: {cert_file: /c, key_file: /k, client_ca_file: /ca}", // behind a proxy with its certificate
			"listen: \":8090\"\n  client_header: X-User\n  auth: {mode: none}",                                      // the header only keys max_per_client
			"listen: \":8090\"\n  auth: {hs256_secret: " + strings.Repeat("s", 32) + "}",
			"listen: \":8090\"\n  auth: {jwks_url: https://idp/jwks.json, query_token: true}\n  tls: {cert_file: /c, key_file: /k}",
			"auth: {jwks_url: http://127.0.0.1:9999/jwks.json, query_token: true}", // loopback: plain http and query tokens
		} {
			_, err := loadYAML(t, withBase(t, "serve:\n  "+y+"\n"))
			assert.NoError(t, err, y)
		}
	})
	t.Run("the secret is never in the problem", func(t *testing.T) {
		_, err := loadYAML(t, withBase(t, "serve:\n  auth: {hs256_secret: sEcReT5hort}\n"))
		require.Error(t, err)
		assert.NotContains(t, err.Error(), "sEcReT5hort")
	})
	t.Run("blames the environment variable", func(t *testing.T) {
		_, err := loadYAML(t, base, environ("BRIDGE_SERVE__MAX_CONNS=0"))
		assert.Equal(t, []string{"serve.max_conns: must be > 0, got 0 (set by environment variable BRIDGE_SERVE__MAX_CONNS)"}, problems(t, err))
	})
	t.Run("a Config built in code without a serve section", func(t *testing.T) {
		c, err := loadYAML(t, base)
		require.NoError(t, err)
		c.Serve = Serve{}
		require.NoError(t, c.Validate())
		c.Serve.Listen = "127.0.0.1:8090" // a partial section is checked whole
		assert.Contains(t, problems(t, c.Validate()), "serve.max_conns: must be > 0, got 0")
	})
}

// TestNonStringKeys checks that keys YAML reads as other scalars keep the
// text written: serve.where's {null: column} must reach the bridge as
// "null".
func TestNonStringKeys(t *testing.T) {
	cfg, err := loadYAML(t, withBase(t, "serve: {where: {not: {null: deleted_at}}}\nsources: {shop: {config: {dsn: x, slot: y, 1: one, true: yes}}}"))
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"not": map[string]any{"null": "deleted_at"}}, cfg.Serve.Where)
	assert.Equal(t, "one", cfg.Sources["shop"].Config["1"])
	assert.Equal(t, "yes", cfg.Sources["shop"].Config["true"])
}
