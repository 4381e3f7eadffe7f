package config

import (
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
			MaxLag: 500, WindowTxns: 1000,
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
		{"where not a mapping", `where: "tenant_id = 42"`, []string{"serve.where: expected a mapping, got a string"}},
		{"unknown key", "max_conn: 5", []string{"serve.max_conn: unknown key (known: client_header, hold, keep_alive, listen, max_conns, max_lag, max_per_client, stream, tables, where, window_txns, write_timeout)"}},
		{"several at once", "max_conns: 0\n  hold: 0s", []string{"serve.hold: must be > 0, got 0s", "serve.max_conns: must be > 0, got 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadYAML(t, withBase(t, "serve:\n  "+tt.yaml+"\n"))
			assert.Equal(t, tt.want, problems(t, err))
		})
	}
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
